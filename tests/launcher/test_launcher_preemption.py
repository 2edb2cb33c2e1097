"""`strategyjob run` and preemption: SIGTERM to the launcher reaches each replica's own
process (as a container runtime sends it to the container's first process) with the job's
grace period, the replicas' PreemptionCheckpointHandler saves at one step and exits 143, and
running the job again resumes there; exit code 143 is retried by the ExitCode policy."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from strategyjob.jobspec import load_manifest
from strategyjob.launcher import (
    DEFAULT_GRACE_PERIOD,
    Phase,
    ReplicaExit,
    decide,
    grace_period_of,
    is_retryable,
)

SDK = Path(__file__).resolve().parents[2] / "sdk"
WORKER = Path(__file__).resolve().parents[1] / "multiprocess" / "preemption_worker.py"
PREEMPTION_EXIT_CODE = 143  # strategyjob.train.preemption's (torch-free here)
pytestmark = pytest.mark.timeout(300)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SDK), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("TF_CONFIG", None)
    return env


def _manifest(
    replica_specs: dict, strategy: str = "MultiWorkerMirroredStrategy", **spec_extra
) -> dict:
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "preempt"},
        "spec": {"strategy": strategy, "replicaSpecs": replica_specs, **spec_extra},
    }


def _replica(command: list[str], replicas: int = 1, grace: float | None = None, **extra) -> dict:
    pod: dict = {"containers": [{"name": "strategyjob", "command": command}]}
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    return {"replicas": replicas, "template": {"spec": pod}, **extra}


def _write(directory: Path, manifest: dict) -> Path:
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def _launch(path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "strategyjob", "run", str(path), "--no-status", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(env),
    )


def _wait_for(paths: list[Path], launcher: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if launcher.poll() is not None:
            raise AssertionError(f"the launcher ended early:\n{launcher.communicate()[0]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {paths}")
        time.sleep(0.05)


def _finish(launcher: subprocess.Popen[str], timeout: float) -> str:
    try:
        return launcher.communicate(timeout=timeout)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state == "Z"


# -- pure rules --------------------------------------------------------------------------------


def test_the_preemption_exit_code_is_retried_by_exit_code_on_failure_and_always():
    preempted = ReplicaExit(PREEMPTION_EXIT_CODE)
    for policy in ("ExitCode", "OnFailure", "Always"):
        assert is_retryable(policy, preempted)
    assert not is_retryable("Never", preempted)
    job = load_manifest(
        _manifest(
            {"worker": _replica(["python", "t.py"], replicas=2, restartPolicy="ExitCode")},
            runPolicy={"backoffLimit": 3},
        )
    )
    decision = decide(job, {("worker", 1): preempted})
    assert decision.phase is Phase.RESTART_JOB
    assert decision.reason == "worker-1 exited with code 143"


def test_grace_period_from_the_pod_templates_unless_given():
    job = load_manifest(
        _manifest(
            {
                "chief": _replica(["python", "t.py"], grace=45),
                "worker": _replica(["python", "t.py"], replicas=2, grace=90),
            }
        )
    )
    assert grace_period_of(job) == 90.0  # the longest: every replica gets time to save
    assert grace_period_of(job, 3) == 3.0  # --grace-period wins
    plain = load_manifest(_manifest({"worker": _replica(["python", "t.py"])}))
    assert grace_period_of(plain) == DEFAULT_GRACE_PERIOD == 10.0


# -- real processes ----------------------------------------------------------------------------

IGNORES_SIGTERM = """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open("ready", "w").close()
    time.sleep(300)
"""
FAILS_WHEN_READY = """
    import os, sys, time
    deadline = time.monotonic() + 60
    while not os.path.exists("ready") and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(4)
