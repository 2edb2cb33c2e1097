"""One MultiWorkerMirroredStrategy task, started by the tests with TF_CONFIG set.

``python mwms_worker.py SCENARIO`` runs a scenario and prints one ``RESULT {json}`` line with
what it observed; the tests compare the lines of all tasks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import strategyjob as sj
import torch
import torch.nn.functional as F
from strategyjob import errors
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def make_strategy(timeout: float | None = 30.0) -> sj.MultiWorkerMirroredStrategy:
    options = sj.experimental.CommunicationOptions(timeout_seconds=timeout)
    return sj.MultiWorkerMirroredStrategy(communication_options=options)


class Net(nn.Module):
    """A small MLP plus a layer that forward never uses (its gradient must stay None)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
        self.unused = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def train_reference(
    x: torch.Tensor, y: torch.Tensor, steps: int, clip: float | None = None
) -> list[torch.Tensor]:
    """One process, no strategy, the global batch: what MWMS training must reproduce."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _small_all_reduce(ctx: sj.ReplicaContext, rid: float) -> dict:
    small = torch.tensor([rid + 1.0, 2.0])
    summed = ctx.all_reduce("SUM", small)
    transposed = torch.arange(6.0).view(2, 3).t() * (rid + 1.0)
    return {
        "new_tensor": summed.data_ptr() != small.data_ptr(),
        "input_untouched": small.tolist() == [rid + 1.0, 2.0],
        "transposed": ctx.all_reduce("SUM", transposed).tolist(),
        "int_mean": ctx.all_reduce("MEAN", torch.tensor([int(rid) * 3 + 1])).tolist(),
    }


def scenario_collectives() -> dict:
    strategy = make_strategy()
    ext = strategy.extended
    w, i = ext._num_workers, ext._worker_index
    out: dict = {
        "num_workers": w,
        "worker_index": i,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "should_checkpoint": ext.should_checkpoint,
        "multi_worker_mode": ext._in_multi_worker_mode(),
        "between_graph": ext.experimental_between_graph,
        "task": [strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id],
    }
    # reduce of a host tensor all-reduces across workers (one replica per worker)
    out["reduce_sum_host"] = strategy.reduce("SUM", torch.tensor(1.0), axis=None).item()
    out["reduce_mean"] = strategy.reduce(sj.ReduceOp.MEAN, torch.tensor(float(i)), axis=None).item()
    # axis reduction: MEAN divides by the global element count
    per_replica = strategy.run(lambda: torch.arange(i + 1, dtype=torch.float32))
    out["reduce_mean_axis0"] = strategy.reduce("MEAN", per_replica, axis=0).item()
    out["reduce_sum_axis0"] = strategy.reduce("SUM", per_replica, axis=0).item()

    def replica_fn() -> dict:
        ctx = sj.get_replica_context()
        rid = float(ctx.replica_id_in_sync_group)
        return {
            "id": int(ctx.replica_id_in_sync_group),
            "sum": ctx.all_reduce("sum", torch.tensor(rid + 1.0)).item(),
            "mean": ctx.all_reduce(sj.ReduceOp.MEAN, torch.tensor(rid + 1.0)).item(),
            "nest": [
                t.tolist() for t in ctx.all_reduce("SUM", [torch.ones(2), torch.tensor([int(rid)])])
            ],
            "all_gather": ctx.all_gather(torch.full((int(rid) + 1,), rid), 0).tolist(),
            # small tensors (reduced through a clone): a new tensor, the input untouched, the
            # transposed layout's values, integer MEAN rounding down
            "small": _small_all_reduce(ctx, rid),
        }

    out["replica"] = strategy.run(replica_fn)

    # A large tensor (one pack of its own): exact sums and means, odd length, the input
    # untouched (sums are written into a new tensor, never into the input).
    big = torch.arange(1_250_001, dtype=torch.float64) * (i + 1)
    before = big.clone()
    ring_sum = strategy.run(lambda: sj.get_replica_context().all_reduce("SUM", big))
    ring_mean = strategy.run(lambda: sj.get_replica_context().all_reduce("MEAN", big))
    factor = sum(range(1, strategy.num_replicas_in_sync + 1))
    expected = torch.arange(1_250_001, dtype=torch.float64) * factor
    out["ring"] = {
        "sum_exact": bool(torch.equal(ring_sum, expected)),
        "mean_close": bool(
            torch.allclose(ring_mean, expected / strategy.num_replicas_in_sync, rtol=0, atol=1e-9)
        ),
        "input_untouched": bool(torch.equal(big, before)),
        "new_tensor": ring_sum.data_ptr() != big.data_ptr(),
    }
    out["gather"] = strategy.gather(torch.tensor([[float(i)] * 2] * (i + 1)), 0).tolist()
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: ctx.replica_id_in_sync_group * 10 + ctx.num_replicas_in_sync
    )
    out["values_from_function"] = list(strategy.experimental_local_results(values))

    # initial values come from the chief
    with strategy.scope():
        var = sj.Variable(torch.tensor([float(i + 5), 1.0]))
        torch.manual_seed(100 + i)  # a different initialisation on every worker
        module = nn.Linear(5, 3)
    out["variable"] = var.numpy().tolist()
    out["module_checksum"] = round(sum(float(p.sum()) for p in module.parameters()), 6)

    # dataset sharding across workers: range(14).batch(8), AUTO (= DATA) policy
    batches = [torch.arange(0, 8), torch.arange(8, 14)]
    try:
        dist_ds = strategy.experimental_distribute_dataset(batches)
        out["dataset"] = [
            [t.tolist() for t in strategy.experimental_local_results(b)] for b in dist_ds
        ]
    except Exception as e:  # reported, so the test shows what failed
        out["dataset"] = f"{type(e).__name__}: {e}"
    return out


def scenario_train() -> dict:
    """MWMS training equals single-process training on the global batch."""
    strategy = make_strategy()
    w, i = strategy.extended.topology.num_workers, strategy.extended.topology.worker_index
    steps, per_worker = 4, 4
    g = torch.Generator().manual_seed(7)
    x = torch.randn(per_worker * w, 6, generator=g)
    y = torch.randint(0, 4, (per_worker * w,), generator=g)
    with strategy.scope():
        # The chief initialises like the reference; the others differently: the chief's
        # values must win.
        torch.manual_seed(0 if i == 0 else 100 + i)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)

    def step_fn(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    shard = slice(i * per_worker, (i + 1) * per_worker)
    losses = []
    kept = []  # gradients the caller holds on to: later steps must not overwrite them
    for _ in range(steps):
        loss = strategy.run(step_fn, args=(x[shard], y[shard]))
        losses.append(strategy.reduce("MEAN", loss, axis=None).item())
        kept += [(p.grad, p.grad.clone()) for p in model.body.parameters()]

    def trained(
        zero_to_none: bool = True, clip: float | None = None, reentrant: bool = False
    ) -> nn.Module:
        with strategy.scope():
            torch.manual_seed(0 if i == 0 else 100 + i)
            net = Net()
            net_opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)

        def forward(xb: torch.Tensor) -> torch.Tensor:
            if not reentrant:
                return net(xb)
            # the last layers' gradients come from a backward pass nested in the outer one
            head = nn.Sequential(*net.body[1:])
            return checkpoint(head, net.body[0](xb), use_reentrant=True)

        def fn(xb: torch.Tensor, yb: torch.Tensor) -> None:
            net_opt.zero_grad(set_to_none=zero_to_none)
            F.cross_entropy(forward(xb), yb).backward()
            if clip is not None:  # sees the averaged gradients, as with DDP
                nn.utils.clip_grad_norm_(net.parameters(), clip)
            net_opt.step()

        for _ in range(steps):
            strategy.run(fn, args=(x[shard], y[shard]))
        return net

    zeroed_in_place = trained(zero_to_none=False)  # .grad tensors live from step to step
    clipped = trained(clip=0.05)
    checkpointed = trained(reentrant=True)

    # Gradient accumulation: two backward passes (half batches) before each step.
    with strategy.scope():
        torch.manual_seed(0 if i == 0 else 100 + i)
        accumulated = Net()
        acc_opt = torch.optim.SGD(accumulated.parameters(), lr=0.5, momentum=0.9)

    def accumulate_fn(xb: torch.Tensor, yb: torch.Tensor) -> None:
        acc_opt.zero_grad()
        for xh, yh in zip(xb.chunk(2), yb.chunk(2)):
            (F.cross_entropy(accumulated(xh), yh) / 2).backward()
        acc_opt.step()

    for _ in range(steps):
        strategy.run(accumulate_fn, args=(x[shard], y[shard]))

    reference = train_reference(x, y, steps)

    def max_diff(m: nn.Module) -> float:
        return max((p.detach() - q).abs().max().item() for p, q in zip(m.parameters(), reference))

    clipped_reference = train_reference(x, y, steps, clip=0.05)
    return {
        "max_abs_diff": max_diff(model),
        "accumulated_max_abs_diff": max_diff(accumulated),
        "zeroed_in_place_max_abs_diff": max_diff(zeroed_in_place),
        "checkpointed_max_abs_diff": max_diff(checkpointed),
        "clipped_max_abs_diff": max(
            (p.detach() - q).abs().max().item()
            for p, q in zip(clipped.parameters(), clipped_reference)
        ),
        "clipping_changed_training": max_diff(clipped) > 1e-3,
        "kept_grads_intact": all(torch.equal(g, copy) for g, copy in kept),
        "losses": losses,
        "unused_grad_is_none": model.unused.weight.grad is None,
        "checksum": round(sum(float(p.sum()) for p in model.parameters()), 5),
    }


def linear_step(strategy: sj.MultiWorkerMirroredStrategy) -> Callable[[], torch.Tensor]:
    """A training step of a one-layer model made in ``strategy``'s scope (its gradient
    all-reduce is the collective the fault scenarios stop in)."""
    with strategy.scope():
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step_fn() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        opt.step()
        return loss

    return step_fn


def scenario_peer_dies() -> dict:
    """The last task dies after the first step; the others must get a clear error in time."""
    timeout = float(os.environ.get("MWMS_TEST_TIMEOUT", "10"))
    strategy = make_strategy(timeout)
    ext = strategy.extended
    victim = int(os.environ.get("MWMS_TEST_VICTIM", ext._num_workers - 1))
    step_fn = linear_step(strategy)

    strategy.run(step_fn)
    strategy.reduce("SUM", torch.tensor(1.0), axis=None)  # everyone passed step 1
    mode = os.environ.get("MWMS_TEST_MODE")
    if ext._worker_index == victim:
        if mode == "stuck":
            time.sleep(3 * timeout)  # alive but never joins the next collective
            os._exit(0)
        if mode == "frozen":  # as a SIGSTOPped process or a lost node: no answer at all
            Path(os.environ["MWMS_TEST_VICTIM_PID"]).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        os.kill(os.getpid(), 9)
    big = torch.ones(2_000_000)  # 8 MB: the out-of-place ring of sends and receives

    def ring_fn() -> torch.Tensor:
        return sj.get_replica_context().all_reduce("SUM", big)

    ring = os.environ.get("MWMS_TEST_COLLECTIVE") == "ring"
    start = time.monotonic()
    try:
        for _ in range(50):
            if ring:
                strategy.run(ring_fn)
                continue
            strategy.run(step_fn)
            strategy.reduce("SUM", torch.tensor(1.0), axis=None)
        error = None
    except (errors.UnavailableError, errors.DeadlineExceededError) as e:
        error = {"type": type(e).__name__, "message": str(e)}
    seconds = time.monotonic() - start
    # A survivor that exits at once would be "down" to another still waiting for its own
    # deadline a moment later (MWMS_TEST_LINGER: stay alive a while).
    time.sleep(float(os.environ.get("MWMS_TEST_LINGER", "0")))
    if mode == "frozen":  # the frozen victim cannot end itself
        os.kill(int(Path(os.environ["MWMS_TEST_VICTIM_PID"]).read_text()), signal.SIGKILL)
    return {"error": error, "seconds": seconds, "timeout": timeout}


def scenario_pauses() -> dict:
    """No ``timeout_seconds``: the last task pauses outside collectives before the steps that
    ``MWMS_TEST_PAUSES`` names (``step:seconds,...``); the adaptive stuck-peer bound decides
    whether the others end the collective. Wall-clock times, so the test can compare tasks."""
    strategy = make_strategy(None)
    ext = strategy.extended
    pauses = {
        int(step): float(seconds)
        for step, seconds in (p.split(":") for p in os.environ["MWMS_TEST_PAUSES"].split(","))
    }
    victim = ext._worker_index == ext._num_workers - 1
    step_fn = linear_step(strategy)

    paused_at: list[float] = []
    error = None
    steps = 0
    try:
        for step in range(int(os.environ.get("MWMS_TEST_STEPS", "40"))):
            if victim and step in pauses:
                paused_at.append(time.time())
                time.sleep(pauses[step])
            strategy.run(step_fn)
            strategy.reduce("SUM", torch.tensor(1.0), axis=None)
            steps += 1
    except (errors.UnavailableError, errors.DeadlineExceededError) as e:
        error = {"type": type(e).__name__, "message": str(e)}
    return {"error": error, "ended_at": time.time(), "paused_at": paused_at, "steps": steps}


if __name__ == "__main__":
    name = sys.argv[1]
    result = globals()[f"scenario_{name}"]()
    emit(result)
    sys.stdout.flush()
    # A peer that died leaves gloo work pending until its timeout; do not wait for it.
    os._exit(0)
