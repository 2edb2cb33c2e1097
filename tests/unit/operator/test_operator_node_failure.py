"""Node failure, decided on plain data: a pod in phase Unknown fails its replica after the
lost-pod timeout (and is restarted per its restart policy), and a deleted pod still
terminating past its grace period plus that timeout is force-deleted only when its node is
gone or NotReady, never when the node is Ready (a slow kubelet)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from strategyjob_operator import constants as c
from strategyjob_operator.decide import (
    DEFAULT_LOST_POD_SECONDS,
    Action,
    decide,
    force_deletions,
    overdue_terminating,
)
from strategyjob_operator.observe import (
    NODE_GONE,
    NODE_NOT_READY,
    NODE_READY,
    node_state,
    observe,
    replica_from_pod,
    stamp_unknown,
)
from strategyjob_operator.settings import lost_pod_seconds

from tests.support.manifests import job
from tests.support.pods import NOW, launched, pod

LOST = 60.0


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- phase Unknown ----------------------------------------------------------------------------


def test_an_unknown_pod_counts_from_when_its_ready_condition_went_false() -> None:
    r = replica_from_pod(pod("worker", 1, "Unknown", not_ready_since=ts(10)), "t")
    assert r is not None and r.phase == "Unknown" and r.unknown_since == ts(10)
    assert r.node_name == "node-1"
    running = replica_from_pod(pod("worker", 1, not_ready_since=ts(10)), "t")
    assert running is not None and running.unknown_since is None  # only for phase Unknown


def test_an_unknown_pod_waits_for_the_timeout_then_restarts_the_job() -> None:
    j = job()
    early = observe(
        j, [pod("worker", 0), pod("worker", 1, "Unknown", not_ready_since=ts(LOST - 15))]
    )
    plan = decide(j, 1, launched(), early, NOW, lost_pod_seconds=LOST)
    assert plan.action is Action.NONE and not plan.delete_pods
    assert plan.requeue_after == pytest.approx(15)  # woken when the timeout ends

    late = observe(j, [pod("worker", 0), pod("worker", 1, "Unknown", not_ready_since=ts(LOST + 5))])
    plan = decide(j, 1, launched(), late, NOW, lost_pod_seconds=LOST)
    assert plan.action is Action.RESTART_JOB
    assert plan.delete_pods == ("j-worker-0", "j-worker-1")
    (event,) = [e for e in plan.events if e.reason == c.REASON_JOB_RESTARTING]
    assert "worker-1 was lost" in event.message and "phase Unknown" in event.message
    assert "node node-1" in event.message and "65s" in event.message
    assert plan.status["restartCount"] == 1


def test_an_unknown_pod_fails_the_job_under_restart_policy_never() -> None:
    j = job(policy="Never")
    replicas = observe(
        j, [pod("worker", 0), pod("worker", 1, "Unknown", not_ready_since=ts(LOST + 1))]
    )
    plan = decide(j, 1, launched(), replicas, NOW, lost_pod_seconds=LOST)
    assert plan.action is Action.FAIL
    assert "restartPolicy Never does not retry it" in plan.status["conditions"][-1]["message"]


def test_an_unknown_pod_without_a_time_counts_from_when_the_operator_first_saw_it() -> None:
    j = job()
    replicas = observe(j, [pod("worker", 0), pod("worker", 1, "Unknown")])
    stamped, seen = stamp_unknown(replicas, {}, ts(0))
    assert seen == {"uid-worker-1": ts(0)} and stamped[("worker", 1)].unknown_since == ts(0)
    plan = decide(j, 1, launched(), stamped, NOW, lost_pod_seconds=LOST)
    assert plan.action is Action.NONE and plan.requeue_after == pytest.approx(LOST)
    # A later pass keeps the first sighting, so the timeout ends.
    stamped, seen = stamp_unknown(replicas, seen, ts(-LOST - 1))
    assert stamped[("worker", 1)].unknown_since == ts(0)
    later = NOW + timedelta(seconds=LOST + 1)
    assert decide(j, 1, launched(), stamped, later, lost_pod_seconds=LOST).action is (
        Action.RESTART_JOB
    )
    # Back to Running: forgotten.
    _, seen = stamp_unknown(observe(j, [pod("worker", 0), pod("worker", 1)]), seen, ts(0))
    assert seen == {}


# --- pods stuck terminating -------------------------------------------------------------------


def test_only_pods_past_grace_plus_timeout_and_not_yet_forced_are_overdue() -> None:
    j = job({"worker": 4})
    replicas = observe(
        j,
        [
            pod("worker", 0, deleted=ts(LOST + 1)),  # grace ended 61 s ago: overdue
            pod("worker", 1, deleted=ts(LOST - 20)),  # 20 s to go
            # force-deleted already (a finalizer keeps it)
            pod("worker", 2, deleted=ts(LOST + 100), grace=0),
            pod("worker", 3, deleted=ts(LOST + 100), node=None),  # never scheduled
        ],
    )
    overdue, wait = overdue_terminating(replicas, NOW, LOST)
    assert [r.name for r in overdue] == ["j-worker-0"]
    assert wait == pytest.approx(20)
    assert overdue_terminating(observe(j, [pod("worker", 0), pod("worker", 1)]), NOW, LOST) == (
        [],
        None,
    )


def test_node_state_reads_the_ready_condition() -> None:
    def node(status: str) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": "Ready", "status": status}]}}

    assert node_state(None) == NODE_GONE
    assert node_state(node("True")) == NODE_READY
    assert node_state(node("False")) == NODE_NOT_READY
    assert node_state(node("Unknown")) == NODE_NOT_READY
    assert node_state({"status": {}}) == NODE_NOT_READY


def test_force_deletion_only_on_a_gone_or_not_ready_node_with_one_event_each() -> None:
    j = job({"worker": 4})
    pods = [
        pod("worker", 0, deleted=ts(LOST + 5), node="gone"),
        pod("worker", 1, deleted=ts(LOST + 5), node="sick"),
        pod("worker", 2, deleted=ts(LOST + 5), node="fine"),
        pod("worker", 3, deleted=ts(LOST + 5), node="unreadable"),
    ]
    overdue, _ = overdue_terminating(observe(j, pods), NOW, LOST)
    nodes = {"gone": NODE_GONE, "sick": NODE_NOT_READY, "fine": NODE_READY}
    doomed = force_deletions("ns", overdue, nodes, NOW)
    assert [r.name for r, _ in doomed] == ["j-worker-0", "j-worker-1"]
    (_, gone), (_, sick) = doomed
    assert gone.type == "Warning" and gone.reason == c.REASON_POD_FORCE_DELETED
    assert "Pod ns/j-worker-0 (worker-0)" in gone.message
    assert "node gone, which is gone (no Node object)" in gone.message
    assert "gracePeriodSeconds=0" in gone.message and "65s" in gone.message
    assert "node sick, which is NotReady" in sick.message


def test_a_job_waits_for_terminating_pods_before_recreating_them() -> None:
    """The wedge this fixes: a restart deleted the pods, one stays terminating on a dead
    node, so no new pod may be created until it is force-deleted."""
    j = job()
    status = {**launched(), "launched": False}
    replicas = observe(j, [pod("worker", 1, deleted=ts(LOST + 5), node="gone")])
    plan = decide(j, 1, status, replicas, NOW, lost_pod_seconds=LOST)
    assert plan.action is Action.NONE and not plan.create
    assert force_deletions("ns", overdue_terminating(replicas, NOW, LOST)[0], {}, NOW) == []


def test_the_setting_is_a_positive_number_of_seconds() -> None:
    assert DEFAULT_LOST_POD_SECONDS == 60
    assert lost_pod_seconds("2.5") == 2.5
    for bad in ("0", "-1", "1m", "inf", "nan"):
        with pytest.raises(ValueError, match=r"STRATEGYJOB_LOST_POD_SECONDS=.* e\.g\. 60"):
            lost_pod_seconds(bad)
