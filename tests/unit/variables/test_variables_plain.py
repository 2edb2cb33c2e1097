"""The plain ``strategyjob.Variable`` (default strategy): values, updates, torch interop, enums."""

from __future__ import annotations

import numpy as np
import pytest
import strategyjob
import torch
from strategyjob import _variables
from strategyjob._variables import IndexedSlices, VariableAggregation, VariableSynchronization


def test_enum_values_match_tensorflow():
    assert [(m.name, m.value) for m in VariableSynchronization] == [
        ("AUTO", 0),
        ("NONE", 1),
        ("ON_WRITE", 2),
        ("ON_READ", 3),
    ]
    assert [(m.name, m.value) for m in VariableAggregation] == [
        ("NONE", 0),
        ("SUM", 1),
        ("MEAN", 2),
        ("ONLY_FIRST_REPLICA", 3),
    ]
    assert strategyjob.VariableAggregation is VariableAggregation
    assert strategyjob.VariableSynchronization is VariableSynchronization


def test_plain_variable_properties():
    v = strategyjob.Variable(1.0)
    assert isinstance(v, strategyjob.Variable)
    assert type(v) is strategyjob.Variable
    assert v.name == "Variable:0"
    assert v.dtype == torch.float32
    assert v.shape == torch.Size([])
    assert v.device == "/job:localhost/replica:0/task:0/device:CPU:0"
    assert v.trainable is True
    assert v.synchronization is VariableSynchronization.AUTO
    assert v.aggregation is VariableAggregation.NONE
    assert v.distribute_strategy is None
    assert v.numpy() == np.float32(1.0)
    assert repr(v) == "<strategyjob.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>"


def test_named_variable_and_array_repr():
    v = strategyjob.Variable([1.0, 2.0], name="w")
    assert v.name == "w:0"
    assert v.shape == (2,)
    assert "numpy=\narray([1., 2.], dtype=float32)" in repr(v)


def test_on_read_defaults_to_not_trainable():
    v = strategyjob.Variable(0.0, synchronization=VariableSynchronization.ON_READ)
    assert v.trainable is False
    assert strategyjob.Variable(0.0, trainable=False).trainable is False


def test_invalid_enum_values():
    with pytest.raises(ValueError, match="Invalid variable aggregation mode: 7 for variable: x"):
        strategyjob.Variable(1.0, name="x", aggregation=7)
    with pytest.raises(ValueError, match="Invalid variable synchronization mode: 9"):
        strategyjob.Variable(1.0, synchronization=9)


def test_initial_value_required_and_callable_accepted():
    with pytest.raises(ValueError, match="initial_value"):
        strategyjob.Variable(None)
    v = strategyjob.Variable(lambda: torch.ones(3))
    assert v.numpy().tolist() == [1.0, 1.0, 1.0]


def test_initial_value_is_copied():
    source = torch.zeros(2)
    v = strategyjob.Variable(source)
    source += 5
    assert v.numpy().tolist() == [0.0, 0.0]


def test_assign_family_returns_updated_value():
    v = strategyjob.Variable(1.0)
    assert float(v.assign(6.0)) == 6.0
    assert float(v.assign_add(2.0)) == 8.0
    assert float(v.assign_sub(3.0)) == 5.0
    assert v.assign(0.5, read_value=False) is None
    assert float(v) == 0.5


def test_read_value_is_a_snapshot():
    v = strategyjob.Variable(1.0)
    snapshot = v.read_value()
    v.assign(2.0)
    assert float(snapshot.detach()) == 1.0
    assert float(v.read_value().detach()) == 2.0


def test_assign_shape_mismatch_message():
    v = strategyjob.Variable(1.0)
    with pytest.raises(ValueError) as err:
        v.assign([1.0, 2.0])
    assert str(err.value) == (
        "Cannot assign value to variable ' Variable:0': Shape mismatch.The variable shape (), "
        "and the assigned value shape (2,) are incompatible."
    )
    with pytest.raises(ValueError, match=r"shapes must be equal"):
        strategyjob.Variable([1.0, 2.0]).assign_add([1.0, 2.0, 3.0])


def test_assign_casts_to_the_variable_dtype():
    v = strategyjob.Variable(torch.tensor([1, 2], dtype=torch.int32))
    v.assign(torch.tensor([3.0, 4.0]))
    assert v.dtype == torch.int32
    assert v.numpy().tolist() == [3, 4]


