"""One scatter kernel (``_variables._scatter``) for a variable held here and one held by a ps:
the same rows for the same ``IndexedSlices``, duplicates included."""

from __future__ import annotations

import pytest
import strategyjob as sj
import torch
from strategyjob._variables import IndexedSlices
from strategyjob._variables._scatter import SCATTER_OPS, scatter_
from strategyjob.ps import _transport
from strategyjob.ps import server as ps_server
from strategyjob.ps._transport import Op

INITIAL = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
INDICES = torch.tensor([2, 0, 2])  # row 2 twice
UPDATES = torch.tensor([[2.0, 2.0], [4.0, 0.5], [1.0, 8.0]])

# Each op's rows by hand: what TensorFlow's scatter ops give.
EXPECTED = {
    "scatter_add": [[5.0, 2.5], [3.0, 4.0], [8.0, 16.0]],
    "scatter_sub": [[-3.0, 1.5], [3.0, 4.0], [2.0, -4.0]],
    "scatter_mul": [[4.0, 1.0], [3.0, 4.0], [10.0, 96.0]],
    "scatter_div": [[0.25, 4.0], [3.0, 4.0], [2.5, 0.375]],
    "scatter_min": [[1.0, 0.5], [3.0, 4.0], [1.0, 2.0]],
    "scatter_max": [[4.0, 2.0], [3.0, 4.0], [5.0, 8.0]],
}
UNIQUE = torch.tensor([2, 0])


def _ps_scatter(kind: str, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    store = ps_server.Store()
    store.run(_transport.encode_ops([Op("create", "v", INITIAL)]))
    reply = store.run(_transport.encode_ops([Op(kind, "v", updates, indices, read_back=True)]))
    return _transport.decode_results(reply)[0]


def _plain_scatter(kind: str, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    v = sj.Variable(INITIAL.clone())
    getattr(v, kind)(IndexedSlices(updates, indices))
    return v.read_value()


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_plain_and_ps_variables_scatter_alike(kind):
    expected = torch.tensor(EXPECTED[kind])
    assert torch.equal(_plain_scatter(kind, INDICES, UPDATES), expected)
    assert torch.equal(_ps_scatter(kind, INDICES, UPDATES), expected)


def test_scatter_update_sets_the_rows():
    updates = UPDATES[:2]
    expected = torch.tensor([[4.0, 0.5], [3.0, 4.0], [2.0, 2.0]])
    assert torch.equal(_plain_scatter("scatter_update", UNIQUE, updates), expected)
    assert torch.equal(_ps_scatter("scatter_update", UNIQUE, updates), expected)


def test_an_unknown_kind_is_named():
    assert "scatter_update" in SCATTER_OPS
    with pytest.raises(ValueError, match="Unknown scatter operation 'scatter_nd'"):
        scatter_(INITIAL.clone(), "scatter_nd", INDICES, UPDATES)
