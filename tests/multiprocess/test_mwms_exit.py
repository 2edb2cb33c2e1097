"""A finished MultiWorkerMirroredStrategy worker exits 0 every time: gloo's threads must not
outlive, into interpreter finalisation, a reference to a tensor the program let go of (the
abort "terminate called without an active exception", exit 134, after the last epoch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _local_cluster import SDK

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "mwms_exit_worker.py"
JOBS = 8
_CLUSTER_ENV = ("TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _run_jobs(jobs: int, timeout: float) -> dict:
    """Run ``mwms_exit_worker.py jobs`` in a session of its own, killed whole past
    ``timeout`` (its workers are its forked children); its RESULT line."""
    env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_ENV}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(SDK), env.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        STRATEGYJOB_RENDEZVOUS_TIMEOUT="60",
    )
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(jobs)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{jobs} jobs did not finish within {timeout:g} s:\n{output[-4000:]}")
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    pytest.fail(f"no RESULT line (exit {proc.returncode}):\n{output[-4000:]}")


@pytest.mark.timeout(240)
def test_finished_workers_exit_zero_every_time():
    result = _run_jobs(JOBS, timeout=200)
    assert len(result["exits"]) == 2 * JOBS
    details = "\n".join(f"exit {f['exit']}:\n{f['output']}" for f in result["failures"][:3])
    assert Counter(result["exits"]) == {0: 2 * JOBS}, details
