"""Elastic ParameterServerStrategy (issue 30): throughput at 1, 2 and 3 workers, the dip around a
resize, and a resize against the restart it replaces.

Workload: bench_ps.py's (a 100k x 64 embedding in 2 shards on one ps, two dense layers, a batch
of 256 examples per scheduled step), one chief (this process, the coordinator), 3 worker
processes and 1 ps (``python -m strategyjob.server``), one compute thread per process. The
coordinator's workers are set with ``transport.set_workers`` (what the operator's members file
and ``STRATEGYJOB_CLUSTER_FILE`` do on a cluster); the servers of the workers not in the job sit
idle.

1. **Throughput** at 1, 2 and 3 workers: steps/s over ``--seconds`` after a warm-up, steps
   scheduled 20 at a time and joined.
2. **The dip**: training at 2 workers, resized to 3 then back to 2 while steps are scheduled;
   steps/s per 0.5 s bucket; the dip is the slowest bucket in the 3 s after a resize against
   the steady rate before it, and how long the rate stays under 90 % of that.
3. **Against a restart**: without elastic workers, a resize is a restart of the job at the new
   size (what torchrun and Kubeflow's TFJob do): the time from the resize to the first step that
   ran on the new worker, against the time from stopping the job to the new worker's first step
   in the job started again at the new size (new server processes, a new chief's strategy,
   variables and datasets, here in this process): a lower bound on a restart, which on a
   cluster also recreates pods and reloads a checkpoint.

    python bench/bench_elastic.py            # ~1 min on 2 cores

The last line is ``elastic: join_s=... restart_s=... ratio=...`` (restart / join: how many
times faster a resize takes a new worker than the cheapest restart).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.support: shared test and benchmark tooling
sys.path.insert(0, str(HERE))

from bench_ps import SDK, _Servers  # noqa: E402

from tests.support.ports import free_ports  # noqa: E402


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=6.0, help="per throughput window")
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=256)
    return p.parse_args()


class Job:
    """The chief's side: strategy, model, coordinator and a per-worker dataset."""

    def __init__(self, cluster: dict[str, list[str]], workers: int, vocab: int, batch: int):
        import torch
        import torch.nn.functional as F
        from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
        from strategyjob.ps.coordinator import ClusterCoordinator, get_current_worker_index
        from strategyjob.ps.partitioners import MinSizePartitioner
        from strategyjob.strategies.parameter_server import ParameterServerStrategy
        from torch import nn

        spec = {**cluster, "worker": cluster["worker"][:workers]}
        resolver = SimpleClusterResolver(ClusterSpec(spec), task_type="chief", task_id=0)
        self.strategy = ParameterServerStrategy(
            resolver, variable_partitioner=MinSizePartitioner(256 << 10, 2)
        )
        self.coordinator = ClusterCoordinator(self.strategy)
        self.addresses = cluster["worker"]

        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.Embedding(vocab, 64)
                self.l1 = nn.Linear(64, 256)
                self.l2 = nn.Linear(256, 10)

            def forward(self, ids: torch.Tensor) -> torch.Tensor:
                return self.l2(F.relu(self.l1(self.emb(ids).mean(1))))

        with self.strategy.scope():
            torch.manual_seed(1)
            model = Model()
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(2)
        ids = torch.randint(0, vocab, (batch, 8), generator=gen)
        labels = torch.randint(0, 10, (batch,), generator=gen)

        def dataset_fn():
            while True:
                yield ids, labels

        self.iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))
        strategy = self.strategy  # what a step ships to the workers: not this object

        def train_step(it: Any) -> Any:
            def step_fn(b: Any) -> Any:
                opt.zero_grad()
                F.cross_entropy(model(b[0]), b[1]).backward()
                opt.step()
                return torch.tensor(get_current_worker_index())

            return strategy.run(step_fn, args=(next(it),))

        self.train_step = train_step

    def resize(self, workers: int) -> None:
        self.strategy.extended.transport.set_workers({i: self.addresses[i] for i in range(workers)})
        self.coordinator.refresh_workers()

    def steps(self, n: int = 20) -> list[int]:
        """Schedule ``n`` steps, wait for them: the worker index each ran on."""
        results = [
            self.coordinator.schedule(self.train_step, args=(self.iterator,)) for _ in range(n)
        ]
        self.coordinator.join()
        return [int(r.fetch()) for r in results]

    def rate(self, seconds: float) -> float:
        began, done = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            done += len(self.steps())
        return done / (time.perf_counter() - began)


