"""A job's metric history in a cluster (issue 31), kept by the operator in the ConfigMap
``<job>-strategyjob-metrics`` (owned by the job, so it goes with it): each report of the
leader carries the reports since its previous one (``points``; where there is room, the newest
of those it carried before again: folding a point twice changes nothing), which are folded into
:class:`strategyjob._history.MetricHistory` (bounded per metric, thinned as the job runs long,
a restart's earlier steps replacing the tail). Pure: the reconciler reads the ConfigMap and
writes what :func:`updated` returns. The operator keeps nothing in memory between passes, so
a restarted operator continues the history where the ConfigMap left it.

Size: at most ``DEFAULT_MAX_POINTS`` (1000) points per metric, about 20 KB of JSON each; a
history over ``MAX_BYTES`` (a ConfigMap holds at most 1 MiB) keeps half as many points per
metric until it fits, so a job reporting 40 metrics still has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strategyjob._history import MetricHistory

#: The most the history's JSON may take in its ConfigMap (whose limit is 1 MiB).
MAX_BYTES = 900_000


def points_of(report: Mapping[str, Any]) -> list[Any]:
    """The reports a leader's annotation carries: its ``points`` (``[[step, {name: value}]]``,
    the reports since the previous annotation), else its own step and metrics."""
    points = report.get("points")
    if isinstance(points, list) and points:
        return points
    return [[report["step"], dict(report.get("metrics") or {})]]


def updated(previous: str | None, report: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The history's new JSON with ``report`` folded in (None: unchanged, nothing to write)
    and a warning when the previous content could not be read (it is replaced)."""
    history, warning = MetricHistory(), None
    if previous:
        try:
            history = MetricHistory.from_json(previous)
        except ValueError as e:
            warning = f"its metric history could not be read ({e}); it starts again"
    history.add_points(points_of(report))
    text = history.to_json()
    while len(text) > MAX_BYTES and history.max_points > 2:
        history = _with_fewer_points(history, history.max_points // 2)
        text = history.to_json()
    return (None if text == previous else text), warning


def _with_fewer_points(history: MetricHistory, max_points: int) -> MetricHistory:
    smaller = MetricHistory(max(max_points, 2))
    for name, points in history.series().items():
        for step, value in points:
            smaller.add(step, {name: value})
    return smaller
