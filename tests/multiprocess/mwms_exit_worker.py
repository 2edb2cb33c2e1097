"""``python mwms_exit_worker.py JOBS``: run JOBS short two-worker MultiWorkerMirroredStrategy
jobs, each worker a process that trains two steps, runs a few collectives and ends through
ordinary interpreter finalisation; print one ``RESULT {json}`` line with every worker's exit
status and the output of those that did not exit 0.

Workers are forked from this process once torch is imported (no thread is running yet), so a
job costs a rendezvous and an exit rather than an interpreter start and torch's import: many
exits fit in a CI budget. Before its last collectives a worker pins all its threads to one CPU,
as a loaded machine does at random: the main thread, woken by the collective's completion,
preempts gloo's worker thread before that thread has let go of the finished work. That is the
race behind "terminate called without an active exception" (exit 134) after a finished
program: the program drops a tensor gloo still references, and gloo's thread later has to
take the GIL to free it, fatal once the interpreter is finalising. A worker checks the cause
itself: the tensor ``reduce`` returned must not be referenced by gloo (exit 3 otherwise).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable

import strategyjob as sj
import torch
from strategyjob.launcher import free_ports

INVARIANT_BROKEN = 3


def run_jobs(jobs: int) -> tuple[str, int] | None:
    """Fork the workers of ``jobs`` jobs one job at a time; in a worker return its
    ``(TF_CONFIG, index)``, in this process print the RESULT line and return None."""
    exits, failures = [], []
    for _ in range(jobs):
        addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
        started = []
        for index in range(2):
            log = tempfile.TemporaryFile()
            pid = os.fork()
            if pid == 0:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                config = {
                    "cluster": {"worker": addresses},
                    "task": {"type": "worker", "index": index},
                }
                return json.dumps(config), index
            started.append((pid, log))
        for pid, log in started:
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            exits.append(code)
            if code != 0:
                log.seek(0)
                failures.append(
                    {"exit": code, "output": log.read()[-3000:].decode(errors="replace")}
                )
            log.close()
    print("RESULT " + json.dumps({"exits": exits, "failures": failures}), flush=True)
    return None


def training_step(
    strategy: sj.MultiWorkerMirroredStrategy,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A small model and its SGD optimizer made in ``strategy``'s scope; the training step
    to ``strategy.run`` on a batch of shape ``(n, 16)``, which returns the loss."""
    with strategy.scope():  # the optimizer imports what keeps the process group referenced
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def work(index: int) -> None:
    """Two training steps, then collectives on one CPU whose tensors are dropped at once."""
    options = sj.experimental.CommunicationOptions(timeout_seconds=60)
    strategy = sj.MultiWorkerMirroredStrategy(communication_options=options)
    step = training_step(strategy)
    x = torch.ones(8, 16)
    for _ in range(2):
        float(strategy.reduce(sj.ReduceOp.MEAN, strategy.run(step, args=(x,)), axis=None))

    cpus = sorted(os.sched_getaffinity(0))
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {cpus[index % len(cpus)]})
    with strategy.scope():  # a new parameter is broadcast from the chief
        torch.nn.Linear(4, 4)
    float(strategy.reduce(sj.ReduceOp.MEAN, strategy.run(step, args=(x,)), axis=None))
    strategy.gather(torch.ones(index + 1, 2), axis=0)
    total = strategy.reduce(sj.ReduceOp.SUM, torch.tensor(1.0), axis=None)
    if total._use_count() != 1:
        print(f"gloo still references the returned tensor ({total._use_count()} uses)")
        sys.exit(INVARIANT_BROKEN)


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker = run_jobs(int(sys.argv[1]))
    if worker is not None:
        os.environ["TF_CONFIG"], index = worker
        work(index)
