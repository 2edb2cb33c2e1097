"""``python exit_fault_worker.py SCENARIO``: one MultiWorkerMirroredStrategy task (TF_CONFIG
from the environment) that ends as a user's training script does, through an uncaught error
or Ctrl-C and ordinary interpreter finalisation (no ``os._exit``): what the test checks is
how soon and how the process exits.

- ``freeze``: train; worker 1 SIGSTOPs itself after a few steps. Worker 0 gets the
  collective's error, saves a checkpoint (``EXIT_TEST_CHECKPOINT``), prints ``FAILED_AT
  <time>`` and lets the error end the program.
- ``join``: only join the cluster (the test starts one task: its peer never comes).
- ``stuck``: one step, then worker 1 sleeps (alive, never reaching the next collective)
  while worker 0 prints ``WAITING`` and waits in an all-reduce.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import strategyjob as sj
import torch
from mwms_exit_worker import training_step  # this script's folder is on sys.path


def train(strategy: sj.MultiWorkerMirroredStrategy, steps: int | None) -> None:
    """``steps`` training steps (no end when None; worker 1 then freezes after 3)."""
    step = training_step(strategy)
    x = torch.ones(8, 16)
    done = 0
    while steps is None or done < steps:
        strategy.reduce(sj.ReduceOp.MEAN, strategy.run(step, args=(x,)), axis=None)
        done += 1
        if done == 3 and strategy.cluster_resolver.task_id == 1 and steps is None:
            os.kill(os.getpid(), signal.SIGSTOP)


def scenario_freeze() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    try:
        train(strategy, steps=None)
    except sj.errors.UnavailableError:
        torch.save({"step": "last"}, os.environ["EXIT_TEST_CHECKPOINT"])
        print(f"FAILED_AT {time.time()}", flush=True)
        raise


def scenario_join() -> None:
    sj.MultiWorkerMirroredStrategy()


def scenario_stuck() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    train(strategy, steps=1)
    if strategy.cluster_resolver.task_id == 1:
        time.sleep(600)
    print("WAITING", flush=True)
    strategy.reduce(sj.ReduceOp.SUM, torch.tensor(1.0), axis=None)


if __name__ == "__main__":
    torch.set_num_threads(1)
    globals()[f"scenario_{sys.argv[1]}"]()
