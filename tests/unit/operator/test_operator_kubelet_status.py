"""Pod status as a real kubelet writes it (seen on a kind cluster, tests/integration/
test_kind_operator.py): a pod's containers are written terminated a few seconds before its
phase leaves Running. A pod whose every container has ended is over, so cleanPodPolicy
Running keeps it (and its logs) when the job finishes; a sidecar still running is not. Pure."""

from __future__ import annotations

from typing import Any

from strategyjob_operator.decide import Action, decide
from strategyjob_operator.observe import observe

from tests.support import manifests
from tests.support.pods import NOW, STARTED, launched, pod, terminated

TRAIN = {"name": "strategyjob", "image": "train"}
SIDECAR = {"name": "log-shipper", "image": "fluent-bit"}
RUNNING = {"running": {"startedAt": STARTED}}


def kubelet_pod(i: int, states: dict[str, Any], containers: list[dict[str, Any]]) -> dict:
    """Worker ``i``'s pod still in phase Running, with its spec's containers (as the API
    server returns every pod)."""
    p = pod("worker", i, "Running", states)
    p["spec"]["containers"] = containers
    return p


def test_a_pod_whose_only_container_ended_is_finished_while_its_phase_is_still_running():
    j = manifests.job({"worker": 1}, containers=[TRAIN])
    r = observe(j, [kubelet_pod(0, {"strategyjob": terminated(0)}, [TRAIN])])[("worker", 0)]
    assert (r.phase, r.pod_finished) == ("Succeeded", True)
    failed = observe(j, [kubelet_pod(0, {"strategyjob": terminated(137)}, [TRAIN])])
    assert (failed[("worker", 0)].phase, failed[("worker", 0)].pod_finished) == ("Failed", True)


def test_cleanpodpolicy_running_keeps_the_finished_pod_and_stops_the_running_one():
    j = manifests.job({"worker": 2}, containers=[TRAIN])
    replicas = observe(
        j,
        [
            kubelet_pod(0, {"strategyjob": terminated(0)}, [TRAIN]),
            kubelet_pod(1, {"strategyjob": RUNNING}, [TRAIN]),
        ],
    )
    plan = decide(j, 1, launched(), replicas, NOW)
    assert plan.action is Action.SUCCEED
    assert plan.delete_pods == ("j-worker-1",)


def test_a_sidecar_still_running_keeps_the_pod_running_and_it_is_cleaned_up():
    both = [TRAIN, SIDECAR]
    j = manifests.job({"worker": 1}, containers=both)
    states = {"strategyjob": terminated(0), "log-shipper": RUNNING}
    replicas = observe(j, [kubelet_pod(0, states, both)])
    assert replicas[("worker", 0)].pod_finished is False
    plan = decide(j, 1, launched(), replicas, NOW)
    assert (plan.action, plan.delete_pods) == (Action.SUCCEED, ("j-worker-0",))