def test_torch_interop_reads_current_value():
    v = strategyjob.Variable([[1.0, 2.0], [3.0, 4.0]])
    x = torch.eye(2)
    assert torch.equal(torch.matmul(x, v).detach(), v.read_value().detach())
    assert (v + 1).detach().tolist() == [[2.0, 3.0], [4.0, 5.0]]
    assert (1 + v).detach().tolist() == [[2.0, 3.0], [4.0, 5.0]]
    assert (x @ v).detach().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert (10 - v).detach()[0].tolist() == [9.0, 8.0]
    assert (-v).detach()[1].tolist() == [-3.0, -4.0]
    assert v[1].detach().tolist() == [3.0, 4.0]
    assert np.asarray(v).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    v.assign([[0.0, 0.0], [0.0, 0.0]])
    assert torch.sum(v).item() == 0.0


def test_trainable_variable_gets_gradients():
    w = strategyjob.Variable([1.0, 2.0])
    loss = (w * w).sum()
    loss.backward()
    assert w.grad.tolist() == [2.0, 4.0]
    frozen = strategyjob.Variable([1.0], trainable=False)
    assert not (frozen * 2).requires_grad


def test_variable_hashes_by_identity():
    a, b = strategyjob.Variable(1.0), strategyjob.Variable(1.0)
    assert len({a, b}) == 2


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("scatter_update", [10.0, 2.0, 30.0]),
        ("scatter_add", [11.0, 2.0, 33.0]),
        ("scatter_sub", [-9.0, 2.0, -27.0]),
        ("scatter_mul", [10.0, 2.0, 90.0]),
        ("scatter_div", [0.1, 2.0, 0.1]),
        ("scatter_min", [1.0, 2.0, 3.0]),
        ("scatter_max", [10.0, 2.0, 30.0]),
    ],
)
def test_scatter_ops(op, expected):
    v = strategyjob.Variable([1.0, 2.0, 3.0])
    delta = IndexedSlices(values=torch.tensor([10.0, 30.0]), indices=torch.tensor([0, 2]))
    result = getattr(v, op)(delta)
    assert result.tolist() == pytest.approx(expected)
    assert v.numpy().tolist() == pytest.approx(expected)


def test_scatter_needs_indexed_slices():
    with pytest.raises(TypeError, match="sparse_delta is not IndexedSlices"):
        strategyjob.Variable([1.0]).scatter_add(torch.tensor([1.0]))


def test_sync_on_read_context_is_reentrant():
    with _variables.variable_sync_on_read_context():
        with _variables.variable_sync_on_read_context():
            assert _variables._in_sync_on_read_context()
        assert _variables._in_sync_on_read_context()
    assert not _variables._in_sync_on_read_context()


def test_deepcopy_and_pickle_keep_the_value():
    import copy
    import pickle

    v = strategyjob.Variable([1.0, 2.0], name="w")
    clone = copy.deepcopy(v)
    clone.assign([3.0, 4.0])
    assert v.numpy().tolist() == [1.0, 2.0]
    restored = pickle.loads(pickle.dumps(v))
    assert restored.name == "w:0"
    assert restored.numpy().tolist() == [1.0, 2.0]
    assert float(restored.assign_add([1.0, 1.0])[0]) == 2.0


def test_every_kind_of_variable_answers_tensor_protocol(mirrored):
    """``__tf_tensor__`` (TensorFlow's TensorProtocol) is the live tensor torch operations read:
    gradients reach the variable; a cross-replica read of a mirrored variable is its primary
    component, of a sync-on-read one the aggregate; a central variable's is the wrapped one's."""
    plain = strategyjob.Variable(torch.ones(2))
    with mirrored.scope():
        on_write = strategyjob.Variable(torch.ones(2))
        on_read = strategyjob.Variable(
            torch.ones(2),
            synchronization=VariableSynchronization.ON_READ,
            aggregation=VariableAggregation.SUM,
        )
    central = strategyjob.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with central.scope():
        aggregating = strategyjob.Variable(torch.ones(2), aggregation=VariableAggregation.SUM)
    assert isinstance(aggregating, _variables.AggregatingVariable)
    for v in (plain, on_write, on_read, aggregating):
        assert isinstance(v, _variables.TensorProtocol)
        assert v.__tf_tensor__(torch.float64).dtype == torch.float64
    (plain.__tf_tensor__() * 3).sum().backward()
    assert torch.equal(plain.grad, torch.full((2,), 3.0))
    assert on_write.__tf_tensor__() is on_write.values[0].__tf_tensor__()
    assert torch.equal(on_read.__tf_tensor__(), torch.full((2,), 2.0))
    assert aggregating.__tf_tensor__() is aggregating.get().__tf_tensor__()
