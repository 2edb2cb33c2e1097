"""A deterministic MultiWorkerMirroredStrategy training script for the preemption tests, run by
``strategyjob run`` (one process per worker, restarted as a whole job).

``python preemption_worker.py OUT MODE K [STEPS [PACE]]``: trains STEPS (default 12) steps of a
small MLP (fixed seed, step ``s``'s global batch drawn from a generator seeded with ``s``, split
by worker) through a ``PreemptionCheckpointHandler`` over a ``CheckpointManager`` in ``OUT/ckpt``
that also saves every ``INTERVAL`` steps. On its first attempt (counted in ``OUT/starts-RANK``)
worker 1 sends itself, before step ``K``: ``sigterm``, SIGTERM; ``sigkill``, SIGKILL (no
notice); ``none``, nothing; ``mark``: steps paced by PACE seconds (default 0.005), and every
worker writes its pid to ``OUT/running-RANK`` and prints ``RUNNING K`` once it has run step
``K`` (for tests that signal it, the launcher or its pod from outside). At the end each worker
writes its model and optimizer state to ``OUT/final-RANK.pt`` and prints ``RESULT {json}``
(attempt, first step of the attempt, steps run) and ``STATE <sha256>``, a digest of that state's
bytes (for tests that only see the workers' logs). With ``REPORT=1`` in its environment each
step is reported (``strategyjob.report``, the learning rate as its metric).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import strategyjob as sj
import torch
import torch.nn.functional as F
from strategyjob import train
from torch import nn

torch.set_num_threads(1)

STEPS = 12
INTERVAL = 3


def main() -> None:
    out, mode, kill_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else STEPS
    pace = float(sys.argv[5]) if len(sys.argv) > 5 else 0.005
    rank = int(os.environ["RANK"])
    starts = os.path.join(out, f"starts-{rank}")  # per worker: a shared file would race
    with open(starts, "a") as f:
        f.write("x")
    attempt = os.path.getsize(starts)

    options = sj.experimental.CommunicationOptions(timeout_seconds=60)
    strategy = sj.MultiWorkerMirroredStrategy(communication_options=options)
    workers, index = strategy.extended.topology.num_workers, strategy.extended.topology.worker_index
    with strategy.scope():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    step = torch.zeros((), dtype=torch.int64)
    ckpt = train.Checkpoint(model=model, optimizer=opt, scheduler=sched, step=step)
    manager = train.CheckpointManager(
        ckpt,
        os.path.join(out, "ckpt"),
        max_to_keep=2,
        step_counter=step,
        checkpoint_interval=INTERVAL,
    )
    handler = sj.experimental.PreemptionCheckpointHandler(strategy.cluster_resolver, manager)
    first = handler.total_run_calls
    assert int(step) == first, (int(step), first)

    def batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + s)
        x = torch.randn(4 * workers, 8, generator=g)
        y = torch.randint(0, 4, (4 * workers,), generator=g)
        shard = slice(4 * index, 4 * (index + 1))
        return x[shard], y[shard]

    def replica_step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    def train_step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        strategy.run(replica_step, args=(xb, yb))
        sched.step()

    ran = []
    reporting = os.environ.get("REPORT") == "1"
    while handler.total_run_calls < steps:
        s = handler.total_run_calls
        if attempt == 1 and rank == 1 and s == kill_step:
            if mode == "sigterm":
                signal.raise_signal(signal.SIGTERM)
            elif mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
        handler.run(train_step, *batch(s))
        step += 1
        ran.append(s)
        if reporting:
            sj.report(s + 1, total_steps=steps, lr=sched.get_last_lr()[0])
        if mode == "mark" and s == kill_step:
            with open(os.path.join(out, f"running-{rank}.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(
                os.path.join(out, f"running-{rank}.tmp"), os.path.join(out, f"running-{rank}")
            )
            print(f"RUNNING {s}", flush=True)
        manager.save()  # every INTERVAL steps: what a kill without notice resumes from
        if mode == "mark":
            time.sleep(pace)  # leaves a window for a signal from outside
    final = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    torch.save(final, os.path.join(out, f"final-{rank}.pt"))
    print("RESULT " + json.dumps({"attempt": attempt, "first": first, "ran": ran}), flush=True)
    print(f"STATE {_digest(final)}", flush=True)


def _digest(final: dict) -> str:
    """sha256 over the parameters', momenta's and param groups' exact bytes, in a fixed order:
    equal digests mean bit-identical states."""
    h = hashlib.sha256()
    tensors = list(final["model"].items()) + [
        (f"momentum/{i}", s["momentum_buffer"])
        for i, s in sorted(final["optimizer"]["state"].items())
    ]
    for name, t in tensors:
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).tolist()))
    h.update(json.dumps(final["optimizer"]["param_groups"], sort_keys=True).encode())
    return h.hexdigest()


if __name__ == "__main__":
    main()