"""


def test_the_templates_grace_period_bounds_a_stop(tmp_path):
    (tmp_path / "chief.py").write_text(textwrap.dedent(IGNORES_SIGTERM))
    (tmp_path / "worker.py").write_text(textwrap.dedent(FAILS_WHEN_READY))
    path = _write(
        tmp_path,
        _manifest(
            {
                "chief": _replica([sys.executable, "chief.py"], grace=1),
                "worker": _replica([sys.executable, "worker.py"], grace=1),
            }
        ),
    )
    started = time.monotonic()
    output = _finish(_launch(path), timeout=60)
    # killed one grace period (1 s, not the default 10 s) after SIGTERM
    assert time.monotonic() - started < 9, output
    assert "worker-0 exited with code 4" in output and "stopped: chief-0" in output


# The replica's own process answers SIGTERM by asking its child (over a pipe, after the
# signal) whether the child got SIGTERM too, then exits 143. A SIGTERM sent to the whole
# process group would reach the child first: its handler runs before it reads the question.
CHILD = """
import signal, sys
seen = []
signal.signal(signal.SIGTERM, lambda *a: seen.append(1))
for line in sys.stdin:
    with open("child-status.tmp", "w") as f:
        f.write("sigterm" if seen else "no-sigterm")
    import os
    os.rename("child-status.tmp", "child-status")
