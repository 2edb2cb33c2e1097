"""When a live peer that never reaches a collective counts as stuck without
``timeout_seconds``: the pure decision of ``strategyjob.collective.stuck``."""

from __future__ import annotations

import pytest
from strategyjob.collective import stuck, waiting
from strategyjob.collective.stuck import StuckPolicy
from strategyjob.collective.waiting import Activity

STUCK = "/job:worker/replica:0/task:2"


def test_no_bound_before_the_job_has_history() -> None:
    policy = StuckPolicy(floor=600.0, factor=10.0, min_collectives=20)
    assert policy.bound(completed=19, longest=1.0) is None  # torch's 30 minutes stay
    assert policy.bound(completed=20, longest=1.0) == 600.0  # the floor
    assert policy.bound(completed=500, longest=90.0) == 900.0  # 10 x the longest pause


def test_a_first_long_evaluation_within_the_floor_is_not_stuck() -> None:
    # Steps of 0.5 s so far; the chief now evaluates for 9 minutes for the first time.
    policy = StuckPolicy(floor=600.0, factor=10.0)
    bound = policy.bound(completed=400, longest=0.5)
    assert bound == 600.0
    evaluating = {"/job:chief/replica:0/task:0": Activity("", 540.0, 0.5)}
    assert stuck.culprits(evaluating, bound) == {}
    assert list(stuck.culprits({STUCK: Activity("", 600.4, 0.5)}, bound)) == [STUCK]


def test_a_pause_the_job_has_had_before_raises_the_bound() -> None:
    # Once the chief has spent 2 minutes outside collectives (its evaluation), 15 minutes of
    # the same is no verdict: the bound is 20 minutes.
    bound = StuckPolicy(floor=600.0, factor=10.0).bound(completed=400, longest=120.0)
    assert bound == 1200.0
    assert stuck.culprits({STUCK: Activity("", 900.0, 120.0)}, bound) == {}


def test_culprits_are_the_absent_peers_over_the_bound() -> None:
    activities = {
        "/job:worker/replica:0/task:0": Activity("all-reduce", 30.0),  # waiting with us
        "/job:worker/replica:0/task:1": Activity("", 5.0),  # late, not stuck
        STUCK: Activity("", 31.0),
        "/job:worker/replica:0/task:3": Activity("broadcast", 40.0),  # other code: stuck too
    }
    absent = waiting.not_arrived(activities, "all-reduce")
    assert list(stuck.culprits(absent, 30.0)) == [STUCK, "/job:worker/replica:0/task:3"]


def test_verdict_names_the_peer_the_bound_and_how_to_raise_it() -> None:
    policy = StuckPolicy(floor=600.0, factor=10.0)
    message = stuck.verdict(
        "gradient all-reduce", {STUCK: Activity("", 612.3)}, 600.0, policy, 1.24
    )
    assert message.startswith(
        f"Collective gradient all-reduce did not complete: Not arrived: {STUCK} (not in a "
        "collective for 612 s), longer than this job's stuck-peer bound of 600 s, the larger of "
        "STRATEGYJOB_STUCK_PEER_SECONDS (600 s) and STRATEGYJOB_STUCK_PEER_FACTOR (10) x the "
        "longest time a worker spent outside collectives so far (1.2 s). "
    )
    assert message.endswith(
        "raise STRATEGYJOB_STUCK_PEER_SECONDS, set it to 'off', or set "
        "CommunicationOptions(timeout_seconds=...) (docs/guide/faults.md)."
    )


def test_policy_from_the_environment() -> None:
    assert stuck.policy_from_env({}) == StuckPolicy(600.0, 10.0, stuck.MIN_COLLECTIVES)
    assert stuck.policy_from_env(
        {"STRATEGYJOB_STUCK_PEER_SECONDS": "45", "STRATEGYJOB_STUCK_PEER_FACTOR": "3"}
    ) == StuckPolicy(45.0, 3.0)
    for off in ("off", "OFF", "0"):
        assert stuck.policy_from_env({"STRATEGYJOB_STUCK_PEER_SECONDS": off}) is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "STRATEGYJOB_STUCK_PEER_SECONDS",
            "ten minutes",
            "STRATEGYJOB_STUCK_PEER_SECONDS='ten minutes' is not a positive number or 'off'. "
            "Unset it for the default (600).",
        ),
        (
            "STRATEGYJOB_STUCK_PEER_SECONDS",
            "-5",
            "STRATEGYJOB_STUCK_PEER_SECONDS='-5' is not a positive number or 'off'. "
            "Unset it for the default (600).",
        ),
        (
            "STRATEGYJOB_STUCK_PEER_FACTOR",
            "inf",
            "STRATEGYJOB_STUCK_PEER_FACTOR='inf' is not a positive number. "
            "Unset it for the default (10).",
        ),
    ],
)
def test_policy_refuses_what_is_not_a_number(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        stuck.policy_from_env({name: value})
    assert str(e.value) == message


def test_activity_carries_the_longest_pause_and_reads_an_older_listener() -> None:
    activity = Activity("", 3.0, 1.5)
    assert Activity.decode(activity.encode()) == activity
    assert Activity.decode(b"all-reduce\t4.0") == Activity("all-reduce", 4.0, 0.0)
    assert Activity.decode(b"x\t1\t2\t3") is None and Activity.decode(b"x\t1\tlong") is None
