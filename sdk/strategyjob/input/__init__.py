"""Input distribution: splitting and sharding global batches across replicas and workers.

Public names mirror ``tf.distribute`` (``InputContext``, ``InputOptions``,
``InputReplicationMode``) and ``tf.data.experimental`` (``AutoShardPolicy``, ``SHARD_HINT``).
Strategies call :func:`distribute_dataset` and :func:`distribute_datasets_from_function`.
"""

from __future__ import annotations

from .datasets import FileDataset, ShardedDataset, shard
from .distribute import distribute_dataset, distribute_datasets_from_function
from .distributed import DistributedDataset, DistributedIterator, Optional
from .input_context import InputContext
from .options import SHARD_HINT, AutoShardPolicy, InputOptions, InputReplicationMode
from .splitting import batch_sizes_for_worker, ceil_fill_sizes

__all__ = [
    "SHARD_HINT",
    "AutoShardPolicy",
    "DistributedDataset",
    "DistributedIterator",
    "FileDataset",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "Optional",
    "ShardedDataset",
    "batch_sizes_for_worker",
    "ceil_fill_sizes",
    "distribute_dataset",
    "distribute_datasets_from_function",
    "shard",
]
