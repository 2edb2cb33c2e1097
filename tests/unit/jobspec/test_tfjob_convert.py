"""``strategyjob convert``: a Kubeflow TFJob as the StrategyJob it becomes for good. Every
Kubeflow manifest of tests/support/kubeflow_tfjobs converts to a manifest the StrategyJob
loader accepts with its fields carried, or is refused with one line saying why; each field a
StrategyJob cannot hold gets one line naming it."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from strategyjob import cli
from strategyjob.jobspec import (
    MAX_INT32,
    ManifestError,
    convert_tfjob,
    load_manifest,
    local_tfjob,
    training_container,
)

from tests.support import kubeflow_tfjobs

#: The strategy each Kubeflow manifest converts to, and the TFJob fields named as not carried
#: as written (None: refused, see the test of PS jobs with one worker and no chief).
EXPECTED: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "docs-gpu-tf-smoke": (None, ()),
    "docs-managedby-multikueue": ("MultiWorkerMirroredStrategy", ("spec.runPolicy.managedBy",)),
    "docs-scheduler-plugins": ("MultiWorkerMirroredStrategy", ()),
    "docs-tensorflow-gcp-credentials": (None, ()),
    "docs-tensorflow-ps-worker": ("ParameterServerStrategy", ("spec.tfReplicaSpecs.Worker",)),
    "docs-tfjob-simple-status": ("MultiWorkerMirroredStrategy", ("status",)),
    "example-dist-mnist": ("ParameterServerStrategy", ()),
    "example-mnist-with-summaries": ("MirroredStrategy", ()),
    "example-multi-worker": ("MultiWorkerMirroredStrategy", ()),
    "example-simple": ("MultiWorkerMirroredStrategy", ()),
}


def test_every_kubeflow_manifest_is_expected() -> None:
    assert sorted(EXPECTED) == kubeflow_tfjobs.NAMES


def _tensorflow(replica: dict[str, Any]) -> dict[str, Any]:
    containers = replica["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "tensorflow")


@pytest.mark.parametrize("name", [n for n, (s, _) in EXPECTED.items() if s is not None])
def test_kubeflow_manifest_converts_with_its_fields(name: str) -> None:
    tf = kubeflow_tfjobs.load(name, "team")
    strategy, dropped = EXPECTED[name]
    conversion = convert_tfjob(copy.deepcopy(tf))
    out = conversion.manifest
    assert [n.split(":")[0] for n in conversion.notes] == list(dropped)

    if "generateName" in tf["metadata"]:
        assert out["metadata"]["generateName"] == tf["metadata"]["generateName"]
        assert "name" not in out["metadata"]
        job = load_manifest({**out, "metadata": {**out["metadata"], "name": "generated"}})
    else:
        assert out["metadata"]["name"] == tf["metadata"]["name"]
        job = load_manifest(out)
    assert job.strategy == strategy == out["spec"]["strategy"]
    assert job.namespace == "team"
    tf_run_policy = tf["spec"].get("runPolicy", {})
    assert job.run_policy.clean_pod_policy == tf_run_policy.get("cleanPodPolicy", "None")
    assert job.run_policy.backoff_limit == tf_run_policy.get("backoffLimit", MAX_INT32)
    scheduling = tf_run_policy.get("schedulingPolicy")
    if scheduling:
        assert out["spec"]["runPolicy"]["schedulingPolicy"] == {
            k: v
            for k, v in scheduling.items()
            if k not in ("minResources", "scheduleTimeoutSeconds")
        }

    tf_specs = {k.lower(): v for k, v in tf["spec"]["tfReplicaSpecs"].items()}
    assert sum(s.get("replicas", 1) for s in tf_specs.values()) == job.total_replicas
    for replica_type, spec in job.replica_specs.items():
        source = tf_specs.get(replica_type, tf_specs.get("worker"))
        assert spec.restart_policy == source.get("restartPolicy", "Never")
        assert spec.template.get("metadata") == source["template"].get("metadata")
        container = training_container(spec.template)
        written = _tensorflow(source)
        assert container["name"] == "tensorflow"
        for field in ("image", "command", "args", "env", "resources", "volumeMounts"):
            assert container.get(field) == written.get(field), (replica_type, field)
    yaml.safe_load(yaml.safe_dump(out))  # plain data


@pytest.mark.parametrize("name", [n for n, (s, _) in EXPECTED.items() if s is None])
def test_ps_job_with_one_worker_and_no_chief_is_refused_with_the_fix(name: str) -> None:
    with pytest.raises(ManifestError) as e:
        convert_tfjob(kubeflow_tfjobs.load(name, "team"))
    (problem,) = e.value.problems
    assert problem.startswith("spec.tfReplicaSpecs: a TFJob with PS replicas and no Chief")
    assert '{"PS": 1, "Worker": 1}' in problem and "Add a Chief" in problem


def test_ps_job_without_chief_makes_worker_0_the_chief() -> None:
    conversion = convert_tfjob(kubeflow_tfjobs.load("docs-tensorflow-ps-worker", "team"))
    specs = conversion.manifest["spec"]["replicaSpecs"]
    assert {t: s["replicas"] for t, s in specs.items()} == {"chief": 1, "worker": 2, "ps": 1}
    assert list(specs) == ["chief", "worker", "ps"]
    assert specs["chief"]["template"] == specs["worker"]["template"]
    assert "Worker 0 is now spec.replicaSpecs.chief" in conversion.notes[0]


def tf_replica(replicas: int = 1, port: int | None = None, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "tensorflow", "image": "tf:2", "command": ["python"]}
    if port is not None:
        container["ports"] = [{"name": "tfjob-port", "containerPort": port}]
    return {"replicas": replicas, "template": {"spec": {"containers": [container]}}, **extra}


def tfjob(spec: dict[str, Any] | None = None, **replicas: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist", "labels": {"team": "a"}, "annotations": {"x": "y"}},
        "spec": {"tfReplicaSpecs": replicas or {"Worker": tf_replica(2)}, **(spec or {})},
    }


def test_master_several_evaluators_ports_and_runpolicy_extras_are_each_named() -> None:
    tf = tfjob(
        {
            "enableDynamicWorker": True,
            "successPolicy": "AllWorkers",
            "runPolicy": {
                "cleanPodPolicy": "All",
                "backoffLimit": 3,
                "activeDeadlineSeconds": 600,
                "schedulingPolicy": {
                    "minAvailable": 3,
                    "queue": "q",
                    "minResources": {"cpu": "4"},
                    "scheduleTimeoutSeconds": 60,
                },
            },
        },
        MASTER=tf_replica(1, port=2223),
        worker=tf_replica(2, restartPolicy="OnFailure"),
        PS=tf_replica(1, port=2224),
        Evaluator=tf_replica(3),
    )
    conversion = convert_tfjob(tf)
    fields = [n.split(":")[0] for n in conversion.notes]
    assert fields == [
        "spec.tfReplicaSpecs.Evaluator.replicas",
        "spec.tfReplicaSpecs.Master",
        "spec.tfReplicaSpecs.Worker",
        "spec.tfReplicaSpecs.PS",
        "spec.tfReplicaSpecs.Evaluator",
        "spec.enableDynamicWorker",
        "spec.runPolicy.schedulingPolicy.minResources",
        "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds",
    ]
    assert "tfjob-port 2222 not carried" in conversion.notes[2]
    assert "all use 2223" in conversion.notes[2]
    job = load_manifest(conversion.manifest)
    assert job.strategy == "ParameterServerStrategy"
    assert {t: s.replicas for t, s in job.replica_specs.items()} == {
        "chief": 1,
        "worker": 2,
        "ps": 1,
        "evaluator": 1,
    }
    assert job.port == 2223
    assert job.replica_specs["worker"].restart_policy == "OnFailure"
    assert job.success_policy == "AllWorkers"
    rp = job.run_policy
    assert (rp.clean_pod_policy, rp.backoff_limit, rp.active_deadline_seconds) == ("All", 3, 600)
    scheduling = conversion.manifest["spec"]["runPolicy"]["schedulingPolicy"]
    assert scheduling == {"minAvailable": 3, "queue": "q"}
    assert (job.labels, job.annotations) == ({"team": "a"}, {"x": "y"})


def test_tensorflow_container_is_moved_first_to_stay_the_training_container() -> None:
    replica = tf_replica(2)
    sidecar = {"name": "proxy", "image": "envoy"}
    replica["template"]["spec"]["containers"].insert(0, sidecar)
    out = convert_tfjob(tfjob(Worker=replica)).manifest
    containers = out["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["tensorflow", "proxy"]
    assert training_container(load_manifest(out).replica_specs["worker"].template) is not None


def test_a_strategyjob_container_beside_tensorflow_is_refused() -> None:
    replica = tf_replica(2)
    replica["template"]["spec"]["containers"].append({"name": "strategyjob", "image": "x"})
    for read in (convert_tfjob, local_tfjob):
        with pytest.raises(ManifestError) as e:
            read(tfjob(Worker=replica))
        assert e.value.problems == [
            "spec.tfReplicaSpecs.Worker.template.spec.containers: a container named "
            "strategyjob beside the tensorflow one would run as the training container "
            'outside a TFJob (got ["tensorflow", "strategyjob"]). Rename it.'
        ]


@pytest.mark.parametrize(
    ("strategy", "accepted"),
    [
        ("MultiWorkerMirroredStrategy", True),
        ("MirroredStrategy", True),
        ("OneDeviceStrategy", True),
        ("ParameterServerStrategy", False),
    ],
)
def test_strategy_flag_overrides_or_is_refused_in_one_line(strategy: str, accepted: bool) -> None:
    tf = tfjob(Worker=tf_replica(1))
    if accepted:
        assert convert_tfjob(tf, strategy).manifest["spec"]["strategy"] == strategy
        return
    with pytest.raises(ManifestError) as e:
        convert_tfjob(tf, strategy)
    (problem,) = e.value.problems
    assert problem.startswith(
        'spec.tfReplicaSpecs: the TFJob\'s replicas ({"Worker": 1}) do not fit '
        "ParameterServerStrategy (--strategy): "
    )
    assert "\n" not in problem


def test_cli_prints_yaml_and_one_stderr_line_per_field(tmp_path, capsys) -> None:
    source = tmp_path / "tf.yaml"
    source.write_text(
        yaml.safe_dump(tfjob({"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}}))
    )
    assert cli.main(["convert", str(source)]) == 0
    captured = capsys.readouterr()
    job = load_manifest(yaml.safe_load(captured.out))
    assert job.run_policy.clean_pod_policy == "None"
    assert captured.err.splitlines() == [
        "strategyjob convert: spec.runPolicy.managedBy: kueue.x-k8s.io/multikueue not "
        "carried: a StrategyJob has no managedBy; the StrategyJob operator of the cluster it "
        "is created in runs it."
    ]
    target = tmp_path / "sj.yaml"
    assert (
        cli.main(["convert", str(source), "--strategy", "MirroredStrategy", "-o", str(target)]) == 2
    )
    assert "do not fit MirroredStrategy (--strategy)" in capsys.readouterr().err
    assert not target.exists()
    assert cli.main(["convert", str(source), "-o", str(target)]) == 0
    assert capsys.readouterr().out == ""
    assert yaml.safe_load(target.read_text()) == yaml.safe_load(captured.out)


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (
            {"apiVersion": "strategyjob.dev/v1alpha1", "kind": "StrategyJob"},
            "strategyjob convert reads a Kubeflow TFJob, not this (got "
            '{"apiVersion": "strategyjob.dev/v1alpha1", "kind": "StrategyJob"})',
        ),
        (
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJob",
                "metadata": {"name": "a"},
                "spec": {"tfReplicaSpecs": {"Boss": tf_replica()}},
            },
            "spec.tfReplicaSpecs.Boss: unknown replica type",
        ),
    ],
)
def test_cli_bad_input_exits_2_naming_the_problem(tmp_path, capsys, document, error) -> None:
    source = tmp_path / "bad.yaml"
    source.write_text(yaml.safe_dump(document))
    assert cli.main(["convert", str(source)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"strategyjob convert: error: {source}: " in captured.err
    assert error in captured.err


def test_the_migration_guides_worked_example_is_what_convert_prints() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs"
    guide = (docs / "kubernetes" / "migrating-from-tfjob.md").read_text()
    tfjob_doc, strategyjob_doc = (
        yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", guide, re.S)
    )
    assert convert_tfjob(tfjob_doc).manifest == strategyjob_doc
