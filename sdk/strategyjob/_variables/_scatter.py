"""The sparse-update kernel of ``Variable.scatter_*``: one implementation for a variable held
in this process (``_plain``) and one held by a parameter server (``ps.server``), so that both
give the same rows for the same ``IndexedSlices``."""

from __future__ import annotations

import torch

__all__ = ["SCATTER_OPS", "scatter_"]

# The reductions of the ops that combine a row with its update (duplicates included).
_REDUCE = {
    "scatter_mul": "prod",
    "scatter_div": "prod",
    "scatter_min": "amin",
    "scatter_max": "amax",
}
SCATTER_OPS = frozenset(("scatter_update", "scatter_add", "scatter_sub", *_REDUCE))


def scatter_(var: torch.Tensor, kind: str, indices: torch.Tensor, updates: torch.Tensor) -> None:
    """Apply ``kind`` (one of ``SCATTER_OPS``) in place to rows ``indices`` (long, 1-D) of
    ``var`` with ``updates`` (same dtype and device as ``var``); run it under ``no_grad``."""
    if kind == "scatter_update":
        var.index_copy_(0, indices, updates)
    elif kind == "scatter_add":
        var.index_add_(0, indices, updates)
    elif kind == "scatter_sub":
        var.index_add_(0, indices, -updates)
    else:
        try:
            reduce = _REDUCE[kind]
        except KeyError:
            raise ValueError(
                f"Unknown scatter operation {kind!r}: one of {sorted(SCATTER_OPS)}"
            ) from None
        if kind == "scatter_div":
            updates = 1 / updates
        rows = indices.view(-1, *([1] * (updates.dim() - 1))).expand_as(updates)
        var.scatter_reduce_(0, rows, updates, reduce, include_self=True)
