"""A TFJob's TF_CONFIG, byte for byte as training-operator v1.9.4 writes it, from the one
environment function."""

from __future__ import annotations

import json
from typing import Any

from strategyjob.jobspec import (
    TFJob,
    load_tfjob,
    tfjob_cluster_spec,
    tfjob_replica_env,
    tfjob_replica_env_by_reference,
    tfjob_tf_config,
)


def tf_replica(replicas: int = 1, port: int | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "sidecar", "image": "busybox"}
    tensorflow: dict[str, Any] = {"name": "tensorflow", "image": "tf:2"}
    if port is not None:
        tensorflow["ports"] = [{"name": "tfjob-port", "containerPort": port}]
    return {"replicas": replicas, "template": {"spec": {"containers": [container, tensorflow]}}}


def load(dynamic: bool = False, **specs: dict[str, Any]) -> TFJob:
    spec: dict[str, Any] = {"tfReplicaSpecs": specs}
    if dynamic:
        spec["enableDynamicWorker"] = True
    return load_tfjob(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "job", "namespace": "ns"},
            "spec": spec,
        }
    )


def test_dense_tf_config_lists_every_type_sorted_with_environment_cloud() -> None:
    tf = load(
        Master=tf_replica(), PS=tf_replica(2, 2223), worker=tf_replica(2), Evaluator=tf_replica()
    )
    assert tfjob_tf_config(tf, "ps", 1) == (
        '{"cluster":{"evaluator":["job-evaluator-0.ns.svc:2222"],'
        '"master":["job-master-0.ns.svc:2222"],'
        '"ps":["job-ps-0.ns.svc:2223","job-ps-1.ns.svc:2223"],'
        '"worker":["job-worker-0.ns.svc:2222","job-worker-1.ns.svc:2222"]},'
        '"task":{"type":"ps","index":1},"environment":"cloud"}'
    )
    assert tfjob_tf_config(tf, "chief", 0).endswith(
        '"task":{"type":"master","index":0},"environment":"cloud"}'
    )


def test_the_operators_cluster_domain_ends_every_address() -> None:
    """training-operator's ``CUSTOM_CLUSTER_DOMAIN``: ``<pod>.<namespace>.svc.<domain>``, in
    the dense and the sparse ``TF_CONFIG`` and in the rendezvous address alike."""
    spec = {"Chief": tf_replica(), "Worker": tf_replica(2, 2223)}
    obj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {"tfReplicaSpecs": spec},
    }
    tf = load_tfjob(obj, cluster_domain="corp.example")
    assert json.loads(tfjob_tf_config(tf, "worker", 1) or "")["cluster"] == {
        "chief": ["job-chief-0.ns.svc.corp.example:2222"],
        "worker": [
            "job-worker-0.ns.svc.corp.example:2223",
            "job-worker-1.ns.svc.corp.example:2223",
        ],
    }
    assert tfjob_replica_env(tf, "worker", 1)["MASTER_ADDR"] == "job-chief-0.ns.svc.corp.example"
    sparse = load_tfjob(
        {**obj, "spec": {**obj["spec"], "enableDynamicWorker": True}}, cluster_domain="corp.example"
    )
    assert '"1":"job-worker-1.ns.svc.corp.example:2223"' in (
        tfjob_tf_config(sparse, "worker", 1) or ""
    )
    # without one, the addresses end with .svc (the pods' DNS search list completes them)
    assert "job-chief-0.ns.svc:2222" in (tfjob_tf_config(load_tfjob(obj), "worker", 1) or "")


def test_one_replica_job_gets_no_tf_config_but_the_sdk_variables() -> None:
    tf = load(Worker=tf_replica())
    assert tfjob_tf_config(tf, "worker", 0) is None
    env = tfjob_replica_env(tf, "worker", 0)
    assert "TF_CONFIG" not in env
    assert env["MASTER_ADDR"] == "job-worker-0.ns.svc" and env["RANK"] == "0"


