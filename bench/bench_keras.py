"""Keras ``fit`` under MultiWorkerMirroredStrategy vs the README's custom loop vs TensorFlow's.

Workload (``keras_workload.py``): MLP 784-512-512-10, ReLU, sparse cross-entropy on logits,
SGD lr 0.01, global batch 256, 2 worker processes with one compute thread each, gloo on
127.0.0.1, the same in-memory arrays (``--examples`` rows) on every worker, as a Keras user
holds them. In the same two processes, timed in alternating windows (one ``fit`` call each):

* ``keras``: the model built in ``strategy.scope()`` (which compiles it too), then
  ``model.fit(x, y, batch_size=256, epochs=EPOCHS, verbose=0)``;
* ``loop``: the README's loop on the same model (a torch MLP with the Keras model's initial
  weights, built in the scope of a strategy of its own), ``experimental_distribute_dataset``
  of a shuffled ``DataLoader`` of the same arrays with the global batch,
  ``strategy.run(step_fn)`` + ``strategy.reduce(MEAN, loss)``, as many steps as a ``fit``;
* ``plain``: plain Keras ``fit`` without any strategy on this worker's share of the arrays
  (batch 128): Keras's own cost per step on one process, no collective;
* ``torch``: a plain torch loop (no strategy) on the same share: ``plain / torch`` is what
  Keras itself costs, ``keras / plain`` and ``loop / torch`` what the strategy costs.

A window's steps/s runs from the end of its first step to the end of its last (a Keras
callback's ``on_train_batch_end`` stamps; the same stamps after each loop step), so process
start, ``fit``'s set-up and the workers' meeting are not counted. Then, with ``--tensorflow
VENV``, TensorFlow 2.21's Keras ``fit`` of the same model under its MultiWorkerMirroredStrategy
(``tf_keras_reference.py``: ``tf_keras``, TensorFlow's Keras 2; its bundled Keras 3 crashes
there), after the torch windows; and the same Keras job on one worker (``keras``, ``plain``
and ``torch`` alternating), whose examples/s against the two workers' shows the work split.
Examples/s are the job's: steps/s x the global batch.

    python bench/bench_keras.py                          # ~2 minutes on 2 cores
    python bench/bench_keras.py --tensorflow /tmp/venv-tf

The last line is ``steps/s: keras_fit=… custom_loop=… tf_keras_fit=… keras/tf=… (aim 1.3)
keras/loop=… (aim 0.9)``.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mwms import (
    _results,
    _spawn_all,
    _window_rates,
    run_tensorflow_workers,
    set_tf_config,
    sgd_step_fn,
    worker_env,
)
from keras_workload import (
    LEARNING_RATE,
    SIZES,
    arrays,
    clock_callback,
    keras_mlp,
    rate_and_cpu,
    steps_per_window,
)
from strategyjob.launcher import free_ports

LOOPS = ("keras", "loop", "plain", "torch")
Window = tuple[list[float], list[float], float]  # wall and CPU stamps after each step, loss
TF_AIM, LOOP_AIM = 1.3, 0.9


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="alternating windows per loop")
    p.add_argument("--epochs", type=int, default=2, help="epochs of one fit call (a window)")
    p.add_argument("--examples", type=int, default=256 * 15, help="rows of the arrays")
    p.add_argument("--warmup", type=int, default=1, help="untimed windows per loop first")
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--nworkers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--no-single", action="store_true", help="skip the 1-worker Keras job")
    p.add_argument(
        "--profile", action="store_true", help="cProfile a window of each loop (rank 0's)"
    )
    p.add_argument("--tensorflow", metavar="VENV", help="also tf_keras fit under TF's MWMS")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    p.add_argument("--loops", default=",".join(LOOPS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.examples % args.global_batch:
        p.error(
            f"--examples {args.examples} is not a multiple of --global-batch "
            f"{args.global_batch}: every step must be a full global batch for examples/s "
            "to be steps/s x the batch"
        )
    if args.global_batch % args.nworkers:
        p.error(f"--global-batch {args.global_batch} does not split over {args.nworkers} workers")
    if args.tensorflow and not (Path(args.tensorflow) / "bin" / "python").exists():
        p.error(f"--tensorflow {args.tensorflow}: no bin/python there (see bench/README.md)")
    if steps_per_window(args.examples, args.global_batch, args.epochs) < 2:
        p.error("a window needs at least 2 steps: raise --examples or --epochs")
    return args


# ----------------------------------------------------------------------------------- launcher
def torch_job(args: argparse.Namespace, nworkers: int, loops: tuple[str, ...]) -> list[dict]:
    """Run this script's worker in ``nworkers`` processes timing ``loops``; their results."""
    ports = free_ports(nworkers)
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--tensorflow=")]
    if "--tensorflow" in forwarded:  # the workers run torch only
        i = forwarded.index("--tensorflow")
        del forwarded[i : i + 2]
    job = [
        f"--nworkers={nworkers}",
        f"--loops={','.join(loops)}",
        f"--ports={','.join(map(str, ports))}",
    ]
    env = dict(worker_env(args.threads), KERAS_BACKEND="torch")
    commands = [
        ([sys.executable, __file__, *forwarded, *job, f"--rank={r}"], env) for r in range(nworkers)
    ]
    print(
        f"torch: {nworkers} process(es) x {args.threads} thread(s), loops {list(loops)}, "
        f"{args.rounds} alternating windows of {args.epochs} epoch(s) x "
        f"{args.examples // args.global_batch} steps, global batch {args.global_batch}",
        flush=True,
    )
    return _results(_spawn_all(commands, args.timeout))


