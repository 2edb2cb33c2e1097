"""Start a local MultiWorkerMirroredStrategy cluster: one ``mwms_worker.py SCENARIO``
subprocess per TF_CONFIG task on 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path

from _local_cluster import TaskRun, free_ports, local_addresses, run_tasks

WORKER = Path(__file__).resolve().parent / "mwms_worker.py"

__all__ = ["TaskRun", "cluster_of", "free_ports", "run_cluster"]


def cluster_of(num_workers: int, with_chief: bool = False) -> dict[str, list[str]]:
    addresses = local_addresses(num_workers)
    if with_chief:
        return {"chief": addresses[:1], "worker": addresses[1:]}
    return {"worker": addresses}


def run_cluster(
    scenario: str,
    cluster: dict[str, list[str]],
    timeout: float,
    extra_env: dict[str, str] | None = None,
) -> list[TaskRun]:
    return run_tasks([sys.executable, str(WORKER), scenario], cluster, timeout, extra_env)
