"""The largest job the loader (and the CRD, with the same rules) admits starts: every
environment string ``replica_env`` injects, ``TF_CONFIG`` above all (expanded: the pod spec
refers to the job's ConfigMap for the cluster), stays within the
kernel's limit per string (``MAX_ARG_STRLEN``, 128 KiB) for the worst names admitted, in
the longest namespace, on the longest port; and one more replica, or one more character of
name, is refused with one line naming the limit and why."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from strategyjob import jobspec
from strategyjob.jobspec import ManifestError, load_manifest
from strategyjob.jobspec import messages as msg
from strategyjob.jobspec._model import TF_CONFIG_BYTES_PER_REPLICA, TF_CONFIG_FIXED_BYTES

LONGEST_NAMESPACE = "n" * jobspec.MAX_NAMESPACE_LENGTH
LONGEST_PORT = 65535
CRD = Path(__file__).resolve().parents[3] / "crds" / "strategyjob.dev_strategyjobs.yaml"


def _manifest(name: str, strategy: str, counts: dict[str, int]) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "strategyjob", "image": "train"}]}}
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name, "namespace": LONGEST_NAMESPACE},
        "spec": {
            "strategy": strategy,
            "port": LONGEST_PORT,
            "replicaSpecs": {t: {"replicas": n, "template": template} for t, n in counts.items()},
        },
    }


def _topologies(total: int) -> list[tuple[str, dict[str, int]]]:
    """Jobs of ``total`` replicas whose addresses are longest: workers (the longest type name)
    with a chief; a parameter-server job of mostly ps (the job's name may be longer when its
    workers are few); and one with an evaluator (counted, though not in TF_CONFIG)."""
    if total == 1:
        return [("MultiWorkerMirroredStrategy", {"worker": 1})]
    out = [("MultiWorkerMirroredStrategy", {"chief": 1, "worker": total - 1})]
    if total >= 3:
        out.append(("ParameterServerStrategy", {"chief": 1, "worker": 1, "ps": total - 2}))
        out.append(("MultiWorkerMirroredStrategy", {"worker": total - 1, "evaluator": 1}))
    return out


def _longest_admitted_name(strategy: str, counts: dict[str, int]) -> str:
    """The longest name the loader admits for this job (the pod-name rule or the job-size
    rule, whichever is stricter)."""
    pod_suffix = max(len(f"-{t}-{n - 1}") for t, n in counts.items() if n > 0)
    length = min(
        jobspec.MAX_NAME_LENGTH - pod_suffix, jobspec.max_name_length(sum(counts.values()))
    )
    name = "j" * length
    load_manifest(_manifest(name, strategy, counts))  # admitted
    with pytest.raises(ManifestError):
        load_manifest(_manifest(name + "j", strategy, counts))
    return name


def _env_strings(job: jobspec.StrategyJob, replica_type: str, index: int) -> list[bytes]:
    """What ``execve`` receives: ``NAME=value`` and its NUL, per injected variable (on
    Kubernetes also the cluster part of TF_CONFIG, read from the job's ConfigMap)."""
    cluster = jobspec.cluster_for_kubernetes(job)
    env = jobspec.replica_env(job, replica_type, index, cluster, restart_attempt=2**31 - 1)
    env[jobspec.ENV_CLUSTER_SPEC] = jobspec.cluster_spec(cluster)
    return [f"{k}={v}".encode() + b"\0" for k, v in env.items()]


@pytest.mark.parametrize("total", [1, 2, 11, 101, 500, 664, 665, 700, 900, 999, 1000])
def test_every_injected_string_of_the_worst_admitted_job_fits_the_kernel_limit(total):
    for strategy, counts in _topologies(total):
        name = _longest_admitted_name(strategy, counts)
        job = load_manifest(_manifest(name, strategy, counts))
        bound = jobspec.tf_config_bound(total, len(name))
        assert bound <= jobspec.MAX_ENV_STRING_BYTES
        # The longest strings: the highest index of each type (the task part differs only
        # there), and the leader; every other replica's are no longer.
        for replica_type, count in counts.items():
            for index in {0, count - 1}:
                longest = max(len(s) for s in _env_strings(job, replica_type, index))
                assert longest <= bound, (strategy, counts, replica_type, index)


def test_the_bound_is_tight_so_the_limit_wastes_little():
    """At 1000 replicas and the longest name admitted, TF_CONFIG is within 3% of the bound
    and of the kernel's limit: the rule admits nearly all that starts."""
    counts = {"chief": 1, "worker": 999}
    name = _longest_admitted_name("MultiWorkerMirroredStrategy", counts)
    job = load_manifest(_manifest(name, "MultiWorkerMirroredStrategy", counts))
    (tf_config,) = [s for s in _env_strings(job, "worker", 998) if s.startswith(b"TF_CONFIG=")]
    assert len(tf_config) >= 0.97 * jobspec.tf_config_bound(1000, len(name))
    assert len(tf_config) >= 0.95 * jobspec.MAX_ENV_STRING_BYTES


def test_the_kernel_starts_a_program_with_the_largest_tf_config_and_refuses_one_byte_more():
    """The limit is the kernel's, not a guess: a real ``execve`` takes the largest admitted
    job's TF_CONFIG, and fails with E2BIG (what a container runtime reports) one byte over."""
    counts = {"chief": 1, "worker": 999}
    name = _longest_admitted_name("MultiWorkerMirroredStrategy", counts)
    job = load_manifest(_manifest(name, "MultiWorkerMirroredStrategy", counts))
    cluster = jobspec.cluster_for_kubernetes(job)
    env = jobspec.replica_env(job, "worker", 998, cluster)
    # on Kubernetes the process also gets the cluster alone, from the job's ConfigMap
    env[jobspec.ENV_CLUSTER_SPEC] = jobspec.cluster_spec(cluster)
    code = "import os, sys; sys.stdout.write(str(len(os.environ['TF_CONFIG'])))"
    started = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout == str(len(env["TF_CONFIG"]))

    over = "x" * (jobspec.MAX_ENV_STRING_BYTES - len("TF_CONFIG=") - 1 + 1)
    with pytest.raises(OSError) as info:
        subprocess.run([sys.executable, "-c", "pass"], env={"TF_CONFIG": over}, timeout=60)
    assert info.value.errno == errno.E2BIG


def test_more_than_the_limit_in_all_is_one_line_naming_the_limit_and_why():
    counts = {"chief": 1, "worker": 998, "evaluator": 1, "ps": 0}
    with pytest.raises(ManifestError) as info:
        load_manifest(_manifest("big", "MultiWorkerMirroredStrategy", {**counts, "worker": 1000}))
    assert info.value.problems == [
        "spec.replicaSpecs: a StrategyJob may have at most 1000 replicas in all: every "
        "replica's TF_CONFIG lists the whole cluster and must stay under the kernel's 128 KiB "
        "limit per environment string (got 1002). Use at most 1000 replicas in all."
    ]
    assert load_manifest(_manifest("big", "MultiWorkerMirroredStrategy", counts))


def test_one_type_over_the_limit_is_one_problem_not_two():
    with pytest.raises(ManifestError) as info:
        load_manifest(_manifest("big", "MultiWorkerMirroredStrategy", {"worker": 10**6}))
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("spec.replicaSpecs.worker.replicas: must be at most")


def test_a_name_too_long_for_the_job_size_is_one_line_with_the_longest_that_fits():
    with pytest.raises(ManifestError) as info:
        load_manifest(_manifest("j" * 21, "MultiWorkerMirroredStrategy", {"worker": 1000}))
    assert info.value.problems == [
        msg.NAME_TOO_LONG_FOR_REPLICAS.format(value=f'"{"j" * 21}"', total=1000, max_length=20)
    ]
    assert (
        '(got "jjjjjjjjjjjjjjjjjjjjj"). Use a name of at most 20 characters'
        in (info.value.problems[0])
    )
    assert load_manifest(_manifest("j" * 20, "MultiWorkerMirroredStrategy", {"worker": 1000}))


def test_every_name_the_pod_name_rule_admits_fits_up_to_664_replicas():
    """Below 665 replicas the job-size rule never adds to the pod-name rule (a job with
    workers has a name of at most 54 characters): only large jobs need short names."""
    assert jobspec.max_name_length(664) >= jobspec.MAX_NAME_LENGTH - len("-worker-0")
    assert jobspec.max_name_length(665) < jobspec.MAX_NAME_LENGTH - len("-worker-0")
    assert jobspec.max_name_length(jobspec.MAX_TOTAL_REPLICAS) == 20


def test_the_crd_applies_the_same_rules_with_the_same_numbers():
    """crds/ (the chart's copy is byte-identical) carries the limit, the per-type maximum
    and the name rule's constants that the loader uses; the real API server's answers are
    compared with the loader's in tests/integration/test_k8s_job_size.py."""
    text = CRD.read_text()
    schema = yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    replicas = schema["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]
    for replica_type in jobspec.REPLICA_TYPES:
        assert replicas[replica_type]["properties"]["replicas"]["maximum"] == jobspec.MAX_REPLICAS
    assert jobspec.MAX_REPLICAS == jobspec.MAX_TOTAL_REPLICAS
    spec_rules = [r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert any(r.endswith(f"<= {jobspec.MAX_TOTAL_REPLICAS}") for r in spec_rules)
    name_rule = next(r["rule"] for r in schema["x-kubernetes-validations"] if "131072" in r["rule"])
    budget = f"{jobspec.MAX_ENV_STRING_BYTES} - {TF_CONFIG_FIXED_BYTES}"
    assert budget in name_rule and f"- {TF_CONFIG_BYTES_PER_REPLICA}) / 2" in name_rule
    assert f"> {jobspec.MAX_TOTAL_REPLICAS}" in name_rule