def summarize(results: list[dict], loops: tuple[str, ...], label: str) -> dict[str, float]:
    """Print each loop's windows; return their median steps/s."""
    medians = {}
    for loop in loops:
        rates = _window_rates(results, f"{loop}_windows")
        medians[loop] = statistics.median(rates)
        cpu = statistics.fmean(r[f"{loop}_cpu_us"] for r in results)
        print(
            f"{label} {loop:5s} steps/s median {medians[loop]:7.2f} (windows "
            f"{min(rates):.1f} - {max(rates):.1f}), CPU per step and process {cpu:6.0f} us, "
            f"final loss {results[0][f'{loop}_loss']}"
        )
    for r in results:
        for line in r.get("profile", []):
            print(line)
    return medians


def paired(results: list[dict], a: str, b: str) -> str:
    """The median of the rounds' a/b ratios (each round times both back to back)."""
    ratios = [
        x / y
        for x, y in zip(
            _window_rates(results, f"{a}_windows"), _window_rates(results, f"{b}_windows")
        )
    ]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    median = statistics.median(ratios)
    return f"{median:.3f} (median of {len(ratios)} rounds, quartiles {q1:.3f} - {q3:.3f})"


def run_tf_keras(args: argparse.Namespace) -> tuple[float, float]:
    """tf_keras fit under TensorFlow's MWMS on every worker; print and return its steps/s
    and CPU per step and process."""
    options = [f"--examples={args.examples}", f"--epochs={args.epochs}", f"--rounds={args.rounds}"]
    print("tensorflow: tf_keras fit under MultiWorkerMirroredStrategy (RING)", flush=True)
    results = run_tensorflow_workers(args, "tf_keras_reference.py", options)
    rates = _window_rates(results, "windows")
    sps = statistics.median(rates)
    cpu = statistics.fmean(r["cpu_us"] for r in results)
    print(
        f"tf_keras fit steps/s median {sps:7.2f} (windows {min(rates):.1f} - {max(rates):.1f}), "
        f"CPU per step and process {cpu:6.0f} us, final loss {results[0]['loss']} "
        f"(TensorFlow {results[0]['tf_version']}, tf_keras {results[0]['tf_keras_version']})"
    )
    return sps, cpu


