"""Which rows of a global batch a replica computes on, and those rows cut out of a batch.

Pure arithmetic and structure (no torch, no Keras): the binding of each strategy splits Keras's
global batches with these, one replica per worker (``_binding``) or several replicas in one
process (``_local``).
"""

from __future__ import annotations

from typing import Any

from strategyjob import _nest
from strategyjob.input.splitting import batch_sizes_for_worker, offsets

__all__ = ["local_rows", "rows_of", "slice_rows"]


def local_rows(global_rows: int, num_replicas: int, replica: int) -> tuple[int, int]:
    """``(start, stop)`` of replica ``replica``'s slice of a batch of ``global_rows`` rows.

    The balanced split of the distributed iterator: the first ``global_rows % num_replicas``
    replicas take one row more, slices are consecutive in replica order, so gathering them in
    replica order gives the batch back in row order. A short last batch leaves some replicas
    with no row (``start == stop``), never a row twice.
    """
    sizes = batch_sizes_for_worker(global_rows, num_replicas, 1, 0)
    return offsets(sizes)[replica]


def rows_of(data: Any) -> int:
    """Rows of a batch: the first dimension of its first array."""
    for leaf in _nest.flatten(data):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    raise ValueError("strategyjob.keras: a batch holds no array to split over the replicas.")


def slice_rows(data: Any, start: int, stop: int, rows: int) -> Any:
    """The rows ``[start, stop)`` of every array of the batch (others as they are)."""

    def rows_of_leaf(leaf: Any) -> Any:
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) > 0 and int(shape[0]) == rows:
            return leaf[start:stop]
        return leaf

    return _nest.map_structure(rows_of_leaf, data)
