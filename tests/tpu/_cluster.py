"""Start a local TPUStrategy cluster: one subprocess per device (TF_CONFIG worker task) on
127.0.0.1 with free ports, each running ``tpu_worker.py SCENARIO ARGS``; collect RESULT lines."""

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
WORKER = HERE / "tpu_worker.py"


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
    index: int
    returncode: int | None
    output: str

    @property
    def result(self) -> dict:
        for line in self.output.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise AssertionError(f"task {self.index} printed no RESULT line:\n{self.output[-4000:]}")


def run_cluster(
    script: Path, args: list[str], num_tasks: int, timeout: float, tf_config: bool = True
) -> list[TaskRun]:
    """Run ``script ARGS`` once per worker task; kill all of them (by group) past ``timeout``.

    ``tf_config=False`` runs the processes without TF_CONFIG (local mode)."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(num_tasks)]}
    env_base = dict(os.environ)
    env_base.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(SDK), env_base.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",  # CPU processes even on a GPU machine
        STRATEGYJOB_RENDEZVOUS_TIMEOUT=str(int(timeout)),
    )
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env_base.pop(key, None)
    procs, logs = [], []
    for index in range(num_tasks):
        env = dict(env_base)
        env.pop("TF_CONFIG", None)
        if tf_config:
            env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            )
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
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
    for index, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        runs.append(TaskRun(index, p.returncode, log.read()))
        log.close()
    return runs


def results(runs: list[TaskRun]) -> list[dict]:
    for run in runs:
        assert run.returncode == 0, (
            f"task {run.index} exited {run.returncode}:\n{run.output[-4000:]}"
        )
    return [run.result for run in runs]
