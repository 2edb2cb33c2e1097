"""What one decision returns (:class:`Plan`: the new status, the pods to delete and to
create, the Events to post) and how the status' times and counters are read and written: values
a status edited by hand may hold are read leniently, so that they never stop every pass."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any


class Action(enum.Enum):
    """What a reconcile pass does, in one word (logs, metrics, tests)."""

    NONE = "none"
    CREATE = "create"  # create missing pods (first start, resume, after a restart)
    RECREATE_REPLICAS = "recreate-replicas"  # ParameterServerStrategy worker/evaluator
    RESTART_JOB = "restart-job"
    SUCCEED = "succeed"
    FAIL = "fail"
    SUSPEND = "suspend"
    DELETE_JOB = "delete-job"  # ttlSecondsAfterFinished expired


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    action: Action
    status: dict[str, Any]
    delete_pods: tuple[str, ...] = ()
    create: tuple[tuple[str, int], ...] = ()
    events: tuple[Event, ...] = ()
    #: Counter names to increment: jobs_created, jobs_succeeded, jobs_failed, jobs_restarted.
    metrics: tuple[str, ...] = ()
    #: Seconds until the next time-driven decision (deadline, TTL); None when none.
    requeue_after: float | None = None
    delete_job: bool = False
    ensure_service: bool = False


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time of the status; None when absent or unreadable (a status edited by
    hand must not stop every pass), UTC when it names no zone."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def add_seconds(start: datetime, seconds: int | float) -> datetime | None:
    """``start`` plus ``seconds``; None when that is past the last date Python can hold
    (a deadline or TTL that never comes)."""
    try:
        return start + timedelta(seconds=seconds)
    except (OverflowError, ValueError):
        return None


def as_count(value: Any) -> int:
    """A counter of the status (restartCount, restarts) as a non-negative int; 0 for a
    value that is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    try:
        return max(int(value), 0)
    except (OverflowError, ValueError):
        return 0


def seconds_since(value: str | None, now: datetime) -> float:
    """Seconds from the time ``value`` to ``now``; 0 when it cannot be read."""
    then = parse_time(value)
    return max((now - then).total_seconds(), 0.0) if then is not None else 0.0
