"""What a process's liveness listener tells its peers of its history outside collectives (what
the stuck-peer bound judges by), read over its real socket."""

from __future__ import annotations

from strategyjob.collective.options import CommunicationOptions
from strategyjob.collective.process_group import _activity, _LivenessListener, _stuck_policy
from strategyjob.collective.stuck import StuckPolicy


def test_longest_pause_counts_from_the_first_collective_on() -> None:
    listener = _LivenessListener()
    try:
        address = ("127.0.0.1", listener.port)
        start = listener.doing[1]
        listener.entered("all-reduce", start + 50.0)  # starting up: no step's pause
        listener.left(start + 51.0)
        listener.left(start + 53.0)  # 2 s outside, collected at once (fast path)
        listener.entered("broadcast", start + 53.5)
        listener.left(start + 60.0)  # 7 s inside a collective: not a pause
        listener.entered("all-reduce", start + 60.25)
        assert (listener.completed, listener.longest) == (3, 2.0)
        said = _activity(address)
        assert said is not None and (said.collective, said.longest) == ("all-reduce", 2.0)
    finally:
        listener.close()


def test_timeout_seconds_turns_the_adaptive_bound_off() -> None:
    policy = StuckPolicy(floor=4.0)
    assert _stuck_policy(CommunicationOptions(), policy) is policy
    assert _stuck_policy(CommunicationOptions(timeout_seconds=20), policy) is None
    assert _stuck_policy(CommunicationOptions(), None) is None
