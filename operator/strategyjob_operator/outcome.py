"""What follows from a reconcile pass's I/O, as pure functions of the plan, what the I/O came
to and the time: the CreateFailed condition and the creation back-off, the ReplicaFailure
condition naming what blocks the job, the Resizing condition, the status patch, and when the
job's next pass is due. :mod:`.decide` decides before the I/O, this module after it, and
:mod:`.reconcile` only carries both out, so that every decision is unit-tested without an API
server (tests/unit/operator/test_operator_outcome.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator import gang, scaling
from strategyjob_operator.create_backoff import (
    CreateBackoff,
    after_create_failure,
    create_failed_message,
    released,
    with_create_failure,
)
from strategyjob_operator.flavor import Flavor, Loaded
from strategyjob_operator.observe import Replica
from strategyjob_operator.plan import Action, Event, Plan, timestamp

#: Seconds between passes while the pods of an earlier job of the same name are going.
STALE_RETRY_SECONDS = 1.0
#: Seconds between passes while an object the job does not control holds one of its names.
BLOCKED_RETRY_SECONDS = 10.0
#: The condition that says which object holds one of the job's names (Deployment's name for
#: a controller that cannot create what it needs), and the reason of it and of its Event.
REPLICA_FAILURE = "ReplicaFailure"
REASON_NOT_CONTROLLED = "ObjectNotControlled"
#: How many of the objects in a job's way its condition names.
BLOCKERS_NAMED = 5
#: CreateFailed's message once the pass created everything that was missing.
CREATED_MESSAGE = "Every object and pod of the job that was missing has been created."


@dataclass(frozen=True)
class CreateFailure:
    """What a pass could not create (the job's objects, a pod, pods held for quota) and why."""

    reason: str
    """The CreateFailed condition's reason (CreateFailed, SetupFailed, WaitingForQuota)."""
    what: str
    """What the message names, e.g. ``pod j-worker-0`` or ``the job's objects``."""
    error: BaseException
    code: int | None = None
    """The API server's HTTP status; None for an error that is not its answer."""
    detail: str = ""
    """The API server's message without the request (the error's text otherwise)."""


@dataclass(frozen=True)
class CreationNote:
    """A pass's creation, noted: the status, the job's back-off from now on, the wait."""

    status: dict[str, Any]
    """The plan's status with CreateFailed set (a confirmed failure) or cleared (created)."""
    backoff: CreateBackoff | None
    """The job's creation back-off after this pass (None: none to keep)."""
    delay: float | None = None
    """Seconds until the next attempt (None: nothing failed)."""
    event: Event | None = None
    """The Warning Event of a confirmed failure whose message is new."""
    message: str | None = None
    """The condition's message of a confirmed failure (the operator logs it)."""


def note_creation(
    plan: Plan,
    previous: CreateBackoff | None,
    generation: int,
    failure: CreateFailure | None,
    now: datetime,
    *,
    freed_since: bool = False,
) -> CreationNote:
    """The CreateFailed condition after a pass: set with the API server's answer when the
    creation failed twice in a row (one Event per distinct message), the back-off started
    or continued; cleared once the pass created what it had to; left as it was when the
    pass had nothing to create (or was held back). ``freed_since``: a ResourceQuota of the
    namespace freed room while the pass checked, so a wait for quota ends at once."""
    if failure is None:
        if not (plan.create or plan.ensure_service):
            return CreationNote(plan.status, previous)
        status, _ = with_create_failure(plan.status, None, CREATED_MESSAGE, now)
        return CreationNote(status, None)
    for_quota = failure.reason == gang.REASON_WAITING_FOR_QUOTA or gang.quota_refusal(failure.error)
    backoff = after_create_failure(
        previous, generation, failure.code, failure.detail, now, for_quota=for_quota
    )
    if backoff.for_quota and freed_since:
        # The room freed while this pass checked: its wake found no wait to end yet.
        backoff = released(backoff, now)
    delay = max(0.0, (backoff.next_at - now).total_seconds())
    if not backoff.confirmed:  # maybe a race: once more soon, before telling anyone
        return CreationNote(plan.status, backoff, delay)
    message = create_failed_message(failure.what, failure.error, backoff.permanent)
    status, event = with_create_failure(plan.status, failure.reason, message, now)
    return CreationNote(status, backoff, delay, event, message)


def held_back(plan: Plan, hold: float | None) -> tuple[Plan, float | None]:
    """The plan without its creations while the job's creation back-off holds (``hold``:
    seconds left, :func:`create_backoff.create_hold`), and the wait; a plan with nothing to
    create waits for nothing."""
    if hold is None or not (plan.create or plan.ensure_service):
        return plan, None
    return dataclasses.replace(plan, create=(), ensure_service=False), hold


def blocked_message(job_name: str, blocked: Sequence[str]) -> str:
    """One line naming what blocks the job and what to do about it."""
    named = ", ".join(blocked[:BLOCKERS_NAMED])
    if len(blocked) > BLOCKERS_NAMED:
        named += f" and {len(blocked) - BLOCKERS_NAMED} more"
    if len(blocked) == 1:
        return (
            f"{named} has a name StrategyJob {job_name} needs and is not controlled by it: "
            "delete it, or give the job another name."
        )
    return (
        f"{len(blocked)} objects have names StrategyJob {job_name} needs and are not "
        f"controlled by it: {named}. Delete them (a job deleted with --cascade=orphan leaves "
        f"them labelled {c.LABEL_JOB_NAME}={job_name}), or give the job another name."
    )


def blocked_condition(
    status: Mapping[str, Any], job_name: str, blocked: Sequence[str], now: datetime
) -> tuple[dict[str, Any], Event | None]:
    """``status`` with the ReplicaFailure condition naming what blocks the job (removed once
    nothing does, as a Deployment's), and the Event to post when that changed: one Event per
    change, not one per pass."""
    conds = list(status.get("conditions") or [])
    if not blocked:
        if cond.get(conds, REPLICA_FAILURE) is None:
            return dict(status), None
        kept = [x for x in conds if x.get("type") != REPLICA_FAILURE]
        return {**status, "conditions": kept}, None
    message = blocked_message(job_name, blocked)
    old = cond.get(conds, REPLICA_FAILURE)
    conds = cond.set_condition(
        conds, REPLICA_FAILURE, True, REASON_NOT_CONTROLLED, message, timestamp(now)
    )
    changed = old is None or old.get("message") != message or old.get("status") != "True"
    event = Event("Warning", REASON_NOT_CONTROLLED, message) if changed else None
    return {**status, "conditions": conds}, event


@dataclass(frozen=True)
class Resize:
    """What the pass saw of a resizable job's workers (:mod:`.scaling`)."""

    job: jobspec.StrategyJob
    replicas: Mapping[tuple[str, int], Replica]
    members: scaling.Members | None
    """The workers the chief follows now (None: the job's chief follows none yet)."""


def resized_status(status: Mapping[str, Any], resize: Resize, now: datetime) -> dict[str, Any]:
    """``status`` with the Resizing condition (and the count of workers the chief follows)
    of a resizable job that follows its workers or was resizing."""
    resizing = cond.is_true(status.get("conditions") or [], c.RESIZING)
    if resize.members is None and not resizing:
        return dict(status)
    held = scaling.resize_condition(resize.job, resize.members, resize.replicas)
    out = dict(status)
    if resize.members is not None:
        out["workers"] = len(resize.members.workers)
    out["conditions"] = cond.set_condition(
        out.get("conditions") or [], c.RESIZING, *held, timestamp(now)
    )
    return out


@dataclass(frozen=True)
class Settled:
    """The status a pass ends with, the Event it adds, the log line, and its retry."""

    status: dict[str, Any]
    event: Event | None = None
    """The ReplicaFailure Warning when what blocks the job changed (the operator logs it)."""
    retry: float | None = None
    """Seconds until the pass to see whether the blocking objects went (None: none)."""


def settle(
    plan: Plan,
    job_name: str,
    status: Mapping[str, Any],
    blocked: Sequence[str],
    resize: Resize | None,
    now: datetime,
) -> Settled:
    """The status a pass ends with, from ``status`` (the plan's, with CreateFailed noted):
    the ReplicaFailure condition of a job that created or runs, and a resizable job's
    Resizing condition (``resize``; None for a job that cannot resize)."""
    out, event, retry = dict(status), None, None
    if blocked or plan.ensure_service or plan.create or out.get("launched"):
        out, event = blocked_condition(out, job_name, blocked, now)
        if blocked:
            retry = BLOCKED_RETRY_SECONDS
    if resize is not None:
        out = resized_status(out, resize, now)
    return Settled(out, event, retry)


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch turning ``old`` into ``new``: keys that ``new`` drops, at any
    depth (``stalledReasons`` once nothing is stuck, ``completedIndexes`` after a restart,
    a metric of the progress), are set to null; otherwise the API server keeps them, the
    next pass sees a difference again, and every pass (and every resync) writes."""
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        before = old.get(k)
        if isinstance(v, Mapping) and isinstance(before, Mapping):
            out[k] = status_patch(before, v)
        else:
            out[k] = v
    return out


def status_write(
    flavor: Flavor,
    loaded: Loaded,
    written: Mapping[str, Any],
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    now: datetime,
) -> dict[str, Any] | None:
    """The merge patch of the job's status as written (``written``, the flavor's form) when
    the pass changed it (``before`` -> ``after``, the operator's form); None: no write. A
    TFJob's says when the status last changed (``lastReconcileTime``)."""
    if after == before:
        return None
    new_written = flavor.external_status(dict(after), loaded)
    if loaded.tfjob is not None:
        new_written["lastReconcileTime"] = timestamp(now)
    return status_patch(written, new_written)


def resync_wait(plan: Plan, period: float | None, jitter: float = 1.0) -> float | None:
    """Seconds until the periodic pass of a job whose pods may change (not finished, not
    suspended): ``period`` times ``jitter`` (the caller draws it around 1, so that 1000 jobs
    do not resync at once); None when it needs none."""
    if period is None or plan.action in (Action.SUSPEND, Action.DELETE_JOB):
        return None
    conds = plan.status.get("conditions") or []
    if any(
        x.get("type") in (c.SUCCEEDED, c.FAILED, c.SUSPENDED) and x.get("status") == "True"
        for x in conds
    ):
        return None
    return period * jitter


def next_pass(*waits: float | None) -> float | None:
    """Seconds until the soonest of the waits that are due (None: none is)."""
    due = [w for w in waits if w is not None]
    return min(due) if due else None
