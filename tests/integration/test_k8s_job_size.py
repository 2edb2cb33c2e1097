"""The job-size bound against the real API server and the operator as a real process: the
CRD refuses a job over the limit (or one whose name is too long for its size) with the
loader's words, admits the largest, and the operator creates all the pods of the largest
admitted job, with the longest names, within the chart's memory limit."""

from __future__ import annotations

import copy
import json
import re
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration_harness import OperatorProcess, manifest, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from strategyjob import jobspec
from strategyjob_operator import children

from tests.support.control_plane import REPO_ROOT

CHART_VALUES = REPO_ROOT / "helm" / "strategyjob-operator" / "values.yaml"
#: The operator's peak RSS may use at most this share of the chart's memory limit.
MARGIN = 0.7
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def chart_memory_limit() -> int:
    """The operator container's memory limit in the chart's default values, in bytes."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    text = str(values["resources"]["limits"]["memory"])
    number, unit = re.fullmatch(r"(\d+)([KMG]i)", text).groups()
    return int(number) * _UNITS[unit]


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def _refusal(kube, obj: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        kube.custom.create_namespaced_custom_object(
            "strategyjob.dev", "v1alpha1", kube.ns, "strategyjobs", obj, dry_run="All"
        )
    assert err.value.status in (400, 422), err.value.body
    return json.loads(err.value.body)["message"]


def _admitted(kube, obj: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(
        "strategyjob.dev", "v1alpha1", kube.ns, "strategyjobs", obj, dry_run="All"
    )
    jobspec.load_manifest({**obj, "metadata": {**obj["metadata"], "namespace": kube.ns}})


def _only_problem(obj: dict[str, Any]) -> str:
    with pytest.raises(jobspec.ManifestError) as info:
        jobspec.load_manifest(obj)
    (problem,) = info.value.problems
    return problem


@pytest.mark.timeout(120)
def test_the_api_server_and_the_loader_refuse_a_job_over_the_limit_in_the_same_words(kube):
    limit = jobspec.MAX_TOTAL_REPLICAS
    mwms = "MultiWorkerMirroredStrategy"
    # the largest job, with the longest name its size allows, is admitted
    _admitted(kube, manifest("j" * jobspec.max_name_length(limit), mwms, {"worker": limit}))
    _admitted(kube, manifest("big", mwms, {"chief": 1, "worker": limit - 2, "evaluator": 1}))

    # one more replica, over the types together
    over = manifest("big", mwms, {"chief": 1, "worker": limit - 1, "evaluator": 1})
    problem = _only_problem(copy.deepcopy(over))
    assert problem.startswith(f"spec.replicaSpecs: a StrategyJob may have at most {limit} ")
    assert problem in _refusal(kube, over)

    # one more character of name than the job's size allows
    long_name = manifest("j" * (jobspec.max_name_length(limit) + 1), mwms, {"worker": limit})
    problem = _only_problem(copy.deepcopy(long_name))
    assert "128 KiB" in problem and "Use a name of at most 20 characters" in problem
    assert problem in _refusal(kube, long_name)

    # one type over the limit: the per-type maximum names the field
    message = _refusal(kube, manifest("big", mwms, {"worker": limit + 1}))
    assert "spec.replicaSpecs.worker.replicas" in message, message
    assert str(limit) in message, message
    assert kube.job("big") is None


def _worst_case_namespace(control_plane) -> str:
    """A namespace of 63 characters, the longest, that no shared operator watches."""
    name = "own-size-" + "n" * (jobspec.MAX_NAMESPACE_LENGTH - len("own-size-") - 4)
    name += str(int(time.time()) % 10_000).rjust(4, "0")
    return name


def _pod_count(kube) -> int:
    """The job's pods, read as metadata only (the test must not hold 130 MB either)."""
    cp = kube.cp
    request = urllib.request.Request(
        f"{cp.server}/api/v1/namespaces/{kube.ns}/pods",
        headers={
            "Authorization": f"Bearer {cp.token}",
            "Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        },
    )
    context = ssl.create_default_context(cafile=str(cp.ca_path))
    with urllib.request.urlopen(request, context=context, timeout=60) as response:
        return len(json.loads(response.read()).get("items") or [])


def _metrics_up(op: OperatorProcess) -> bool:
    try:
        return bool(op.metrics())
    except OSError:  # not listening yet (URLError is an OSError)
        return False


def _passes_or_zero(op: OperatorProcess) -> float:
    return _reconcile_passes(op) if _metrics_up(op) else 0.0


def _reconcile_passes(op: OperatorProcess) -> float:
    match = re.search(
        r"^strategyjob_operator_reconcile_duration_seconds_count (\S+)$", op.metrics(), re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


@pytest.mark.timeout(400)
def test_a_jobs_cluster_is_stored_once_and_every_pod_refers_to_it(kube, operator):
    """A job of 200 replicas: one ConfigMap holds the cluster part of TF_CONFIG, every pod's
    env refers to it, and, expanded as a kubelet does, gives each pod exactly the TF_CONFIG
    of jobspec.tf_config. The job's pod objects are measured against what they were when
    each pod carried the whole TF_CONFIG: their size grows with N, not N²."""
    total = 200
    counts = {"chief": 1, "worker": 188, "ps": 10, "evaluator": 1}
    obj = manifest("size", "ParameterServerStrategy", counts)
    kube.create_job(obj)
    job = jobspec.load_manifest({**obj, "metadata": {"name": "size", "namespace": kube.ns}})
    assert job.total_replicas == total
    wait_for(f"{total} pods", lambda: len(kube.raw_pods("size")) >= total, timeout=300, interval=1)
    cluster = jobspec.cluster_for_kubernetes(job)

    # a ParameterServerStrategy job's: <job>-strategyjob-cluster-<hash>, one per worker count
    cm_name = children.cluster_config_map_name(job)
    config_map = kube.core.read_namespaced_config_map(cm_name, kube.ns)
    assert config_map.data == {"cluster": jobspec.cluster_spec(cluster)}
    assert config_map.immutable is True
    config_map_bytes = len(config_map.data["cluster"])

    pods = kube.raw_pods("size")
    assert len(pods) == total
    new_bytes = old_bytes = 0
    sizes, env_sizes = [], []
    for pod, size in pods:
        labels = pod["metadata"]["labels"]
        replica_type = labels["strategyjob.dev/replica-type"]
        index = int(labels["strategyjob.dev/replica-index"])
        entries = pod["spec"]["containers"][0]["env"]
        assert entries[0] == {
            "name": "STRATEGYJOB_CLUSTER_SPEC",
            "valueFrom": {"configMapKeyRef": {"name": cm_name, "key": "cluster"}},
        }
        (reference,) = [e["value"] for e in entries if e["name"] == "TF_CONFIG"]
        assert "$(STRATEGYJOB_CLUSTER_SPEC)" in reference
        full = jobspec.tf_config(cluster, replica_type, index)
        if index < 3 or replica_type in ("chief", "evaluator"):  # the kubelet's view
            assert kube.container_env(pod)["TF_CONFIG"] == full
        # (the chief's STRATEGYJOB_CLUSTER_FILE, the path of the workers it follows, is as
        # long whatever the job's size)
        sized = [e for e in entries if e["name"] != "STRATEGYJOB_CLUSTER_FILE"]
        env_sizes.append(len(json.dumps(sized, separators=(",", ":"))))
        sizes.append(size)
        new_bytes += size
        # the same pod with the whole TF_CONFIG in it, as before, and without the reference
        old_entries = [{"name": "TF_CONFIG", "value": full}, *entries[2:]]
        old_size = size - len(json.dumps(entries[:2], separators=(",", ":")))
        old_size += len(json.dumps(old_entries[:1], separators=(",", ":")))
        old_bytes += old_size
    # O(1) per pod: envs differ only by the replica type's name, its index, and RANK and
    # WORLD_SIZE (chief and workers only), never by the job's size
    assert max(env_sizes) - min(env_sizes) <= 128, (min(env_sizes), max(env_sizes))
    assert max(env_sizes) < 1500, max(env_sizes)
    print(
        f"{total} pods: {new_bytes / 2**20:.2f} MiB of pod objects (each {min(sizes):,} to "
        f"{max(sizes):,} B, env at most {max(env_sizes):,} B) + {config_map_bytes:,} B of "
        f"ConfigMap, against {old_bytes / 2**20:.2f} MiB with the whole TF_CONFIG in every "
        f"pod: {old_bytes / (new_bytes + config_map_bytes):.1f}x less"
    )
    assert new_bytes + config_map_bytes < old_bytes / 2


@pytest.mark.slow  # about 2 minutes: 1000 pods, two operators
@pytest.mark.timeout(600)
def test_the_operator_creates_the_largest_job_within_the_charts_memory_limit(control_plane):
    """The largest job the CRD admits, with the longest names (job name, 63-character
    namespace, port 65535), so that every pod carries the largest TF_CONFIG: the operator,
    as a real process, creates all its pods and its peak RSS stays under 70% of the chart's
    limit, through the passes that read all the pods back; and so does an operator started
    afresh beside the job."""
    from integration_harness import Kube

    total = jobspec.MAX_TOTAL_REPLICAS
    ns = _worst_case_namespace(control_plane)
    assert len(ns) == jobspec.MAX_NAMESPACE_LENGTH
    kube = Kube(control_plane, ns)
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    op = OperatorProcess(control_plane, "--standalone", "-n", ns).start()
    try:
        wait_for("the operator's metrics endpoint", lambda: _metrics_up(op), timeout=60)
        name = "j" * jobspec.max_name_length(total)
        obj = manifest(name, "MultiWorkerMirroredStrategy", {"chief": 1, "worker": total - 1})
        obj["spec"]["port"] = 65535
        job = jobspec.load_manifest({**obj, "metadata": {"name": name, "namespace": ns}})
        env = jobspec.replica_env(
            job, "worker", total - 2, jobspec.cluster_for_kubernetes(job), restart_attempt=0
        )
        tf_config_bytes = len("TF_CONFIG=") + len(env["TF_CONFIG"]) + 1
        assert 0.95 * jobspec.MAX_ENV_STRING_BYTES <= tf_config_bytes
        assert tf_config_bytes <= jobspec.MAX_ENV_STRING_BYTES

        started = time.monotonic()
        kube.create_job(obj)
        wait_for(f"{total} pods", lambda: _pod_count(kube) >= total, timeout=420, interval=1)
        created_after = time.monotonic() - started
        wait_for(
            "the job's status to record that all pods were created",
            lambda: ((kube.job(name) or {}).get("status") or {}).get("launched"),
            timeout=120,
            interval=1,
        )
        # one more pass that reads every pod back (a resync, an event), measured too
        before = _reconcile_passes(op)
        kube.patch_job(name, {"metadata": {"annotations": {"touch": "1"}}})
        wait_for("one more pass", lambda: _reconcile_passes(op) > before, timeout=120)

        worker = f"{name}-worker-{total - 2}"
        (pod,) = [p for p, _ in kube.raw_pods(name) if p["metadata"]["name"] == worker]
        # exact, as user code reads it: the cluster from the job's ConfigMap, expanded
        assert kube.container_env(pod)["TF_CONFIG"] == env["TF_CONFIG"]

        peak, limit = peak_rss(op.proc.pid), chart_memory_limit()
        print(
            f"{total} pods of {tf_config_bytes} B TF_CONFIG created in {created_after:.1f} s; "
            f"operator peak RSS {peak / 2**20:.0f} MiB = {peak / limit:.2f} of the chart's "
            f"{limit / 2**20:.0f} MiB"
        )
        assert op.proc.poll() is None, op.output()[-3000:]
        assert peak <= MARGIN * limit, (
            f"peak RSS {peak / 2**20:.0f} MiB over {MARGIN:.0%} of {limit / 2**20:.0f} MiB"
        )

        # An operator started beside the job (an upgrade, a crash, another replica taking
        # over): kopf lists the pods before it watches them, and a pass reads them all.
        op.stop()
        op = OperatorProcess(control_plane, "--standalone", "-n", ns).start()
        wait_for("the new operator's first pass", lambda: _passes_or_zero(op) >= 1, timeout=180)
        before = _reconcile_passes(op)
        kube.patch_job(name, {"metadata": {"annotations": {"touch": "2"}}})
        wait_for("one more pass", lambda: _reconcile_passes(op) > before, timeout=120)
        peak = peak_rss(op.proc.pid)
        print(f"restarted beside it: peak RSS {peak / 2**20:.0f} MiB = {peak / limit:.2f}")
        assert op.proc.poll() is None, op.output()[-3000:]
        assert peak <= MARGIN * limit, (
            f"restarted: peak RSS {peak / 2**20:.0f} MiB over {MARGIN:.0%} of "
            f"{limit / 2**20:.0f} MiB"
        )
    finally:
        op.stop()
        kube.core.delete_namespace(ns)
        kube.api_client.close()
