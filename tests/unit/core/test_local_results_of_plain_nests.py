"""``experimental_local_results`` of values that hold no distributed value, as TensorFlow 2.21
returns them (checked against it: ``{"a": 1.0, "b": (2, 3)}`` under a 2-replica
MirroredStrategy gives two copies of the dict; ``5`` gives ``(5,)``)."""

from __future__ import annotations

import collections

import pytest
import strategyjob as sj

Point = collections.namedtuple("Point", "x y")


@pytest.fixture
def mirrored() -> sj.MirroredStrategy:
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


@pytest.mark.parametrize(
    "nest", [{"a": 1.0, "b": (2, 3)}, [1, 2], (1,), {}, [], Point(1, 2)], ids=repr
)
def test_a_plain_nest_gives_one_copy_per_local_replica(mirrored, nest) -> None:  # type: ignore[no-untyped-def]
    results = mirrored.experimental_local_results(nest)
    assert isinstance(results, tuple) and len(results) == 2
    assert results[0] == nest and results[1] == nest
    assert type(results[0]) is type(nest)
    assert results[0] is not nest and results[0] is not results[1]  # copies, as TF's


@pytest.mark.parametrize("leaf", [5, "abc", None, 1.5])
def test_a_single_plain_value_gives_itself_once(mirrored, leaf) -> None:  # type: ignore[no-untyped-def]
    assert mirrored.experimental_local_results(leaf) == (leaf,)


def test_a_nest_mixing_distributed_and_plain_values_is_split(mirrored) -> None:  # type: ignore[no-untyped-def]
    value = {"d": sj.PerReplica([10, 11]), "p": (2, 3)}
    assert mirrored.experimental_local_results(value) == (
        {"d": 10, "p": (2, 3)},
        {"d": 11, "p": (2, 3)},
    )


def test_central_storage_gives_one_copy_per_compute_device() -> None:
    css = sj.CentralStorageStrategy(["cpu:0", "cpu:1"])
    assert css.experimental_local_results({"plain": 1.0}) == ({"plain": 1.0},) * 2


def test_one_replica_strategies_return_the_nest_once() -> None:
    nest = {"a": 1.0}
    assert sj.MultiWorkerMirroredStrategy().experimental_local_results(nest) == (nest,)
    assert sj.OneDeviceStrategy("cpu:0").experimental_local_results(nest) == (nest,)
    assert sj.get_strategy().experimental_local_results(nest) == (nest,)
