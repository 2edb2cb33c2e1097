"""A finished MultiWorkerMirroredStrategy worker exits 0 every time: gloo's threads must not
outlive, into interpreter finalisation, a reference to a tensor the program let go of (the
abort "terminate called without an active exception", exit 134, after the last epoch)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.processes import child_env, result_line, run_in_session

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "mwms_exit_worker.py"
JOBS = 8


def _run_jobs(jobs: int, timeout: float) -> dict:
    """Run ``mwms_exit_worker.py jobs`` in a session of its own, killed whole past
    ``timeout`` (its workers are its forked children); its RESULT line."""
    env = child_env(CUDA_VISIBLE_DEVICES="", STRATEGYJOB_RENDEZVOUS_TIMEOUT="60")
    run = run_in_session([sys.executable, str(WORKER), str(jobs)], env, timeout)
    if run.timed_out:
        pytest.fail(f"{jobs} jobs did not finish within {timeout:g} s:\n{run.output[-4000:]}")
    result = result_line(run.output)
    if result is None:
        pytest.fail(f"no RESULT line (exit {run.returncode}):\n{run.output[-4000:]}")
    return result


@pytest.mark.timeout(240)
def test_finished_workers_exit_zero_every_time():
    result = _run_jobs(JOBS, timeout=200)
    assert len(result["exits"]) == 2 * JOBS
    details = "\n".join(f"exit {f['exit']}:\n{f['output']}" for f in result["failures"][:3])
    assert Counter(result["exits"]) == {0: 2 * JOBS}, details
