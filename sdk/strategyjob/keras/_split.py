"""Which rows of a global batch a worker computes on (pure arithmetic, no torch, no Keras)."""

from __future__ import annotations

from strategyjob.input.splitting import batch_sizes_for_worker, offsets

__all__ = ["local_rows"]


def local_rows(global_rows: int, num_workers: int, worker_index: int) -> tuple[int, int]:
    """``(start, stop)`` of worker ``worker_index``'s slice of a batch of ``global_rows`` rows.

    The balanced split of the distributed iterator (one replica per worker): the first
    ``global_rows % num_workers`` workers take one row more, slices are consecutive in worker
    order, so gathering them in worker order gives the batch back in row order. A short last
    batch leaves some workers with no row (``start == stop``), never a row twice.
    """
    sizes = batch_sizes_for_worker(global_rows, num_workers, 1, 0)
    return offsets(sizes)[worker_index]
