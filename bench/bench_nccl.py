"""MultiWorkerMirroredStrategy vs raw DistributedDataParallel on one GPU, and a 25 MB CUDA
all-reduce through the SDK's collective group vs raw NCCL.

Why: bench_mwms.py measures the CPU path (gloo). On a GPU a step of this MLP takes well under a
millisecond, so whatever the SDK adds per step (Python, synchronisation, copies) shows here.

Workload as in bench_mwms.py: MLP 784-512-512-10, ReLU, cross-entropy, SGD lr 0.01, batch 256,
one fixed synthetic batch, all on cuda:0; each step also reduces the loss.
  (a) SDK: MultiWorkerMirroredStrategy in local mode (no TF_CONFIG: one replica, cuda:0), model
      and optimizer built in strategy.scope(), strategy.run(step_fn) doing zero_grad/backward/
      step, then strategy.reduce(SUM, loss) (on the host, as in TensorFlow).
  (b) DDP on an NCCL world-size-1 process group (tcp://127.0.0.1), then dist.all_reduce(loss).
In local mode the SDK issues no collective (one replica has nothing to average) while DDP
all-reduces its gradient buckets even alone, so (c), the same loop in plain torch with
float(loss), is timed too: SDK/plain is the SDK's own per-step cost. Windows alternate so that
machine noise hits all loops alike; cuda is synchronised before every timer read.

Then a 25 MB float32 CUDA all-reduce: CollectiveGroup.all_reduce (the SDK's group, joined to
the same NCCL process group; it returns a new tensor) vs in-place dist.all_reduce.

    PYTHONPATH=sdk python3 bench/bench_nccl.py

The last line is ``steps/s: sdk_mwms=… torch_ddp=… ratio=…``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import strategyjob as sj
import torch
import torch.distributed as dist
import torch.nn.functional as F
from strategyjob.collective import process_group
from strategyjob.collective.options import CommunicationOptions
from strategyjob.launcher import free_ports
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BATCH, AR_FLOATS = 256, 6_250_000  # AR_FLOATS: 25.0e6 bytes of float32


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="alternating windows per loop")
    p.add_argument("--steps", type=int, default=200, help="steps per window")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--ar-iters", type=int, default=50)
    return p.parse_args()


def mlp(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)]
    return nn.Sequential(*layers).to(device)


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    args = _args()
    for key in ("TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        os.environ.pop(key, None)
    device = torch.device("cuda", 0)
    port = free_ports(1)[0]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    strategy = sj.MultiWorkerMirroredStrategy()  # local mode: one replica per local GPU
    assert strategy.extended.topology.local_devices == (device,), "run with one visible GPU"
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, NCCL {nccl}", flush=True)
    x = torch.randn(BATCH, 784, device=device)
    y = torch.randint(0, 10, (BATCH,), device=device)

    def sgd_step(net: nn.Module, opt: torch.optim.Optimizer):
        def step(xb: torch.Tensor = x, yb: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            return loss.detach()

        return step

    with strategy.scope():
        model = mlp(device)
        step_fn = sgd_step(model, torch.optim.SGD(model.parameters(), lr=0.01))

    def sdk_step() -> torch.Tensor:
        return strategy.reduce(sj.ReduceOp.SUM, strategy.run(step_fn, args=(x, y)), axis=None)

    ddp = DistributedDataParallel(mlp(device), device_ids=[0])
    ddp_fn = sgd_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))

    def ddp_step() -> torch.Tensor:
        total = ddp_fn().clone()
        dist.all_reduce(total)
        return total

    plain = mlp(device)
    plain_fn = sgd_step(plain, torch.optim.SGD(plain.parameters(), lr=0.01))

    def plain_step() -> float:
        return float(plain_fn())  # a host copy, as strategy.reduce makes

    def window(step) -> float:
        return args.steps / timed(lambda: [step() for _ in range(args.steps)])

    loops = [sdk_step, ddp_step, plain_step]
    for _ in range(args.warmup):
        for step in loops:
            step()
    rates: dict = {step: [] for step in loops}
    for r in range(args.rounds):
        for step in loops[r % 3 :] + loops[: r % 3]:
            rates[step].append(window(step))
    sdk, ddp_rates, plain_rates = rates[sdk_step], rates[ddp_step], rates[plain_step]
    print(f"SDK MWMS windows (steps/s): {[round(v, 1) for v in sdk]}")
    print(f"DDP      windows (steps/s): {[round(v, 1) for v in ddp_rates]}")
    print(f"plain    windows (steps/s): {[round(v, 1) for v in plain_rates]}")
    print(f"paired window ratios SDK/DDP: {[round(s / d, 3) for s, d in zip(sdk, ddp_rates)]}")
    print(f"median SDK/plain torch: {statistics.median(sdk) / statistics.median(plain_rates):.3f}")

    # 25 MB all-reduce of a CUDA tensor: the SDK's CollectiveGroup vs raw dist.all_reduce
    cluster = {"worker": [f"127.0.0.1:{port}"]}
    membership = process_group.membership_from_cluster(cluster, "worker", 0, environ={})
    group = process_group.get_group(membership, CommunicationOptions())  # joins the NCCL group
    big = torch.full((AR_FLOATS,), 1.5, device=device)
    (result,) = group.all_reduce([big], "sum")
    assert result.device == device and torch.equal(result, big), result.device
    sdk_times, raw_times = [], []
    for i in range(args.ar_iters + 3):
        sdk_time = timed(lambda: group.all_reduce([big], "sum"))
        t = big.clone()  # dist.all_reduce works in place: copy outside the timed region
        raw_time = timed(functools.partial(dist.all_reduce, t))
        if i >= 3:
            sdk_times.append(sdk_time)
            raw_times.append(raw_time)
    ar_sdk, ar_raw = statistics.median(sdk_times), statistics.median(raw_times)
    nbytes = AR_FLOATS * 4
    print(
        f"all-reduce {nbytes / 1e6:.1f} MB on cuda (median of {args.ar_iters}): "
        f"CollectiveGroup.all_reduce {ar_sdk * 1e3:.3f} ms = {nbytes / ar_sdk / 1e9:.1f} GB/s, "
        f"dist.all_reduce {ar_raw * 1e3:.3f} ms = {nbytes / ar_raw / 1e9:.1f} GB/s, "
        f"ratio {ar_raw / ar_sdk:.3f}"
    )
    dist.destroy_process_group()
    sdk_med, ddp_med = statistics.median(sdk), statistics.median(ddp_rates)
    print(f"steps/s: sdk_mwms={sdk_med:.2f} torch_ddp={ddp_med:.2f} ratio={sdk_med / ddp_med:.3f}")


if __name__ == "__main__":
    main()
