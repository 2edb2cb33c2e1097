"""Every cross-replica reduction goes local-first, then through ``extended.collectives``.

MultiWorkerMirroredStrategy's backend runs torch.distributed collectives; here a fake peer
worker (pure logic, a ``CollectiveBackend``) stands in for the other process so the routing can
be checked: global element counts for MEAN with ``axis``, one collective per batch, gradients
of all_reduce.
"""

from __future__ import annotations

import pytest
import strategyjob as sj
import torch
from strategyjob.collective.backend import CollectiveBackend, InProcessCollectives
from strategyjob.strategies.mirrored import MirroredExtended


class _FakePeer(InProcessCollectives):
    """This worker's backend with one peer, whose contributions come from ``peer`` (one entry
    per call) and ``gathered_from_peer``."""

    num_workers = 2

    def __init__(self) -> None:
        super().__init__()
        self.peer: list[list[torch.Tensor]] = []
        self.calls: list[tuple[sj.ReduceOp, list[torch.Tensor]]] = []
        self.gathered_from_peer: list[torch.Tensor] = []

    def all_reduce(self, tensors, op):
        self.calls.append((op, [t.clone() for t in tensors]))
        contributions = self.peer.pop(0)
        return [t + torch.as_tensor(p, dtype=t.dtype) for t, p in zip(tensors, contributions)]

    def all_gather(self, tensor, axis):
        return torch.cat([tensor, self.gathered_from_peer.pop(0)], dim=axis)


class _FakePeerExtended(MirroredExtended):
    """Worker 0 of two."""

    _num_workers = 2
    _worker_index = 0

    def __init__(self, strategy: sj.Strategy, devices: list[str]) -> None:
        super().__init__(strategy, devices)
        self.collectives = _FakePeer()
        assert isinstance(self.collectives, CollectiveBackend)


class _FakePeerStrategy(sj.Strategy):
    def __init__(self, devices: list[str]) -> None:
        super().__init__(_FakePeerExtended(self, devices))


def test_reduce_mean_with_axis_all_reduces_numerator_and_denominator() -> None:
    strategy = _FakePeerStrategy(["cpu:0"])
    # the peer holds [4, 5]
    strategy.extended.collectives.peer = [[torch.tensor(9.0)], [torch.tensor(2)]]
    result = strategy.reduce("MEAN", torch.tensor([0.0, 1.0, 2.0, 3.0]), axis=0)
    assert float(result) == 2.5  # (6 + 9) / (4 + 2)
    ops = [op for op, _ in strategy.extended.collectives.calls]
    assert ops == [sj.ReduceOp.SUM, sj.ReduceOp.SUM]
    assert [float(t[0]) for _, t in strategy.extended.collectives.calls] == [6.0, 4.0]


def test_host_value_with_one_local_replica_is_all_reduced() -> None:
    strategy = _FakePeerStrategy(["cpu:0"])
    strategy.extended.collectives.peer = [[torch.tensor(1.0)]]
    assert float(strategy.reduce("SUM", torch.tensor(1.0), axis=None)) == 2.0
    assert strategy.num_replicas_in_sync == 2


def test_local_replicas_are_summed_before_the_cross_worker_call() -> None:
    strategy = _FakePeerStrategy(["cpu:0", "cpu:1"])
    assert strategy.num_replicas_in_sync == 4
    assert [strategy.extended.topology.global_replica_id(i) for i in range(2)] == [0, 1]
    strategy.extended.collectives.peer = [[torch.tensor([10.0, 10.0])]]
    value = sj.PerReplica([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])])
    assert strategy.reduce("MEAN", value, axis=None).tolist() == [3.5, 4.0]  # (4+10)/4, (6+10)/4
    ((op, sent),) = strategy.extended.collectives.calls
    assert op == sj.ReduceOp.SUM and sent[0].tolist() == [4.0, 6.0]


def test_all_reduce_in_replicas_issues_one_batched_call() -> None:
    strategy = _FakePeerStrategy(["cpu:0", "cpu:1"])
    strategy.extended.collectives.peer = [[torch.tensor(100.0), torch.tensor([1, 1])]]

    def fn() -> tuple:
        i = int(sj.get_replica_context().replica_id_in_sync_group)
        return sj.get_replica_context().all_reduce(
            "sum", (torch.tensor(float(i)), torch.tensor([i, 2 * i]))
        )

    scalars, vectors = strategy.run(fn)
    assert [float(v) for v in scalars.values] == [101.0, 101.0]
    assert [v.tolist() for v in vectors.values] == [[2, 3], [2, 3]]
    assert len(strategy.extended.collectives.calls) == 1


def test_gather_concatenates_local_then_workers() -> None:
    strategy = _FakePeerStrategy(["cpu:0", "cpu:1"])
    strategy.extended.collectives.gathered_from_peer = [torch.tensor([5, 6])]
    value = sj.PerReplica([torch.tensor([1, 2]), torch.tensor([3])])
    assert strategy.gather(value, axis=0).tolist() == [1, 2, 3, 5, 6]


def test_values_from_function_use_global_replica_ids() -> None:
    class _SecondWorker(_FakePeerExtended):
        _worker_index = 1

    strategy = _FakePeerStrategy(["cpu:0", "cpu:1"])
    strategy._extended = _SecondWorker(strategy, ["cpu:0", "cpu:1"])
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync)
    )
    assert [v.values for v in values] == [(2, 3), (4, 4)]


# --- gradients of all_reduce (semantics §2.4) -------------------------------------------------


@pytest.mark.parametrize(("op", "grad"), [("sum", 6.0), ("mean", 3.0)])
def test_all_reduce_gradient_is_all_reduce_of_upstream(op: str, grad: float) -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])

    def fn() -> torch.Tensor:
        i = int(sj.get_replica_context().replica_id_in_sync_group)
        x = torch.tensor(i + 1.0, requires_grad=True)
        y = sj.get_replica_context().all_reduce(op, x * 2)
        (y * (i + 1)).backward()  # upstream gradients 1 and 2
        return x.grad

    grads = strategy.run(fn)
    assert [float(g) for g in grads.values] == [grad, grad]


def test_all_reduce_without_grad_does_not_track() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        out = strategy.run(lambda: sj.get_replica_context().all_reduce("sum", x * 1))
    assert all(not v.requires_grad for v in out.values)


def test_all_gather_gradient_is_this_replicas_slice_of_the_summed_gradient() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])

    def fn() -> torch.Tensor:
        i = int(sj.get_replica_context().replica_id_in_sync_group)
        x = torch.ones(i + 1, requires_grad=True)  # lengths 1 and 2 -> gathered length 3
        gathered = sj.get_replica_context().all_gather(x, axis=0)
        weights = torch.tensor([1.0, 2.0, 3.0]) * (i + 1)  # upstream 1x and 2x
        (gathered * weights).sum().backward()
        return x.grad

    grads = strategy.run(fn)
    # summed upstream gradient is 3 * [1, 2, 3]; replica 0 owns [0:1], replica 1 owns [1:3]
    assert [g.tolist() for g in grads.values] == [[3.0], [6.0, 9.0]]


def test_all_gather_gradient_along_a_later_axis() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])

    def fn() -> torch.Tensor:
        x = torch.zeros(2, 1, requires_grad=True)
        gathered = sj.get_replica_context().all_gather(x, axis=1)  # shape (2, 2)
        (gathered * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
        return x.grad

    grads = strategy.run(fn)
    assert [g.tolist() for g in grads.values] == [[[2.0], [6.0]], [[4.0], [8.0]]]
