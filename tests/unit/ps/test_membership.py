"""The coordinator's membership decision (which workers join and leave on a resize) and the
reading of a cluster's workers from TF_CONFIG's ``cluster`` form."""

from __future__ import annotations

import re

import pytest
from strategyjob.ps._membership import Change, change, workers_of

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


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        ({"chief": [A], "worker": [B, C], "ps": [D]}, {0: B, 1: C}),
        ({"worker": {"0": B, "3": C}}, {0: B, 3: C}),  # sparse, JSON's string keys
        ({"worker": {2: D}}, {2: D}),
    ],
    ids=["list", "sparse", "int-keys"],
)
def test_workers_of_reads_tf_configs_cluster(cluster, expected):
    assert workers_of(cluster) == expected


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        (["worker"], "expected a JSON object like TF_CONFIG's 'cluster'"),
        ({"ps": [A]}, "its 'worker' must be a list of host:port or an object"),
        ({"worker": "10.0.0.1:2222"}, "its 'worker' must be a list"),
        ({"worker": []}, "it names no worker"),
        ({"worker": {"one": A}}, "worker index 'one' is not a non-negative integer"),
        ({"worker": {"-1": A}}, "worker index '-1' is not a non-negative integer"),
        ({"worker": [A, 7]}, "worker 1's address 7 is not host:port"),
        ({"worker": ["nohost"]}, "worker 0's address 'nohost' is not host:port"),
    ],
)
def test_workers_of_refuses_bad_content_saying_what_is_wrong(cluster, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        workers_of(cluster)
