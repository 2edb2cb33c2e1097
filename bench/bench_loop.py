"""The README's training loop, input pipeline included, against DDP with a DistributedSampler.

``bench_mwms.py`` feeds both loops one fixed batch; users feed a ``DataLoader``. Here every loop
reads a shuffled map-style dataset (MLP 784-512-512-10 on synthetic data, global batch 256,
2 processes, one compute thread each, gloo on 127.0.0.1), epoch after epoch:

* ``dataset``: ``strategy.experimental_distribute_dataset(DataLoader(ds, batch_size=256))``
  (the README's loop: global batches, split per replica), ``strategy.run`` + ``strategy.reduce``;
* ``fn`` / ``exp_fn``: ``distribute_datasets_from_function`` and
  ``experimental_distribute_datasets_from_function``, each worker's ``DataLoader`` sharded with
  the ``InputContext`` (``DistributedSampler(num_replicas=ctx.num_input_pipelines,
  rank=ctx.input_pipeline_id)``, ``ctx.get_per_replica_batch_size(256)``);
* ``ddp``: ``DistributedDataParallel`` over ``DataLoader(ds, batch_size=128,
  sampler=DistributedSampler(ds))`` with ``set_epoch`` each epoch, the loss all-reduced.

The loops live in the same two processes and are timed in alternating windows. Each phase of
a step (next batch, the step, the loss reduce) is also timed with ``time.thread_time()``: the
main thread's CPU, which machine load does not inflate. ``--profile`` adds where the SDK's own
Python spends it (cProfile, per step).

    python bench/bench_loop.py            # ~2 minutes on 2 cores

The last line is ``steps/s: sdk_loop=… torch_ddp=… ratio=…`` (bar: ratio >= 0.97).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mwms import (
    _results,
    _spawn_all,
    _window_rates,
    run_tensorflow,
    set_tf_config,
    sgd_step_fn,
    worker_env,
)
from strategyjob.launcher import free_ports

LOOPS = ("dataset", "fn", "exp_fn", "ddp")
PHASES = ("input", "step", "reduce")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=30, help="alternating windows per loop")
    p.add_argument("--steps", type=int, default=25, help="steps per window")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--examples", type=int, default=256 * 40 + 100, help="dataset size")
    p.add_argument("--nworkers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--loops", default=",".join(LOOPS), help="which loops to time")
    p.add_argument("--profile", action="store_true", help="cProfile the SDK's loop after timing")
    p.add_argument("--tensorflow", metavar="VENV", help="also TF MWMS over a tf.data input")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args: argparse.Namespace) -> None:
    ports = free_ports(args.nworkers)
    env = worker_env(args.threads)
    port_arg = ",".join(map(str, ports))
    forwarded = list(sys.argv[1:])
    if args.tensorflow:
        i = forwarded.index("--tensorflow")
        del forwarded[i : i + 2]
    commands = [
        ([sys.executable, __file__, *forwarded, "--rank", str(r), "--ports", port_arg], env)
        for r in range(args.nworkers)
    ]
    loops = args.loops.split(",")
    print(
        f"torch: {args.nworkers} processes x {args.threads} thread(s), global batch "
        f"{args.global_batch}, {args.examples} examples, loops {loops}, {args.rounds} "
        f"alternating windows of {args.steps} steps",
        flush=True,
    )
    results = _results(_spawn_all(commands, args.timeout))
    medians = {}
    for loop in loops:
        rates = _window_rates(results, f"{loop}_windows")
        medians[loop] = statistics.median(rates)
        cpu = {ph: statistics.fmean(r[f"{loop}_cpu_us"][ph] for r in results) for ph in PHASES}
        print(
            f"{loop:8s} steps/s median {medians[loop]:7.2f}  (windows "
            f"{min(rates):.1f} - {max(rates):.1f}); main-thread CPU per step: "
            + ", ".join(f"{ph} {cpu[ph]:6.0f} us" for ph in PHASES)
            + f", total {sum(cpu.values()):6.0f} us; all threads "
            + f"{statistics.fmean(r[f'{loop}_process_cpu_us'] for r in results):6.0f} us; "
            + f"final loss {results[0][f'{loop}_loss']}"
        )
    if "ddp" in medians:
        ddp_cpu = {ph: statistics.fmean(r["ddp_cpu_us"][ph] for r in results) for ph in PHASES}
        for loop in loops:
            if loop == "ddp":
                continue
            extra = {
                ph: statistics.fmean(r[f"{loop}_cpu_us"][ph] for r in results) - ddp_cpu[ph]
                for ph in PHASES
            }
            print(
                f"{loop:8s} CPU per step beyond DDP's: "
                + ", ".join(f"{ph} {extra[ph]:+5.0f} us" for ph in PHASES)
                + f", total {sum(extra.values()):+5.0f} us"
            )
    for r in results:
        if "profile" in r:
            print(f"--- rank {r['rank']}: SDK Python per step (cProfile tottime, top entries) ---")
            for line in r["profile"]:
                print(line)
    if args.tensorflow:
        # TF's loop over tf.data, after the torch windows (one run, not alternating)
        args.ar_floats, args.ar_iters = 1, 0
        tf_rate = run_tensorflow(args, ("--input=dataset", f"--examples={args.examples}"))
        for loop in loops:
            print(f"ratio {loop}/tensorflow = {medians[loop] / tf_rate:.3f}")
    if "ddp" in medians:
        ddp_rates = _window_rates(results, "ddp_windows")
        paired = {}
        for loop in loops:
            if loop == "ddp":
                continue
            # Each round times every loop once, back to back: the ratio within a round is
            # free of the machine's slower drifts, which move both loops alike.
            ratios = [s / d for s, d in zip(_window_rates(results, f"{loop}_windows"), ddp_rates)]
            paired[loop] = statistics.median(ratios)
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            print(
                f"ratio {loop}/ddp = {medians[loop] / medians['ddp']:.3f} (of the medians); "
                f"{paired[loop]:.3f} (median of {len(ratios)} rounds' ratios, "
                f"quartiles {q1:.3f} - {q3:.3f})"
            )
        sdk = "dataset" if "dataset" in medians else next(iter(medians))
        print(
            f"steps/s: sdk_loop={medians[sdk]:.2f} torch_ddp={medians['ddp']:.2f} "
            f"ratio={medians[sdk] / medians['ddp']:.3f} paired_ratio={paired[sdk]:.3f} (bar 0.97)"
        )


# ------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    import strategyjob as sj
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(args.threads)
    n, rank = args.nworkers, args.rank
    set_tf_config(args)
    loops = args.loops.split(",")
    sj.MultiWorkerMirroredStrategy()  # joins the gloo process group that DDP uses too

    data = torch.Generator().manual_seed(1234)  # the same dataset on every worker
    dataset = TensorDataset(
        torch.randn(args.examples, 784, generator=data),
        torch.randint(0, 10, (args.examples,), generator=data),
    )

    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    def forever(make_epoch: Callable[[int], Iterator]) -> Iterator:
        epoch = 0
        while True:
            yield from make_epoch(epoch)
            epoch += 1

    # --- the SDK loops: the README's code ---
    def sdk_loop(make_dataset: Callable) -> tuple[Callable, Callable, Callable]:
        # A strategy per loop: the gradients of every model built in one strategy's scope are
        # averaged at each of its steps, so the loops must not share one.
        strategy = sj.MultiWorkerMirroredStrategy()
        dist_dataset = make_dataset(strategy)
        with strategy.scope():
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)

        step_fn = sgd_step_fn(model, opt)

        def run(batch):
            return strategy.run(step_fn, args=batch)

        def reduce(per_replica):
            return strategy.reduce(sj.ReduceOp.MEAN, per_replica, axis=None)

        batches = forever(lambda _epoch: iter(dist_dataset))
        return (lambda: next(batches)), run, reduce

    def shuffled_global_loader() -> DataLoader:
        # the same shuffle on every worker: each takes its replicas' part of a global batch
        return DataLoader(
            dataset,
            batch_size=args.global_batch,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
        )

    def dataset_fn(ctx: sj.InputContext) -> DataLoader:
        sampler = DistributedSampler(
            dataset, num_replicas=ctx.num_input_pipelines, rank=ctx.input_pipeline_id, seed=0
        )
        return DataLoader(
            dataset, batch_size=ctx.get_per_replica_batch_size(args.global_batch), sampler=sampler
        )

    made: dict[str, tuple[Callable, Callable, Callable]] = {}
    if "dataset" in loops:
        made["dataset"] = sdk_loop(
            lambda s: s.experimental_distribute_dataset(shuffled_global_loader())
        )
    if "fn" in loops:
        made["fn"] = sdk_loop(lambda s: s.distribute_datasets_from_function(dataset_fn))
    if "exp_fn" in loops:
        made["exp_fn"] = sdk_loop(
            lambda s: s.experimental_distribute_datasets_from_function(dataset_fn)
        )

    # --- raw DDP with a DistributedSampler ---
    if "ddp" in loops:
        ddp = DistributedDataParallel(mlp())
        ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        sampler = DistributedSampler(dataset, seed=0)
        loader = DataLoader(dataset, batch_size=args.global_batch // n, sampler=sampler)

        def ddp_epoch(epoch: int) -> Iterator:
            sampler.set_epoch(epoch)
            return iter(loader)

        ddp_batches = forever(ddp_epoch)

        def ddp_run(batch):
            x, y = batch
            ddp_opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            ddp_opt.step()
            return loss.detach()

        def ddp_reduce(loss):
            total = loss.clone()
            dist.all_reduce(total)
            return total / n

        made["ddp"] = ((lambda: next(ddp_batches)), ddp_run, ddp_reduce)

    cpu = {loop: dict.fromkeys(PHASES, 0.0) for loop in made}
    steps_timed = dict.fromkeys(made, 0)
    process_cpu = dict.fromkeys(made, 0.0)  # every thread: gloo's and the SDK's helpers too

    def window(loop: str, count: int, timed: bool) -> tuple[float, float]:
        get, run, reduce = made[loop]
        spent = cpu[loop]
        clock = time.thread_time
        dist.barrier()
        start = time.perf_counter()
        process_start = time.process_time()
        for _ in range(count):
            t0 = clock()
            batch = get()
            t1 = clock()
            out = run(batch)
            t2 = clock()
            loss = reduce(out)
            t3 = clock()
            if timed:
                spent["input"] += t1 - t0
                spent["step"] += t2 - t1
                spent["reduce"] += t3 - t2
        value = float(loss)
        elapsed = time.perf_counter() - start
        if timed:
            steps_timed[loop] += count
            process_cpu[loop] += time.process_time() - process_start
        return count / elapsed, value

    for loop in made:
        window(loop, args.warmup, timed=False)
    windows = {loop: [] for loop in made}
    losses = {}
    order = list(made)
    for r in range(args.rounds):
        for loop in order if r % 2 == 0 else reversed(order):
            rate, losses[loop] = window(loop, args.steps, timed=True)
            windows[loop].append(rate)

    result: dict = {"rank": rank}
    for loop in made:
        result[f"{loop}_windows"] = windows[loop]
        result[f"{loop}_loss"] = round(losses[loop], 4)
        result[f"{loop}_cpu_us"] = {ph: 1e6 * cpu[loop][ph] / steps_timed[loop] for ph in PHASES}
        result[f"{loop}_process_cpu_us"] = 1e6 * process_cpu[loop] / steps_timed[loop]
    if args.profile:
        sdk = next(loop for loop in made if loop != "ddp")
        profiler = cProfile.Profile(time.thread_time)  # CPU, not waiting
        steps = args.steps * 4
        profiler.enable()
        window(sdk, steps, timed=False)
        profiler.disable()
        stats = pstats.Stats(profiler)
        rows = [
            (tottime / steps * 1e6, calls / steps, f"{Path(file).name}:{line}({name})")
            for (file, line, name), (_, calls, tottime, _, _) in stats.stats.items()
            if "strategyjob" in file
        ]
        rows.sort(reverse=True)
        total = sum(row[0] for row in rows)
        result["profile"] = [
            f"  all strategyjob Python: {total:.0f} us CPU/step (under cProfile)"
        ] + [f"  {us:7.1f} us {calls:5.1f} calls  {where}" for us, calls, where in rows[:15]]
    print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()


if __name__ == "__main__":
    arguments = _args()
    if arguments.rank is None:
        launch(arguments)
    else:
        worker(arguments)
