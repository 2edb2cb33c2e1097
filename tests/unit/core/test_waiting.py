"""Who a waiting task names: the pure logic of ``strategyjob.collective.waiting``."""

from __future__ import annotations

import pytest
from strategyjob.collective import waiting
from strategyjob.collective.waiting import Activity, Reporter


def test_reporter_is_due_once_per_interval_even_after_a_long_stall() -> None:
    reporter = Reporter(10.0, start=100.0)
    assert [reporter.due(t) for t in (105.0, 110.0, 115.0)] == [False, True, False]
    assert reporter.due(145.0) and not reporter.due(149.0) and reporter.due(150.0)


def test_activity_survives_the_wire_and_garbage_is_unknown() -> None:
    for activity in (Activity("all-reduce", 12.5), Activity("", 3.0)):
        assert Activity.decode(activity.encode()) == activity
    assert Activity.decode(b"") is None and Activity.decode(b"x\tsoon") is None
    assert Activity("", 21.4).describe() == "not in a collective for 21 s"
    assert Activity("broadcast", 7).describe() == "in broadcast for 7 s"


def test_not_arrived_are_peers_in_no_or_another_collective() -> None:
    activities = {
        "/job:worker/replica:0/task:1": Activity("all-reduce", 5.0),
        "/job:worker/replica:0/task:2": Activity("", 30.0),
        "/job:worker/replica:0/task:3": Activity("broadcast", 6.0),
        "/job:worker/replica:0/task:4": None,  # did not say: not named
    }
    absent = waiting.not_arrived(activities, "all-reduce")
    assert list(absent) == ["/job:worker/replica:0/task:2", "/job:worker/replica:0/task:3"]
    line = waiting.collective_line("/job:worker/replica:0/task:0", "all-reduce", 20.2, absent)
    assert line == (
        "/job:worker/replica:0/task:0 waiting 20 s in all-reduce for "
        "/job:worker/replica:0/task:2 (not in a collective for 30 s), "
        "/job:worker/replica:0/task:3 (in broadcast for 6 s)"
    )


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_positive_seconds_refuses_what_is_not(value: str) -> None:
    with pytest.raises(ValueError) as e:
        waiting.positive_seconds("X_SECONDS", 10.0, {"X_SECONDS": value})
    assert str(e.value) == (
        f"X_SECONDS={value!r} is not a positive number of seconds. Unset it for the default (10)."
    )
    assert waiting.positive_seconds("X_SECONDS", 10.0, {}) == 10.0
    assert waiting.positive_seconds("X_SECONDS", 10.0, {"X_SECONDS": "2.5"}) == 2.5
