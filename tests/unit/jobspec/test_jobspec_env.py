"""replica_env and friends: the environment every replica gets, in TF's exact format."""

from __future__ import annotations

import json

import pytest
from strategyjob.jobspec import (
    ManifestError,
    cluster_for_kubernetes,
    leader,
    load_manifest,
    replica_env,
    success_replicas,
    to_manifest,
    training_container,
)


@pytest.fixture
def ps_job(make_manifest):
    counts = {"chief": 1, "ps": 2, "worker": 2, "evaluator": 1}
    obj = make_manifest("ParameterServerStrategy", name="mnist", namespace="ml", **counts)
    return load_manifest(obj)


def test_cluster_for_kubernetes_uses_pod_dns_names(ps_job):
    assert cluster_for_kubernetes(ps_job) == {
        "chief": ["mnist-chief-0.mnist.ml.svc:2222"],
        "worker": ["mnist-worker-0.mnist.ml.svc:2222", "mnist-worker-1.mnist.ml.svc:2222"],
        "ps": ["mnist-ps-0.mnist.ml.svc:2222", "mnist-ps-1.mnist.ml.svc:2222"],
        "evaluator": ["mnist-evaluator-0.mnist.ml.svc:2222"],
    }


def test_cluster_for_kubernetes_uses_the_job_port(make_manifest):
    obj = make_manifest(worker=1)
    obj["spec"]["port"] = 4000
    assert cluster_for_kubernetes(load_manifest(obj)) == {
        "worker": ["mnist-worker-0.mnist.default.svc:4000"]
    }


def test_tf_config_is_exact_json_without_the_evaluator(ps_job):
    env = replica_env(ps_job, "worker", 1, cluster_for_kubernetes(ps_job))
    assert env["TF_CONFIG"] == (
        '{"cluster":{"chief":["mnist-chief-0.mnist.ml.svc:2222"],'
        '"ps":["mnist-ps-0.mnist.ml.svc:2222","mnist-ps-1.mnist.ml.svc:2222"],'
        '"worker":["mnist-worker-0.mnist.ml.svc:2222","mnist-worker-1.mnist.ml.svc:2222"]},'
        '"task":{"index":1,"type":"worker"}}'
    )


def test_evaluator_gets_training_cluster_and_its_own_task(ps_job):
    cluster = cluster_for_kubernetes(ps_job)
    env = replica_env(ps_job, "evaluator", 0, cluster)
    config = json.loads(env["TF_CONFIG"])
    assert config["task"] == {"type": "evaluator", "index": 0}
    assert sorted(config["cluster"]) == ["chief", "ps", "worker"]
    assert "environment" not in config
    assert "RANK" not in env and "WORLD_SIZE" not in env


@pytest.mark.parametrize(
    ("replica_type", "index", "rank"),
    [("chief", 0, "0"), ("worker", 0, "1"), ("worker", 1, "2"), ("ps", 0, None), ("ps", 1, None)],
)
def test_env_of_each_replica_type(ps_job, replica_type, index, rank):
    env = replica_env(ps_job, replica_type, index, cluster_for_kubernetes(ps_job))
    expected = {
        "MASTER_ADDR": "mnist-chief-0.mnist.ml.svc",
        "MASTER_PORT": "2222",
        "STRATEGYJOB_JOB_NAME": "mnist",
        "STRATEGYJOB_NAMESPACE": "ml",
        "STRATEGYJOB_STRATEGY": "ParameterServerStrategy",
        "STRATEGYJOB_REPLICA_TYPE": replica_type,
        "STRATEGYJOB_REPLICA_INDEX": str(index),
        "STRATEGYJOB_POD_NAME": f"mnist-{replica_type}-{index}",
        "STRATEGYJOB_RESTART_ATTEMPT": "0",
    }
    if rank is not None:
        expected.update(RANK=rank, WORLD_SIZE="3")
    env.pop("TF_CONFIG")
    assert env == expected


