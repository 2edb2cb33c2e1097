"""When a closure that runs on a live worker counts as stuck: the pure decision and its words.

Why: a worker that answers gRPC's keepalives but never finishes its closure (its function blocked
on a lock, looping on one step) made the coordinator's ``join`` wait forever, silently. The bound
is the collective jobs' stuck-peer rule (``collective.stuck``: the same environment variables,
defaults and minimum history), applied to each function's own closures: once
``StuckPolicy.min_collectives`` closures of a function have completed, one running longer than
``max(floor, factor x the longest of them)`` is stuck. Before that history, a fixed
:data:`FALLBACK_SECONDS` (torch's 30 minutes, the bound collectives keep until theirs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from strategyjob import _names
from strategyjob.collective.stuck import StuckPolicy

__all__ = [
    "FALLBACK_SECONDS",
    "Bound",
    "History",
    "bound",
    "stuck_message",
    "taken_out_line",
    "waiting_line",
]

#: The bound before a function has enough completed closures to judge by (never below the floor).
FALLBACK_SECONDS = 1800.0
_RAISE = (
    f"If it was busy, raise {_names.ENV_STUCK_PEER_SECONDS} (or set it to 'off': no bound) or "
    f"{_names.ENV_STUCK_PEER_FACTOR} ({_names.DOCS_FAULTS})."
)


@dataclass(frozen=True)
class Bound:
    """A closure running ``seconds`` or longer is stuck; ``how``: how that figure came about."""

    seconds: float
    how: str


def bound(policy: StuckPolicy, completed: int, longest: float) -> Bound:
    """The bound for a closure of a function of which ``completed`` closures have completed,
    the longest in ``longest`` seconds."""
    seconds = policy.bound(completed, longest)
    if seconds is None:
        fixed = max(policy.floor, FALLBACK_SECONDS)
        return Bound(
            fixed,
            f"a fixed {fixed:g} s until {policy.min_collectives} closures of this function have "
            f"completed ({completed} so far)",
        )
    return Bound(
        seconds,
        f"the larger of {_names.ENV_STUCK_PEER_SECONDS} ({policy.floor:g} s) and "
        f"{_names.ENV_STUCK_PEER_FACTOR} ({policy.factor:g}) x the longest of the {completed} "
        f"completed closures of this function ({longest:.1f} s)",
    )


def _seconds(value: float) -> str:
    return f"{round(value, 1):g} s"


class History:
    """How many closures of each function (by digest) completed, and the longest one's seconds:
    what :func:`bound` judges by. Thread-safe (every worker thread records into it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[int, float]] = {}

    def record(self, function: str, seconds: float) -> None:
        with self._lock:
            completed, longest = self._runs.get(function, (0, 0.0))
            self._runs[function] = (completed + 1, max(longest, seconds))

    def of(self, function: str) -> tuple[int, float]:
        """``(completed, longest seconds)`` of ``function``'s closures so far."""
        with self._lock:
            return self._runs.get(function, (0, 0.0))


def waiting_line(
    function: str, worker: str, seconds: float, completed: int, longest: float, limit: Bound | None
) -> str:
    """The coordinator's periodic line while a closure runs longer than its function's ever did
    (``completed`` of them, the longest in ``longest`` seconds)."""
    seen = f"the longest completed one took {longest:.1f} s" if completed else "none completed yet"
    then = f"; taken out at {_seconds(limit.seconds)}" if limit is not None else ""
    return f"coordinator waiting {seconds:.0f} s for closure {function} on {worker} ({seen}{then})"


def _beyond(seconds: float, limit: Bound) -> str:
    return (
        f"{seconds:.1f} s, longer than this job's stuck-peer bound of {_seconds(limit.seconds)} "
        f"({limit.how})"
    )


def taken_out_line(function: str, worker: str, seconds: float, limit: Bound) -> str:
    """What the coordinator says when it takes ``worker`` out for a stuck closure."""
    then = (
        f"It is rescheduled on another worker; {worker} gets no closure until that one ends (its "
        "result is then dropped, and the ps skips its updates: each step is applied once)."
    )
    verdict = f"coordinator takes {worker} out: closure {function} ran {_beyond(seconds, limit)}."
    return " ".join((verdict, then, _RAISE))


def stuck_message(function: str, worker: str, seconds: float, limit: Bound) -> str:
    """The ``DeadlineExceededError`` when no worker is left to run a stuck closure."""
    return (
        f"Closure {function} on {worker} did not complete: it ran {_beyond(seconds, limit)}, and "
        f"no other worker is left to run it (every worker is taken out as stuck). {_RAISE}"
    )
