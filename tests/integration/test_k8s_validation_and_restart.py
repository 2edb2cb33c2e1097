"""The API server rejects topologies that cannot work; the operator survives being
killed in the middle of creating a large job; two replicas never both act."""

from __future__ import annotations

import json

import pytest
from integration_harness import OperatorProcess, create_peering, manifest, wait_for
from kubernetes.client.exceptions import ApiException

INVALID = [
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"worker": 2, "ps": 1},
        "spec.replicaSpecs.ps: MultiWorkerMirroredStrategy takes no ps replicas",
        id="mwms-ps",
    ),
    pytest.param(
        "ParameterServerStrategy",
        {"worker": 2, "ps": 1},
        "spec.replicaSpecs.chief: ParameterServerStrategy needs one chief",
        id="pss-no-chief",
    ),
    pytest.param(
        "ParameterServerStrategy",
        {"chief": 1, "ps": 1},
        "spec.replicaSpecs.worker: ParameterServerStrategy needs at least one worker",
        id="pss-no-worker",
    ),
    pytest.param(
        "ParameterServerStrategy",
        {"chief": 1, "worker": 1},
        "spec.replicaSpecs.ps: ParameterServerStrategy needs at least one ps replica",
        id="pss-no-ps",
    ),
    pytest.param(
        "MirroredStrategy",
        {"worker": 2},
        "spec.replicaSpecs: MirroredStrategy runs in one process",
        id="mirrored-2",
    ),
    pytest.param(
        "OneDeviceStrategy",
        {"chief": 1, "worker": 1},
        "spec.replicaSpecs: OneDeviceStrategy runs in one process",
        id="onedevice-2",
    ),
    pytest.param(
        "TPUStrategy",
        {"chief": 1, "worker": 1},
        "spec.replicaSpecs.chief: TPUStrategy takes worker replicas only",
        id="tpu-chief",
    ),
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"chief": 2, "worker": 1},
        "there must be at most one chief",
        id="two-chiefs",
    ),
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"worker": 1, "evaluator": 2},
        "there must be at most one evaluator",
        id="two-evaluators",
    ),
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"evaluator": 1},
        "needs at least one chief or worker replica",
        id="no-trainer",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("strategy", "replicas", "message"), INVALID)
def test_api_server_rejects_invalid_topology(kube, strategy, replicas, message):
    with pytest.raises(ApiException) as err:
        kube.create_job(manifest("bad", strategy, replicas))
    assert err.value.status == 422
    assert message in err.value.body


@pytest.mark.timeout(60)
def test_api_server_rejects_names_too_long_for_pods(kube):
    name = "n" * 55
    with pytest.raises(ApiException) as err:
        kube.create_job(manifest(name, "MultiWorkerMirroredStrategy", {"worker": 100}))
    message = json.loads(err.value.body)["message"]
    assert f"metadata.name: too long, pod name {name}-worker-<index>" in message
    assert "Use a name of at most 53 characters." in message
    kube.create_job(
        manifest(
            "n" * 53, "MultiWorkerMirroredStrategy", {"worker": 100}, run_policy={"suspend": True}
        )
    )


@pytest.mark.timeout(60)
def test_topology_is_immutable(kube):
    kube.create_job(manifest("imm", "TPUStrategy", {"worker": 2}, run_policy={"suspend": True}))
    with pytest.raises(ApiException) as err:
        kube.patch_job("imm", {"spec": {"strategy": "ParameterServerStrategy"}})
    assert "spec.strategy cannot be changed after the job is created" in err.value.body
    # the worker count may change: a TPUStrategy job re-forms at the new size
    kube.patch_job("imm", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    assert kube.job("imm")["spec"]["replicaSpecs"]["worker"]["replicas"] == 3


@pytest.mark.timeout(240)
def test_operator_killed_while_creating_a_large_job_finishes_it_without_duplicates(
    own_kube, control_plane
):
    kube = own_kube
    # Large enough that the operator cannot finish before the test sees the first pods, even
    # when the test process is descheduled on a loaded host (300 was once created in full).
    workers = 1000
    op = OperatorProcess(control_plane, "--standalone", "-n", kube.ns).start()
    try:
        kube.create_job(manifest("big", "MultiWorkerMirroredStrategy", {"worker": workers}))
        wait_for("some pods", lambda: len(kube.pods("big")) >= 20, timeout=60, interval=0.05)
        op.kill()
        partial = len(kube.pods("big"))
        assert partial < workers, "the operator finished before it was killed; kill it earlier"
        assert not (kube.job("big").get("status") or {}).get("launched")
        op = OperatorProcess(control_plane, "--standalone", "-n", kube.ns).start()
        pods = kube.wait_pods("big", workers, timeout=120)
        assert sorted(pods) == sorted(f"big-worker-{i}" for i in range(workers))
        launched = lambda: (kube.job("big").get("status") or {}).get("launched")  # noqa: E731
        wait_for("launched", launched, timeout=60)
        # pods missing before the job was fully launched are created, not counted as failures
        assert kube.job("big")["status"]["restartCount"] == 0
        assert "StrategyJob " + kube.ns + "/big: create" in op.output()
    finally:
        op.stop()


@pytest.mark.timeout(120)
def test_peering_lets_only_the_highest_priority_replica_act(own_kube, control_plane):
    kube = own_kube
    create_peering(control_plane, kube.ns, "sjob-peering")
    args = ("-n", kube.ns, "--peering=sjob-peering")
    # the low one first: the high one's arrival is then a change the low one must react to
    low = OperatorProcess(control_plane, *args, "--priority=1").start()
    high = None
    try:
        wait_for("low starts", lambda: "Resuming operations" in low.output(), timeout=60)
        high = OperatorProcess(control_plane, *args, "--priority=10").start()
        wait_for("low pauses", lambda: "Pausing operations" in low.output(), timeout=60)
        kube.create_job(manifest("peer", "MultiWorkerMirroredStrategy", {"worker": 3}))
        kube.wait_pods("peer", 3)
        wait_for("high reports", lambda: f"StrategyJob {kube.ns}/peer: create" in high.output())
        assert f"StrategyJob {kube.ns}/peer:" not in low.output()
    finally:
        for op in (high, low):
            if op is not None:
                op.stop()
