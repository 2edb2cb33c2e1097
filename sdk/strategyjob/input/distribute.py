"""The two entry points strategies call: ``distribute_dataset`` and
``distribute_datasets_from_function`` (semantics §4.1, §4.4)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from . import dataloader_sharding
from . import rebatch as streams
from .distributed import DistributedDataset
from .input_context import InputContext
from .options import AutoShardPolicy, InputOptions, InputReplicationMode, validate_function_options
from .sharding import (
    Split,
    declared_files,
    effective_policy,
    select_files,
    split_for,
    static_batch_size,
)
from .splitting import batch_sizes_for_worker
from .structure import batch_size_of, tensors_of, unbatched_error

__all__ = ["distribute_dataset", "distribute_datasets_from_function"]


def _topology(extended: Any) -> tuple[int, int, int, int]:
    """``(R, W, w, Rw)`` of the strategy, checking that replicas divide evenly among workers."""
    topology = extended.topology
    num_replicas, num_workers = topology.num_replicas_in_sync, topology.num_workers
    if num_replicas % num_workers != 0:
        raise ValueError(
            "tf.distribute expects every worker to have the same number of replicas. However, "
            f"encountered `num_replicas_in_sync` ({num_replicas}) that cannot be divided by "
            f"`num_workers` ({num_workers})"
        )
    return num_replicas, num_workers, topology.worker_index, len(topology.local_devices)


def _as_policy(policy: Any) -> AutoShardPolicy:
    try:
        return AutoShardPolicy(policy)
    except ValueError:
        raise ValueError(
            f"auto_shard_policy must be a strategyjob.experimental.AutoShardPolicy (AUTO, FILE, "
            f"DATA, HINT or OFF), got {policy!r}"
        ) from None


def _check_iterable(value: Any, what: str) -> None:
    if not isinstance(value, Iterable):
        raise TypeError(
            f"{what} must be an iterable of batches (a torch DataLoader, a list of tensors, a "
            f"generator, a FileDataset…), got {type(value).__name__}"
        )


def _resolve_hints(dataset: Any, num_shards: int, index: int) -> Any:
    if getattr(dataset, "has_shard_hint", False):
        return dataset.resolve_shard_hint(num_shards, index)
    return dataset


class _Plan:
    """What this worker does with the input: the decisions, made once per distributed dataset."""

    def __init__(
        self, dataset: Any, extended: Any, policy: AutoShardPolicy, rebatch_input: bool
    ) -> None:
        self.dataset = dataset
        self.num_replicas, self.num_workers, self.worker_index, self.num_local = _topology(extended)
        self.policy = effective_policy(policy, dataset, self.num_workers)
        self.split_input = rebatch_input and self.num_replicas > 1
        self.batch_size = None
        if self.split_input and self.policy != AutoShardPolicy.DATA:
            self.batch_size = static_batch_size(
                dataset, lambda element: batch_size_of(tensors_of(element, 1), 1)
            )
        self.split = split_for(self.policy, self.batch_size)
        self._local_loader: Any = None  # built once, so persistent loader workers persist

    def worker_source(self, dataset: Any) -> Any:
        """The input this worker reads: its files under FILE, hints resolved under HINT."""
        workers, index = self.num_workers, self.worker_index
        if self.policy == AutoShardPolicy.HINT:
            return _resolve_hints(dataset, workers, index)
        dataset = _resolve_hints(dataset, 1, 0)
        if self.policy == AutoShardPolicy.FILE and workers > 1:
            files = select_files(declared_files(dataset), workers, index)
            return dataset.with_files(files)
        return dataset

    def steps(self) -> tuple[Iterator[list[Any]], int | None]:
        """A new pass over this worker's steps (``Rw`` entries each), and how many it has where
        that is known exactly."""
        source = self.worker_source(self.dataset)
        data_sharded = self.policy == AutoShardPolicy.DATA and self.num_workers > 1
        if not self.split_input:
            if data_sharded:
                elements = streams.round_robin(source, self.num_workers, self.worker_index)
                return streams.group_steps(elements, self.num_local), None
            count = streams.step_count(streams.exact_length(source), self.num_local)
            return streams.group_steps(source, self.num_local), count
        if self.split == Split.BALANCED:
            assert self.batch_size is not None  # split_for balances only a known batch size
            sizes = batch_sizes_for_worker(
                self.batch_size, self.num_workers, self.num_local, self.worker_index
            )
            sub_batches = streams.balanced_sub_batches(source, sizes, self.num_replicas)
        elif data_sharded and dataloader_sharding.can_shard_indices(source):
            if self._local_loader is None:
                self._local_loader = dataloader_sharding.local_loader(
                    source, self.num_replicas, self.num_workers, self.worker_index
                )
            sub_batches = dataloader_sharding.sub_batches(self._local_loader)
            # each global batch gives this worker one sub-batch per local replica: one step
            steps = streams.group_steps(sub_batches, self.num_local)
            return steps, streams.exact_length(self._local_loader)
        else:
            sub_batches = streams.ceil_fill_sub_batches(source, self.num_replicas)
            if data_sharded:
                sub_batches = streams.round_robin(sub_batches, self.num_workers, self.worker_index)
        return streams.group_steps(sub_batches, self.num_local), None


def distribute_dataset(
    dataset: Iterable[Any],
    *,
    extended: Any,
    options: InputOptions | None = None,
    auto_shard_policy: AutoShardPolicy = AutoShardPolicy.AUTO,
    rebatch: bool = True,
) -> DistributedDataset:
    """Split and shard an iterable of **global** batches across the strategy's replicas.

    Backs ``Strategy.experimental_distribute_dataset``. Each element is a tensor or a nested
    tuple/list/dict of tensors batched on dim 0; see ``AutoShardPolicy`` for the sharding and
    semantics §4.2 for the exact splits. ``rebatch=False`` treats elements as per-replica
    batches that local replicas take in turn.
    """
    options = InputOptions() if options is None else options
    if options.experimental_replication_mode == InputReplicationMode.PER_REPLICA:
        raise NotImplementedError(
            "InputReplicationMode.PER_REPLICA is only supported in "
            "`distribute_datasets_from_function`."
        )
    _check_iterable(dataset, "The dataset")
    plan = _Plan(dataset, extended, _as_policy(auto_shard_policy), rebatch)
    if (
        plan.split_input
        and isinstance(dataset, DataLoader)
        and dataset.batch_size is None
        and dataset.batch_sampler is None
    ):
        raise unbatched_error(
            plan.num_replicas,
            "The DataLoader has batch_size=None, so its elements have no batch dimension; give it "
            "the global batch size.",
        )
    return DistributedDataset(
        plan.steps,
        extended,
        fetch_to_device=bool(options.experimental_fetch_to_device),
    )


def distribute_datasets_from_function(
    dataset_fn: Callable[[InputContext], Iterable[Any]],
    *,
    extended: Any,
    options: InputOptions | None = None,
    allow_per_replica: bool | None = None,
) -> DistributedDataset:
    """Call ``dataset_fn`` once per input pipeline; its batches are already per-replica.

    No rebatching or auto-sharding: ``dataset_fn`` shards with its ``InputContext``. Local
    replicas take one element each per step, in replica order. PER_REPLICA builds one dataset per
    local replica; it is allowed in single-worker strategies unless ``allow_per_replica`` says
    otherwise (TensorFlow allows it only for MirroredStrategy).
    """
    validate_function_options(options)
    options = InputOptions() if options is None else options
    num_replicas, num_workers, worker_index, num_local = _topology(extended)
    fetch = bool(
        options.experimental_fetch_to_device or options.experimental_place_dataset_on_device
    )
    if options.experimental_replication_mode == InputReplicationMode.PER_REPLICA:
        allowed = num_workers == 1 if allow_per_replica is None else allow_per_replica
        if not allowed:
            raise NotImplementedError(
                "InputReplicationMode.PER_REPLICA is only supported in "
                "`experimental_distribute_datasets_from_function` of "
                "tf.distribute.MirroredStrategy"
            )
        datasets = []
        for local_id in range(num_local):
            context = InputContext(
                num_replicas, extended.topology.global_replica_id(local_id), num_replicas
            )
            datasets.append(dataset_fn(context))
            _check_iterable(datasets[-1], "The value returned by `dataset_fn`")
        return DistributedDataset(
            lambda: (streams.zip_steps(datasets), None), extended, fetch_to_device=fetch
        )
    dataset = dataset_fn(InputContext(num_workers, worker_index, num_replicas))
    _check_iterable(dataset, "The value returned by `dataset_fn`")

    def make_pass() -> tuple[Iterator[list[Any]], int | None]:
        count = streams.step_count(streams.exact_length(dataset), num_local)
        return streams.group_steps(dataset, num_local), count

    return DistributedDataset(make_pass, extended, fetch_to_device=fetch)
