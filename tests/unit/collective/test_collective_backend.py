"""The collective backends' pure logic: the in-process one, the op names, the gather order of
a sub-group, packing by dtype, and how the process-group backend routes each call (a recording
stand-in for ``CollectiveGroup``; the real one is exercised by tests/multiprocess and
tests/tpu)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import strategyjob as sj
import torch
from strategyjob.collective.backend import (
    IN_PROCESS,
    CollectiveBackend,
    InProcessCollectives,
    ProcessGroupCollectives,
    reduce_op_name,
)
from strategyjob.collective.options import CommunicationOptions
from strategyjob.collective.process_group import _packs, gather_order

# --- in-process ------------------------------------------------------------------------------


def test_in_process_collectives_are_identities_of_one_worker() -> None:
    backend = InProcessCollectives()
    assert isinstance(backend, CollectiveBackend)
    assert backend.num_workers == 1 and backend.bucket_bytes == 0
    a, b = torch.ones(2), torch.arange(3)
    reduced = backend.all_reduce([a, b], sj.ReduceOp.SUM)
    assert reduced[0] is a and reduced[1] is b
    assert backend.all_gather(a, 0) is a
    assert backend.broadcast_from_chief(a) is a
    backend.broadcast_from_chief_in_place([a])
    assert a.tolist() == [1.0, 1.0]
    backend.all_reduce_async(a).wait()
    assert a.tolist() == [1.0, 1.0]


def test_in_process_agreements_answer_this_worker_and_keep_the_per_step_check() -> None:
    assert IN_PROCESS.any_has_data(True) is True and IN_PROCESS.any_has_data(False) is False
    assert IN_PROCESS.start_any_has_data(True)() is True
    assert IN_PROCESS.start_any_has_data(False)() is False
    assert IN_PROCESS.least_count(7) == 0 and IN_PROCESS.least_count(None) == 0


def test_in_process_backend_carries_the_timeout_and_is_shared_by_copies() -> None:
    backend = InProcessCollectives(timeout_seconds=5.0)
    assert backend.timeout_seconds == 5.0 and IN_PROCESS.timeout_seconds is None
    assert copy.deepcopy(backend) is backend


def test_strategies_of_one_process_hold_the_in_process_backend() -> None:
    for strategy in (sj.MirroredStrategy(["cpu:0", "cpu:1"]), sj.OneDeviceStrategy("cpu:0")):
        assert isinstance(strategy.extended.collectives, InProcessCollectives)
        assert strategy.extended.collectives.num_workers == 1
    local = sj.MultiWorkerMirroredStrategy(
        communication_options=CommunicationOptions(timeout_seconds=9.0)
    )
    assert isinstance(local.extended.collectives, InProcessCollectives)
    assert local.extended.collectives.timeout_seconds == 9.0  # bounds merge calls


# --- op names, gather order, packing ---------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "name"),
    [(sj.ReduceOp.SUM, "sum"), (sj.ReduceOp.MEAN, "mean"), ("sum", "sum"), ("MEAN", "mean")],
)
def test_reduce_op_names(op: Any, name: str) -> None:
    assert reduce_op_name(op) == name


@pytest.mark.parametrize("op", ["max", None, ["sum"]])
def test_an_unsupported_reduce_op_is_one_clear_line(op: Any) -> None:
    with pytest.raises(ValueError, match=r"^Unsupported reduce op .* use ReduceOp.SUM") as info:
        reduce_op_name(op)
    assert "\n" not in str(info.value)


def test_gather_order_maps_worker_order_to_group_ranks() -> None:
    assert gather_order([0, 2, 4]) is None  # ascending: torch's order already
    assert gather_order([3]) is None
    # replica 0 runs on rank 5, replica 1 on rank 1: group rank 1 first, then group rank 0
    assert gather_order([5, 1]) == [1, 0]
    assert gather_order([4, 0, 2]) == [2, 0, 1]


def test_packs_group_by_dtype_and_cut_at_the_pack_size() -> None:
    f = torch.zeros(4)  # 16 bytes
    i = torch.zeros(4, dtype=torch.int64)  # 32 bytes
    tensors = [f, i, f, f, i]
    assert _packs(tensors, 0) == [[0, 2, 3], [1, 4]]
    assert _packs(tensors, 32) == [[0, 2], [3], [1], [4]]
    assert _packs([], 0) == []


# --- process-group routing -------------------------------------------------------------------


class _Recorder:
    """Stands in for a ``CollectiveGroup`` (or a view of it): records what is asked of it."""

    def __init__(self, name: str, world_size: int, calls: list, options: Any = None) -> None:
        self.name, self.world_size, self.calls = name, world_size, calls
        self.options = options or CommunicationOptions(bytes_per_pack=64, timeout_seconds=3.0)

    def over(self, sub_group: Any, workers: Any = None) -> _Recorder:
        self.calls.append(("over", sub_group, workers))
        return _Recorder("replicas", sub_group.size(), self.calls, self.options)

    def all_reduce(self, tensors: list, op: str) -> list:
        self.calls.append((self.name, "all_reduce", op))
        return [t * self.world_size for t in tensors]

    def all_reduce_async(self, flat: torch.Tensor) -> str:
        self.calls.append((self.name, "all_reduce_async"))
        return "work"

    def wait(self, work: Any, what: str) -> None:
        self.calls.append((self.name, "wait", work, what))

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        self.calls.append((self.name, "all_gather", axis))
        return torch.cat([tensor] * self.world_size, dim=axis)

    def broadcast(self, tensors: list, src: int) -> None:
        self.calls.append((self.name, "broadcast", len(tensors), src))
        for t in tensors:
            t.fill_(7)

    def any(self, flag: bool) -> bool:
        self.calls.append((self.name, "any"))
        return True

    def any_async(self, flag: bool) -> Any:
        self.calls.append((self.name, "any_async"))
        return lambda: True

    def least_count(self, count: int | None) -> int:
        self.calls.append((self.name, "least_count"))
        return 3


def test_reductions_go_across_the_sub_group_and_broadcasts_across_the_cluster() -> None:
    calls: list = []
    cluster = _Recorder("cluster", 4, calls)
    backend = ProcessGroupCollectives(
        cluster, SimpleNamespace(size=lambda: 2), chief=2, workers=[2, 0]
    )
    assert isinstance(backend, CollectiveBackend)
    assert (backend.num_workers, backend.bucket_bytes, backend.timeout_seconds) == (2, 64, 3.0)
    assert calls[0][0] == "over" and calls[0][2] == [2, 0]
    assert [t.tolist() for t in backend.all_reduce([torch.ones(1)], sj.ReduceOp.SUM)] == [[2.0]]
    backend.all_reduce([torch.ones(1)], "mean")
    backend.all_reduce_async(torch.ones(1)).wait()
    assert backend.all_gather(torch.ones(1), 0).tolist() == [1.0, 1.0]
    source = torch.zeros(2)
    copied = backend.broadcast_from_chief(source)
    assert copied.tolist() == [7.0, 7.0] and source.tolist() == [0.0, 0.0]  # a copy
    params = [torch.zeros(1), torch.zeros(2)]
    backend.broadcast_from_chief_in_place(params)
    assert [p.tolist() for p in params] == [[7.0], [7.0, 7.0]]
    backend.broadcast_from_chief_in_place([])  # nothing to send: no collective
    assert backend.any_has_data(False) is True
    assert backend.start_any_has_data(False)() is True
    assert backend.least_count(5) == 3
    assert calls[1:] == [
        ("replicas", "all_reduce", "sum"),
        ("replicas", "all_reduce", "mean"),
        ("replicas", "all_reduce_async"),
        ("replicas", "wait", "work", "gradient all-reduce"),
        ("replicas", "all_gather", 0),
        ("cluster", "broadcast", 1, 2),
        ("cluster", "broadcast", 2, 2),
        ("cluster", "any"),
        ("cluster", "any_async"),
        ("cluster", "least_count"),
    ]
    assert copy.deepcopy(backend) is backend


def test_a_one_replica_sub_group_reduces_nothing_but_still_broadcasts() -> None:
    calls: list = []
    backend = ProcessGroupCollectives(
        _Recorder("cluster", 2, calls), SimpleNamespace(size=lambda: 1)
    )
    a = torch.ones(2)
    assert backend.num_workers == 1
    assert backend.all_reduce([a], "sum")[0] is a
    assert backend.all_gather(a, 0) is a
    backend.all_reduce_async(a).wait()
    backend.broadcast_from_chief_in_place([a])
    assert calls[1:] == [("cluster", "broadcast", 1, 0)]


def test_without_a_sub_group_everything_runs_on_the_cluster_group() -> None:
    calls: list = []
    backend = ProcessGroupCollectives(_Recorder("cluster", 3, calls))
    assert backend.num_workers == 3 and backend.chief == 0
    backend.all_reduce([torch.ones(1)], sj.ReduceOp.MEAN)
    with pytest.raises(ValueError, match="Unsupported reduce op"):
        backend.all_reduce([torch.ones(1)], "max")
    assert calls == [("cluster", "all_reduce", "mean")]
