"""Workers that know their step counts agree on the end of the input once per pass, not per step.

Fake workers step in lock-step threads (``FakeCluster``); the real two-process case is in
``test_input_multiprocess.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from input_fakes import FakeCluster, FakeExtended, steps_of
from strategyjob.errors import InvalidArgumentError
from strategyjob.input import (
    AutoShardPolicy,
    InputContext,
    distribute_dataset,
    distribute_datasets_from_function,
)
from torch.utils.data import DataLoader, Sampler


def run_workers(make: Callable[[FakeExtended], Any], num_local: int = 1) -> list[dict]:
    """Every worker's steps, the step count it offered and its per-step agreements."""

    def worker(extended: FakeExtended) -> dict:
        steps = steps_of(make(extended), num_local)
        return {
            "steps": steps,
            "offered": extended.counts_offered,
            "agreements": extended.any_worker_calls,
        }

    return FakeCluster(2).run(num_local, worker)


def test_equal_dataloader_passes_agree_only_on_their_end() -> None:
    def make(extended: FakeExtended) -> Any:
        loader = DataLoader(torch.arange(16), batch_size=4)
        return distribute_dataset(loader, extended=extended, auto_shard_policy=AutoShardPolicy.DATA)

    chief, worker = run_workers(make)
    assert chief["steps"] == [[[0, 1]], [[4, 5]], [[8, 9]], [[12, 13]]]
    assert worker["steps"] == [[[2, 3]], [[6, 7]], [[10, 11]], [[14, 15]]]
    assert chief["offered"] == worker["offered"] == [4]
    # no agreement during the 4 steps every worker has; one to end the pass
    assert chief["agreements"] == worker["agreements"] == [False]


def test_uneven_counts_agree_per_step_beyond_the_smallest() -> None:
    def make(extended: FakeExtended) -> Any:
        def dataset_fn(ctx: InputContext) -> DataLoader:
            sizes = [5, 2]  # 3 batches of 2 on the chief, 1 on the other worker
            start = 10 * ctx.input_pipeline_id
            data = torch.arange(start, start + sizes[ctx.input_pipeline_id])
            return DataLoader(data, batch_size=2)

        return distribute_datasets_from_function(dataset_fn, extended=extended)

    chief, worker = run_workers(make)
    assert chief["steps"] == [[[0, 1]], [[2, 3]], [[4]]]
    assert worker["steps"] == [[[10, 11]], [[]], [[]]]  # empty batches while the chief has data
    assert chief["offered"] == [3] and worker["offered"] == [1]
    assert chief["agreements"] == [True, True, False]
    assert worker["agreements"] == [False, False, False]


def test_a_worker_that_cannot_count_makes_every_step_agree() -> None:
    def make(extended: FakeExtended) -> Any:
        def dataset_fn(ctx: InputContext) -> Any:
            if ctx.input_pipeline_id == 0:
                return DataLoader(torch.arange(4), batch_size=2)

            def generator() -> Iterator[torch.Tensor]:  # no len(): unknown count
                yield torch.arange(10, 12)
                yield torch.arange(12, 14)

            return generator()

        return distribute_datasets_from_function(dataset_fn, extended=extended)

    chief, worker = run_workers(make)
    assert chief["offered"] == [2] and worker["offered"] == [None]
    assert chief["agreements"] == worker["agreements"] == [True, True, False]
    assert worker["steps"] == [[[10, 11]], [[12, 13]]]


def test_each_pass_exchanges_its_count_again() -> None:
    def make(extended: FakeExtended) -> Any:
        loader = DataLoader(torch.arange(8), batch_size=4)
        distributed = distribute_dataset(loader, extended=extended)
        first = steps_of(distributed, 1)
        second = steps_of(distributed, 1)
        assert first == second
        return distributed

    chief, _worker = run_workers(make)
    assert chief["offered"] == [2, 2, 2]  # two passes in make, one in run_workers


class _LyingSampler(Sampler[int]):
    """Says 5 indices, yields 2: a len() the iterator cannot trust."""

    def __iter__(self) -> Iterator[int]:
        return iter([0, 1])

    def __len__(self) -> int:
        return 5


def test_an_input_shorter_than_its_len_is_an_error_naming_the_worker() -> None:
    class Agreed(FakeExtended):
        def least_count(self, count: int | None) -> int:
            return count or 0  # as if every worker had offered the same count

    loader = DataLoader(torch.arange(5), batch_size=1, sampler=_LyingSampler())
    extended = Agreed(num_local=1, num_workers=2, worker_index=1)
    iterator = iter(distribute_datasets_from_function(lambda ctx: loader, extended=extended))
    assert [next(iterator).tolist() for _ in range(2)] == [[0], [1]]
    with pytest.raises(InvalidArgumentError, match=r"worker 1 ended after 2 steps .* promised 5"):
        next(iterator)
