"""The coordinator's membership decision: which workers join and leave on a resize."""

from __future__ import annotations

import pytest
from strategyjob.ps._membership import Change, change

A, B, C, D = "10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222", "10.0.0.4:2222"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({0: A, 1: B}, {0: A, 1: B}, Change()),
        ({0: A, 1: B}, {0: A, 1: B, 2: C, 3: D}, Change(added=(2, 3))),
        ({0: A, 1: B, 2: C, 3: D}, {0: A}, Change(removed=(1, 2, 3))),
        ({0: A, 1: B, 2: C, 3: D}, {0: A, 2: C, 3: D}, Change(removed=(1,))),  # sparse: kept
        ({0: A}, {0: A, 1: C, 2: D}, Change(added=(1, 2))),
        ({0: A, 1: B}, {0: A, 1: C}, Change(added=(1,), removed=(1,))),  # moved: a new worker
        ({}, {1: B, 0: A}, Change(added=(0, 1))),
        ({0: A, 1: B}, {}, Change(removed=(0, 1))),
    ],
    ids=["same", "grow", "shrink", "remove-middle", "regrow", "moved", "first", "all-gone"],
)
def test_change_names_the_workers_that_join_and_leave(old, new, expected):
    assert change(old, new) == expected


def test_no_change_is_false_and_any_change_true():
    assert not change({0: A}, {0: A})
    assert change({0: A}, {0: A, 1: B})
    assert change({0: A, 1: B}, {0: A})
