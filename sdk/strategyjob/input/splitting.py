"""The two ways TensorFlow cuts a global batch into per-replica batches (semantics §4.2).

Pure integer arithmetic, no torch: the callers slice tensors with the sizes computed here.
"""

from __future__ import annotations

__all__ = ["batch_sizes_for_worker", "ceil_fill_sizes", "offsets"]


def batch_sizes_for_worker(
    global_batch_size: int, num_workers: int, num_replicas_per_worker: int, worker_index: int
) -> list[int]:
    """Balanced split (TF's ``RebatchDatasetV2``): the sizes worker ``worker_index`` cycles through.

    With ``N = W * Rw`` slots, the first ``B % N`` slots get one element more; worker ``w`` uses
    that list rotated left by ``w * Rw`` so that, at every step, the slots the workers consume
    together add up to exactly one global batch. ``(7, 2, 2, 1) -> [2, 1, 2, 2]``.
    """
    if global_batch_size < 0:
        raise ValueError(f"global_batch_size must be >= 0, got {global_batch_size}")
    if num_workers < 1 or num_replicas_per_worker < 1:
        raise ValueError(
            f"num_workers ({num_workers}) and num_replicas_per_worker "
            f"({num_replicas_per_worker}) must both be >= 1"
        )
    if not 0 <= worker_index < num_workers:
        raise ValueError(f"worker_index {worker_index} is not in [0, {num_workers})")
    slots = num_workers * num_replicas_per_worker
    floor, extra = divmod(global_batch_size, slots)
    worker0 = [floor + 1] * extra + [floor] * (slots - extra)
    shift = worker_index * num_replicas_per_worker
    return worker0[shift:] + worker0[:shift]


def ceil_fill_sizes(batch_size: int, num_replicas: int) -> list[int]:
    """Ceil-fill split (TF's legacy ``RebatchDataset``) of one batch of actual size ``b``.

    Replicas take consecutive chunks of ``ceil(b / R)`` until the batch runs out; the rest get
    empty batches. ``(10, 4) -> [3, 3, 3, 1]``, ``(6, 4) -> [2, 2, 2, 0]``.
    """
    if batch_size < 0 or num_replicas < 1:
        raise ValueError(f"invalid split of a batch of {batch_size} over {num_replicas} replicas")
    chunk = -(-batch_size // num_replicas)
    sizes = []
    left = batch_size
    for _ in range(num_replicas):
        take = min(chunk, left)
        sizes.append(take)
        left -= take
    return sizes


def offsets(sizes: list[int]) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of consecutive slices with the given sizes."""
    bounds = []
    start = 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds
