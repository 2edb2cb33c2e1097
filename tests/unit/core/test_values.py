"""Distributed values, ValueContext, regroup/select_replica: semantics doc §1.3, §2.7, §3.1."""

from __future__ import annotations

import collections

import pytest
import strategyjob as sj
import torch
from strategyjob import _values


@pytest.fixture
def mirrored() -> sj.MirroredStrategy:
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


def test_values_are_tuples_and_print_like_tensorflow() -> None:
    value = sj.PerReplica([1, 2])
    assert value.values == (1, 2) and isinstance(value.values, tuple)
    assert str(value) == "PerReplica:{\n  0: 1,\n  1: 2\n}"
    assert repr(sj.Mirrored(["a"])) == "Mirrored:{\n  0: 'a'\n}"
    assert str(sj.Mirrored(["a"])) == "Mirrored:{\n  0: a\n}"
    assert str(sj.DistributedValues([torch.tensor(1)])) == "DistributedValues:{\n  0: tensor(1)\n}"
    with pytest.raises(ValueError, match="at least one component"):
        sj.PerReplica([])


def test_values_property_is_read_only() -> None:
    value = sj.PerReplica([1, 2])
    with pytest.raises(AttributeError):
        value.values = (3, 4)


def test_per_replica_outside_replica_context() -> None:
    value = sj.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(ValueError) as err:
        torch.add(value, 1)
    assert str(err.value) == (
        "It looks like you are using a PerReplica object while not inside a replica context, "
        "which is not supported. Try running your op or function inside a replica context by "
        "using `strategy.run`"
    )
    with pytest.raises(TypeError):
        value + 1


def test_per_replica_in_replica_context_uses_local_component(
    mirrored: sj.MirroredStrategy,
) -> None:
    value = sj.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    # passed through a closure (not args), so run does not unwrap it
    result = mirrored.run(lambda: torch.mul(value, 10))
    assert [float(v) for v in result.values] == [10.0, 20.0]


def test_mirrored_delegates_operators() -> None:
    v = sj.Mirrored((7, 8))
    assert v + 1 == 8
    assert 13 - v == 6
    assert 10.5 / v == 1.5
    assert 16 % v == 2
    assert pow(v, 3, 10) == 3
    assert ~v == ~7
    assert v * 2 == 14 and 2 * v == 14 and -v == -7 and abs(v) == 7
    assert v // 2 == 3 and 50 // v == 7 and v**2 == 49 and 2**v == 128
    assert (v < 8, v <= 7, v > 6, v >= 8) == (True, True, True, False)
    assert (v & 3, 3 | v, v ^ 1, v << 1, v >> 1) == (3, 7, 6, 14, 3)
    with pytest.raises(TypeError):
        v[2]


def test_mirrored_delegates_attributes() -> None:
    v = sj.Mirrored([torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])])
    assert v.shape == (2,)
    assert v.sum().item() == 3.0
    assert v[1].item() == 2.0
    assert (v @ torch.tensor([1.0, 1.0])).item() == 3.0
    assert torch.add(v, 1).tolist() == [2.0, 3.0]
    with pytest.raises(AttributeError):
        v.no_such_attribute  # noqa: B018
    with pytest.raises(AttributeError):
        v._private  # noqa: B018


def test_mirrored_in_replica_context_reads_local_component(mirrored: sj.MirroredStrategy) -> None:
    v = sj.Mirrored((torch.tensor(1.0), torch.tensor(2.0)))
    result = mirrored.run(lambda: v + 0)
    assert [float(x) for x in result.values] == [1.0, 2.0]


def test_value_context() -> None:
    ctx = sj.ValueContext(2, 4)
    assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (2, 4)
    assert str(ctx) == "tf.distribute.ValueContext(replica id 2,  total replicas in sync: 4)"
    default = sj.ValueContext()
    assert (default.replica_id_in_sync_group, default.num_replicas_in_sync) == (0, 1)
    with pytest.raises(AttributeError):
        ctx.num_replicas_in_sync = 3


# --- regroup / select_replica -------------------------------------------------------------------


def test_regroup_rules() -> None:
    a, b = torch.tensor(1), torch.tensor(2)
    assert _values.regroup((a,)) is a
    assert _values.regroup((1, 1)) == 1
    wrapped = _values.regroup((a, b))
    assert isinstance(wrapped, sj.PerReplica) and wrapped.values == (a, b)
    forced = _values.regroup((a, a), always_wrap=True)
    assert isinstance(forced, sj.PerReplica) and forced.values == (a, a)
    mirrored = _values.regroup((a, b), wrap_class=sj.Mirrored)
    assert isinstance(mirrored, sj.Mirrored)


def test_regroup_structures() -> None:
    Pair = collections.namedtuple("Pair", "left right")
    out = _values.regroup(
        ({"x": [1, Pair(1, "s")]}, {"x": [2, Pair(3, "s")]}),
    )
    assert out["x"][0].values == (1, 2)
    assert isinstance(out["x"][1], Pair)
    assert out["x"][1].left.values == (1, 3) and out["x"][1].right == "s"
    with pytest.raises(ValueError, match="different keys"):
        _values.regroup(({"a": 1}, {"b": 1}))
    with pytest.raises(ValueError, match="different structures"):
        _values.regroup(([1, 2], [1]))


def test_regroup_components_of_a_distributed_variable(mirrored: sj.MirroredStrategy) -> None:
    with mirrored.scope():
        var = sj.Variable(1.0)
    assert _values.regroup(var.values) is var
    assert _values.regroup((var, var)) is var
    assert mirrored.run(lambda: var) is var


def test_select_replica(mirrored: sj.MirroredStrategy) -> None:
    with mirrored.scope():
        var = sj.Variable(1.0)
    structure = {"p": sj.PerReplica([1, 2]), "m": sj.Mirrored([3, 3]), "v": var, "c": 9}
    picked = _values.select_replica(1, structure)
    assert picked == {"p": 2, "m": 3, "v": var, "c": 9}
    assert _values.select_replica(0, (sj.PerReplica(["a", "b"]),)) == ("a",)


def test_select_replica_passes_tuples_of_plain_values_as_they_are(
    mirrored: sj.MirroredStrategy,
) -> None:
    # run()'s usual arguments: nothing to pick, so no copy per step; containers a replica
    # function may change are still its own.
    x, y = torch.ones(2), torch.zeros(2)
    args = (x, (y, 3))
    assert _values.select_replica(1, args) is args
    nested_list = (x, [y])
    picked = _values.select_replica(0, nested_list)
    assert picked == (x, [y]) and picked[1] is not nested_list[1]
    kwargs: dict = {}
    assert (
        _values.select_replica(0, kwargs) == {} and _values.select_replica(0, kwargs) is not kwargs
    )
    assert _values.select_replica(1, (x, (sj.PerReplica([1, 2]),))) == (x, (2,))

    seen = []

    def fn(items: list) -> None:
        items.append(sj.get_replica_context().replica_id_in_sync_group)
        seen.append(list(items))

    shared: list = []
    mirrored.run(fn, args=(shared,))
    assert shared == [] and sorted(len(s) for s in seen) == [1, 1]


def test_replica_id_is_an_int32_tensor_made_once(mirrored: sj.MirroredStrategy) -> None:
    ids = mirrored.run(lambda: sj.get_replica_context().replica_id_in_sync_group)
    assert [t.dtype for t in ids.values] == [torch.int32, torch.int32]
    assert [int(t) for t in ids.values] == [0, 1]
    ctx = sj.ReplicaContext(mirrored, 1)
    assert ctx.replica_id_in_sync_group is ctx.replica_id_in_sync_group
