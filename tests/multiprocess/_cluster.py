"""Start a local MultiWorkerMirroredStrategy cluster: one subprocess per TF_CONFIG task on
127.0.0.1 with free ports, each running ``mwms_worker.py SCENARIO``; collect their results."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SDK = HERE.parents[1] / "sdk"
WORKER = HERE / "mwms_worker.py"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class TaskRun:
    task: tuple[str, int]
    returncode: int | None
    output: str

    @property
    def result(self) -> dict:
        for line in self.output.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise AssertionError(f"task {self.task} printed no RESULT line:\n{self.output[-4000:]}")


def cluster_of(num_workers: int, with_chief: bool = False) -> dict[str, list[str]]:
    ports = free_ports(num_workers)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    if with_chief:
        return {"chief": addresses[:1], "worker": addresses[1:]}
    return {"worker": addresses}


def run_cluster(
    scenario: str,
    cluster: dict[str, list[str]],
    timeout: float,
    extra_env: dict[str, str] | None = None,
) -> list[TaskRun]:
    """Run every task of ``cluster``; kill all of them (by process group) past ``timeout``."""
    tasks = [(t, i) for t in ("chief", "worker") for i in range(len(cluster.get(t, [])))]
    env_base = dict(os.environ)
    env_base.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(SDK), env_base.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",  # CPU replicas even on a GPU machine
        **(extra_env or {}),
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env_base.pop(key, None)
    procs = []
    logs = []
    for task_type, index in tasks:
        env = dict(env_base)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": index}}
        )
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    runs = []
    for task, p, log in zip(tasks, procs, logs):
        log.seek(0)
        runs.append(TaskRun(task, p.returncode, log.read()))
        log.close()
    return runs
