"""The stuck-closure decision (``ps._closure_watch``): the collective jobs' stuck-peer rule,
applied to each function's completed closures, and the words that name the culprit."""

from __future__ import annotations

import pytest
from strategyjob.collective.stuck import StuckPolicy, policy_from_env
from strategyjob.ps import _closure_watch
from strategyjob.ps._closure_watch import FALLBACK_SECONDS, History, bound

WORKER = "/job:worker/replica:0/task:1"


def test_before_twenty_completed_closures_the_bound_is_the_fixed_fallback():
    policy = StuckPolicy(floor=3.0, factor=10.0)
    limit = bound(policy, completed=19, longest=100.0)
    assert limit.seconds == FALLBACK_SECONDS == 1800.0
    assert "until 20 closures of this function have completed (19 so far)" in limit.how


def test_the_fallback_is_never_below_the_floor():
    assert bound(StuckPolicy(floor=4000.0), completed=0, longest=0.0).seconds == 4000.0


@pytest.mark.parametrize(
    ("longest", "expected"),
    [(0.1, 3.0), (2.0, 20.0)],
    ids=["floor-wins", "factor-times-the-longest-wins"],
)
def test_with_history_the_bound_is_the_larger_of_the_floor_and_factor_times_the_longest(
    longest, expected
):
    limit = bound(StuckPolicy(floor=3.0, factor=10.0), completed=20, longest=longest)
    assert limit.seconds == expected
    assert "STRATEGYJOB_STUCK_PEER_SECONDS (3 s)" in limit.how
    assert "STRATEGYJOB_STUCK_PEER_FACTOR (10) x the longest of the 20 completed" in limit.how


def test_the_environment_sets_the_same_knobs_as_collective_jobs():
    policy = policy_from_env({"STRATEGYJOB_STUCK_PEER_SECONDS": "3"})
    assert policy == StuckPolicy(floor=3.0, factor=10.0, min_collectives=20)
    assert policy_from_env({"STRATEGYJOB_STUCK_PEER_SECONDS": "off"}) is None
    assert policy_from_env({}) == StuckPolicy(floor=600.0, factor=10.0)


def test_history_counts_completions_and_keeps_the_longest_per_function():
    history = History()
    assert history.of("f") == (0, 0.0)
    for seconds in (0.2, 0.5, 0.3):
        history.record("f", seconds)
    history.record("g", 9.0)
    assert history.of("f") == (3, 0.5)
    assert history.of("g") == (1, 9.0)


def test_the_messages_name_the_worker_the_closure_how_long_and_how_to_raise_the_bound():
    limit = bound(StuckPolicy(floor=3.0, factor=10.0), completed=25, longest=0.2)
    line = _closure_watch.waiting_line("train_step", WORKER, 10.2, 25, 0.2, limit)
    assert line == (
        f"coordinator waiting 10 s for closure train_step on {WORKER} (the longest completed one "
        "took 0.2 s; taken out at 3 s)"
    )
    first = _closure_watch.waiting_line("train_step", WORKER, 10.2, 0, 0.0, None)
    assert first.endswith(f"on {WORKER} (none completed yet)")
    taken = _closure_watch.taken_out_line("train_step", WORKER, 3.1, limit)
    assert taken.startswith(f"coordinator takes {WORKER} out: closure train_step ran 3.1 s")
    error = _closure_watch.stuck_message("train_step", WORKER, 3.1, limit)
    assert error.startswith(f"Closure train_step on {WORKER} did not complete: it ran 3.1 s")
    for text in (taken, error):
        assert "stuck-peer bound of 3 s" in text
        assert "raise STRATEGYJOB_STUCK_PEER_SECONDS" in text
