"""The API server rejects topologies that cannot work; the operator survives being
killed in the middle of creating a large job; two replicas never both act."""

from __future__ import annotations

import json
import time

import pytest
from conftest import OperatorProcess, manifest, wait_for
from kubernetes.client.exceptions import ApiException

INVALID = [
    pytest.param("MultiWorkerMirroredStrategy", {"worker": 2, "ps": 1}, "spec.replicaSpecs.ps: MultiWorkerMirroredStrategy takes no ps replicas", id="mwms-ps"),
    pytest.param("ParameterServerStrategy", {"worker": 2, "ps": 1}, "spec.replicaSpecs.chief: ParameterServerStrategy needs one chief", id="pss-no-chief"),
    pytest.param("ParameterServerStrategy", {"chief": 1, "ps": 1}, "spec.replicaSpecs.worker: ParameterServerStrategy needs at least one worker", id="pss-no-worker"),
    pytest.param("ParameterServerStrategy", {"chief": 1, "worker": 1}, "spec.replicaSpecs.ps: ParameterServerStrategy needs at least one ps replica", id="pss-no-ps"),
    pytest.param("MirroredStrategy", {"worker": 2}, "spec.replicaSpecs: MirroredStrategy runs in one process", id="mirrored-2"),
    pytest.param("OneDeviceStrategy", {"chief": 1, "worker": 1}, "spec.replicaSpecs: OneDeviceStrategy runs in one process", id="onedevice-2"),
    pytest.param("TPUStrategy", {"chief": 1, "worker": 1}, "spec.replicaSpecs.chief: TPUStrategy takes worker replicas only", id="tpu-chief"),
    pytest.param("MultiWorkerMirroredStrategy", {"chief": 2, "worker": 1}, "there must be at most one chief", id="two-chiefs"),
    pytest.param("MultiWorkerMirroredStrategy", {"worker": 1, "evaluator": 2}, "there must be at most one evaluator", id="two-evaluators"),
    pytest.param("MultiWorkerMirroredStrategy", {"evaluator": 1}, "needs at least one chief or worker replica", id="no-trainer"),
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
    kube.create_job(manifest("n" * 53, "MultiWorkerMirroredStrategy", {"worker": 100}, run_policy={"suspend": True}))


@pytest.mark.timeout(60)
def test_topology_is_immutable(kube):
    kube.create_job(manifest("imm", "MultiWorkerMirroredStrategy", {"worker": 2}, run_policy={"suspend": True}))
    with pytest.raises(ApiException) as err:
        kube.patch_job("imm", {"spec": {"strategy": "ParameterServerStrategy"}})
    assert "spec.strategy cannot be changed after the job is created" in err.value.body
    with pytest.raises(ApiException) as err:
        kube.patch_job("imm", {"spec": {"replicaSpecs": {"worker": {"replicas": 3}}}})
    assert "replicas cannot be changed after the job is created" in err.value.body


@pytest.mark.timeout(240)
def test_operator_killed_while_creating_a_large_job_finishes_it_without_duplicates(kube, control_plane):
    op = OperatorProcess(control_plane).start()
    try:
        kube.create_job(manifest("big", "MultiWorkerMirroredStrategy", {"worker": 300}))
        wait_for("some pods", lambda: len(kube.pods("big")) >= 20, timeout=60, interval=0.05)
        op.kill()
        partial = len(kube.pods("big"))
        assert partial < 300, "the operator finished before it was killed; kill it earlier"
        assert not (kube.job("big").get("status") or {}).get("launched")
        op = OperatorProcess(control_plane).start()
        pods = kube.wait_pods("big", 300, timeout=120)
        names = sorted(pods)
        assert names == sorted(f"big-worker-{i}" for i in range(300))
        wait_for("launched", lambda: (kube.job("big").get("status") or {}).get("launched"), timeout=60)
        assert kube.job("big")["status"]["restartCount"] == 0  # missing pods before launch are no failures
    finally:
        op.stop()


@pytest.mark.timeout(120)
def test_peering_lets_only_the_highest_priority_replica_act(kube, control_plane):
    control_plane.kubectl(
        "apply", "-f", "-",
        input="apiVersion: kopf.dev/v1\nkind: ClusterKopfPeering\nmetadata:\n  name: sjob-peering-test\n",
    )
    high = OperatorProcess(control_plane, "--peering=sjob-peering-test", "--priority=10").start()
    wait_for("high starts", lambda: "Activity 'login' succeeded" in high.output(), timeout=60)
    low = OperatorProcess(control_plane, "--peering=sjob-peering-test", "--priority=1").start()
    try:
        wait_for("low pauses", lambda: "Pausing operations" in low.output(), timeout=30)
        kube.create_job(manifest("peer", "MultiWorkerMirroredStrategy", {"worker": 3}))
        kube.wait_pods("peer", 3)
        time.sleep(1)  # give a misbehaving low-priority replica time to act; it must not
        assert f"StrategyJob {kube.ns}/peer:" not in low.output()
        assert "StrategyJob " + kube.ns + "/peer: create" in high.output()
    finally:
        high.stop()
        low.stop()
