"""The terminal curves of ``strategyjob metrics --plot`` (pure)."""

from __future__ import annotations

import math

from strategyjob.client._curves import curve, curves, terminal_curves


def test_a_rising_series_is_an_area_chart_with_its_labels():
    lines = curve("loss", [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)], width=8, height=2)
    assert lines == [
        "loss  last 3 at step 4",
        "3 │  ▃█",  # the top row: levels 8..16
        "0 │ ▅██",  # the bottom row: levels 0..8 (0, 5, 11, 16 of 16)
        "   1  4",
    ]


def test_steps_are_bucketed_into_the_columns_by_their_mean():
    points = [(s, float(s % 2)) for s in range(100)]  # 0, 1, 0, 1, ...: each bucket's mean 0.5
    points.append((100, 1.0))
    lines = curve("x", points, width=12, height=1)
    assert len(lines[1]) == 12 and set(lines[1][3:-1]) == {"▄"}
    assert lines[-1].split() == ["0", "100"]


def test_flat_single_and_non_finite_series_are_drawn_without_failing():
    assert curve("flat", [(1, 2.0), (2, 2.0)], width=10, height=2)[1:3] == ["2 │", "2 │██"]
    single = curve("acc", [(5, 0.5)], width=10, height=2)
    assert single[0] == "acc  last 0.5 at step 5" and single[-1].strip() == "5"
    assert curve("bad", [(1, math.nan), (2, math.inf)]) == ["bad: no value"]
    mixed = curve("m", [(1, 1.0), (2, math.nan), (3, 3.0)], width=10, height=2)
    assert mixed[0] == "m  last 3 at step 3"


def test_every_metric_is_drawn_in_name_order():
    text = curves({"loss": [(1, 1.0), (2, 0.5)], "acc": [(1, 0.1), (2, 0.9)]}, width=20, height=2)
    assert [line for line in text.splitlines() if "last" in line] == [
        "acc  last 0.9 at step 2",
        "loss  last 0.5 at step 2",
    ]


def test_terminal_curves_fit_the_width_and_the_lines_given():
    series = {name: [(1, 1.0), (2, 2.0)] for name in ("acc", "loss", "lr")}
    whole = terminal_curves(series, columns=200).splitlines()
    assert len(whole) == 3 * 9 - 1  # header, 6 rows, axis; a blank line between charts
    assert max(len(line) for line in whole) <= 120  # wider, a few points are spread thin
    assert terminal_curves(series, columns=200, lines=26).splitlines() == whole
    two = terminal_curves(series, columns=60, lines=25).splitlines()
    assert len(two) == 18 and two[-1] == "not drawn, no room: lr"
    assert two[9].startswith("loss  last 2 at step 2")
    assert terminal_curves(series, columns=60, lines=8) == "not drawn, no room: acc, loss, lr"
