"""Which sharding and which split apply to an input (semantics §4.2, §4.3).

Pure decisions: they look at the policy, the number of workers and what the input declares
(its files, its static batch size) and never touch tensors.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import InvalidArgumentError
from .options import AutoShardPolicy

__all__ = [
    "Split",
    "declared_files",
    "effective_policy",
    "select_files",
    "split_for",
    "static_batch_size",
    "sub_batch_ids_for_worker",
]


class Split(enum.Enum):
    """The two ways of cutting a global batch (``splitting.py``)."""

    BALANCED = "balanced"
    CEIL_FILL = "ceil-fill"


def declared_files(dataset: Any) -> tuple[str, ...] | None:
    """The files an input declares (``FileDataset`` and look-alikes), or None."""
    files = getattr(dataset, "files", None)
    if files is None or not callable(getattr(dataset, "with_files", None)):
        return None
    return tuple(files)


def effective_policy(policy: AutoShardPolicy, dataset: Any, num_workers: int) -> AutoShardPolicy:
    """AUTO becomes FILE when the input declares enough files for the workers, else DATA."""
    if policy != AutoShardPolicy.AUTO:
        return policy
    files = declared_files(dataset)
    if files is not None and len(files) >= num_workers:
        return AutoShardPolicy.FILE
    return AutoShardPolicy.DATA


def select_files(files: Sequence[str] | None, num_workers: int, worker_index: int) -> list[str]:
    """FILE sharding: worker ``w`` reads files ``w, w + W, …`` (needs ``>= W`` files)."""
    if files is None:
        raise InvalidArgumentError(
            "Could not apply FILE based sharding: the input does not declare its files. Wrap "
            "file-backed input in strategyjob.input.FileDataset, or pass auto_shard_policy="
            "AutoShardPolicy.DATA (or OFF) to experimental_distribute_dataset."
        )
    if len(files) < num_workers:
        raise InvalidArgumentError(
            f"Could not apply FILE based sharding: the dataset only has {len(files)} file(s), "
            f"which is not enough for the required {num_workers} shards/workers. Pass "
            "auto_shard_policy=AutoShardPolicy.DATA (or OFF) to experimental_distribute_dataset, "
            f"or split the input into at least {num_workers} files."
        )
    return list(files[worker_index::num_workers])


def static_batch_size(dataset: Iterable[Any], batch_size_of: Any) -> int | None:
    """The global batch size the input declares, as TF's ``compute_batch_size`` finds it.

    A ``batch_size`` attribute (``DataLoader``, ``FileDataset``) declares it; for a list or
    tuple of batches it is the size shared by all but the last batch (which may be smaller).
    Anything else (generators, custom batch samplers) is unknown: None.
    """
    declared = getattr(dataset, "batch_size", None)
    if isinstance(declared, int) and not isinstance(declared, bool):
        return declared
    if isinstance(dataset, (list, tuple)) and dataset:
        try:
            sizes = [batch_size_of(element) for element in dataset]
        except (ValueError, TypeError, AttributeError):
            return None
        full = sizes[0]
        if all(size == full for size in sizes[:-1]) and sizes[-1] <= full:
            return full
    return None


def split_for(policy: AutoShardPolicy, batch_size: int | None) -> Split:
    """Balanced when the batch size is known, except that DATA sharding rewrites it to ceil-fill."""
    if policy == AutoShardPolicy.DATA or batch_size is None:
        return Split.CEIL_FILL
    return Split.BALANCED


def sub_batch_ids_for_worker(num_replicas: int, num_workers: int, worker_index: int) -> list[int]:
    """DATA sharding: of the ``R`` ceil-fill sub-batches of a global batch, the ones worker
    ``w``'s local replicas get, in local replica order (``r * W + w``)."""
    per_worker = num_replicas // num_workers
    return [r * num_workers + worker_index for r in range(per_worker)]
