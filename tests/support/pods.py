"""Pods as the API server returns them, and the job statuses a test starts a pass from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from strategyjob_operator import constants as c

#: The clock of pure-logic tests, and when their jobs started (an hour before).
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
STARTED = "2026-01-01T11:00:00Z"


def pod(
    t: str,
    i: int,
    phase: str = "Running",
    states: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    init: Mapping[str, Mapping[str, Any]] | None = None,
    conditions: Sequence[Mapping[str, Any]] | None = None,
    reason: str | None = None,
    node: str | None = "node-1",
    created: str = STARTED,
    uid: str | None = None,
    owner: str | None = None,
    deleted: str | None = None,
    grace: int = 30,
    not_ready_since: str | None = None,
    job_name: str = "j",
) -> dict[str, Any]:
    """Replica ``t``-``i``'s pod. ``states``: container name -> state; ``deleted``: its
    ``deletionTimestamp`` (``grace``: its grace period); ``not_ready_since``: when its Ready
    condition went False (a node that stopped answering); ``owner``: the controlling job's
    uid."""
    meta: dict[str, Any] = {
        "name": f"{job_name}-{t}-{i}",
        "uid": uid or f"uid-{t}-{i}",
        "creationTimestamp": created,
        "labels": {
            c.LABEL_JOB_NAME: job_name,
            c.LABEL_REPLICA_TYPE: t,
            c.LABEL_REPLICA_INDEX: str(i),
        },
    }
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "StrategyJob", "uid": owner, "controller": True}]
    if deleted is not None:
        meta["deletionTimestamp"] = deleted
        meta["deletionGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": phase}
    if states is not None:
        status["containerStatuses"] = [{"name": n, "state": s} for n, s in states.items()]
    if init is not None:
        status["initContainerStatuses"] = [{"name": n, "state": s} for n, s in init.items()]
    conds = [dict(x) for x in conditions or ()]
    if not_ready_since is not None:
        conds.append({"type": "Ready", "status": "False", "lastTransitionTime": not_ready_since})
    if conditions is not None or conds:
        status["conditions"] = conds
    if reason:
        status["reason"] = reason
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


def terminated(code: int, reason: str | None = None) -> dict[str, Any]:
    """A container state: exited with ``code`` a minute before :data:`NOW`."""
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "finishedAt": "2026-01-01T11:59:00Z",
        }
    }


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    """A container state: not started, for ``reason`` (e.g. ImagePullBackOff)."""
    return {"waiting": {"reason": reason, "message": message}}


def launched(**extra: Any) -> dict[str, Any]:
    """The status of a job whose pods were all created and one of which runs."""
    return {
        "launched": True,
        "startTime": STARTED,
        "conditions": [
            {"type": c.CREATED, "status": "True", "reason": c.REASON_CREATED},
            {"type": c.RUNNING, "status": "True", "reason": c.REASON_RUNNING},
        ],
        **extra,
    }
