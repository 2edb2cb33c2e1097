"""One process on one GPU, started by ``test_nccl.py``: ``python nccl_worker.py SCENARIO``.

Scenarios:
  collectives  the SDK's ``CollectiveGroup`` (world size 1, backend "cpu:gloo,cuda:nccl"):
               CUDA tensors go through NCCL, CPU tensors through gloo
  slow         an NCCL all-reduce that completes after more than one poll slice (1 s)
  mwms         MultiWorkerMirroredStrategy's multi-worker code path on one GPU: a two-worker
               TF_CONFIG with WORLD_SIZE=1, so the strategy counts two workers (averages are
               halves of this worker's values) while the NCCL group has this process only

Every check runs even if an earlier one failed; the process prints one
``RESULT {"failures": {check: traceback}, ...}`` line.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from strategyjob.collective import process_group
from strategyjob.collective.options import CommunicationOptions
from torch import nn

DEV = torch.device("cuda", 0)
failures: dict[str, str] = {}
info: dict = {}


def check(fn):
    """Run ``fn`` now; record its traceback instead of stopping at the first failure."""
    try:
        fn()
    except Exception:
        failures[fn.__name__] = traceback.format_exc()
    return fn


def same(result: torch.Tensor, expected: torch.Tensor) -> None:
    assert result.device == expected.device, f"on {result.device}, expected {expected.device}"
    assert result.dtype == expected.dtype, f"{result.dtype}, expected {expected.dtype}"
    assert result.shape == expected.shape, f"{tuple(result.shape)} != {tuple(expected.shape)}"
    assert torch.equal(result, expected), f"{result.flatten()[:4]} != {expected.flatten()[:4]}"


def make_group(timeout: float = 60.0) -> process_group.CollectiveGroup:
    port = int(os.environ["STRATEGYJOB_TEST_PORT"])
    cluster = {"worker": [f"127.0.0.1:{port}"]}
    membership = process_group.membership_from_cluster(cluster, "worker", 0)
    return process_group.get_group(membership, CommunicationOptions(timeout_seconds=timeout))


def backends(group: process_group.CollectiveGroup) -> dict[str, str]:
    return {d: type(group._pg._get_backend(torch.device(d))).__name__ for d in ("cpu", "cuda")}


def scenario_collectives() -> None:
    group = make_group()
    info["backends"] = backends(group)

    @check
    def backend_is_gloo_and_nccl():
        assert group.world_size == 1 and group.rank == 0
        assert group._backend() == "cpu:gloo,cuda:nccl"
        assert info["backends"] == {"cpu": "ProcessGroupGloo", "cuda": "ProcessGroupNCCL"}

    @check
    def all_reduce_sum_of_a_pack():
        a = torch.arange(6.0, device=DEV).view(2, 3)
        b = torch.tensor([1.5, -2.0], device=DEV)
        ra, rb = group.all_reduce([a, b], "sum")
        same(ra, a)
        same(rb, b)
        assert ra.data_ptr() != a.data_ptr(), "the result must be a new tensor"

    @check
    def all_reduce_mean_of_one_tensor():
        t = torch.randn(1000, device=DEV)
        (r,) = group.all_reduce([t], "mean")
        same(r, t)

    @check
    def all_reduce_sum_of_one_large_tensor():  # 12 MB: past the pooled/ring sizes of CPU
        t = torch.randn(3_000_000, device=DEV)
        (r,) = group.all_reduce([t], "sum")
        same(r, t)

    @check
    def all_reduce_integer_bool_and_bf16():
        ints = torch.tensor([7, -3, 4], device=DEV)
        flags = torch.tensor([True, False], device=DEV)
        halves = torch.tensor([0.5, 2.0], device=DEV, dtype=torch.bfloat16)
        (ri,) = group.all_reduce([ints], "mean")
        (rf,) = group.all_reduce([flags], "sum")
        (rh,) = group.all_reduce([halves], "sum")
        same(ri, ints)
        same(rf, flags)
        same(rh, halves)

    @check
    def all_reduce_cuda_and_cpu_in_one_call():
        g, c = torch.ones(4, device=DEV), torch.full((3,), 2.0)
        rg, rc = group.all_reduce([g, c], "sum")
        same(rg, g)
        same(rc, c)

    @check
    def all_gather_cuda():
        t = torch.arange(12.0, device=DEV).view(4, 3)
        same(group.all_gather(t, 0), t)
        same(group.all_gather(t, 1), t)

    @check
    def broadcast_cuda():
        f, i = torch.tensor([1.0, 2.0, 3.0], device=DEV), torch.tensor([5, 6], device=DEV)
        expected = [f.clone(), i.clone()]
        group.broadcast([f, i], src=0)
        same(f, expected[0])
        same(i, expected[1])

    @check
    def all_reduce_async_and_wait_on_a_cuda_flat_tensor():
        flat = torch.randn(1 << 22, device=DEV)  # 16 MB, a gradient bucket's size
        expected = flat.clone()
        work = group.all_reduce_async(flat)
        group.wait(work, "test all-reduce")
        same(flat, expected)

    @check
    def cpu_tensors_on_the_same_group():
        small = torch.arange(10.0)
        (r,) = group.all_reduce([small], "sum")
        same(r, small)
        same(group.all_gather(small.view(5, 2), 0), small.view(5, 2))
        assert group.any(True) and not group.any(False)
        group.barrier()

    @check
    def cpu_large_tensor_all_reduce():  # >= 4 MB: the ring path for CPU tensors
        big = torch.arange(2_000_000, dtype=torch.float32)
        (r,) = group.all_reduce([big], "sum")
        same(r, big)


def scenario_slow() -> None:
    """The collective waits behind ~2.5 s of GPU work queued before it on the stream: the
    group must wait (timeout_seconds=60), not give up after its first 1 s poll slice."""
    group = make_group(timeout=60.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(100_000_000)
    end.record()
    end.synchronize()
    cycles = int(100_000_000 * 2500 / start.elapsed_time(end))

    @check
    def all_reduce_async_behind_slow_gpu_work():
        flat = torch.ones(1 << 20, device=DEV)
        torch.cuda._sleep(cycles)
        began = time.monotonic()
        work = group.all_reduce_async(flat)
        group.wait(work, "test all-reduce")
        torch.cuda.synchronize()
        info["waited_s"] = round(time.monotonic() - began, 2)
        same(flat, torch.ones(1 << 20, device=DEV))

    @check
    def group_still_works_afterwards():
        t = torch.arange(4.0, device=DEV)
        (r,) = group.all_reduce([t, t.clone()], "sum")[:1]
        same(r, t)


def scenario_mwms() -> None:
    import strategyjob as sj

    options = CommunicationOptions(timeout_seconds=60)
    strategy = sj.MultiWorkerMirroredStrategy(communication_options=options)
    ext = strategy.extended

    @check
    def replica_on_cuda_and_group_on_nccl():
        assert ext._num_workers == 2 and ext._group.world_size == 1
        assert ext._local_devices == (DEV,)
        assert strategy.num_replicas_in_sync == 2
        assert backends(ext._group)["cuda"] == "ProcessGroupNCCL"

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))

    torch.manual_seed(0)
    with strategy.scope():
        model = mlp().to(DEV)  # .to() keeps the registered Parameter objects
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
    reference = mlp().to(DEV)  # outside scope: plain torch, the same initial values
    reference.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.25)  # half: the average of 2 workers
    x = torch.randn(64, 20, device=DEV)
    y = x[:, :4].argmax(1)  # learnable

    def step_fn(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss.detach()

    losses: list[float] = []

    @check
    def train_matches_reference_and_reduces():
        for _ in range(30):
            per_replica = strategy.run(step_fn, args=(x, y))
            (loss,) = strategy.experimental_local_results(per_replica)
            assert loss.device == DEV
            total = strategy.reduce(sj.ReduceOp.SUM, per_replica, axis=None)
            mean = strategy.reduce(sj.ReduceOp.MEAN, per_replica, axis=None)
            assert total.device.type == "cpu", total.device  # reduce returns on the host
            torch.testing.assert_close(total, loss.cpu())
            torch.testing.assert_close(mean, loss.cpu() / 2)
            losses.append(float(total))
            ref_opt.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            ref_opt.step()
        for p, r in zip(model.parameters(), reference.parameters()):
            assert p.device == DEV
            torch.testing.assert_close(p, r, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(p.grad, r.grad / 2, atol=1e-5, rtol=1e-4)
        assert losses[-1] < 0.8 * losses[0], losses

    @check
    def replica_context_all_reduce_and_gather_on_cuda():
        def fn(t: torch.Tensor) -> torch.Tensor:
            return sj.get_replica_context().all_reduce(sj.ReduceOp.SUM, t)

        result = strategy.run(fn, args=(x,))
        (local,) = strategy.experimental_local_results(result)
        same(local, x)
        gathered = strategy.gather(strategy.run(lambda: x * 1), axis=0)
        same(gathered, x.cpu())

    info["losses"] = [round(v, 4) for v in losses[:1] + losses[-1:]]


if __name__ == "__main__":
    torch.manual_seed(0)
    {"collectives": scenario_collectives, "slow": scenario_slow, "mwms": scenario_mwms}[
        sys.argv[1]
    ]()
    print("RESULT " + json.dumps({"failures": failures, **info}), flush=True)
