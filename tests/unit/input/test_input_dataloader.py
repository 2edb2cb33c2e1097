"""DataLoader input, and DATA sharding that loads only each worker's own examples."""

from __future__ import annotations

import pytest
import torch
from input_fakes import FakeCluster, FakeExtended, steps_of
from strategyjob.input import AutoShardPolicy, distribute_dataset
from strategyjob.input.dataloader_sharding import can_shard_indices
from strategyjob.strategies import base  # noqa: F401  (the default strategy the fakes fall back to)
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset


class CountingDataset(Dataset):
    """A map-style dataset that records which indices were loaded (thread-safe append)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.loaded.append(index)
        return torch.tensor([float(index), -float(index)]), torch.tensor(index)


def test_global_batch_dataloader_over_tensor_dataset() -> None:
    features = torch.arange(20, dtype=torch.float32).reshape(10, 2)
    labels = torch.arange(10)
    loader = DataLoader(TensorDataset(features, labels), batch_size=4)
    steps = list(distribute_dataset(loader, extended=FakeExtended(2)))
    assert len(steps) == 3
    x, y = steps[0]
    assert [v.tolist() for v in y.values] == [[0, 1], [2, 3]]
    assert torch.equal(x.values[1], features[2:4])
    assert [v.tolist() for v in steps[2][1].values] == [[8], [9]]


@pytest.mark.parametrize("shuffle", [False, True])
def test_data_sharding_loads_only_each_workers_examples(shuffle: bool) -> None:
    datasets = [CountingDataset(14), CountingDataset(14)]

    def worker(extended: FakeExtended) -> list:
        dataset = datasets[extended.topology.worker_index]
        generator = torch.Generator().manual_seed(7)  # the same order on every worker
        loader = DataLoader(dataset, batch_size=8, shuffle=shuffle, generator=generator)
        distributed = distribute_dataset(loader, extended=extended)
        return [[y.tolist() for _, y in [step]] for step in distributed]

    chief, other = FakeCluster(2).run(1, worker)
    chief_labels = [labels for (labels,) in chief]
    other_labels = [labels for (labels,) in other]
    # Each worker loaded exactly the examples it returned, and together they saw each once.
    assert sorted(datasets[0].loaded) == sorted(x for labels in chief_labels for x in labels)
    assert sorted(datasets[1].loaded) == sorted(x for labels in other_labels for x in labels)
    assert sorted(datasets[0].loaded + datasets[1].loaded) == list(range(14))
    if not shuffle:
        assert chief_labels == [[0, 1, 2, 3], [8, 9, 10]]
        assert other_labels == [[4, 5, 6, 7], [11, 12, 13]]


def test_data_sharding_of_a_dataloader_matches_reading_everything() -> None:
    def run(make_loader) -> list:
        def worker(extended: FakeExtended) -> list:
            return steps_of(
                distribute_dataset(make_loader(), extended=extended),
                len(extended.topology.local_devices),
            )

        return FakeCluster(2).run(2, worker)

    data = TensorDataset(torch.arange(13))
    sharded = run(lambda: DataLoader(data, batch_size=8))
    everything = run(lambda: iter(DataLoader(data, batch_size=8)))  # a plain iterator
    assert sharded == everything
    # Step 2, b=5 over R=4: ceil-fill [8,9][10,11][12][]; worker w's replica r gets r*W + w.
    assert sharded[0][1] == [[[8, 9], [12]]]
    assert sharded[1][1] == [[[10, 11], []]]


def test_empty_local_sub_batches_are_shaped_like_the_data() -> None:
    # Worker 1 of 2 (Rw=2) gets no rows of a 1-example global batch: it loads one example
    # to shape its empty batches, and returns none of it.
    dataset = CountingDataset(1)
    extended = FakeExtended(num_local=2, num_workers=2, worker_index=1)
    loader = DataLoader(dataset, batch_size=4)
    (step,) = list(distribute_dataset(loader, extended=extended))
    x, y = step
    assert [tuple(v.shape) for v in x.values] == [(0, 2), (0, 2)]
    assert [v.dtype for v in y.values] == [torch.int64, torch.int64]


@pytest.mark.timeout(60)
def test_data_sharding_with_worker_processes() -> None:
    data = TensorDataset(torch.arange(12))

    def worker(index: int) -> list:
        # One worker at a time, in this thread: forking loader workers from a threaded
        # process is unsafe. DATA sharding gives every worker the same number of steps.
        extended = FakeExtended(num_local=1, num_workers=2, worker_index=index)
        loader = DataLoader(data, batch_size=6, num_workers=1, multiprocessing_context="fork")
        return steps_of(distribute_dataset(loader, extended=extended), 1)

    chief, other = worker(0), worker(1)
    assert chief == [[[[0, 1, 2]]], [[[6, 7, 8]]]]
    assert other == [[[[3, 4, 5]]], [[[9, 10, 11]]]]


def test_off_policy_reads_the_original_loader() -> None:
    dataset = CountingDataset(4)
    extended = FakeExtended(num_local=1, num_workers=2, worker_index=1)
    loader = DataLoader(dataset, batch_size=2)
    list(distribute_dataset(loader, extended=extended, auto_shard_policy=AutoShardPolicy.OFF))
    assert dataset.loaded == [0, 1, 2, 3]


def test_which_loaders_can_be_sharded_by_index() -> None:
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    assert can_shard_indices(DataLoader(TensorDataset(torch.arange(4)), batch_size=2))
    assert not can_shard_indices(DataLoader(Stream(), batch_size=2))
    assert not can_shard_indices(DataLoader(TensorDataset(torch.arange(4)), batch_size=None))
    assert not can_shard_indices([torch.arange(4)])


def test_every_pass_over_a_data_sharded_loader_reuses_one_local_loader() -> None:
    dataset = CountingDataset(6)
    extended = FakeExtended(num_local=1, num_workers=2, worker_index=0)
    distributed = distribute_dataset(DataLoader(dataset, batch_size=4), extended=extended)
    first = steps_of(distributed, 1)
    second = steps_of(distributed, 1)
    assert first == second
    assert [y for step in first for (_, y) in step] == [[0, 1], [4]]
    assert dataset.loaded == [0, 1, 4, 0, 1, 4]
