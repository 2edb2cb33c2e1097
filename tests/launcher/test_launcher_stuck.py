"""`strategyjob run` of a MultiWorkerMirrored job whose worker stops reaching collectives, no
timeout_seconds set: the job ends within the adaptive stuck-peer bound, and its last line
names the stuck task."""

from __future__ import annotations

import re
import time

import pytest

from tests.launcher.test_launcher_run import cli_env, run_cli, write_job

pytestmark = pytest.mark.timeout(90)

WORKER = """
import os, time, torch
import strategyjob
strategy = strategyjob.MultiWorkerMirroredStrategy()
for step in range(60):
    if step == 25 and os.environ["STRATEGYJOB_REPLICA_INDEX"] == "1":
        print("stalled at", time.time(), flush=True)
        time.sleep(300)  # alive, never reaches the next collective
    strategy.reduce("SUM", torch.tensor(1.0), axis=None)
"""


def test_a_stuck_worker_ends_the_job_within_the_bound_naming_it(tmp_path):
    manifest = write_job(tmp_path, {"worker": (2, WORKER)})
    env = cli_env() | {"STRATEGYJOB_STUCK_PEER_SECONDS": "4", "OMP_NUM_THREADS": "1"}
    result = run_cli(manifest, "--grace-period", "2", env=env)
    ended = time.time()
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    (stalled,) = [float(line.split()[-1]) for line in lines if "] stalled at " in line]
    after = ended - stalled
    print(f"the job ended {after:.1f} s after worker 1 stalled (bound 4 s)")
    assert 4 <= after < 4 + 6  # the bound, a slice, the summary and the stop of worker 1
    summary = next(line for line in lines if line.startswith("strategyjob: job demo failed "))
    assert re.search(
        r"worker-0 exited with code 1: \[rank0\]: strategyjob\.errors\.DeadlineExceededError: "
        r"Collective all-reduce did not complete: Not arrived: /job:worker/replica:0/task:1 "
        r"\(not in a collective for [45] s\)",
        summary,
    ), summary
