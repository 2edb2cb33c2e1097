"""ParameterServerStrategy throughput: TensorFlow's benchmark c1 (shared/reference/tf-baseline.md).

Workload: 1 chief (this process, the coordinator) + 2 workers + 1 ps, each worker and ps a
``python -m strategyjob.server`` process; a 100k x 64 ``nn.Embedding`` split by
``MinSizePartitioner(256 KiB, max_shards=2)`` into 2 shards (both on ps0) -> mean over the 8 ids
of an example -> Linear 64-256 -> ReLU -> Linear 256-10, cross-entropy, SGD lr 0.05, a fixed
batch of 256 examples per scheduled step (``create_per_worker_dataset``), one compute thread per
process. 20 warm-up steps, then ``--repeats`` windows of 200 scheduled steps; steps/s is the
median. The embedding is read and updated row-wise on the ps (only the rows a batch touches
travel); the dense layers are read before and updated after each step.

With ``--tensorflow`` the two alternate, ``--rounds`` times (default 2): our windows, then a
TensorFlow run (200 steps, while our processes sit idle), then our windows again, and so on, so
that the load of a shared machine, which drifts over a minute, weighs on both alike. Each side's
figure is its median; the per-round ratios (with the 1-minute load average after our round)
and their median are printed too (``--rounds 1``: ours, then TF).

Bytes moved per step are counted on the wire (serialized gRPC messages: coordinator <-> workers
and workers <-> ps) and compared with the minimum the model needs: the unique rows of a batch down
and their gradients up (with their ids), plus the dense parameters down and their gradients up.
CPU time per scheduled step is reported for every process (user + system, Linux /proc; each
worker runs about half of the steps): on a shared machine it is steadier than steps/s, and with
four processes on two cores their total bounds the throughput.

    python bench/bench_ps.py                      # ~20 s on 2 cores
    python bench/bench_ps.py --tensorflow VENV    # also TF's PS (bench/tf_ps_reference.py), ~1 min

Without ``--tensorflow`` the TensorFlow figure is the recorded one (102.3 steps/s, c1 in
tf-baseline.md, same 2-core machine class), and the script says so. The last line is
``steps/s: strategyjob_ps=... tensorflow_ps=... ratio=...`` (bar: ratio >= 1, aim 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.support: shared test and benchmark tooling

from tests.support.ports import free_ports  # noqa: E402

SDK = HERE.parent / "sdk"
TF_RECORDED_STEPS_PER_S = 102.3  # tf-baseline.md, benchmark c1 (median of 3)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ids-per-example", type=int, default=8)
    p.add_argument("--batch", type=int, default=256, help="examples per scheduled step")
    p.add_argument("--min-shard-bytes", type=int, default=256 << 10)
    p.add_argument("--max-shards", type=int, default=2)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--tensorflow", metavar="VENV", help="also run TF with VENV/bin/python")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="with --tensorflow: alternate ours (--repeats windows) and TF this many times",
    )
    return p.parse_args()


class _Servers:
    """The ps and worker processes, each in its own process group (killed on exit)."""

    def __init__(self, cluster: dict[str, list[str]], logdir: str) -> None:
        self.procs: list[subprocess.Popen] = []
        # The servers refuse to start without a token; this process (the chief) carries it too.
        os.environ.setdefault("STRATEGYJOB_TOKEN", secrets.token_urlsafe(16))
        for kind in ("ps", "worker"):
            for i in range(len(cluster[kind])):
                env = dict(
                    os.environ,
                    PYTHONPATH=f"{SDK}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    OMP_NUM_THREADS="1",
                    TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}}),
                )
                log = open(os.path.join(logdir, f"{kind}{i}.log"), "w")
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "strategyjob.server"],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def cpu_seconds(self) -> list[float]:
        """User + system CPU seconds used so far by each server (Linux /proc)."""
        ticks = os.sysconf("SC_CLK_TCK")
        out = []
        for proc in self.procs:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                out.append((int(fields[11]) + int(fields[12])) / ticks)
            except (OSError, IndexError):
                out.append(float("nan"))
        return out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)


def run_strategyjob(args: argparse.Namespace, between: Any = None) -> dict:
    """Our cluster: ``--repeats`` timed windows, then ``between(round)`` (TensorFlow's run,
    while our processes sit idle), and so on for ``--rounds`` rounds when ``between`` is
    given."""
    sys.path.insert(0, str(SDK))
    import torch
    import torch.nn.functional as F
    from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
    from strategyjob.ps import _remote, _transport
    from strategyjob.ps.coordinator import ClusterCoordinator
    from strategyjob.ps.partitioners import MinSizePartitioner
    from strategyjob.strategies.parameter_server import ParameterServerStrategy
    from torch import nn

    torch.set_num_threads(1)
    ports = free_ports(1 + args.workers + args.ps)
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {
        "chief": addr[:1],
        "worker": addr[1 : 1 + args.workers],
        "ps": addr[1 + args.workers :],
    }
    logdir = tempfile.mkdtemp(prefix="bench_ps_")
    servers = _Servers(cluster, logdir)
    try:
        resolver = SimpleClusterResolver(ClusterSpec(cluster), task_type="chief", task_id=0)
        partitioner = MinSizePartitioner(args.min_shard_bytes, args.max_shards)
        strategy = ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        coordinator = ClusterCoordinator(strategy)
        V, D = args.vocab, args.dim

        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.Embedding(V, D)
                self.l1 = nn.Linear(D, 256)
                self.l2 = nn.Linear(256, 10)

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                return self.l2(F.relu(self.l1(self.emb(ids).mean(1))))

        with strategy.scope():
            torch.manual_seed(1)
            model = Model()
            nn.init.uniform_(model.emb.weight, -0.05, 0.05)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
        shards = strategy.extended._parameter_device(model.emb.weight)
        gen = torch.Generator().manual_seed(2)
        ids = torch.randint(0, V, (args.batch, args.ids_per_example), generator=gen)
        labels = torch.randint(0, 10, (args.batch,), generator=gen)

        def dataset_fn():
            while True:
                yield ids, labels

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        def train_step(it):
            def step_fn(batch):
                x, y = batch
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                return loss.detach()

            return strategy.run(step_fn, args=(next(it),))

        ps_calls = [0]

        def traffic_reset() -> int:
            total = 0
            for task in range(args.ps):
                (counts,) = _transport.run_ps_ops(task, [_remote.var_op("traffic", "")])
                total += int(counts[0] + counts[1])
                ps_calls[0] += int(counts[2])
            for worker in coordinator._pool.workers.values():
                total += sum(worker.traffic)
                worker.traffic[:] = [0, 0]
            return total

        t0 = time.perf_counter()
        for _ in range(args.warmup):
            rv = coordinator.schedule(train_step, args=(iterator,))
        coordinator.join()
        loss_first = float(rv.fetch())
        warmup_s = time.perf_counter() - t0
        rates, traffic, round_rates, round_loads = [], [], [], []
        rounds = max(1, args.rounds) if between is not None else 1
        cpu_s = [0.0] * len(servers.procs)
        chief_s = 0.0
        for r in range(rounds):
            cpu0, chief0 = servers.cpu_seconds(), time.process_time()
            for _ in range(args.repeats):
                traffic_reset()
                t = time.perf_counter()
                for _ in range(args.steps):
                    rv = coordinator.schedule(train_step, args=(iterator,))
                coordinator.join()
                rates.append(args.steps / (time.perf_counter() - t))
                ps_calls[0] = 0
                traffic.append(traffic_reset() / args.steps)
            cpu_s = [c + b - a for c, a, b in zip(cpu_s, cpu0, servers.cpu_seconds())]
            chief_s += time.process_time() - chief0
            round_rates.append(round(statistics.median(rates[-args.repeats :]), 2))
            round_loads.append(round(os.getloadavg()[0], 2))  # 1-minute load average
            if between is not None:
                between(r)
        total_steps = args.steps * args.repeats * rounds
        cpu_ms = [round(1000 * c / total_steps, 2) for c in cpu_s]
        chief_ms = round(1000 * chief_s / total_steps, 2)
        loss_last = float(rv.fetch())
        unique = int(torch.unique(ids).numel())
        dense = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("emb"))
        minimum = 2 * unique * 8 + 2 * unique * D * 4 + 2 * dense * 4
        return dict(
            bench="strategyjob_ps",
            workers=args.workers,
            ps=args.ps,
            emb_shards=shards,
            warmup_s=round(warmup_s, 2),
            steps=args.steps,
            steps_per_s_windows=[round(r, 1) for r in rates],
            steps_per_s_rounds=round_rates,
            load_avg_rounds=round_loads,
            steps_per_s=round(statistics.median(rates), 2),
            loss_first=round(loss_first, 4),
            loss_last=round(loss_last, 4),
            cpu_ms_per_step=dict(
                chief=chief_ms,
                **{f"ps{i}": cpu_ms[i] for i in range(args.ps)},
                **{f"worker{i}": cpu_ms[args.ps + i] for i in range(args.workers)},
            ),
            ps_calls_per_step=round(ps_calls[0] / args.steps, 2),
            bytes_per_step=round(statistics.median(traffic)),
            min_bytes_per_step=minimum,
        )
    finally:
        servers.close()


def run_tensorflow(args: argparse.Namespace) -> dict:
    python = Path(args.tensorflow) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"--tensorflow {args.tensorflow}: {python} does not exist")
    cmd = [
        str(python),
        str(HERE / "tf_ps_reference.py"),
        "--workers",
        str(args.workers),
        "--ps",
        str(args.ps),
        "--max-shards",
        str(args.max_shards),
        "--steps",
        str(args.steps),
        "--timeout",
        str(args.timeout),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(
        f"TensorFlow run gave no RESULT:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )


def main() -> None:
    args = _args()
    tf_rates: list[float] = []

    def tensorflow_round(_round: int) -> None:
        tf = run_tensorflow(args)
        print("RESULT " + json.dumps(tf), flush=True)
        tf_rates.append(float(tf["steps_per_s"]))

    ours = run_strategyjob(args, tensorflow_round if args.tensorflow else None)
    print("RESULT " + json.dumps(ours), flush=True)
    if args.tensorflow:
        rounds = zip(ours["steps_per_s_rounds"], tf_rates, ours["load_avg_rounds"])
        ratios = []
        for i, (mine, theirs, load) in enumerate(rounds):
            ratios.append(mine / theirs)
            print(
                f"round {i + 1}: strategyjob_ps={mine} tensorflow_ps={theirs} "
                f"ratio={ratios[-1]:.2f} load_avg={load}"
            )
        print(f"ratio per round: median={statistics.median(ratios):.2f} of {len(ratios)} rounds")
        tf_rate = round(statistics.median(tf_rates), 2)
        source = f"measured now, median of {len(tf_rates)} run(s) alternating with ours"
    else:
        tf_rate = TF_RECORDED_STEPS_PER_S
        source = "recorded in tf-baseline.md (c1); no TensorFlow venv given (--tensorflow VENV)"
    print(
        f"bytes/step: moved={ours['bytes_per_step']} minimum={ours['min_bytes_per_step']} "
        f"ratio={ours['bytes_per_step'] / ours['min_bytes_per_step']:.2f}"
    )
    cpu = ours["cpu_ms_per_step"]
    print(
        "cpu ms/step: "
        + " ".join(f"{name}={ms}" for name, ms in cpu.items())
        + f" total={sum(cpu.values()):.2f}"
    )
    print(f"tensorflow figure: {source}")
    print(
        f"steps/s: strategyjob_ps={ours['steps_per_s']} tensorflow_ps={tf_rate} "
        f"ratio={ours['steps_per_s'] / tf_rate:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
