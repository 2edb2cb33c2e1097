"""Start a local TPUStrategy cluster: one subprocess per device (TF_CONFIG worker task) on
127.0.0.1, each running ``tpu_worker.py SCENARIO ARGS``."""

from __future__ import annotations

import sys
from pathlib import Path

from _local_cluster import TaskRun, local_addresses, run_tasks

WORKER = Path(__file__).resolve().parent / "tpu_worker.py"

__all__ = ["WORKER", "results", "run_cluster"]


def run_cluster(
    script: Path, args: list[str], num_tasks: int, timeout: float, tf_config: bool = True
) -> list[TaskRun]:
    """``tf_config=False`` runs the processes without TF_CONFIG (local mode)."""
    return run_tasks(
        [sys.executable, str(script), *args],
        {"worker": local_addresses(num_tasks)},
        timeout,
        extra_env={"STRATEGYJOB_RENDEZVOUS_TIMEOUT": str(int(timeout))},
        tf_config=tf_config,
    )


def results(runs: list[TaskRun]) -> list[dict]:
    for run in runs:
        assert run.returncode == 0, (
            f"task {run.task} exited {run.returncode}:\n{run.output[-4000:]}"
        )
    return [run.result for run in runs]
