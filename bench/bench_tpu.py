"""TPUStrategy's split layer vs hand-written tensor parallelism, same processes, same run.

Workload: one linear layer ``H x F`` whose input features are split across the logical devices
of a replica (row-parallel: each device multiplies its block of ``x`` by its block of ``W``,
the partial products are summed), plus bias, mean-squared loss, backward and SGD. Both versions
keep TensorFlow's semantics of the annotations: ``W`` is held whole on every logical device and
its gradient comes back whole (the shards' gradients are all-gathered).

* ``sdk``: ``strategy.run(step)`` with ``experimental_split_to_logical_devices`` on ``x`` and
  ``W`` and ``experimental_replicate_to_logical_devices`` on the product (DTensor inside).
* ``raw``: the same maths with ``torch.distributed`` by hand: narrow, local matmul,
  ``all_reduce``; backward ``all_gather`` of the weight-gradient blocks.

The processes (one per device, TF_CONFIG on 127.0.0.1, gloo, one compute thread each) are
started once; the two loops are timed in alternating windows so machine noise hits both alike.

    python bench/bench_tpu.py                 # 1 replica x 2 logical devices, ~1 minute
    python bench/bench_tpu.py --replicas 2    # 2 replicas x 2 logical devices (4 processes)

The last line is ``time/step: sdk=… raw=… overhead=…x`` (bar: overhead <= 1.10). On a shared
machine the figures are indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from strategyjob.launcher import free_ports

HERE = Path(__file__).resolve().parent
SDK = HERE.parent / "sdk"


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--cores", type=int, default=2, help="logical devices per replica")
    p.add_argument("--batch", type=int, default=256, help="per-replica batch")
    p.add_argument("--features", type=int, default=2048, help="F, split across logical devices")
    p.add_argument("--hidden", type=int, default=1024, help="H")
    p.add_argument("--rounds", type=int, default=20, help="alternating windows per loop")
    p.add_argument("--steps", type=int, default=5, help="steps per window")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


# ----------------------------------------------------------------------------------- launcher
def launch(args: argparse.Namespace) -> None:
    n = args.replicas * args.cores
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(n)]}
    env_base = dict(os.environ)
    env_base.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(SDK), env_base.get("PYTHONPATH")])),
        OMP_NUM_THREADS=str(args.threads),
        CUDA_VISIBLE_DEVICES="",
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env_base.pop(key, None)
    procs, logs = [], []
    for i in range(n):
        env = dict(env_base)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", *sys.argv[1:]],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + args.timeout
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    outputs = []
    for p, log in zip(procs, logs):
        log.seek(0)
        outputs.append(log.read())
        log.close()
        if p.returncode != 0:
            sys.exit(f"a benchmark process failed ({p.returncode}):\n{outputs[-1][-4000:]}")
    result = None
    for line in outputs[0].splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    if result is None:
        sys.exit(f"no RESULT from rank 0:\n{outputs[0][-4000:]}")
    sdk, raw = result["sdk"], result["raw"]
    paired = [s / r for s, r in zip(sdk, raw)]
    print(
        f"{args.replicas} replica(s) x {args.cores} logical devices, batch {args.batch}/replica, "
        f"layer {args.hidden}x{args.features}, gloo, {args.threads} thread(s)/process"
    )
    print(f"results equal (sdk vs raw, per step): {result['equal']}")
    print(f"paired window ratios sdk/raw: {[round(x, 3) for x in paired]}")
    sdk_ms, raw_ms = statistics.median(sdk) * 1e3, statistics.median(raw) * 1e3
    print(
        f"time/step: sdk={sdk_ms:.2f}ms raw={raw_ms:.2f}ms "
        f"overhead={statistics.median(paired):.3f}x (bar <= 1.10)"
    )


# ------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from strategyjob.strategies.tpu import TPUStrategy
    from strategyjob.tpu.experimental import DeviceAssignment, initialize_tpu_system

    torch.set_num_threads(args.threads)
    topology = initialize_tpu_system()
    assignment = DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, args.cores], num_replicas=args.replicas
    )
    strategy = TPUStrategy(experimental_device_assignment=assignment)
    ext = strategy.extended
    cores, core = args.cores, ext.logical_device_id
    logical_group = ext.device_mesh.get_group("logical")
    block = args.features // cores

    with strategy.scope():
        layer = torch.nn.Linear(args.features, args.hidden)
        opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    raw_layer = torch.nn.Linear(args.features, args.hidden)
    raw_layer.load_state_dict(layer.state_dict())
    raw_opt = torch.optim.SGD(raw_layer.parameters(), lr=0.01)
    torch.manual_seed(ext.topology.worker_index)  # the replica's own batch, equal on its devices
    x = torch.randn(args.batch, args.features)

    def sdk_step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        x_split = strategy.experimental_split_to_logical_devices(x, [1, cores])
        w_split = strategy.experimental_split_to_logical_devices(layer.weight, [1, cores])
        h = strategy.experimental_replicate_to_logical_devices(x_split @ w_split.t())
        loss = ((h + layer.bias) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    class SplitColumns(torch.autograd.Function):
        """This device's column block; backward gathers the blocks' gradients whole."""

        @staticmethod
        def forward(ctx, t):
            return t[:, core * block : (core + 1) * block].contiguous()

        @staticmethod
        def backward(ctx, grad):
            parts = [torch.empty_like(grad) for _ in range(cores)]
            dist.all_gather(parts, grad.contiguous(), group=logical_group)
            return torch.cat(parts, dim=1)

    class SumPartials(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            t = t.clone()
            dist.all_reduce(t, group=logical_group)
            return t

        @staticmethod
        def backward(ctx, grad):
            return grad

    replica_group = ext.device_mesh.get_group("replica")

    def raw_step() -> torch.Tensor:
        raw_opt.zero_grad()
        x_block = x[:, core * block : (core + 1) * block].contiguous()
        h = SumPartials.apply(x_block @ SplitColumns.apply(raw_layer.weight).t())
        loss = ((h + raw_layer.bias) ** 2).mean()
        loss.backward()
        if args.replicas > 1:  # average over replicas, as the strategy does
            for p in raw_layer.parameters():
                dist.all_reduce(p.grad, group=replica_group)
                p.grad.div_(args.replicas)
        raw_opt.step()
        return loss

    def run_sdk() -> torch.Tensor:
        return strategy.experimental_local_results(strategy.run(sdk_step, args=(x,)))[0]

    equal = []
    for _ in range(args.warmup):
        a, b = run_sdk(), raw_step()
        equal.append(bool(torch.allclose(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)))

    def window(step) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        dist.barrier()
        return (time.perf_counter() - start) / args.steps

    sdk, raw = [], []
    for i in range(args.rounds):
        if i % 2 == 0:
            sdk.append(window(run_sdk))
            raw.append(window(raw_step))
        else:
            raw.append(window(raw_step))
            sdk.append(window(run_sdk))
    equal.append(bool(torch.allclose(layer.weight, raw_layer.weight, rtol=1e-4, atol=1e-6)))
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"sdk": sdk, "raw": raw, "equal": all(equal)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = _args()
    if arguments.worker:
        worker(arguments)
    else:
        launch(arguments)