def test_sdk_variables_beside_tf_config_leave_it_unchanged() -> None:
    tf = load(Chief=tf_replica(), Worker=tf_replica(2))
    env = tfjob_replica_env(tf, "worker", 1, restart_attempt=2)
    assert env["TF_CONFIG"] == tfjob_tf_config(tf, "worker", 1)
    assert env["MASTER_ADDR"] == "job-chief-0.ns.svc" and env["MASTER_PORT"] == "2222"
    assert (env["RANK"], env["WORLD_SIZE"]) == ("2", "3")
    assert env["STRATEGYJOB_POD_NAME"] == "job-worker-1"
    assert env["STRATEGYJOB_RESTART_ATTEMPT"] == "2"


def expand(entries: list[dict[str, Any]], config_map: dict[str, str]) -> dict[str, str]:
    """What the kubelet gives the container: $(VAR) of earlier entries expanded, $$ -> $."""
    env: dict[str, str] = {}
    for entry in entries:
        if "valueFrom" in entry:
            env[entry["name"]] = config_map[entry["valueFrom"]["configMapKeyRef"]["key"]]
            continue
        value = entry["value"]
        for name, known in env.items():
            value = value.replace(f"$({name})", known)
        env[entry["name"]] = value.replace("$$", "$")
    return env


def test_by_reference_env_expands_to_the_exact_tf_config() -> None:
    tf = load(Master=tf_replica(), PS=tf_replica(2), Worker=tf_replica(3), Evaluator=tf_replica())
    config_map = {"cluster": tfjob_cluster_spec(tf)}
    for replica_type, index in tf.job.replicas():
        entries = tfjob_replica_env_by_reference(tf, replica_type, index, config_map="cm")
        assert entries[0]["valueFrom"]["configMapKeyRef"] == {"name": "cm", "key": "cluster"}
        env = expand(entries, config_map)
        assert env == {
            "STRATEGYJOB_CLUSTER_SPEC": config_map["cluster"],
            **tfjob_replica_env(tf, replica_type, index),
        }
        assert len(entries[1]["value"]) < 120  # the pod spec holds no cluster


def test_dynamic_worker_sparse_form() -> None:
    tf = load(
        True, Chief=tf_replica(), PS=tf_replica(2), Worker=tf_replica(2), Evaluator=tf_replica()
    )
    assert tfjob_tf_config(tf, "worker", 1) == (
        '{"cluster":{"worker":{"1":"job-worker-1.ns.svc:2222"},'
        '"ps":["job-ps-0.ns.svc:2222","job-ps-1.ns.svc:2222"]},'
        '"task":{"type":"worker","index":1}}'
    )
    assert tfjob_tf_config(tf, "ps", 0) == (
        '{"cluster":{"worker":{},"ps":["job-ps-0.ns.svc:2222"]},"task":{"type":"ps","index":0}}'
    )
    assert tfjob_tf_config(tf, "evaluator", 0) == (
        '{"cluster":{"worker":{},"ps":[]},"task":{"type":"evaluator","index":0}}'
    )
    # the chief sees the whole cluster (training-operator's bug #1763 gives it none)
    chief = json.loads(tfjob_tf_config(tf, "chief", 0) or "")
    assert chief == {
        "cluster": json.loads(tfjob_cluster_spec(tf)),
        "task": {"type": "chief", "index": 0},
    }
    entries = tfjob_replica_env_by_reference(tf, "worker", 1, config_map="cm")
    assert {"name": "TF_CONFIG", "value": tfjob_tf_config(tf, "worker", 1)} in entries
    assert all("valueFrom" not in e for e in entries)


def test_dynamic_worker_without_ps_writes_null_as_go_does() -> None:
    tf = load(True, Worker=tf_replica(2))
    assert tfjob_tf_config(tf, "worker", 0) == (
        '{"cluster":{"worker":{"0":"job-worker-0.ns.svc:2222"},"ps":null},'
        '"task":{"type":"worker","index":0}}'
    )
