"""When a peer that is alive but never reaches a collective counts as stuck, without
``CommunicationOptions.timeout_seconds``: the pure decision, from what the job has seen.

Why adaptive rather than a fixed shorter default: a peer busy outside collectives (the chief
evaluating or writing a checkpoint between steps) looks exactly like a stuck one, so no fixed
bound short of torch's 30 minutes is safe for every job. What this job has done so far says
how long its workers are outside collectives: once it has completed :data:`MIN_COLLECTIVES`
collectives, a peer outside every collective for longer than ``max(floor, factor x the
longest time any worker spent outside collectives so far)`` while others wait for it is stuck.
The floor (10 minutes by default) is what keeps a long pause the job has not had before (its
first evaluation) from being taken as stuck; before that history, the 30-minute bound stays.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from strategyjob import _names
from strategyjob.collective.waiting import Activity

__all__ = [
    "DEFAULT_FACTOR",
    "DEFAULT_FLOOR_SECONDS",
    "ENV_STUCK_PEER_FACTOR",
    "ENV_STUCK_PEER_SECONDS",
    "MIN_COLLECTIVES",
    "StuckPolicy",
    "culprits",
    "policy_from_env",
    "verdict",
]

ENV_STUCK_PEER_SECONDS = _names.ENV_STUCK_PEER_SECONDS
ENV_STUCK_PEER_FACTOR = _names.ENV_STUCK_PEER_FACTOR
#: The least time outside collectives taken as stuck: longer than most evaluations and
#: checkpoint writes a job does between steps, a third of torch's 30 minutes.
DEFAULT_FLOOR_SECONDS = 600.0
#: How many times the longest time outside collectives seen so far a peer may take.
DEFAULT_FACTOR = 10.0
#: Collectives this worker must have completed before the job's history counts (a few steps).
MIN_COLLECTIVES = 20
_OFF = ("off", "0")


@dataclass(frozen=True)
class StuckPolicy:
    """A peer outside collectives for ``max(floor, factor x longest)`` seconds is stuck, once
    ``min_collectives`` have completed."""

    floor: float = DEFAULT_FLOOR_SECONDS
    factor: float = DEFAULT_FACTOR
    min_collectives: int = MIN_COLLECTIVES

    def bound(self, completed: int, longest: float) -> float | None:
        """The bound, given the collectives completed and the longest time any worker spent
        outside collectives between two of them; None: not enough history yet."""
        if completed < self.min_collectives:
            return None
        return max(self.floor, self.factor * longest)


def policy_from_env(environ: Mapping[str, str] = os.environ) -> StuckPolicy | None:
    """The policy the environment sets; None when :data:`ENV_STUCK_PEER_SECONDS` is ``off``.
    A value that is not a positive number (or ``off``) is refused saying what to set."""
    floor_text = environ.get(ENV_STUCK_PEER_SECONDS, "").strip()
    if floor_text.lower() in _OFF:
        return None
    floor = _positive(ENV_STUCK_PEER_SECONDS, floor_text, DEFAULT_FLOOR_SECONDS, "or 'off'")
    factor_text = environ.get(ENV_STUCK_PEER_FACTOR, "").strip()
    factor = _positive(ENV_STUCK_PEER_FACTOR, factor_text, DEFAULT_FACTOR, "")
    return StuckPolicy(floor=floor, factor=factor)


def _positive(name: str, text: str, default: float, alternative: str) -> float:
    try:
        value = float(text) if text else default
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        also = f" {alternative}" if alternative else ""
        raise ValueError(
            f"{name}={text!r} is not a positive number{also}. Unset it for the default "
            f"({default:g})."
        )
    return value


def culprits(absent: Mapping[str, Activity], bound: float) -> dict[str, Activity]:
    """The ``absent`` peers (not in the awaited collective) that have been so for ``bound``
    seconds or longer."""
    return {name: a for name, a in absent.items() if a.seconds >= bound}


def verdict(
    what: str, stuck: Mapping[str, Activity], bound: float, policy: StuckPolicy, longest: float
) -> str:
    """The ``DeadlineExceededError`` message naming the ``stuck`` peers, how the bound came
    about and how to raise it."""
    peers = ", ".join(f"{name} ({a.describe()})" for name, a in stuck.items())
    return (
        f"Collective {what} did not complete: Not arrived: {peers}, longer than this job's "
        f"stuck-peer bound of {bound:.0f} s, the larger of {ENV_STUCK_PEER_SECONDS} "
        f"({policy.floor:g} s) and {ENV_STUCK_PEER_FACTOR} ({policy.factor:g}) x the longest "
        f"time a worker spent outside collectives so far ({longest:.1f} s). A peer that is "
        "alive but not in it is stuck or running different code (all workers must issue the "
        "same collectives in the same order). If it was busy (evaluating, writing a "
        f"checkpoint), raise {ENV_STUCK_PEER_SECONDS}, set it to 'off', or set "
        f"CommunicationOptions(timeout_seconds=...) ({_names.DOCS_FAULTS})."
    )
