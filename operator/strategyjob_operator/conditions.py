"""Job conditions in TFJob's shape: type, status, reason, message, lastUpdateTime,
lastTransitionTime. Pure list-in, list-out helpers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from strategyjob_operator import constants as c

#: Conditions that exclude each other: setting one True sets the others False.
_EXCLUSIVE = {c.RUNNING: (c.RESTARTING,), c.RESTARTING: (c.RUNNING,)}


def get(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((x for x in conditions if x.get("type") == type_), None)


def is_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    cond = get(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
) -> list[dict[str, Any]]:
    """A new condition list with ``type_`` set. Transition times change only when the
    status flips, update times only when something changes, so an unchanged job
    produces an unchanged status (and no write)."""
    value = "True" if status else "False"
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        cond = dict(cond)
        if cond.get("type") == type_:
            found = True
            if (cond.get("status"), cond.get("reason"), cond.get("message")) != (
                value,
                reason,
                message,
            ):
                if cond.get("status") != value:
                    cond["lastTransitionTime"] = now
                cond.update(status=value, reason=reason, message=message, lastUpdateTime=now)
        out.append(cond)
    if not found:
        if not status:
            return out  # a condition that never held need not be recorded as False
        out.append(
            {
                "type": type_,
                "status": value,
                "reason": reason,
                "message": message,
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            }
        )
    if status:
        for other in _EXCLUSIVE.get(type_, ()):
            if is_true(out, other):
                out = set_condition(out, other, False, reason, message, now)
    return out


def state(conditions: Sequence[Mapping[str, Any]]) -> str:
    """The ``State`` printer column: the most decisive true condition."""
    for type_ in c.STATE_PRECEDENCE:
        if is_true(conditions, type_):
            return type_
    return ""
