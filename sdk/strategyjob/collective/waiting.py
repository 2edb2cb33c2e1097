"""Say whom a worker waits for: in the rendezvous, the tasks that have not joined; in a
collective that does not complete, the peers that are not in it.

Why: a worker waiting for a peer that never comes was silent until its timeout (30 minutes by
default), and a stuck collective's error could not say which peer was stuck. Each process's
liveness listener (``process_group``) answers a probe with what the process is doing
(:class:`Activity`), so a waiting peer learns, without the job's store or any other party,
which peers have not reached the collective and since when.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strategyjob import _names

__all__ = [
    "DEFAULT_RENDEZVOUS_SECONDS",
    "DEFAULT_REPORT_SECONDS",
    "ENV_RENDEZVOUS_TIMEOUT",
    "ENV_WAITING_REPORT_SECONDS",
    "Activity",
    "Reporter",
    "collective_line",
    "not_arrived",
    "positive_seconds",
    "rendezvous_line",
]

#: How long a task waits in the rendezvous for every chief and worker task to join, unless
#: :data:`ENV_RENDEZVOUS_TIMEOUT` says otherwise: torch's default. Not shorter: on a cluster a
#: pod may stay Pending for minutes (a node scaled up, a large image pulled), and a task that
#: gives up fails the job under an ExitCode restart policy; the lines below show the wait.
DEFAULT_RENDEZVOUS_SECONDS = 1800.0
ENV_RENDEZVOUS_TIMEOUT = _names.ENV_RENDEZVOUS_TIMEOUT
#: Seconds between two "waiting for" lines, unless :data:`ENV_WAITING_REPORT_SECONDS` says.
DEFAULT_REPORT_SECONDS = 10.0
ENV_WAITING_REPORT_SECONDS = _names.ENV_WAITING_REPORT_SECONDS


def positive_seconds(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """The positive number of seconds in environment variable ``name``, ``default`` when unset;
    anything else is refused with what to do."""
    value = environ.get(name)
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"{name}={value!r} is not a positive number of seconds. "
            f"Unset it for the default ({default:g})."
        )
    return seconds


class Reporter:
    """Whether a line is due: first ``interval`` seconds after ``start``, then every
    ``interval`` seconds (monotonic clock)."""

    def __init__(self, interval: float, start: float) -> None:
        self.interval = interval
        self._next = start + interval

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        while self._next <= now:
            self._next += self.interval
        return True


def rendezvous_line(own: str, missing: Sequence[str], seconds: float, timeout: float) -> str:
    """The line a task prints while ``missing`` tasks have not joined the rendezvous."""
    return (
        f"{own} waiting for {', '.join(missing)} (not joined for {seconds:.0f} s; the "
        f"rendezvous times out after {timeout:g} s, {ENV_RENDEZVOUS_TIMEOUT})"
    )


@dataclass(frozen=True)
class Activity:
    """What a process is doing, as its liveness listener says: waiting in ``collective``
    (empty: in none) for ``seconds``; ``longest``: the longest it has been outside collectives
    between two of them so far (the history ``collective.stuck`` judges by)."""

    collective: str
    seconds: float
    longest: float = 0.0

    def encode(self) -> bytes:
        return f"{self.collective}\t{self.seconds:.1f}\t{self.longest:.1f}".encode()

    @classmethod
    def decode(cls, data: bytes) -> Activity | None:
        """None for a half-read or garbled answer; an older listener's has no ``longest``."""
        collective, *numbers = data.decode(errors="replace").split("\t")
        try:
            return cls(collective, *map(float, numbers)) if 1 <= len(numbers) <= 2 else None
        except ValueError:
            return None

    def describe(self) -> str:
        if self.collective:
            return f"in {self.collective} for {self.seconds:.0f} s"
        return f"not in a collective for {self.seconds:.0f} s"


def not_arrived(activities: Mapping[str, Activity | None], what: str) -> dict[str, Activity]:
    """The peers (by task name) of ``activities`` that are not waiting in ``what``: in no
    collective, or in another one. Peers that did not say are left out (unknown)."""
    return {
        name: activity
        for name, activity in activities.items()
        if activity is not None and activity.collective != what
    }


def collective_line(own: str, what: str, waited: float, absent: Mapping[str, Activity]) -> str:
    """The line a task prints while waiting in collective ``what`` for the ``absent`` peers."""
    peers = ", ".join(f"{name} ({activity.describe()})" for name, activity in absent.items())
    return f"{own} waiting {waited:.0f} s in {what} for {peers}"
