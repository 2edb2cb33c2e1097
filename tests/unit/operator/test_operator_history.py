"""The operator's pure part of a job's metric history (issue 31, :mod:`strategyjob_operator.
history`): reports folded in, nothing written when nothing changed, a restart's tail replaced,
unreadable content replaced with a warning, and the ConfigMap's size bounded."""

from __future__ import annotations

import json

from strategyjob._history import MetricHistory
from strategyjob_operator import history, progress


def report(step: int, points: list[tuple[int, float]] | None = None, **metrics: float) -> dict:
    out: dict = {"step": step, "metrics": metrics}
    if points is not None:
        out["points"] = [[s, {"loss": v}] for s, v in points]
    return out


def series(text: str) -> dict:
    return MetricHistory.from_json(text).series()


def test_points_are_folded_in_and_the_same_report_changes_nothing():
    text, warning = history.updated(None, report(2, [(1, 0.5), (2, 0.4)], loss=0.4))
    assert warning is None and text is not None
    assert series(text) == {"loss": [(1, 0.5), (2, 0.4)]}
    again, _ = history.updated(text, report(2, [(1, 0.5), (2, 0.4)], loss=0.4))
    assert again is None  # nothing to write
    more, _ = history.updated(text, report(3, [(3, 0.3)], loss=0.3))
    assert series(more)["loss"] == [(1, 0.5), (2, 0.4), (3, 0.3)]


def test_a_report_without_points_adds_its_own_step():
    text, _ = history.updated(None, report(7, loss=0.25, accuracy=0.9))
    assert series(text) == {"accuracy": [(7, 0.9)], "loss": [(7, 0.25)]}


def test_a_restart_replaces_the_tail():
    text, _ = history.updated(None, report(4, [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]))
    resumed, _ = history.updated(text, report(3, [(3, 2.5)]))
    assert series(resumed)["loss"] == [(1, 4.0), (2, 3.0), (3, 2.5)]


def test_unreadable_content_is_replaced_with_a_warning():
    text, warning = history.updated("{not json", report(1, loss=1.0))
    assert series(text) == {"loss": [(1, 1.0)]}
    assert warning is not None and "could not be read" in warning
    _, warning = history.updated(json.dumps({"version": 99, "series": {}}), report(1, loss=1.0))
    assert "version 99" in warning


def test_the_history_fits_a_configmap_however_many_metrics():
    many = {f"metric_{i:03d}": 0.123456789 + i for i in range(80)}
    points = [[step, many] for step in range(1000)]  # 1000 points of 80 metrics: ~1.7 MB
    text, _ = history.updated(None, {"step": 999, "metrics": many, "points": points})
    assert text is not None and len(text) <= history.MAX_BYTES
    text, _ = history.updated(text, {"step": 1000, "metrics": many})
    assert text is not None and len(text) <= history.MAX_BYTES
    kept = series(text)
    assert len(kept) == 80 and kept["metric_000"][-1][0] == 1000  # every metric, newest step


def test_the_annotation_points_reach_the_report_but_not_the_status():
    raw = json.dumps({"step": 2, "metrics": {"loss": 0.4}, "points": [[1, {"loss": 0.5}]]})
    parsed = progress.parse_report(raw)
    assert parsed is not None and parsed["points"] == [[1, {"loss": 0.5}]]
    assert "points" not in (progress.aggregate(parsed, None) or {})
