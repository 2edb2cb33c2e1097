"""Fake strategy internals for unit tests of the input layer's pure logic.

``FakeExtended`` carries the ``topology`` ``distribute_dataset`` reads and is its own
``collectives`` (the agreements of a ``CollectiveBackend``). ``FakeCluster`` runs several fake
workers in threads and makes ``any_has_data`` a real lock-step all-reduce among them, like the
process-group backend of MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from strategyjob import _nest
from strategyjob._devices import Topology
from strategyjob._values import PerReplica


class FakeExtended:
    def __init__(
        self,
        num_local: int = 1,
        num_workers: int = 1,
        worker_index: int = 0,
        cluster: FakeCluster | None = None,
        num_replicas: int | None = None,
    ) -> None:
        self.topology = Topology(
            local_devices=tuple(torch.device("cpu") for _ in range(num_local)),
            num_workers=num_workers,
            worker_index=worker_index,
            num_replicas_in_sync=num_local * num_workers if num_replicas is None else num_replicas,
        )
        self._cluster = cluster
        self.counts_offered: list[int | None] = []  # step counts exchanged, one per pass
        self.any_worker_calls: list[bool] = []
        self.answers_collected: list[int] = []  # steps whose agreement the iterator waited on

    @property
    def collectives(self) -> FakeExtended:
        return self

    def any_has_data(self, flag: bool) -> bool:
        self.any_worker_calls.append(flag)
        if self._cluster is None:
            return flag
        return self._cluster.any_has_data(self.topology.worker_index, flag)

    def least_count(self, count: int | None) -> int:
        """Single worker: 0 (agree at every step, as the real base strategy); in a cluster: the
        smallest count, -1 for a worker that cannot count (as MultiWorkerMirroredStrategy)."""
        self.counts_offered.append(count)
        if self._cluster is None:
            return 0
        counts = self._cluster.gather(self.topology.worker_index, -1 if count is None else count)
        return max(min(counts), 0)

    def start_any_has_data(self, flag: bool) -> Callable[[], bool]:
        """Agrees at once (lock-step); records when the iterator asks for the answer."""
        answer = self.any_has_data(flag)
        step = len(self.any_worker_calls) - 1

        def wait() -> bool:
            self.answers_collected.append(step)
            return answer

        return wait


class FakeCluster:
    """Lock-step ``any`` across worker threads (a barrier-based all-reduce)."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._flags = [False] * num_workers
        self._barrier = threading.Barrier(num_workers, timeout=20)

    def any_has_data(self, worker_index: int, flag: bool) -> bool:
        return any(self.gather(worker_index, flag))

    def gather(self, worker_index: int, value: Any) -> list[Any]:
        """Every worker's ``value`` in worker order, once all have given theirs."""
        self._flags[worker_index] = value
        self._barrier.wait()
        result = list(self._flags)
        self._barrier.wait()
        return result

    def run(self, num_local: int, fn: Callable[[FakeExtended], Any]) -> list[Any]:
        """``fn(extended)`` on every worker at once; their results in worker order."""
        results: list[Any] = [None] * self.num_workers
        errors: list[BaseException] = []

        def work(index: int) -> None:
            try:
                results[index] = fn(FakeExtended(num_local, self.num_workers, index, self))
            except BaseException as err:  # reported in the main thread
                errors.append(err)
                self._barrier.abort()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(self.num_workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a fake worker hung"
        if errors:
            raise errors[0]
        return results


def as_lists(value: Any) -> Any:
    """Tensors to nested lists; a PerReplica becomes the list of its components."""
    if isinstance(value, PerReplica):
        return [as_lists(v) for v in value.values]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return _nest.map_structure(as_lists, value) if _nest.is_nested(value) else value


def steps_of(distributed: Any, num_local: int) -> list[list[Any]]:
    """Every step of a distributed dataset as ``[replica0_list, replica1_list, …]``."""
    steps = []
    for element in distributed:
        if num_local == 1:
            steps.append([as_lists(element)])
        else:
            steps.append(as_lists(element))
    return steps


def range_batches(n: int, batch_size: int, drop_remainder: bool = False) -> list[torch.Tensor]:
    """``tf.data.Dataset.range(n).batch(batch_size)`` as a list of int64 tensors."""
    data = torch.arange(n)
    batches = [data[i : i + batch_size] for i in range(0, n, batch_size)]
    if drop_remainder and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches
