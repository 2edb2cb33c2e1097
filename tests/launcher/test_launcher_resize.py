"""A local resize (issue 30): ``strategyjob scale NAME --replicas N --local`` against a
ParameterServerStrategy job that ``strategyjob run`` runs. Real processes: new workers start
and the chief's coordinator takes them; removed ones are let go by the chief, then stopped;
nothing else restarts, every step is applied once, and bad requests get one line."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.launcher.test_launcher_ps_faults import CHIEF, SERVER, assert_gone, pid_of
from tests.launcher.test_launcher_run import cli_env, write_job
from tests.support.launch import Launch

pytestmark = pytest.mark.timeout(180)

JOINED = "[chief-0] strategyjob: workers resized (joined: "


def scale(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "strategyjob", "scale", name, "--local", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )


def test_a_ps_job_run_locally_is_resized_1_3_1_and_applies_every_step_once(tmp_path):
    name = f"resize-{uuid.uuid4().hex[:8]}"
    rounds = 150
    manifest = write_job(
        tmp_path,
        {"chief": (1, CHIEF), "worker": (1, SERVER), "ps": (1, SERVER)},
        strategy="ParameterServerStrategy",
        name=name,
        runPolicy={"backoffLimit": 0},
    )
    env = cli_env() | {"ROUNDS": str(rounds), "STEP_SECONDS": "0.05"}
    launch = Launch(manifest, env, "--grace-period", "5")
    try:
        launch.wait_line("[chief-0] ROUND 3", 90)
        ps, worker = pid_of(tmp_path, "ps-0"), pid_of(tmp_path, "worker-0")

        up = scale(name, "--replicas", "3")
        assert up.returncode == 0, up.stderr
        assert up.stdout.startswith(f"job {name}: workers 1 -> 3; started worker-1 (127.0.0.1:")
        launch.wait_line(
            f"{JOINED}/job:worker/replica:0/task:1, /job:worker/replica:0/task:2); now 3", 30
        )
        added = [pid_of(tmp_path, "worker-1"), pid_of(tmp_path, "worker-2")]

        down = scale(name, "--replicas", "1")
        assert down.returncode == 0, down.stderr
        assert down.stdout.strip() == f"job {name}: workers 3 -> 1; stopped worker-1, worker-2"
        launch.wait_line(
            "[chief-0] strategyjob: workers resized (left: /job:worker/replica:0/task:1, "
            "/job:worker/replica:0/task:2); now 1",
            30,
        )
        assert_gone(added)

        # one line each, the job untouched
        zero = scale(name, "--replicas", "0")
        assert zero.returncode == 1
        assert "--replicas must be a whole number of workers, 1 or more (got 0)" in zero.stderr
        nobody = scale("no-such-run", "--replicas", "2")
        assert nobody.returncode == 1
        assert "no job named no-such-run runs under strategyjob run" in nobody.stderr

        assert launch.finish(150) == 0, launch.text
    finally:
        launch.stop()
    text = launch.text
    assert f"[chief-0] trained {4.0 * rounds}" in text, text[-20:]  # every step once
    assert not any("restarting" in line for line in text), text
    assert pid_of(tmp_path, "worker-0") == worker  # attempt 0's, never replaced
    assert_gone([ps, worker])


def test_a_collective_job_is_not_resized_locally(tmp_path):
    name = f"mwms-{uuid.uuid4().hex[:8]}"
    sleeper = "import time\ntime.sleep(60)\n"
    manifest = write_job(tmp_path, {"worker": (1, sleeper)}, name=name)
    launch = Launch(manifest, cli_env(), "--grace-period", "1")
    try:
        launch.wait_line("strategyjob: job ", 60)
        refused = scale(name, "--replicas", "2")
        while "no job named" in refused.stderr:  # the launcher's directory comes first
            refused = scale(name, "--replicas", "2")
        assert refused.returncode == 1
        assert (
            "a MultiWorkerMirroredStrategy job run by strategyjob run cannot be resized; only "
            "the workers of a ParameterServerStrategy job join and leave a local run"
        ) in refused.stderr
    finally:
        launch.stop()