def dip(job: Job, to: int, before_s: float = 3.0, after_s: float = 4.0) -> dict[str, float]:
    """Steps/s per 0.5 s bucket around a resize to ``to`` workers."""
    marks: list[tuple[float, int]] = []
    began = time.perf_counter()
    resized_at = None
    while time.perf_counter() - began < before_s + after_s:
        if resized_at is None and time.perf_counter() - began >= before_s:
            resized_at = time.perf_counter()
            job.resize(to)
        n = len(job.steps(10))
        marks.append((time.perf_counter(), n))
    assert resized_at is not None

    def bucket_rates(start: float, end: float) -> list[float]:
        rates = []
        t = start
        while t + 0.5 <= end:
            done = sum(n for at, n in marks if t < at <= t + 0.5)
            rates.append(done / 0.5)
            t += 0.5
        return rates

    steady = statistics.median(bucket_rates(began + 1.0, resized_at))
    after = bucket_rates(resized_at, resized_at + 3.0)
    slow = [r for r in after if r < 0.9 * steady]
    return {
        "steady": steady,
        "lowest": min(after),
        "depth": 1 - min(after) / steady,
        "under_90pct_s": 0.5 * len(slow),
    }


def join_time(job: Job, worker: int) -> float:
    """Seconds from a resize adding ``worker`` to the end of the first step it ran."""
    began = time.perf_counter()
    job.resize(worker + 1)
    while worker not in job.steps(4):
        pass
    return time.perf_counter() - began


def _cluster() -> dict[str, list[str]]:
    addr = [f"127.0.0.1:{p}" for p in free_ports(5)]
    return {"chief": addr[:1], "worker": addr[1:4], "ps": addr[4:]}


def main() -> None:
    args = _args()
    sys.path.insert(0, str(SDK))
    import torch

    torch.set_num_threads(1)
    cluster = _cluster()
    servers = _Servers(cluster, tempfile.mkdtemp(prefix="bench_elastic_"))
    try:
        job = Job(cluster, 1, args.vocab, args.batch)
        job.steps(40)  # warm-up: connections, the ps' tables
        rates = {}
        for workers in (1, 2, 3):
            job.resize(workers)
            job.steps(20 * workers)
            rates[workers] = job.rate(args.seconds)
            print(f"{workers} worker(s): {rates[workers]:.1f} steps/s", flush=True)
        job.resize(2)
        job.steps(40)
        up = dip(job, 3)
        down = dip(job, 2)
        for what, d in (("2 -> 3", up), ("3 -> 2", down)):
            print(
                f"resize {what}: steady {d['steady']:.1f} steps/s, lowest 0.5 s bucket after "
                f"{d['lowest']:.1f} (dip {100 * d['depth']:.0f}%), under 90% for "
                f"{d['under_90pct_s']:.1f} s",
                flush=True,
            )
        job.resize(2)
        job.steps(20)
        joins = []
        for _ in range(3):
            job.resize(2)
            job.steps(10)
            joins.append(join_time(job, 2))
        join_s = statistics.median(joins)
        restarts = []
        for _ in range(2):  # the job at the new size from scratch: processes, then the chief
            servers.close()
            began = time.perf_counter()
            cluster = _cluster()
            servers = _Servers(cluster, tempfile.mkdtemp(prefix="bench_elastic_"))
            fresh = Job(cluster, 3, args.vocab, args.batch)
            while 2 not in fresh.steps(4):
                pass
            restarts.append(time.perf_counter() - began)
        restart_s = statistics.median(restarts)
        print(
            f"a new worker's first step: resize {join_s:.2f} s (median of 3), restart at the "
            f"new size {restart_s:.2f} s (median of 2)"
        )
        print(
            f"elastic: steps_per_s_1={rates[1]:.1f} steps_per_s_2={rates[2]:.1f} "
            f"steps_per_s_3={rates[3]:.1f} dip_up={100 * up['depth']:.0f}% "
            f"dip_down={100 * down['depth']:.0f}% join_s={join_s:.2f} restart_s={restart_s:.2f} "
            f"ratio={restart_s / join_s:.1f}"
        )
    except BaseException:
        traceback.print_exc()
        servers.close()
        os._exit(1)
    servers.close()
    sys.stdout.flush()
    os._exit(0)  # the coordinators' threads: nothing more to wait for


if __name__ == "__main__":
    main()
