"""The TFJob v1 reader: training-operator's defaults and rules, StrategyJob's model."""

from __future__ import annotations

from typing import Any

import pytest
from strategyjob.jobspec import (
    MAX_INT32,
    ManifestError,
    TFReplica,
    infer_strategy,
    load_tfjob,
)


def tf_replica(
    replicas: int = 1, *, port: int | None = None, name: str = "tensorflow", **extra: Any
):
    container: dict[str, Any] = {"name": name, "image": "tf:2", "command": ["python", "t.py"]}
    if port is not None:
        container["ports"] = [{"name": "tfjob-port", "containerPort": port}]
    return {"replicas": replicas, "template": {"spec": {"containers": [container]}}, **extra}


def tfjob(name: str = "mnist", run_policy: dict[str, Any] | None = None, **specs: Any):
    spec: dict[str, Any] = {"tfReplicaSpecs": specs or {"Worker": tf_replica(2)}}
    if run_policy is not None:
        spec["runPolicy"] = run_policy
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "team"},
        "spec": spec,
    }


def problems(manifest: Any) -> list[str]:
    with pytest.raises(ManifestError) as e:
        load_tfjob(manifest)
    return e.value.problems


@pytest.mark.parametrize(
    ("counts", "strategy"),
    [
        ({"ps": 2, "worker": 4}, "ParameterServerStrategy"),
        ({"chief": 1, "ps": 1, "worker": 2}, "ParameterServerStrategy"),
        ({"worker": 2}, "MultiWorkerMirroredStrategy"),
        ({"chief": 1, "worker": 1}, "MultiWorkerMirroredStrategy"),
        ({"worker": 1}, "MirroredStrategy"),
        ({"chief": 1, "evaluator": 1}, "MirroredStrategy"),
    ],
)
def test_strategy_is_inferred_from_the_replicas(counts: dict[str, int], strategy: str) -> None:
    assert infer_strategy(counts) == strategy


def test_keys_in_any_case_master_as_chief_and_tfjob_defaults() -> None:
    tf = load_tfjob(
        tfjob(
            Master=tf_replica(),
            WORKER=tf_replica(3, port=3000),
            ps=tf_replica(2),
            evaluator=tf_replica(2),
        )
    )
    job = tf.job
    assert job.strategy == "ParameterServerStrategy"
    assert [(t, job.num_replicas(t)) for t in job.replica_specs] == [
        ("chief", 1),
        ("worker", 3),
        ("ps", 2),
        ("evaluator", 2),
    ]
    assert tf.replicas == {
        "chief": TFReplica("Master", 2222),
        "worker": TFReplica("Worker", 3000),
        "ps": TFReplica("PS", 2222),
        "evaluator": TFReplica("Evaluator", 2222),
    }
    assert tf.pod_name("chief", 0) == "mnist-master-0"
    assert tf.address("worker", 2) == "mnist-worker-2.team.svc:3000"
    # TFJob's defaults: cleanPodPolicy None, no backoff limit, restartPolicy Never
    assert job.run_policy.clean_pod_policy == "None"
    assert job.run_policy.backoff_limit == MAX_INT32 and tf.backoff_limit is None
    assert job.replica_specs["worker"].restart_policy == "Never"
    # the defaulter's port, added to the tensorflow container when it has none
    ps_ports = job.replica_specs["ps"].template["spec"]["containers"][0]["ports"]
    assert ps_ports == [{"name": "tfjob-port", "containerPort": 2222}]
    assert tf.served and not tf.enable_dynamic_worker


def test_run_policy_fields_strategyjob_lacks_are_kept() -> None:
    tf = load_tfjob(
        tfjob(
            run_policy={
                "managedBy": "kueue.x-k8s.io/multikueue",
                "backoffLimit": 3,
                "cleanPodPolicy": "All",
                "schedulingPolicy": {
                    "minAvailable": 2,
                    "queue": "q",
                    "minResources": {"cpu": "4"},
                    "scheduleTimeoutSeconds": 90,
                },
            }
        )
    )
    assert tf.managed_by == "kueue.x-k8s.io/multikueue" and not tf.served
    assert tf.min_resources == {"cpu": "4"} and tf.schedule_timeout_seconds == 90
    assert tf.job.run_policy.backoff_limit == 3 and tf.backoff_limit == 3
    assert tf.job.run_policy.clean_pod_policy == "All"
    assert tf.job.run_policy.scheduling_policy.min_available == 2
    assert load_tfjob(tfjob(run_policy={"managedBy": "kubeflow.org/training-operator"})).served


def test_several_evaluators_and_ps_without_chief_are_accepted() -> None:
    tf = load_tfjob(tfjob(PS=tf_replica(1), Worker=tf_replica(2), Evaluator=tf_replica(3)))
    assert tf.job.num_replicas("evaluator") == 3


def test_bad_input_names_the_tfjob_field() -> None:
    found = problems(
        tfjob(
            Worker=tf_replica(2, name="main"),
            Chief=tf_replica(),
            Master=tf_replica(),
            Driver=tf_replica(),
        )
    )
    assert any(
        p.startswith(
            "spec.tfReplicaSpecs.Worker.template.spec.containers: there is no container "
            "named tensorflow"
        )
        for p in found
    ), found
    assert any(
        p.startswith("spec.tfReplicaSpecs: a TFJob may have at most one Chief or Master")
        for p in found
    ), found
    assert any(p.startswith("spec.tfReplicaSpecs.Driver: unknown replica type") for p in found), (
        found
    )


def test_loader_problems_are_renamed_to_tfjob_paths() -> None:
    found = problems(
        tfjob(worker=tf_replica("two"), PS={**tf_replica(), "restartPolicy": "Sometimes"})
    )
    assert any(
        p.startswith("spec.tfReplicaSpecs.worker.replicas: must be an integer") for p in found
    ), found
    assert any(
        p.startswith("spec.tfReplicaSpecs.PS.restartPolicy: unknown value") for p in found
    ), found
    assert not any("replicaSpecs." in p and "tfReplicaSpecs" not in p for p in found), found


@pytest.mark.parametrize(
    ("manifest", "start"),
    [
        (
            {**tfjob(), "apiVersion": "strategyjob.dev/v1alpha1"},
            "apiVersion: unsupported apiVersion for a TFJob",
        ),
        ({**tfjob(), "kind": "PyTorchJob"}, "kind: unsupported kind"),
        (
            {**tfjob(), "spec": {"tfReplicaSpecs": {}}},
            "spec.tfReplicaSpecs: the TFJob has no replicas",
        ),
        (tfjob(name="2mnist"), "metadata.name: must be lowercase letters"),
        (tfjob(PS=tf_replica()), "spec.tfReplicaSpecs: the TFJob has no Chief, Master or Worker"),
        (
            tfjob(worker=tf_replica(), Worker=tf_replica()),
            "spec.tfReplicaSpecs.Worker: the same replica type as worker",
        ),
        (tfjob(run_policy={"managedBy": "me"}), "spec.runPolicy.managedBy: unknown controller"),
        ("text", "manifest: a TFJob manifest must be a mapping"),
        (
            tfjob(name="m" * 55, Master=tf_replica()),
            "metadata.name: too long, pod name " + "m" * 55 + "-master-0",
        ),
    ],
)
def test_each_mistake_gets_one_clear_error(manifest: Any, start: str) -> None:
    found = problems(manifest)
    assert any(p.startswith(start) for p in found), found
