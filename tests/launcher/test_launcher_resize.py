"""A local resize (issue 30): ``strategyjob scale NAME --replicas N --local`` against a
ParameterServerStrategy job that ``strategyjob run`` runs. Real processes: new workers start
and the chief's coordinator takes them; removed ones are let go by the chief, then stopped;
nothing else restarts, every step is applied once, and bad requests get one line."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from strategyjob.jobspec import messages as msg

from tests.launcher.test_launcher_preemption import WORKER, _results
from tests.launcher.test_launcher_ps_faults import CHIEF, SERVER, assert_gone, pid_of
from tests.launcher.test_launcher_run import cli_env, run_cli, write_job
from tests.support.launch import Launch
from tests.support.manifests import preemptible_workers

pytestmark = pytest.mark.timeout(180)

TPU_WORKER = Path(__file__).resolve().parents[1] / "multiprocess" / "tpu_reform_worker.py"

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

        assert launch.finish(150) == 0, launch.transcript
    finally:
        launch.stop()
    text = launch.text
    assert f"[chief-0] trained {4.0 * rounds}" in text, text[-20:]  # every step once
    assert not any("restarting" in line for line in text), text
    assert pid_of(tmp_path, "worker-0") == worker  # attempt 0's, never replaced
    assert_gone([ps, worker])


def test_a_one_process_job_is_not_resized_locally(tmp_path):
    name = f"mirrored-{uuid.uuid4().hex[:8]}"
    sleeper = "import time\ntime.sleep(60)\n"
    manifest = write_job(tmp_path, {"worker": (1, sleeper)}, strategy="MirroredStrategy", name=name)
    launch = Launch(manifest, cli_env(), "--grace-period", "1")
    try:
        launch.wait_line("strategyjob: job ", 60)
        refused = scale(name, "--replicas", "2")
        while "no job named" in refused.stderr:  # the launcher's directory comes first
            refused = scale(name, "--replicas", "2")
        assert refused.returncode == 1
        assert msg.NOT_RESIZABLE.format(strategy="MirroredStrategy", value=2) in refused.stderr
    finally:
        launch.stop()


def _tpu_job(tmp_path: Path, name: str, steps: int, pace: float) -> Path:
    out = tmp_path / name
    out.mkdir()
    command = [str(TPU_WORKER), str(out), str(steps), str(pace)]
    job = preemptible_workers(name, command)
    job["spec"]["strategy"] = "TPUStrategy"
    job["spec"]["runPolicy"]["backoffLimit"] = 0  # a resize is no restart: none is allowed
    manifest = out / "job.yaml"
    manifest.write_text(json.dumps(job))
    return manifest


def test_a_tpu_run_is_re_formed_locally_from_its_checkpoint_and_keeps_its_global_batch(tmp_path):
    """TPUStrategy, replicas of two logical devices: 2 processes (1 replica) scaled to 4 (2
    replicas). Every process saves at one step, the group of 4 resumes there and runs each
    remaining step once, in sync; the global batch is the one the script set, split over
    twice the replicas, so the run ends where a run that was never resized ends."""
    name, steps = f"tpu-{uuid.uuid4().hex[:8]}", 30
    env = cli_env() | {"OMP_NUM_THREADS": "1"}
    launch = Launch(_tpu_job(tmp_path, name, steps, 0.3), env, "--grace-period", "60")
    try:
        launch.wait_line("[worker-1] RUNNING", 180)
        done = scale(name, "--replicas", "4")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"job {name}: workers 2 -> 4; re-formed"
        assert launch.finish(240) == 0, launch.transcript
    finally:
        launch.stop()
    output = "\n".join(launch.text)
    assert f"strategyjob: job {name} re-forms with 4 workers (it ran 2)" in output
    (results,) = {json.dumps(_results(output, rank)) for rank in range(4)}  # all alike
    (resumed,) = json.loads(results)
    assert resumed["replicas"] == 2
    assert 3 < resumed["first"] < steps, output[-4000:]
    assert resumed["ran"] == list(range(resumed["first"], steps))
    states = {line.split("] STATE ")[1] for line in output.splitlines() if "] STATE " in line}
    assert len(states) == 1, states  # in sync
    assert "restarting" not in output

    reference = run_cli(_tpu_job(tmp_path, "never-resized", steps, 0), timeout=180, env=env)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    (whole,) = _results(reference.stdout + reference.stderr, 0)
    assert whole["replicas"] == 1 and whole["ran"] == list(range(steps))
    # the same global batches: equal up to the order of the float additions
    assert resumed["loss"] == pytest.approx(whole["loss"], rel=1e-5)


def test_a_mwms_run_is_re_formed_locally_from_its_checkpoint(tmp_path):
    """``strategyjob scale --local`` of a MultiWorkerMirroredStrategy run: every worker saves at
    the same step and stops, the group of 3 starts and resumes there, runs each remaining step
    once and ends in sync; no restart is counted."""
    name = f"reform-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    out.mkdir()
    steps = 30
    job = preemptible_workers(name, [str(WORKER), str(out), "mark", "3", str(steps), "0.3"])
    job["spec"]["runPolicy"]["backoffLimit"] = 0  # a resize is no restart: none is allowed
    manifest = tmp_path / "job.yaml"
    manifest.write_text(json.dumps(job))
    launch = Launch(manifest, cli_env() | {"OMP_NUM_THREADS": "1"}, "--grace-period", "60")
    try:
        launch.wait_line("[worker-1] RUNNING 3", 180)
        done = scale(name, "--replicas", "3")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"job {name}: workers 2 -> 3; re-formed"
        assert launch.finish(240) == 0, launch.text[-30:]
    finally:
        launch.stop()
    output = "\n".join(launch.text)
    assert f"strategyjob: job {name} re-forms with 3 workers (it ran 2)" in output
    results = [_results(output, rank) for rank in range(3)]
    firsts = {r[0]["first"] for r in results}
    (saved,) = firsts  # every worker of the new group resumed at the one saved step
    assert 3 < saved < steps, output[-4000:]
    assert all(r[0]["ran"] == list(range(saved, steps)) for r in results)
    states = {line for line in output.splitlines() if "] STATE " in line}
    assert len({line.split("] STATE ")[1] for line in states}) == 1, states  # in sync
    assert "restarting" not in output
