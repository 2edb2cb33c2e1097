"""What the API server refuses to create: the backoff before trying again (exponential for what
may pass later, long for what cannot pass as it is) and the CreateFailed condition and Event."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.plan import Event, timestamp

#: Seconds before the first retry of a creation that may pass later (a quota, a 5xx, a
#: timeout); each further failure doubles it, up to :data:`CREATE_BACKOFF_MAX_SECONDS`.
CREATE_BACKOFF_SECONDS = 5.0
CREATE_BACKOFF_MAX_SECONDS = 300.0
#: Seconds before a creation that cannot pass as it is (422 Invalid, 403 Forbidden by RBAC or
#: an admission webhook, 404 no such API or namespace, 400) is tried again, unless the job's
#: spec changes first: what the cluster's administrator may have fixed meanwhile. Only once
#: it failed twice in a row: the first failure is retried after
#: :data:`CREATE_BACKOFF_SECONDS` like any other, so that a race (an object its creation
#: needs, created a moment before) neither holds the job nor reaches its status.
CREATE_PERMANENT_RETRY_SECONDS = 600.0
#: HTTP statuses of a request that fails the same way until the request or the cluster changes.
_PERMANENT_STATUSES = frozenset({400, 403, 404, 405, 413, 415, 422})
#: Longest API message quoted in the CreateFailed condition.
_CREATE_DETAIL_CHARS = 1000


def permanent_create_error(status: int | None, detail: str) -> bool:
    """Whether creating again, unchanged, cannot succeed. A ResourceQuota's 403 ("exceeded
    quota") can: the quota frees up as other pods end, so it is retried with backoff, like a
    conflict, throttling (429), a server error or a lost connection (``status`` None)."""
    if status == 403 and "exceeded quota" in detail:
        return False
    return status in _PERMANENT_STATUSES


@dataclass(frozen=True)
class CreateBackoff:
    """A job's creation failures for one spec generation: when to try again."""

    generation: int
    attempts: int
    next_at: datetime
    permanent: bool
    for_quota: bool = False
    """It waits for a ResourceQuota to free room: the quota's update ends the wait
    (:func:`released`), which is then only a fallback."""

    @property
    def confirmed(self) -> bool:
        """Failed twice in a row: worth the status and an Event (once is maybe a race)."""
        return self.attempts >= 2


def after_create_failure(
    previous: CreateBackoff | None,
    generation: int,
    status: int | None,
    detail: str,
    now: datetime,
    *,
    for_quota: bool = False,
) -> CreateBackoff:
    """The backoff after a failed creation: a retryable error waits 5 s, then 10, 20, ... up
    to 5 min; a permanent one waits 5 s the first time, then
    :data:`CREATE_PERMANENT_RETRY_SECONDS`. A new spec generation starts over. ``for_quota``:
    the creation waits for a ResourceQuota (:attr:`CreateBackoff.for_quota`)."""
    attempts = 1
    if previous is not None and previous.generation == generation:
        attempts = previous.attempts + 1
    permanent = permanent_create_error(status, detail)
    if permanent and attempts > 1:
        delay = CREATE_PERMANENT_RETRY_SECONDS
    else:
        delay = min(CREATE_BACKOFF_SECONDS * 2 ** min(attempts - 1, 30), CREATE_BACKOFF_MAX_SECONDS)
    return CreateBackoff(
        generation, attempts, now + timedelta(seconds=delay), permanent, for_quota and not permanent
    )


def released(backoff: CreateBackoff, now: datetime) -> CreateBackoff:
    """``backoff`` with its wait over at ``now``: a quota freed room, so the next pass checks
    again at once. Its attempts are kept: if the room is still too small, the wait after that
    check is the one the back-off was at (and doubles), as before."""
    return dataclasses.replace(backoff, next_at=min(backoff.next_at, now))


def quota_waiters(
    backoffs: Mapping[tuple[str, str, str], CreateBackoff], namespace: str
) -> list[tuple[str, str, str]]:
    """The jobs (keys ``(namespace, name, uid)``) of ``namespace`` whose creation waits for a
    ResourceQuota to free room: those to wake when one of its quotas does."""
    return sorted(key for key, b in backoffs.items() if key[0] == namespace and b.for_quota)


def create_hold(backoff: CreateBackoff | None, generation: int, now: datetime) -> float | None:
    """Seconds to wait before creating the job's pods and objects again; None: go ahead (no
    failure, the backoff is over, or the spec changed since: it may fix the cause)."""
    if backoff is None or backoff.generation != generation:
        return None
    left = (backoff.next_at - now).total_seconds()
    return left if left > 0 else None


def create_failed_message(what: str, error: BaseException, permanent: bool) -> str:
    """The CreateFailed condition's message: what could not be created, the API server's
    answer, what the operator does. Free of counts and times, so that the same failure
    reads the same on every attempt (one Event, not one per retry)."""
    detail = " ".join(str(error).split()) or type(error).__name__
    if len(detail) > _CREATE_DETAIL_CHARS:
        detail = detail[: _CREATE_DETAIL_CHARS - 3] + "..."
    if permanent:
        then = (
            "This cannot succeed as it is: fix the job's spec (or what the API server names), "
            "and the operator tries again when the spec changes, or in "
            f"{CREATE_PERMANENT_RETRY_SECONDS / 60:g} min."
        )
    else:
        then = (
            "Retrying with exponential backoff (up to every "
            f"{CREATE_BACKOFF_MAX_SECONDS / 60:g} min)."
        )
    return f"Cannot create {what}: {detail}. {then}"


def with_create_failure(
    status: Mapping[str, Any], reason: str | None, message: str, now: datetime
) -> tuple[dict[str, Any], Event | None]:
    """``status`` with the CreateFailed condition set (``reason`` None: cleared, once
    something was created again), and the Warning Event to post: one per distinct
    message, not one per attempt."""
    conds = [dict(x) for x in status.get("conditions") or [] if isinstance(x, Mapping)]
    old = cond.get(conds, c.CREATE_FAILED)
    if reason is None:
        if old is None or old.get("status") != "True":
            return dict(status), None
        conds = cond.set_condition(
            conds, c.CREATE_FAILED, False, c.REASON_CREATE_SUCCEEDED, message, timestamp(now)
        )
        return {**status, "conditions": conds}, None
    conds = cond.set_condition(conds, c.CREATE_FAILED, True, reason, message, timestamp(now))
    new = old is None or old.get("status") != "True" or old.get("message") != message
    return {**status, "conditions": conds}, Event("Warning", reason, message) if new else None
