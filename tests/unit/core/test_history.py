"""The metric history's bound, its restart rule and its file format (pure)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from strategyjob._history import DEFAULT_MAX_POINTS, MetricHistory, thin


def test_a_long_run_stays_bounded_and_covers_the_whole_run():
    history = MetricHistory()
    for step in range(100_000):
        history.add(step, {"loss": 1 / (step + 1)})
    points = history.series()["loss"]
    steps = [s for s, _ in points]
    assert len(points) <= DEFAULT_MAX_POINTS
    assert steps == sorted(steps)
    assert steps[0] == 0  # the start of the run is still there
    assert steps[-500:] == list(range(99_500, 100_000))  # the newest half, every report
    gaps = {b - a for a, b in itertools.pairwise(steps) if b < 99_500}
    assert len(gaps) <= 2  # older steps evenly sampled (one stride, and the seam)
    assert len(history.to_json()) < 30_000  # about 30 KB per metric, whatever the length


def test_a_restarted_job_continues_its_curve_from_the_step_it_resumed_at():
    history = MetricHistory()
    for step in range(1, 31):
        history.add(step, {"loss": float(step)})
    history.add(21, {"loss": -21.0})  # resumed from the checkpoint of step 20
    history.add(22, {"loss": -22.0})
    points = history.series()["loss"]
    assert points[-3:] == [(20, 20.0), (21, -21.0), (22, -22.0)]
    assert len(points) == 22  # not doubled


def test_only_finite_numbers_are_kept_per_metric():
    history = MetricHistory()
    history.add(1, {"loss": 0.5, "phase": "train", "nan": "nan", "inf": math.inf, "ok": True})
    history.add(2, {"loss": 0.25, "acc": 1})
    assert history.series() == {"acc": [(2, 1.0)], "loss": [(1, 0.5), (2, 0.25)]}
    assert len(history) == 3


def test_points_as_the_reporter_writes_them_and_malformed_ones_skipped():
    history = MetricHistory()
    malformed = [["x", {"loss": 1}], [2], [True, {}]]
    history.add_points([[1, {"loss": 2.0}], *malformed, [3, {"loss": 1.0}]])
    history.add_points({"not": "a list"})
    assert history.series() == {"loss": [(1, 2.0), (3, 1.0)]}


def test_the_file_round_trips_and_bad_files_say_what_is_wrong():
    history = MetricHistory(max_points=10)
    for step in range(50):
        history.add(step, {"loss": step / 2, "lr": 0.1})
    again = MetricHistory.from_json(history.to_json())
    assert again.series() == history.series()
    assert again.max_points == 10
    with pytest.raises(ValueError, match="invalid JSON"):
        MetricHistory.from_json("{")
    with pytest.raises(ValueError, match="no 'series' object"):
        MetricHistory.from_json("[]")
    with pytest.raises(ValueError, match="version 2 is not 1"):
        MetricHistory.from_json(json.dumps({"version": 2, "series": {}}))
    with pytest.raises(ValueError, match="max_points must be 2 or more"):
        MetricHistory(max_points=1)


def test_a_history_read_back_at_every_report_thins_as_one_kept_in_memory():
    """The operator reads, extends and writes the history at each report: its sampling state
    travels in the JSON, or the older half would soon hold only the newest steps."""
    kept, text = MetricHistory(max_points=40), MetricHistory(max_points=40).to_json()
    for step in range(2_000):
        kept.add(step, {"loss": step / 7})
        again = MetricHistory.from_json(text)
        again.add(step, {"loss": step / 7})
        text = again.to_json()
    assert MetricHistory.from_json(text).series() == kept.series()
    assert text == kept.to_json()
    assert kept.series()["loss"][0][0] == 0 and kept.series()["loss"][5][0] > 200


def test_a_document_without_or_with_a_bad_sampling_state_is_sampled_afresh():
    history = MetricHistory(max_points=10)
    for step in range(50):
        history.add(step, {"loss": float(step)})
    document = json.loads(history.to_json())
    for bad in (None, {"loss": [3, 40]}, {"loss": [2, 1]}, {"loss": "x"}):
        document["sampling"] = bad
        again = MetricHistory.from_json(json.dumps(document))
        assert again.series() == history.series()  # few enough points: all kept
    document["series"]["loss"].append([3, 1.0])  # steps out of order: re-added, tail rule
    assert MetricHistory.from_json(json.dumps(document)).series()["loss"][-1] == (3, 1.0)


@pytest.mark.parametrize("count", [0, 1, 2, 3, 9, 257, 1000])
def test_thin_keeps_at_most_the_limit_and_always_the_newest(count):
    points = list(range(count))
    kept = thin(points, 8)
    assert len(kept) <= 8 and kept == sorted(kept)
    assert kept[-4:] == points[-4:]  # the newest half stays whole