def test_the_restart_attempt_tells_runs_apart(ps_job):
    cluster = cluster_for_kubernetes(ps_job)
    attempts = [
        replica_env(ps_job, "worker", 0, cluster, n)["STRATEGYJOB_RESTART_ATTEMPT"]
        for n in range(3)
    ]
    assert attempts == ["0", "1", "2"]


def test_the_rendezvous_timeout_reaches_chief_and_workers_only(make_manifest):
    # runPolicy.rendezvousTimeoutSeconds is the replicas' STRATEGYJOB_RENDEZVOUS_TIMEOUT (the
    # one env function serves the operator and strategyjob run); unset, none is injected, so
    # a value the template sets stays in force.
    obj = make_manifest("ParameterServerStrategy", chief=1, worker=1, ps=1)
    unset = load_manifest(obj)
    cluster = cluster_for_kubernetes(unset)
    assert "STRATEGYJOB_RENDEZVOUS_TIMEOUT" not in replica_env(unset, "worker", 0, cluster)
    obj["spec"]["runPolicy"] = {"rendezvousTimeoutSeconds": 300}
    job = load_manifest(obj)
    timeouts = {
        t: replica_env(job, t, 0, cluster).get("STRATEGYJOB_RENDEZVOUS_TIMEOUT")
        for t in ("chief", "worker", "ps")
    }
    assert timeouts == {"chief": "300", "worker": "300", "ps": None}
    assert to_manifest(job)["spec"]["runPolicy"] == {"rendezvousTimeoutSeconds": 300}
    obj["spec"]["runPolicy"] = {"rendezvousTimeoutSeconds": 0}
    with pytest.raises(ManifestError) as e:
        load_manifest(obj)
    assert str(e.value) == (
        "spec.runPolicy.rendezvousTimeoutSeconds: must be at least 1 (got 0). Set it to 1 or more."
    )


def test_without_chief_worker_zero_leads_and_ranks_start_at_zero(make_manifest):
    job = load_manifest(make_manifest(worker=3))
    cluster = {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]}
    envs = [replica_env(job, "worker", i, cluster) for i in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", "5000")}
    assert json.loads(envs[2]["TF_CONFIG"]) == {
        "cluster": {"worker": cluster["worker"]},
        "task": {"type": "worker", "index": 2},
    }


def test_all_values_are_strings(ps_job):
    cluster = cluster_for_kubernetes(ps_job)
    for replica_type, index in ps_job.replicas():
        env = replica_env(ps_job, replica_type, index, cluster)
        assert all(isinstance(v, str) for v in env.values())


def test_unknown_replica_is_refused(ps_job):
    cluster = cluster_for_kubernetes(ps_job)
    with pytest.raises(ValueError, match="no replica worker-2"):
        replica_env(ps_job, "worker", 2, cluster)
    with pytest.raises(ValueError, match="no replica master-0"):
        replica_env(ps_job, "master", 0, cluster)


def test_cluster_missing_an_address_is_refused(ps_job):
    cluster = cluster_for_kubernetes(ps_job)
    cluster["worker"] = cluster["worker"][:1]
    with pytest.raises(ValueError, match="no address for worker-1"):
        replica_env(ps_job, "chief", 0, cluster)


def test_leader(make_manifest, ps_job):
    assert leader(ps_job) == ("chief", 0)
    assert leader(load_manifest(make_manifest(worker=2))) == ("worker", 0)


def test_success_replicas(make_manifest, ps_job):
    assert success_replicas(ps_job) == [("chief", 0)]
    assert success_replicas(load_manifest(make_manifest(worker=3))) == [("worker", 0)]
    obj = make_manifest(chief=1, worker=2, evaluator=1)
    obj["spec"]["successPolicy"] = "AllWorkers"
    assert success_replicas(load_manifest(obj)) == [("chief", 0), ("worker", 0), ("worker", 1)]


def test_training_container_prefers_the_named_one(make_container):
    side = make_container("sidecar")
    main = make_container("strategyjob")
    assert training_container({"spec": {"containers": [side, main]}}) is main
    assert training_container({"spec": {"containers": [side]}}) is side
    with pytest.raises(ValueError, match="no containers"):
        training_container({"spec": {}})
