"""Run one subprocess per task of a TF_CONFIG cluster on 127.0.0.1 and collect what each
printed: the multi-process and TPU suites start their clusters this way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from strategyjob.launcher import free_ports

SDK = Path(__file__).resolve().parents[1] / "sdk"
_RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")

__all__ = ["SDK", "TaskRun", "free_ports", "local_addresses", "run_tasks"]


def local_addresses(count: int) -> list[str]:
    return [f"127.0.0.1:{port}" for port in free_ports(count)]


@dataclass
class TaskRun:
    task: tuple[str, int]
    returncode: int | None
    output: str

    @property
    def result(self) -> dict:
        """The JSON a task printed on its ``RESULT {...}`` line."""
        for line in self.output.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise AssertionError(f"task {self.task} printed no RESULT line:\n{self.output[-4000:]}")


def run_tasks(
    command: list[str],
    cluster: dict[str, list[str]],
    timeout: float,
    extra_env: dict[str, str] | None = None,
    tf_config: bool = True,
) -> list[TaskRun]:
    """Run ``command`` once per chief and worker task of ``cluster``, each with its TF_CONFIG
    (none when ``tf_config`` is false: local mode); past ``timeout`` kill every process group
    so that no process outlives the test."""
    tasks = [(t, i) for t in ("chief", "worker") for i in range(len(cluster.get(t, [])))]
    env_base = dict(os.environ)
    env_base.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(SDK), env_base.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",  # CPU processes even on a GPU machine
        **(extra_env or {}),
    )
    for key in (*_RENDEZVOUS_ENV, "TF_CONFIG"):
        env_base.pop(key, None)
    procs, logs = [], []
    try:
        for task_type, index in tasks:
            env = dict(env_base)
            if tf_config:
                env["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": task_type, "index": index}}
                )
            log = tempfile.TemporaryFile(mode="w+")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    command,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
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
