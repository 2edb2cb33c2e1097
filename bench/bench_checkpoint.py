"""The stall a checkpoint adds to training, against ``torch.save`` of the same state.

Two MultiWorkerMirroredStrategy workers (gloo on 127.0.0.1, one compute thread each) hold a
~100 MB model (two ``Linear(3584, 3584)`` layers, float32) and its SGD-with-momentum optimizer
built in the strategy's scope. In alternating rounds each worker times:

* ``manager.save()``: ``strategyjob.train.CheckpointManager`` as users call it, on every worker
  (the chief writes an atomic file; the other waits for it) — the stall a training step sees;
* ``torch.save({"model": ..., "optimizer": ...}, path)`` of the same state dicts on the chief
  alone, to the same directory (the reference: what plain torch code pays, without atomicity or
  the workers' agreement); the other worker waits at a barrier meanwhile.

Both write to a temporary directory on the same file system and are followed by the same barrier,
so they stall training alike. The last line is ``seconds: checkpoint=… torch_save=… ratio=…``.

    python bench/bench_checkpoint.py            # ~1 minute on 2 cores
    python bench/bench_checkpoint.py --preemption   # ~1 minute: SIGTERM, save, exit, restart

``--preemption`` times a preemption of the same model under ``strategyjob run``
(``bench/preemption_train.py``: a ``PreemptionCheckpointHandler`` over a ``CheckpointManager``):
SIGTERM to worker 1 → every replica saved and exited, and the restart → its first resumed
step, against the first start → its first step (process start, imports and rendezvous, which a
restart pays too). Last line: ``seconds: restart_to_step=… start_to_step=… ratio=…``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the repository root: the tests' shared builders (tests.support), whatever the directory
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from bench_mwms import SDK, _results, _spawn_all
from strategyjob.launcher import free_ports

from tests.support.manifests import preemptible_workers
from tests.support.processes import start_strategyjob_run, stop_strategyjob_run


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds of each")
    p.add_argument("--preemption", action="store_true", help="time a preemption instead")
    p.add_argument("--width", type=int, default=3584, help="the two Linear layers' width")
    p.add_argument("--nworkers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def launch(args: argparse.Namespace) -> None:
    ports = free_ports(args.nworkers)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SDK), env.get("PYTHONPATH")]))
    for key in ("TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as directory:
        commands = [
            (
                [
                    sys.executable,
                    __file__,
                    *sys.argv[1:],
                    "--rank",
                    str(r),
                    "--ports",
                    ",".join(map(str, ports)),
                    "--dir",
                    directory,
                ],
                env,
            )
            for r in range(args.nworkers)
        ]
        results = _results(_spawn_all(commands, args.timeout))
    if len(results) != args.nworkers:
        sys.exit("a worker failed; run again with fewer rounds to see its output")
    chief = next(r for r in results if r["rank"] == 0)
    print(
        f"{args.nworkers} workers, model + momentum {chief['megabytes']:.0f} MB of state, "
        f"checkpoint file {chief['file_megabytes']:.0f} MB, {args.rounds} alternating rounds"
    )
    for r in sorted(results, key=lambda r: r["rank"]):
        print(
            f"rank {r['rank']}: manager.save() stall {_ms(r['checkpoint'])}; "
            f"torch.save on the chief, stall {_ms(r['torch_save'])}"
        )
    checkpoint = max(statistics.median(r["checkpoint"]) for r in results)
    reference = max(statistics.median(r["torch_save"]) for r in results)
    print(
        f"seconds: checkpoint={checkpoint:.3f} torch_save={reference:.3f} "
        f"ratio={checkpoint / reference:.2f}"
    )


def _ms(values: list[float]) -> str:
    return (
        f"median {1e3 * statistics.median(values):.0f} ms ("
        + ", ".join(f"{1e3 * v:.0f}" for v in values)
        + ")"
    )


def worker(args: argparse.Namespace) -> None:
    import strategyjob as sj
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    ports = args.ports.split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": args.rank},
        }
    )
    strategy = sj.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = nn.Sequential(nn.Linear(args.width, args.width), nn.Linear(args.width, args.width))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    # one step, so that the optimizer holds its momentum buffers (state as in training)
    def step() -> None:
        optimizer.zero_grad()
        model(torch.ones(4, args.width)).sum().backward()
        optimizer.step()

    strategy.run(step)
    state_bytes = sum(p.numel() * 4 for p in model.parameters()) * 2  # weights + momentum

    directory = Path(args.dir)
    step_counter = torch.tensor(0)
    checkpoint = sj.train.Checkpoint(model=model, optimizer=optimizer, step=step_counter)
    manager = sj.train.CheckpointManager(checkpoint, directory / "managed", max_to_keep=1)
    plain = directory / "plain.pt"
    timings: dict[str, list[float]] = {"checkpoint": [], "torch_save": []}

    def timed_checkpoint() -> float:
        dist.barrier()
        start = time.perf_counter()
        manager.save()
        dist.barrier()  # training resumes when every worker may go on
        return time.perf_counter() - start

    def timed_torch_save() -> float:
        dist.barrier()
        start = time.perf_counter()
        if args.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, plain)
        dist.barrier()
        return time.perf_counter() - start

    timed_checkpoint()  # warm-up of both paths (first file creation, page cache)
    timed_torch_save()
    for r in range(args.rounds):
        order = ("checkpoint", "torch_save") if r % 2 == 0 else ("torch_save", "checkpoint")
        for kind in order:
            fn = timed_checkpoint if kind == "checkpoint" else timed_torch_save
            timings[kind].append(fn())
    file_bytes = 0
    if args.rank == 0 and manager.latest_checkpoint:
        file_bytes = Path(manager.latest_checkpoint).stat().st_size
    print(
        "RESULT "
        + json.dumps(
            {
                "rank": args.rank,
                "megabytes": state_bytes / 1e6,
                "file_megabytes": file_bytes / 1e6,
                **timings,
            }
        ),
        flush=True,
    )
    dist.barrier()


def _wait_for(what: str, ready, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while (value := ready()) is None:
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


def _read_all(out: Path, kind: str, cast):
    """Both workers' ``OUT/KIND-RANK`` values, once both files exist; None before."""
    files = [out / f"{kind}-{r}" for r in (0, 1)]
    return [cast(f.read_text()) for f in files] if all(f.exists() for f in files) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "(Z)" not in _stat(pid)


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1][:4]
    except OSError:
        return "(Z)"