def launch(args: argparse.Namespace) -> None:
    batch, n = args.global_batch, args.nworkers
    results = torch_job(args, n, LOOPS)
    medians = summarize(results, LOOPS, f"{n} workers:")
    print(f"paired ratio keras/loop: {paired(results, 'keras', 'loop')}")
    print(f"paired ratio keras/plain: {paired(results, 'keras', 'plain')}")
    print(f"paired ratio plain/torch: {paired(results, 'plain', 'torch')} (Keras's own cost)")
    tf_sps, tf_cpu = run_tf_keras(args) if args.tensorflow else (float("nan"), float("nan"))
    if not args.no_single:
        alone = ("keras", "plain", "torch")
        single = summarize(torch_job(args, 1, alone), alone, "1 worker: ")
        print(
            f"Keras fit job examples/s: 1 worker {single['keras'] * batch:.0f}, {n} workers "
            f"{medians['keras'] * batch:.0f} (x{medians['keras'] / single['keras']:.2f}); "
            f"plain Keras, one process, batch {batch}: {single['plain'] * batch:.0f}, "
            f"plain torch: {single['torch'] * batch:.0f}"
        )
    keras_sps, loop_sps = medians["keras"], medians["loop"]
    cpu = {loop: statistics.fmean(r[f"{loop}_cpu_us"] for r in results) for loop in LOOPS}
    print(
        f"CPU per step and process (all threads; load inflates it less than wall time): "
        f"keras_fit={cpu['keras']:.0f} us custom_loop={cpu['loop']:.0f} us "
        f"tf_keras_fit={tf_cpu:.0f} us; loop/keras={cpu['loop'] / cpu['keras']:.3f} "
        f"tf/keras={tf_cpu / cpu['keras']:.3f}"
    )
    print(
        f"examples/s (job, {n} workers): keras_fit={keras_sps * batch:.0f} "
        f"custom_loop={loop_sps * batch:.0f} tf_keras_fit={tf_sps * batch:.0f}"
    )
    print(
        f"steps/s: keras_fit={keras_sps:.2f} custom_loop={loop_sps:.2f} "
        f"tf_keras_fit={tf_sps:.2f} keras/tf={keras_sps / tf_sps:.3f} (aim {TF_AIM}) "
        f"keras/loop={keras_sps / loop_sps:.3f} (aim {LOOP_AIM})"
    )


# ------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    set_tf_config(args)
    n, rank, loops = args.nworkers, args.rank, args.loops.split(",")
    import keras  # on torch: KERAS_BACKEND is set in the job's env, as the README says
    import strategyjob as sj
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(args.threads)
    x, y = arrays(args.examples)
    steps = steps_per_window(args.examples, args.global_batch, args.epochs)

    # (keras) built and compiled in the scope; fit as users write it
    keras_strategy = sj.MultiWorkerMirroredStrategy()  # also the gloo group of the barriers
    keras.utils.set_random_seed(0)
    with keras_strategy.scope():
        model = keras_mlp(keras)

    def fit_window(fit_model: Any, xs: Any, ys: Any, batch_size: int) -> Window:
        clock = clock_callback(keras)
        history = fit_model.fit(
            xs, ys, batch_size=batch_size, epochs=args.epochs, verbose=0, callbacks=[clock]
        )
        return clock.wall, clock.cpu, float(history.history["loss"][-1])

    windows: dict[str, Callable[[], Window]] = {
        "keras": lambda: fit_window(model, x, y, args.global_batch)
    }

    def torch_mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
        """The same MLP in torch, with the Keras model's initial weights (the chief's)."""
        linears = [nn.Linear(a, b) for a, b in itertools.pairwise(SIZES)]
        mlp = nn.Sequential(linears[0], nn.ReLU(), linears[1], nn.ReLU(), linears[2])
        with torch.no_grad():
            kernels = model.get_weights()  # [kernel (in, out), bias] per Dense layer
            for layer, kernel, bias in zip(linears, kernels[::2], kernels[1::2]):
                layer.weight.copy_(torch.from_numpy(kernel.T))
                layer.bias.copy_(torch.from_numpy(bias))
        return mlp, torch.optim.SGD(mlp.parameters(), lr=LEARNING_RATE)

    def loader(xs: Any, ys: Any, batch_size: int) -> DataLoader:
        return DataLoader(
            TensorDataset(torch.from_numpy(xs), torch.from_numpy(ys)),
            batch_size=batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),  # the same order on every worker
        )

    def stamped(batches: Any, step: Callable[..., Any]) -> Callable[[], Window]:
        """A window of ``args.epochs`` passes over ``batches``, stamped after every step."""

        def window() -> Window:
            wall, cpu = [], []
            for _ in range(args.epochs):
                for batch in batches:
                    loss = step(*batch)
                    wall.append(time.perf_counter())
                    cpu.append(time.process_time())
            return wall, cpu, float(loss)

        return window

    # (loop) the README's custom loop, in the scope of a strategy of its own
    if "loop" in loops:
        loop_strategy = sj.MultiWorkerMirroredStrategy()
        with loop_strategy.scope():
            step_fn = sgd_step_fn(*torch_mlp())
        dist_dataset = loop_strategy.experimental_distribute_dataset(
            loader(x, y, args.global_batch)
        )

        def loop_step(xb: Any, yb: Any) -> Any:
            per_replica = loop_strategy.run(step_fn, args=(xb, yb))
            return loop_strategy.reduce(sj.ReduceOp.MEAN, per_replica, axis=None)

        windows["loop"] = stamped(dist_dataset, loop_step)

    # (plain, torch) no strategy, this worker's share: Keras's own cost per step, and torch's
    share = args.global_batch // n
    if "plain" in loops:
        plain = keras_mlp(keras)
        plain.set_weights(model.get_weights())
        windows["plain"] = lambda: fit_window(plain, x[rank::n], y[rank::n], share)
    if "torch" in loops:
        windows["torch"] = stamped(loader(x[rank::n], y[rank::n], share), sgd_step_fn(*torch_mlp()))

    def timed(loop: str) -> tuple[float, float, float]:
        if n > 1:
            torch.distributed.barrier()
        wall, cpu, loss = windows[loop]()
        if len(wall) != steps:
            raise RuntimeError(f"{loop}: {len(wall)} steps in a window, expected {steps}")
        rate, cpu_per_step = rate_and_cpu(wall, cpu)
        return rate, cpu_per_step, loss

    for _ in range(args.warmup):
        for loop in loops:
            timed(loop)
    rates: dict[str, list[float]] = {loop: [] for loop in loops}
    cpu: dict[str, list[float]] = {loop: [] for loop in loops}
    losses: dict[str, float] = {}
    for r in range(args.rounds):
        for loop in loops if r % 2 == 0 else reversed(loops):
            rate, cpu_per_step, losses[loop] = timed(loop)
            rates[loop].append(rate)
            cpu[loop].append(cpu_per_step)
    result: dict = {"rank": rank}
    for loop in loops:
        result[f"{loop}_windows"] = rates[loop]
        result[f"{loop}_cpu_us"] = 1e6 * statistics.fmean(cpu[loop])
        result[f"{loop}_loss"] = round(losses[loop], 4)
    if args.profile:  # every worker profiles (same collectives); rank 0's is printed
        lines = [line for loop in loops for line in profile(loop, windows[loop], steps, n)]
        if rank == 0:
            result["profile"] = lines
    print("RESULT " + json.dumps(result), flush=True)
    if n > 1:
        torch.distributed.barrier()


