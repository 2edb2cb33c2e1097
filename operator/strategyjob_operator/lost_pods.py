"""Pods whose node is lost: a pod in phase Unknown fails its replica after the lost-pod
timeout, and a deleted pod still terminating that long past its grace period, on a node that is
gone or NotReady, is force-deleted, so that a restart never waits for a kubelet that is gone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from strategyjob_operator import constants as c
from strategyjob_operator.observe import NODE_GONE, NODE_NOT_READY, Replica
from strategyjob_operator.plan import Event, parse_time, seconds_since

#: Seconds a pod may stay in phase Unknown (its node unreachable) before its replica counts
#: as failed, and a deleted pod may stay terminating past its grace period on a node that is
#: gone or NotReady before it is force-deleted (``STRATEGYJOB_LOST_POD_SECONDS``). Kubernetes
#: itself waits 300 s (the default unreachable toleration) and then only deletes the pod,
#: which stays terminating as long as its node does not come back.
DEFAULT_LOST_POD_SECONDS = 60.0


def lost_seconds_left(r: Replica, now: datetime, lost_after: float) -> float | None:
    """For a pod in phase Unknown: seconds left before its replica counts as failed (<= 0:
    it does now); None for any other pod."""
    if r.phase != "Unknown" or r.terminating:
        return None
    return lost_after - seconds_since(r.unknown_since, now)


def describe_lost(r: Replica, now: datetime, lost_after: float) -> str:
    node = f"node {r.node_name}" if r.node_name else "its node"
    return (
        f"was lost: its pod {r.name} has been in phase Unknown ({node} unreachable) for "
        f"{seconds_since(r.unknown_since, now):.0f}s, past the operator's lost-pod timeout of "
        f"{lost_after:g}s"
    )


def overdue_terminating(
    replicas: Mapping[tuple[str, int], Replica], now: datetime, lost_after: float
) -> tuple[list[Replica], float | None]:
    """Deleted pods on a node that are still there ``lost_after`` seconds after their grace
    period ended (``deletionTimestamp``), and not force-deleted yet: whether to force-delete
    them depends on their node (:func:`force_deletions`). Also the seconds until the next
    terminating pod gets there (None: none will)."""
    due: list[Replica] = []
    wait: float | None = None
    for r in replicas.values():
        if not r.terminating or not r.node_name or r.deletion_grace_seconds == 0:
            continue  # not deleted; never scheduled (gone at once); force-deleted already
        if (end := parse_time(r.deletion_timestamp)) is None:
            continue
        left = lost_after - (now - end).total_seconds()
        if left <= 0:
            due.append(r)
        else:
            wait = left if wait is None else min(wait, left)
    return sorted(due, key=lambda r: r.name), wait


def force_deletions(
    namespace: str,
    overdue: Iterable[Replica],
    nodes: Mapping[str, str],
    now: datetime,
) -> list[tuple[Replica, Event]]:
    """The overdue terminating pods to force-delete (``gracePeriodSeconds=0``), each with the
    Warning Event that says so: those whose node is gone or NotReady (``nodes``: node name to
    :func:`observe.node_state`), whose end no kubelet will ever confirm, as Kubernetes' pod
    garbage collector does for pods of deleted or out-of-service nodes. A pod on a Ready node
    is left alone (its kubelet is slow, not gone), and so is one whose node could not be
    read."""
    out: list[tuple[Replica, Event]] = []
    for r in overdue:
        state = nodes.get(r.node_name or "")
        if state not in (NODE_GONE, NODE_NOT_READY):
            continue
        how = "is gone (no Node object)" if state == NODE_GONE else "is NotReady"
        msg = (
            f"Pod {namespace}/{r.name} ({r.label}) was still terminating "
            f"{seconds_since(r.deletion_timestamp, now):.0f}s after its grace period ended, on "
            f"node {r.node_name}, which {how}: no kubelet will confirm that it stopped. "
            "Force-deleted it (gracePeriodSeconds=0) so that its replacement can be created."
        )
        out.append((r, Event("Warning", c.REASON_POD_FORCE_DELETED, msg)))
    return out
