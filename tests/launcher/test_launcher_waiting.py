"""`strategyjob run` of a job whose worker never joins: the manifest's
runPolicy.rendezvousTimeoutSeconds reaches the workers, which say whom they wait for
until it ends the rendezvous naming the absent task."""

from __future__ import annotations

import time

import pytest

from tests.launcher.test_launcher_run import cli_env, run_cli, write_job

pytestmark = pytest.mark.timeout(90)

WORKER = """
import os, time
if os.environ["STRATEGYJOB_REPLICA_INDEX"] == "1":
    time.sleep(300)  # alive, never joins the rendezvous
import strategyjob
strategyjob.MultiWorkerMirroredStrategy()
"""


def test_a_worker_that_never_joins_is_named_every_second_until_the_manifest_timeout(tmp_path):
    manifest = write_job(
        tmp_path, {"worker": (2, WORKER)}, runPolicy={"rendezvousTimeoutSeconds": 4}
    )
    env = cli_env() | {"STRATEGYJOB_WAITING_REPORT_SECONDS": "1", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    result = run_cli(manifest, "--grace-period", "2", env=env)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    absent = "/job:worker/replica:0/task:1"
    waiting = [line for line in lines if line.startswith("[worker-0] strategyjob: ")]
    assert waiting[0] == (
        f"[worker-0] strategyjob: /job:worker/replica:0/task:0 waiting for {absent} (not "
        "joined for 1 s; the rendezvous times out after 4 s, STRATEGYJOB_RENDEZVOUS_TIMEOUT)"
    )
    assert 3 <= len(waiting) <= 4, waiting  # at 1, 2, 3 s (4 s: the timeout may come first)
    assert (
        "[worker-0] RuntimeError: Timeout waiting for the cluster, timeout is 4 seconds; "
        f"not joined: {absent}."
    ) in lines
    assert elapsed < 40  # python and torch start, 4 s of rendezvous, 2 s of grace at most