AREAS = (("strategyjob", "/strategyjob/"), ("keras", "/keras/"), ("torch (Python)", "/torch/"))


def _area(file: str, name: str) -> str:
    """Which code a cProfile entry is: the SDK's, Keras's, torch's Python, torch's kernels."""
    for area, part in AREAS:
        if part in file:
            return area
    if file == "~" and "torch" in name:
        return "torch (C++: kernels, autograd, gloo waits)"
    return "other Python and builtins"


def profile(loop: str, fn: Callable[[], object], steps: int, workers: int) -> list[str]:
    """Where the main thread's CPU goes in ``fn`` (cProfile on ``time.thread_time``, so
    waiting costs nothing), per training step: by area, then the top entries."""
    profiler = cProfile.Profile(time.thread_time)
    profiler.runcall(fn)
    stats = pstats.Stats(profiler)
    entries = stats.stats.items()  # type: ignore[attr-defined]
    areas: dict[str, float] = {}
    for (file, _, name), (_, _, tottime, _, _) in entries:
        areas[_area(file, name)] = areas.get(_area(file, name), 0.0) + tottime
    lines = [
        f"--- {loop}, {workers} worker(s): main-thread CPU per step under cProfile: "
        f"{1e6 * sum(areas.values()) / steps:.0f} us ---"
    ]
    lines += [
        f"  {1e6 * t / steps:7.0f} us  {area}"
        for area, t in sorted(areas.items(), key=lambda a: -a[1])
    ]
    rows = sorted(entries, key=lambda e: -e[1][2])[:10]
    lines += [
        f"  {1e6 * tottime / steps:7.0f} us {calls / steps:6.1f} calls  "
        f"{Path(file).name}:{line}({name})"
        for (file, line, name), (_, calls, tottime, _, _) in rows
    ]
    return lines


if __name__ == "__main__":
    arguments = _args()
    (launch if arguments.rank is None else worker)(arguments)