"""
PARENT = """
    import os, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, text=True)

    def on_sigterm(signum, frame):
        child.stdin.write("did you get SIGTERM?\\n")
        child.stdin.flush()
        deadline = time.monotonic() + 30
        while not os.path.exists("child-status") and time.monotonic() < deadline:
            time.sleep(0.02)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    with open("pids.tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename("pids.tmp", "pids")
    while True:
        signal.pause()
"""


def test_sigterm_reaches_the_replicas_process_not_its_helpers(tmp_path):
    (tmp_path / "worker.py").write_text(f"CHILD = {CHILD!r}\n" + textwrap.dedent(PARENT))
    path = _write(tmp_path, _manifest({"worker": _replica([sys.executable, "worker.py"])}))
    launcher = _launch(path, "--grace-period", "30")
    try:
        _wait_for([tmp_path / "pids"], launcher, timeout=60)
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        launcher.send_signal(signal.SIGTERM)
        output = _finish(launcher, timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGTERM, output
    assert "strategyjob: received SIGTERM, stopping every replica" in output
    assert (tmp_path / "child-status").read_text() == "no-sigterm"
    deadline = time.monotonic() + 10  # the helper is SIGKILLed with the replica's group
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"processes {pids} outlived the job"
        time.sleep(0.05)


def _results(output: str, rank: int) -> list[dict]:
    prefix = f"[worker-{rank}] RESULT "
    return [
        json.loads(line[len(prefix) :]) for line in output.splitlines() if line.startswith(prefix)
    ]


def test_sigterm_to_the_launcher_saves_once_and_a_new_run_resumes(tmp_path):
    """The launcher, preempted itself (a node drain, a batch system's notice), forwards SIGTERM
    to both workers; their handlers agree on one step, save it and exit 143 within the grace
    period; `strategyjob run` again resumes from that step."""
    out = tmp_path / "out"
    out.mkdir()

    def job(steps: int) -> Path:
        command = [sys.executable, str(WORKER), str(out), "mark", "3", str(steps)]
        return _write(
            tmp_path,
            _manifest({"worker": _replica(command, replicas=2, grace=60)}),
        )

    launcher = _launch(job(10**6))
    try:
        _wait_for([out / "running-0", out / "running-1"], launcher, timeout=180)
        launcher.send_signal(signal.SIGTERM)
        output = _finish(launcher, timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGTERM, output
    saves = [line for line in output.splitlines() if "saving a checkpoint after" in line]
    assert len(saves) == 2, output[-6000:]
    assert all("termination notice received (this worker)" in line for line in saves)
    counts = {line.rsplit(" after ", 1)[1] for line in saves}
    assert len(counts) == 1, saves  # the same step on both workers
    saved = int(counts.pop().split()[0])
    assert saved > 3
    assert output.count("exiting for a restart") == 2
    assert "stopped worker-0, worker-1" in output

    again = _launch(job(saved + 2))
    output = _finish(again, timeout=180)
    assert again.returncode == 0, output[-6000:]
    for rank in (0, 1):
        (result,) = _results(output, rank)
        assert result["first"] == saved and result["ran"] == [saved, saved + 1]


KERAS_WORKER = Path(__file__).resolve().parents[1] / "multiprocess" / "keras_restart_worker.py"


@pytest.mark.skipif(
    importlib.util.find_spec("keras") is None,
    reason="needs the keras extra (pip install 'strategyjob[keras]')",
)
@pytest.mark.parametrize(
    ("mode", "signum"),
    [("epoch", signal.SIGKILL), ("batches", signal.SIGKILL), ("preempted", signal.SIGTERM)],
    ids=["killed-epoch-backup", "killed-batch-backup", "preempted-mid-epoch"],
)
def test_keras_backup_and_restore_resumes_a_restarted_job(tmp_path, mode, signum):
    """Keras ``fit`` with ``BackupAndRestore`` in a 2-worker job, worker 1 stopped after batch
    1 of epoch 2 (0-based) and signalled; `strategyjob run` (ExitCode: 137 and 143 are retried)
    restarts the whole job, which resumes where the last backup was taken and ends as an
    uninterrupted fit does:

    * SIGKILL, epoch backups: at epoch 2's start (its first batches trained again, as Keras
      does, from the weights of epoch 1's end), with the weights of plain Keras uninterrupted;
    * SIGKILL, ``save_freq=2`` (shuffled): after the backup of epoch 2's batch 1, the 2 batches
      done skipped, the epoch shuffled as before;
    * SIGTERM (shuffled, epoch backups): both workers agree on the next batch, back up after it
      (3 batches of epoch 2 done) and exit 143; the job resumes after that batch.

    In the last two, the weights, the optimizer's step count (16: no batch trained twice or
    skipped) and the history (epoch 2's metrics given back) are those of the same 2-worker fit
    run uninterrupted."""
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, str(KERAS_WORKER), str(out), mode]
    path = _write(
        tmp_path,
        _manifest(
            {"worker": _replica(command, replicas=2, grace=30, restartPolicy="ExitCode")},
            runPolicy={"backoffLimit": 1},
        ),
    )
    # the killed worker cannot remove its scratch directory: keep it in the test's own
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    launcher = _launch(path, env={"KERAS_BACKEND": "torch", "TMPDIR": str(scratch)})
    try:
        _wait_for([out / "blocked-pid"], launcher, timeout=120)
        os.kill(int((out / "blocked-pid").read_text()), signum)
        (out / "signalled").touch()
        output = _finish(launcher, timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, output[-6000:]
    if signum == signal.SIGKILL:
        assert "worker-1 was killed by SIGKILL (exit code 137)" in output, output[-6000:]
    else:
        assert "exited with code 143" in output, output[-6000:]
        for rank in (0, 1):
            assert (
                f"[worker-{rank}] BackupAndRestore: preempted; backed up epoch 3 after its "
                "batch 3" in output
            ), output[-6000:]
    resumed_after = {"epoch": None, "batches": 2, "preempted": 3}[mode]
    for rank in (0, 1):
        if resumed_after is not None:
            assert (
                f"[worker-{rank}] BackupAndRestore: resuming epoch 3 after its batch "
                f"{resumed_after}" in output
            ), output[-6000:]
        results = _results(output, rank)
        assert len(results) == 1, output[-6000:]  # the first run printed none: stopped mid-fit
        (result,) = results
        assert result["epochs"] == [2, 3]
        assert result["weights_diff"] < 1e-5
        if mode != "epoch":
            assert result["steps"] == 16  # 4 epochs of 4 batches, each trained once
            for key, values in result["expected"].items():
                assert result["history"][key] == pytest.approx(values, rel=1e-5), key
    assert not (out / "backup").exists()  # the chief removes the backup when fit ends
