"""Metric curves as text: what ``strategyjob metrics --plot`` draws in a terminal.

Pure and torch-free: a series in, lines out. Each metric is an area chart ``height`` rows high
drawn with the eighth blocks (``▁▂▃▄▅▆▇█``, so each row has eight levels), its steps bucketed
into the columns (a column shows the mean of its bucket; an empty one repeats the column before),
the y-axis labelled with the series' max and min, and a header with the last value and its step.
A flat series is drawn at half height; a single point fills one column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["curve", "curves", "terminal_curves"]

_EIGHTHS = " ▁▂▃▄▅▆▇█"
#: The widest and the rows of the charts the terminal views draw (``status --watch``,
#: ``run --curves``): wider, a chart spreads few points thin.
TERMINAL_MAX_WIDTH = 120
TERMINAL_HEIGHT = 6
Points = Sequence[tuple[int, float]]


def _finite(points: Points) -> list[tuple[int, float]]:
    return [(s, v) for s, v in points if math.isfinite(v)]


def _columns(points: list[tuple[int, float]], width: int) -> list[float]:
    """The points bucketed by step into at most ``width`` columns (each its bucket's mean)."""
    first, last = points[0][0], points[-1][0]
    count = min(width, last - first + 1)
    sums = [0.0] * count
    counts = [0] * count
    for step, value in points:
        i = (step - first) * count // (last - first + 1)
        sums[i] += value
        counts[i] += 1
    columns: list[float] = []
    for total, n in zip(sums, counts, strict=True):
        columns.append(total / n if n else columns[-1])
    return columns


def _label(value: float) -> str:
    return f"{value:.4g}"


def curve(name: str, points: Points, width: int = 60, height: int = 6) -> list[str]:
    """``name``'s chart: a header, ``height`` rows and a step axis; one line when it has no
    finite point."""
    kept = _finite(points)
    if not kept:
        return [f"{name}: no value"]
    last_step, last = kept[-1]
    low, high = min(v for _, v in kept), max(v for _, v in kept)
    margin = max(len(_label(low)), len(_label(high)))
    columns = _columns(kept, max(1, width - margin - 2))
    span = high - low
    levels = [round((v - low) / span * height * 8) if span > 0 else height * 4 for v in columns]
    lines = [f"{name}  last {_label(last)} at step {last_step}"]
    for row in range(height):
        floor = (height - 1 - row) * 8  # the level this row starts at
        cells = "".join(_EIGHTHS[min(8, max(0, level - floor))] for level in levels)
        label = _label(high) if row == 0 else _label(low) if row == height - 1 else ""
        lines.append(f"{label.rjust(margin)} │{cells}".rstrip())
    first_step = str(kept[0][0])
    axis = first_step
    if last_step != kept[0][0]:
        axis += str(last_step).rjust(len(columns) - len(first_step))
    lines.append(" " * (margin + 2) + axis)
    return lines


def curves(series: Mapping[str, Points], width: int = 60, height: int = 6) -> str:
    """Every metric's :func:`curve`, one under the other, a blank line apart."""
    return "\n\n".join("\n".join(curve(n, p, width, height)) for n, p in sorted(series.items()))


def terminal_curves(
    series: Mapping[str, Points],
    columns: int,
    lines: int | None = None,
    height: int = TERMINAL_HEIGHT,
) -> str:
    """:func:`curves` as the terminal views draw them: ``columns`` wide (at most 120). With
    ``lines``, only the charts that fit in that many lines, then one line naming the others:
    a live block taller than the screen cannot be redrawn in place."""
    if lines is not None:
        names = sorted(series)
        per_chart = height + 3  # header, rows, axis, and the blank line between charts
        if len(names) * per_chart - 1 > lines:
            fit = max(0, lines) // per_chart
            drawn = terminal_curves({n: series[n] for n in names[:fit]}, columns, height=height)
            rest = f"not drawn, no room: {', '.join(names[fit:])}"
            return f"{drawn}\n{rest}" if drawn else rest
    return curves(series, width=min(columns, TERMINAL_MAX_WIDTH), height=height)
