"""The history of each metric ``strategyjob.report`` publishes: a bounded series per metric.

Torch-free and pure (the launcher keeps one; the reporter thins with :func:`thin`). Why
bounded: a job reports for days, and its history must stay small wherever it is kept. Each
series holds at most ``max_points`` points, covering the whole run: its newest half one by one
(every report), and older steps sampled evenly, one point in ``stride``, the stride doubling
whenever that half is full (a 100k-step job reporting every step keeps its last 500 steps, and
500 points over the rest of the run, 256 steps apart).

A restarted job resumes from its checkpoint and reports steps it reported before: a step at or
below a series' last one replaces that series' tail from that step on (as TensorBoard drops a
restarted run's orphaned points), so the curve continues from where the job resumed, never
doubled. Only finite numbers are kept: a string, a NaN or an infinity (``report`` publishes
those as strings) is left out of the series.

:meth:`MetricHistory.to_json` keeps each series' sampling state (``sampling``: its stride and
how many points left its tail), so that a history read back and added to thins exactly as one
kept in memory: the operator reads, extends and writes one per report (a ConfigMap), and a
history that restarted its sampling at every read would keep only its newest steps.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_MAX_POINTS", "FORMAT_VERSION", "MetricHistory", "thin"]

#: Points kept per metric by default: about 30 KB of JSON per metric.
DEFAULT_MAX_POINTS = 1000
#: The ``version`` of :meth:`MetricHistory.to_json`'s document.
FORMAT_VERSION = 1

Point = tuple[int, float]


def thin(points: Sequence[Any], limit: int) -> list[Any]:
    """``points`` (oldest first) cut to at most ``limit``: while too many, the older half
    keeps every other point (its newest included) and the newer half stays whole."""
    kept = list(points)
    while len(kept) > max(limit, 2):
        half = len(kept) // 2
        if half < 2:  # nothing left to thin: the newest ones
            return kept[-max(limit, 2) :]
        kept = kept[:half][::-2][::-1] + kept[half:]
    return kept


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class _Series:
    """One metric's points: ``older`` (every ``stride``-th point that left the tail) and
    ``recent`` (the newest, whole)."""

    def __init__(self, max_points: int) -> None:
        self.recent_max = max_points - max_points // 2
        self.older_max = max_points // 2
        self.older: list[Point] = []
        self.recent: collections.deque[Point] = collections.deque()
        self.stride = 1
        self.left = 0  # points that left the tail so far (their ordinal decides the sample)

    def add(self, step: int, value: float) -> None:
        last = self.recent[-1] if self.recent else (self.older[-1] if self.older else None)
        if last is not None and step <= last[0]:  # resumed from a checkpoint: a new tail
            self.older = [p for p in self.older if p[0] < step]
            self.recent = collections.deque(p for p in self.recent if p[0] < step)
        self.recent.append((step, value))
        if len(self.recent) > self.recent_max:
            point = self.recent.popleft()
            if self.left % self.stride == 0:
                self.older.append(point)
            self.left += 1
            if len(self.older) > self.older_max:
                self.older = self.older[::2]
                self.stride *= 2

    def points(self) -> list[Point]:
        return [*self.older, *self.recent]

    def restore(self, points: list[Point], stride: int, left: int) -> bool:
        """Take ``points`` (ascending steps) and the sampling state :meth:`to_json` wrote;
        False, leaving the series empty, when they do not fit together."""
        older_count = max(0, len(points) - self.recent_max)
        steps = [s for s, _ in points]
        if (
            older_count > self.older_max
            or stride < 1
            or stride & (stride - 1)  # strides double from 1
            or left < older_count
            or any(a >= b for a, b in itertools.pairwise(steps))
        ):
            return False
        self.older = points[:older_count]
        self.recent = collections.deque(points[older_count:])
        self.stride, self.left = stride, left
        return True


class MetricHistory:
    """Per metric name, its ``(step, value)`` points in ascending steps, bounded."""

    def __init__(self, max_points: int = DEFAULT_MAX_POINTS) -> None:
        if max_points < 2:
            raise ValueError(f"max_points must be 2 or more, got {max_points}")
        self.max_points = max_points
        self._series: dict[str, _Series] = {}

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        """The metrics reported at ``step``; what is not a finite number is left out."""
        for name, raw in metrics.items():
            value = _finite(raw)
            if value is None:
                continue
            series = self._series.get(str(name))
            if series is None:
                series = self._series[str(name)] = _Series(self.max_points)
            series.add(step, value)

    def add_points(self, points: Any) -> None:
        """Points as the reporter publishes them: ``[[step, {name: value}], ...]``; malformed
        entries are skipped."""
        if not isinstance(points, list):
            return
        for point in points:
            if (
                isinstance(point, list)
                and len(point) == 2
                and isinstance(point[0], int)
                and not isinstance(point[0], bool)
                and isinstance(point[1], Mapping)
            ):
                self.add(point[0], point[1])

    def series(self) -> dict[str, list[Point]]:
        """A copy: metric name -> its points, ascending steps."""
        return {name: series.points() for name, series in sorted(self._series.items())}

    def __len__(self) -> int:
        return sum(len(series.points()) for series in self._series.values())

    def to_json(self) -> str:
        document = {
            "version": FORMAT_VERSION,
            "maxPoints": self.max_points,
            "series": {name: [[s, v] for s, v in pts] for name, pts in self.series().items()},
            "sampling": {
                name: [series.stride, series.left] for name, series in sorted(self._series.items())
            },
        }
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> MetricHistory:
        """Read :meth:`to_json`'s document; ``ValueError`` saying what is wrong otherwise."""
        try:
            document = json.loads(text)
        except ValueError as e:
            raise ValueError(f"not a metric history (invalid JSON: {e})") from None
        if not isinstance(document, dict) or not isinstance(document.get("series"), dict):
            raise ValueError("not a metric history (no 'series' object)")
        version = document.get("version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"metric history version {version!r} is not {FORMAT_VERSION}, the one this "
                "strategyjob reads; read it with the strategyjob that wrote it"
            )
        limit = document.get("maxPoints")
        history = cls(limit if isinstance(limit, int) and limit >= 2 else DEFAULT_MAX_POINTS)
        sampling = document.get("sampling")
        sampling = sampling if isinstance(sampling, dict) else {}
        for name, points in document["series"].items():
            kept = [
                (point[0], value)
                for point in (points if isinstance(points, list) else ())
                if isinstance(point, list)
                and len(point) == 2
                and isinstance(point[0], int)
                and not isinstance(point[0], bool)
                and (value := _finite(point[1])) is not None
            ]
            if not kept:
                continue
            state = sampling.get(name)
            series = _Series(history.max_points)
            if (
                isinstance(state, list)
                and len(state) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in state)
                and series.restore(kept, state[0], state[1])
            ):
                history._series[str(name)] = series
                continue
            for step, value in kept:  # no state (or not this series'): sampled afresh
                history.add(step, {name: value})
        return history
