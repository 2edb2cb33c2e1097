"""The small ``tf.nest`` used by regroup, all_reduce and all_gather."""

from __future__ import annotations

import collections

import pytest
from strategyjob import _nest

Point = collections.namedtuple("Point", "x y")


def test_flatten_and_pack_round_trip() -> None:
    structure = {"b": [1, (2, 3)], "a": Point(4, {"z": 5, "y": 6})}
    flat = _nest.flatten(structure)
    assert flat == [4, 6, 5, 1, 2, 3]  # mapping keys in sorted order
    rebuilt = _nest.pack_sequence_as(structure, flat)
    assert rebuilt == structure and isinstance(rebuilt["a"], Point)
    assert list(rebuilt) == ["b", "a"]  # insertion order of the template kept


def test_dicts_built_in_different_orders_pair_up() -> None:
    assert _nest.flatten({"a": 1, "b": 2}) == _nest.flatten({"b": 2, "a": 1})


def test_map_structure_and_errors() -> None:
    assert _nest.map_structure(lambda a, b: a + b, [1, (2,)], [10, (20,)]) == [11, (22,)]
    assert _nest.map_structure(str, 7) == "7"
    with pytest.raises(ValueError, match="same nested structure"):
        _nest.map_structure(lambda a, b: a, [1], [1, 2])
    with pytest.raises(ValueError, match="same keys"):
        _nest.map_structure(lambda a, b: a, {"a": 1}, {"b": 1})
    with pytest.raises(ValueError, match="more leaves"):
        _nest.pack_sequence_as([0], [1, 2])
