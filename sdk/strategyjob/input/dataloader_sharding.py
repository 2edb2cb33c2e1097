"""DATA sharding of a ``DataLoader`` over a map-style dataset without reading everything.

TensorFlow's DATA policy makes every worker read every example and drop the ones that are not
its own. A map-style dataset can do better: the batch sampler says which indices make up each
global batch, so each worker asks its dataset only for the indices of its own sub-batches. The
rebuilt loader keeps the original's worker processes, pinning and seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from .sharding import sub_batch_ids_for_worker
from .splitting import ceil_fill_sizes, offsets
from .structure import empty_like

__all__ = ["can_shard_indices", "local_loader", "sub_batches"]

# One step's request: the index list of each local replica's sub-batch, plus one index of the
# global batch to build empty batches from when none of this worker's sub-batches has rows.
_Request = tuple[tuple[list[int], ...], int | None]


def can_shard_indices(dataset: Any) -> bool:
    """A DataLoader whose batches come from a batch sampler over a map-style dataset."""
    return (
        isinstance(dataset, DataLoader)
        and not isinstance(dataset.dataset, IterableDataset)
        and dataset.batch_sampler is not None
    )


class _LocalSubBatchIndices(Sampler):
    """For each global batch of the original batch sampler, this worker's sub-batch indices."""

    def __init__(
        self,
        batch_sampler: Iterable[Sequence[int]],
        num_replicas: int,
        num_workers: int,
        worker_index: int,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_replicas = num_replicas
        self.sub_batch_ids = sub_batch_ids_for_worker(num_replicas, num_workers, worker_index)

    def __iter__(self) -> Iterator[_Request]:
        for indices in self.batch_sampler:
            indices = list(indices)
            bounds = offsets(ceil_fill_sizes(len(indices), self.num_replicas))
            mine = tuple(indices[slice(*bounds[i])] for i in self.sub_batch_ids)
            template = indices[0] if indices and not any(mine) else None
            yield mine, template

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


class _SubBatchFetcher(Dataset):
    """Loads and collates each requested sub-batch; empty ones are shaped like a loaded one."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def _load(self, indices: list[int]) -> Any:
        getitems = getattr(self.dataset, "__getitems__", None)
        examples = getitems(indices) if getitems else [self.dataset[i] for i in indices]
        return self.collate_fn(examples)

    def __getitem__(self, request: _Request) -> list[Any]:
        index_lists, template_index = request
        loaded = [self._load(indices) if indices else None for indices in index_lists]
        template = next((batch for batch in loaded if batch is not None), None)
        if template is None and template_index is not None:
            template = self._load([template_index])
        if template is None:  # an empty global batch: nothing to shape the empties after
            return loaded
        return [empty_like(template) if batch is None else batch for batch in loaded]


def _as_is(batch: Any) -> Any:
    return batch


def local_loader(
    loader: DataLoader, num_replicas: int, num_workers: int, worker_index: int
) -> DataLoader:
    """A loader of this worker's DATA-sharded sub-batches: one list of ``Rw`` per global batch."""
    kwargs: dict[str, Any] = {
        "batch_size": None,
        "sampler": _LocalSubBatchIndices(
            cast("Iterable[Sequence[int]]", loader.batch_sampler),  # batch_size is set
            num_replicas,
            num_workers,
            worker_index,
        ),
        "collate_fn": _as_is,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(_SubBatchFetcher(loader.dataset, loader.collate_fn), **kwargs)


def sub_batches(local: DataLoader) -> Iterator[Any]:
    """The sub-batches of a :func:`local_loader`, one after another."""
    for step in local:
        yield from step