def preemption(args: argparse.Namespace) -> None:
    script = Path(__file__).with_name("preemption_train.py")
    with tempfile.TemporaryDirectory(prefix="bench-preemption-") as directory:
        out = Path(directory)
        manifest = preemptible_workers("bench-preemption", [str(script), str(out)])
        started = time.time()
        launcher = start_strategyjob_run(
            manifest, out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            running = _wait_for("5 steps on both workers", lambda: _read_all(out, "running", int))
            first_step = max(_wait_for("the first steps", lambda: _read_all(out, "started", float)))
            signalled = time.time()
            os.kill(running[1], signal.SIGTERM)
            _wait_for("both replicas to exit", lambda: None if any(map(_alive, running)) else 1)
            exited = time.time()
            resumed = max(_wait_for("the resumed steps", lambda: _read_all(out, "resumed", float)))
            code = launcher.wait(timeout=300)
        finally:
            stop_strategyjob_run(launcher)
    if code != 0:
        sys.exit(f"strategyjob run exited {code}")
    start_to_step = first_step - started
    restart_to_step = resumed - exited
    print("2 MWMS workers, 100 MB model + momentum; SIGTERM to worker 1 after 5 steps")
    print(f"SIGTERM -> both saved and exited: {exited - signalled:.2f} s")
    print(f"first start -> first step: {start_to_step:.2f} s (launcher start included)")
    print(f"all exited -> first resumed step: {restart_to_step:.2f} s (restore included)")
    print(
        f"seconds: restart_to_step={restart_to_step:.2f} start_to_step={start_to_step:.2f} "
        f"ratio={restart_to_step / start_to_step:.2f}"
    )


if __name__ == "__main__":
    arguments = _args()
    if arguments.preemption:
        preemption(arguments)
    elif arguments.rank is None:
        launch(arguments)
    else:
        worker(arguments)
