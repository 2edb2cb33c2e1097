"""ShardedVariable over local variables (pure): TensorFlow's worked examples."""

from __future__ import annotations

import re

import pytest
import torch
from strategyjob._variables import IndexedSlices, Variable
from strategyjob.ps.sharded_variable import ShardedVariable, embedding_lookup


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def shards(*parts):
    return ShardedVariable([Variable(t(p)) for p in parts])


def values(sv):
    return [v.read_value().tolist() for v in sv.variables]


def test_construction_errors():
    with pytest.raises(
        TypeError, match=re.escape("should be a non-empty list of `variables.Variable`s")
    ):
        ShardedVariable([])
    with pytest.raises(ValueError, match="must have the same dtype"):
        ShardedVariable([Variable(t([1.0])), Variable(torch.tensor([1]))])
    with pytest.raises(ValueError, match="same shapes except for the first axis"):
        ShardedVariable([Variable(t([[1.0]])), Variable(t([[1.0, 2.0]]))])


def test_shape_and_iteration():
    sv = shards([[0, 0]], [[1, 1], [2, 2]], [[3, 3]])
    assert sv.shape == torch.Size([4, 2])
    assert list(sv) == sv.variables
    assert torch.equal(sv.read_value(), t([[0, 0], [1, 1], [2, 2], [3, 3]]))
    assert torch.equal(sv + 1, t([[1, 1], [2, 2], [3, 3], [4, 4]]))


def test_assign_and_assign_add_slice_by_rows():
    sv = shards([[0, 0]], [[1, 1], [2, 2]], [[3, 3]])
    assert sv.assign(t([[4, 4], [5, 5], [6, 6], [7, 7]])) is sv
    assert values(sv) == [[[4, 4]], [[5, 5], [6, 6]], [[7, 7]]]
    sv = shards([[0, 0]], [[1, 1], [2, 2]], [[3, 3]])
    sv.assign_add(t([[1, 1], [1, 1], [2, 2], [2, 2]]))
    assert values(sv) == [[[1, 1]], [[2, 2], [4, 4]], [[5, 5]]]
    sv.assign_sub(t([[1, 1], [1, 1], [2, 2], [2, 2]]))
    assert values(sv) == [[[0, 0]], [[1, 1], [2, 2]], [[3, 3]]]
    with pytest.raises(ValueError, match="shapes must be equal"):
        sv.assign(t([[1, 1]]))


def test_indexing():
    sv = shards([[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10]])
    assert sv[3].tolist() == [7, 8]
    assert sv[-1].tolist() == [9, 10]
    assert sv[1:4].tolist() == [[3, 4], [5, 6], [7, 8]]
    assert sv[::2].tolist() == [[1, 2], [5, 6], [9, 10]]
    with pytest.raises(
        IndexError, match=re.escape("ShardedVariable: slice index 5 of dimension 0 out of bounds.")
    ):
        sv[5]


class CountingVariable(Variable):
    """Counts row gathers and refuses whole-table reads."""

    def sparse_read(self, ids, name=None):
        self.gathers = getattr(self, "gathers", 0) + 1
        return self._tensor.detach().index_select(0, ids)

    def read_value(self):
        raise AssertionError("embedding_lookup read a whole shard")


def test_embedding_lookup_touches_each_shard_once():
    parts = [t([[1, 2], [3, 4]]), t([[5, 6], [7, 8]]), t([[9, 10]])]
    sv = ShardedVariable([CountingVariable(p) for p in parts])
    out = embedding_lookup(sv, torch.tensor([[0, 3, 4], [3, 3, 1]]))
    assert out.tolist() == [[[1, 2], [7, 8], [9, 10]], [[7, 8], [7, 8], [3, 4]]]
    assert [v.gathers for v in sv.variables] == [1, 1, 1]


def test_scatter_ops_need_div_sharding():
    sv = shards([[0, 0], [1, 1]], [[2, 2], [3, 3]], [[4, 4]])
    sv.scatter_add(IndexedSlices(t([[10, 10], [20, 20]]), torch.tensor([1, 4])))
    assert sv.read_value()[:, 0].tolist() == [0, 11, 2, 3, 24]
    sv.scatter_update(IndexedSlices(t([[7, 7]]), torch.tensor([2])))
    assert sv.sparse_read(torch.tensor([0, 2, 4]))[:, 0].tolist() == [0, 7, 24]
    not_div = shards([[0, 0]], [[1, 1], [2, 2]])
    with pytest.raises(NotImplementedError, match='does not conform to "div" sharding'):
        not_div.scatter_add(IndexedSlices(t([[1, 1]]), torch.tensor([0])))


@pytest.mark.parametrize(("src", "dst"), [(4, 1), (1, 4), (4, 2), (3, 5)])
def test_state_dict_restores_into_other_shard_counts(src, dst):
    from strategyjob.ps.partitioners import div_partition

    def make(n, fill):
        return ShardedVariable(
            [Variable(fill[o : o + s].clone()) for o, s in div_partition(fill.shape[0], n)]
        )

    full = torch.arange(20.0).reshape(10, 2)
    saved = make(src, full).state_dict()
    target = make(dst, torch.zeros(10, 2))
    target.load_state_dict(saved)
    assert len(target.variables) == dst
    assert torch.equal(target.read_value(), full)
    if (src, dst) == (4, 2):
        small = make(2, torch.zeros(4, 1))
        small.load_state_dict(make(4, torch.arange(4.0).reshape(4, 1)).state_dict())
        assert values(small) == [[[0.0], [1.0]], [[2.0], [3.0]]]
