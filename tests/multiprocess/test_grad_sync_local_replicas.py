"""Gradient synchronisation with several replica threads sharing one module (one process):
``zero_grad`` and ``step`` act once per step and gradients are averaged over the replicas."""

from __future__ import annotations

import pytest
import strategyjob as sj
import torch
import torch.nn.functional as F
from torch import nn


def _data(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _reference(x, y, steps: int, make_opt) -> list[torch.Tensor]:
    model = _model()
    opt = make_opt(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _strategies():
    yield "mirrored-3", lambda: sj.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    yield "mirrored-1", lambda: sj.MirroredStrategy(["cpu:0"])
    yield "central-storage-3", lambda: sj.CentralStorageStrategy(["cpu:0", "cpu:1", "cpu:2"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "make_strategy"), list(_strategies()))
@pytest.mark.parametrize("zero_grad_on", ["optimizer", "module"])
def test_custom_loop_equals_global_batch_training(name, make_strategy, zero_grad_on):
    strategy = make_strategy()
    x, y = _data()

    def make_opt(params):
        return torch.optim.Adam(params, lr=0.05)

    with strategy.scope():
        model = _model()
        opt = make_opt(model.parameters())

    def step_fn(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        (opt if zero_grad_on == "optimizer" else model).zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    steps = 3
    for batch_x, batch_y in strategy.experimental_distribute_dataset([(x, y)] * steps):
        strategy.run(step_fn, args=(batch_x, batch_y))
    for p, q in zip(model.parameters(), _reference(x, y, steps, make_opt)):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)
    assert int(opt.state[model[0].weight]["step"]) == steps  # one real update per step
    assert model[0].weight.grad is not None  # gradients are visible after the step


@pytest.mark.timeout(60)
def test_parameters_outside_scope_are_not_synchronised():
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    model = nn.Linear(2, 1)  # built outside scope: plain torch, untouched by the strategy
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model.weight.grad = torch.ones_like(model.weight)
    before = model.weight.detach().clone()
    opt.step()
    torch.testing.assert_close(model.weight.detach(), before - 1.0)
    del strategy


@pytest.mark.timeout(60)
def test_step_with_closure_is_refused_with_several_local_replicas():
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step_fn() -> None:
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = model(torch.ones(1, 2)).sum()
            loss.backward()
            return loss

        opt.step(closure)

    with pytest.raises(ValueError, match=r"optimizer.step\(closure\) is not supported"):
        strategy.run(step_fn)


def test_buckets_follow_reverse_registration_order_and_sizes():
    from strategyjob.collective.grad_sync import FIRST_BUCKET_BYTES, _build_buckets

    mib = 1024 * 1024 // 4  # float32 elements per MiB
    params = [
        nn.Parameter(torch.zeros(3 * mib)),  # registered first: reduced last
        nn.Parameter(torch.zeros(mib // 2)),
        nn.Parameter(torch.zeros(2, dtype=torch.float64)),
        nn.Parameter(torch.zeros(mib // 2 + 1)),
        nn.Parameter(torch.zeros(4), requires_grad=False),
    ]
    buckets = _build_buckets(params, bucket_bytes=2 * 1024 * 1024)
    index = {id(p): k for k, p in enumerate(params)}
    layout = [[index[id(p)] for p in b.params] for b in buckets]
    # float32: the first bucket closes past 1 MiB, the next ones past 2 MiB; float64 apart;
    # parameters without requires_grad are not reduced
    assert layout == [[3, 1], [0], [2]]
    assert buckets[0].buffer.flat.numel() * 4 >= FIRST_BUCKET_BYTES
    assert buckets[2].buffer.flat.dtype == torch.float64
    assert buckets[0].buffer.flat.numel() == mib + 1 + 2  # gradients, then one flag each


def _shares_memory(tensor: torch.Tensor, flat: torch.Tensor) -> bool:
    return tensor.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_bucket_hands_averages_back_as_views_and_never_refills_memory_still_seen():
    from strategyjob.collective.grad_sync import _Bucket

    params = [
        nn.Parameter(torch.zeros(2, 3)),
        nn.Parameter(torch.zeros(4)),
        nn.Parameter(torch.zeros(1)),
    ]
    bucket = _Bucket(params)
    params[0].grad, params[1].grad = torch.ones(2, 3), torch.full((4,), 3.0)  # params[2]: none
    flat = bucket.seal(0.5)  # divided by the number of workers on the way in
    assert flat.tolist() == [0.5] * 6 + [1.5] * 4 + [0.0] + [1.0, 1.0, 0.0]
    bucket.hand_back()  # (a one-worker "all-reduce": the flat as it is)
    assert _shares_memory(params[0].grad, flat) and params[0].grad.shape == (2, 3)
    assert params[1].grad.tolist() == [1.5] * 4
    assert params[2].grad is None  # no worker had a gradient for it

    kept = params[1].grad
    params[0].grad, params[1].grad = torch.ones(2, 3), torch.ones(4)
    second = bucket.seal(1.0)  # ``kept`` still views the first buffer: another one is filled
    assert not _shares_memory(second, flat) and kept.tolist() == [1.5] * 4
    bucket.hand_back()
    params[0].grad, params[1].grad = torch.ones(2, 3), torch.ones(4)  # zero_grad, backward
    assert _shares_memory(bucket.seal(1.0), second)  # free again: no new memory
    assert len(bucket.buffers) == 2 and kept.tolist() == [1.5] * 4


def test_bucket_copies_into_gradients_it_must_not_replace():
    from strategyjob.collective.grad_sync import _Bucket

    channels_last = nn.Parameter(torch.zeros(1, 2, 2, 2).to(memory_format=torch.channels_last))
    plain = nn.Parameter(torch.zeros(3))
    bucket = _Bucket([channels_last, plain])
    channels_last.grad = torch.ones(1, 2, 2, 2).to(memory_format=torch.channels_last)
    own = channels_last.grad
    plain.grad = torch.ones(3, requires_grad=True)  # from backward(create_graph=True)
    graph_grad = plain.grad
    bucket.seal(0.5)
    bucket.hand_back()
    assert channels_last.grad is own and own.is_contiguous(memory_format=torch.channels_last)
    assert plain.grad is graph_grad and graph_grad.requires_grad
    assert own.flatten().tolist() == [0.5] * 8 and graph_grad.tolist() == [0.5] * 3


def test_collective_packs_group_by_dtype_and_size():
    from strategyjob.collective.process_group import _packs

    tensors = [torch.zeros(4), torch.zeros(4, dtype=torch.int64), torch.zeros(4), torch.zeros(4)]
    assert _packs(tensors, 0) == [[0, 2, 3], [1]]
    assert _packs(tensors, 32) == [[0, 2], [3], [1]]  # a pack closes once it reaches 32 bytes
