"""MultiWorkerMirroredStrategy vs raw DistributedDataParallel, same MLP, same processes.

Workload (as in the TensorFlow baseline): MLP 784-512-512-10, ReLU, cross-entropy, SGD lr 0.01,
global batch 256 = 2 processes x 128, one fixed synthetic batch per process, one compute thread
per process, gloo on 127.0.0.1. Each step also reduces the loss across workers (the SDK's
``strategy.reduce(SUM, loss)``; DDP's ``dist.all_reduce(loss)``).

Two worker processes are started once; inside them the SDK loop (model and optimizer built in
``strategy.scope()``, ``strategy.run(step_fn)`` doing ``zero_grad/backward/step``) and the DDP
loop are timed in alternating windows, so machine noise hits both alike. Then a 25 MB float32
all-reduce is timed through ``ReplicaContext.all_reduce`` and through raw ``dist.all_reduce``,
alternating calls.

    python bench/bench_mwms.py                       # ~1 minute on 2 cores
    python bench/bench_mwms.py --tensorflow VENV     # also TF MWMS (bench/tf_mwms_reference.py)

The last line is ``steps/s: sdk_mwms=… torch_ddp=… ratio=…`` (bar: ratio >= 0.97).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from strategyjob.launcher import free_ports

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.support: shared test and benchmark tooling
from tests.support.processes import SDK as SDK  # noqa: E402  (bench_checkpoint uses it)
from tests.support.processes import child_env  # noqa: E402


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=40, help="alternating windows per loop")
    p.add_argument("--steps", type=int, default=25, help="steps per window")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--ar-floats", type=int, default=6_250_000, help="25.0e6 bytes of float32")
    p.add_argument("--ar-iters", type=int, default=40)
    p.add_argument("--nworkers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--tensorflow", metavar="VENV", help="also run TF MWMS with VENV/bin/python")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


# ----------------------------------------------------------------------------------- launcher
def _spawn_all(commands: list[tuple[list[str], dict]], timeout: float) -> list[str]:
    """Run commands concurrently (own process groups); return their outputs; kill on timeout."""
    logs, procs = [], []
    for cmd, env in commands:
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    deadline = time.monotonic() + timeout
    failed = False
    for p in procs:
        try:
            failed |= p.wait(timeout=max(0.1, deadline - time.monotonic())) != 0
        except subprocess.TimeoutExpired:
            failed = True
    outputs = []
    for p, log in zip(procs, logs):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if failed:
        for i, out in enumerate(outputs):
            print(f"--- process {i} (tail) ---\n{out[-3000:]}", file=sys.stderr)
        raise SystemExit("a benchmark process failed")
    return outputs


def _results(outputs: list[str]) -> list[dict]:
    return [
        json.loads(line[len("RESULT ") :])
        for out in outputs
        for line in out.splitlines()
        if line.startswith("RESULT ")
    ]


def _window_rates(results: list[dict], key: str) -> list[float]:
    """Steps/s per window, averaged over the processes of the run."""
    per_rank = [r[key] for r in results]
    return [statistics.fmean(w) for w in zip(*per_rank)]


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a torch worker process (``tests.support.processes.child_env``: this
    SDK first on PYTHONPATH, none of the caller's cluster variables) with ``threads`` compute
    threads and no GPU."""
    return child_env(OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")


def launch(args: argparse.Namespace) -> None:
    ports = free_ports(args.nworkers + 1)
    env = worker_env(args.threads)
    forwarded = [a for a in sys.argv[1:]]
    if args.tensorflow:
        i = forwarded.index("--tensorflow")
        del forwarded[i : i + 2]
    commands = [
        (
            [
                sys.executable,
                __file__,
                *forwarded,
                "--rank",
                str(r),
                "--ports",
                ",".join(map(str, ports)),
            ],
            env,
        )
        for r in range(args.nworkers)
    ]
    print(
        f"torch: {args.nworkers} processes x {args.threads} thread(s), global batch "
        f"{args.global_batch}, {args.rounds} alternating windows of {args.steps} steps",
        flush=True,
    )
    results = _results(_spawn_all(commands, args.timeout))
    sdk = _window_rates(results, "sdk_windows")
    ddp = _window_rates(results, "ddp_windows")
    paired = [s / d for s, d in zip(sdk, ddp)]
    sdk_med, ddp_med = statistics.median(sdk), statistics.median(ddp)
    ar_sdk = statistics.fmean(r["ar_sdk_med_s"] for r in results)
    ar_raw = statistics.fmean(r["ar_raw_med_s"] for r in results)
    nbytes = args.ar_floats * 4
    print(f"SDK MWMS windows (steps/s): {[round(x, 1) for x in sdk]}")
    print(f"DDP      windows (steps/s): {[round(x, 1) for x in ddp]}")
    print(f"paired window ratios SDK/DDP: {[round(x, 3) for x in paired]}")
    print(f"loss SDK {results[0]['sdk_loss']}, DDP {results[0]['ddp_loss']}")
    print(
        f"all-reduce {nbytes / 1e6:.1f} MB (median of {args.ar_iters}): "
        f"ReplicaContext.all_reduce {ar_sdk * 1e3:.2f} ms = {nbytes / ar_sdk / 1e9:.3f} GB/s, "
        f"dist.all_reduce {ar_raw * 1e3:.2f} ms = {nbytes / ar_raw / 1e9:.3f} GB/s, "
        f"ratio {ar_raw / ar_sdk:.3f} (bar 0.95)"
    )
    if args.tensorflow:
        run_tensorflow(args)
    print(
        f"steps/s: sdk_mwms={sdk_med:.2f} torch_ddp={ddp_med:.2f} "
        f"ratio={sdk_med / ddp_med:.3f} (bar 0.97)"
    )


def run_tensorflow_workers(args: argparse.Namespace, script: str, options: list[str]) -> list[dict]:
    """Run ``bench/SCRIPT OPTIONS`` with ``VENV/bin/python`` (``args.tensorflow``) once per
    worker (``args.nworkers``), TF_CONFIG set for each on 127.0.0.1; their RESULT lines.
    ``--threads``, ``--global-batch`` and ``--warmup`` come from ``args``."""
    python = Path(args.tensorflow) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"--tensorflow {args.tensorflow}: {python} does not exist (see README)")
    ports = free_ports(args.nworkers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    commands = []
    for i in range(args.nworkers):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        common = [f"--threads={args.threads}", f"--global-batch={args.global_batch}"]
        common.append(f"--warmup={args.warmup}")
        commands.append(([str(python), str(HERE / script), *common, *options], env))
    return _results(_spawn_all(commands, args.timeout))


def run_tensorflow(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> float:
    """Run bench/tf_mwms_reference.py on every worker (``extra``: more of its options);
    print and return TF's steps/s."""
    options = [
        f"--steps={args.steps * args.rounds}",
        f"--ar-floats={args.ar_floats}",
        f"--ar-iters={args.ar_iters}",
        *extra,
    ]
    print("tensorflow: MultiWorkerMirroredStrategy (RING), same workload", flush=True)
    results = run_tensorflow_workers(args, "tf_mwms_reference.py", options)
    sps = statistics.fmean(r["steps_per_s"] for r in results)
    ar = statistics.fmean(r["ar_med_s"] for r in results)
    nbytes = args.ar_floats * 4
    timed = f", all-reduce {ar * 1e3:.2f} ms = {nbytes / ar / 1e9:.3f} GB/s" if ar == ar else ""
    print(f"TF MWMS: {sps:.2f} steps/s{timed} (TensorFlow {results[0]['tf_version']})")
    return sps


# ------------------------------------------------------------------------------------- worker
def sgd_step_fn(model: Any, optimizer: Any) -> Callable[[Any, Any], Any]:
    """The README's ``step_fn``: zero_grad, cross-entropy, backward, step; the loss returned."""
    import torch.nn.functional as F

    def step_fn(x: Any, y: Any) -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step_fn


def set_tf_config(args: argparse.Namespace) -> None:
    """TF_CONFIG of worker ``args.rank`` of ``args.nworkers``, on the first of ``args.ports``."""
    ports = args.ports.split(",")[: args.nworkers]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": args.rank}}
    )


def worker(args: argparse.Namespace) -> None:
    import strategyjob as sj
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(args.threads)
    n, rank = args.nworkers, args.rank
    set_tf_config(args)
    strategy = sj.MultiWorkerMirroredStrategy()  # initialises the gloo process group

    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    per_replica = args.global_batch // n
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(per_replica, 784, generator=g)
    y = torch.randint(0, 10, (per_replica,), generator=g)

    # (a) the SDK's ordinary custom loop
    with strategy.scope():
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

    step_fn = sgd_step_fn(model, opt)

    def sdk_step() -> torch.Tensor:
        loss = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(sj.ReduceOp.SUM, loss, axis=None) / n

    # (b) raw DDP on the same gloo process group
    ddp = DistributedDataParallel(mlp())
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def ddp_step() -> torch.Tensor:
        ddp_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        ddp_opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total / n

    def window(step) -> tuple[float, float]:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        value = float(loss)
        return args.steps / (time.perf_counter() - start), value

    for _ in range(args.warmup):
        sdk_step()
        ddp_step()
    sdk_windows, ddp_windows = [], []
    for r in range(args.rounds):
        order = (sdk_step, ddp_step) if r % 2 == 0 else (ddp_step, sdk_step)
        for step in order:
            rate, loss = window(step)
            (sdk_windows if step is sdk_step else ddp_windows).append(rate)
            if step is sdk_step:
                sdk_loss = loss
            else:
                ddp_loss = loss

    # 25 MB all-reduce: ReplicaContext.all_reduce vs raw dist.all_reduce, alternating calls
    big = torch.full((args.ar_floats,), float(rank + 1))

    def replica_all_reduce(t: torch.Tensor) -> torch.Tensor:
        return sj.get_replica_context().all_reduce(sj.ReduceOp.SUM, t)

    sdk_times, raw_times = [], []
    for i in range(args.ar_iters + 3):
        dist.barrier()
        start = time.perf_counter()
        result = strategy.run(replica_all_reduce, args=(big,))
        sdk_time = time.perf_counter() - start
        assert float(result[0]) == n * (n + 1) / 2
        t = big.clone()  # dist.all_reduce works in place: copy outside the timed region
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        raw_time = time.perf_counter() - start
        if i >= 3:
            sdk_times.append(sdk_time)
            raw_times.append(raw_time)
    print(
        "RESULT "
        + json.dumps(
            {
                "rank": rank,
                "sdk_windows": sdk_windows,
                "ddp_windows": ddp_windows,
                "sdk_loss": round(sdk_loss, 4),
                "ddp_loss": round(ddp_loss, 4),
                "ar_sdk_med_s": statistics.median(sdk_times),
                "ar_raw_med_s": statistics.median(raw_times),
            }
        ),
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = _args()
    if arguments.rank is None:
        launch(arguments)
    else:
        worker(arguments)
