"""Training that survives preemption, end to end under ``strategyjob run``: a 2-worker
MultiWorkerMirroredStrategy job (gloo on 127.0.0.1, fixed seeds and data order) whose worker 1
gets SIGTERM (sent by itself before step K, or by another process mid-step) saves once on both
workers at the same step, exits 143, is restarted
as a whole job by its ``ExitCode`` policy, resumes from that step and ends with parameters
bit-identical to an uninterrupted run's; after a SIGKILL (no notice) it resumes from the
last periodic checkpoint instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.support.manifests import preemptible_workers
from tests.support.processes import start_strategyjob_run, stop_strategyjob_run

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
WORKER = HERE / "preemption_worker.py"
STEPS = 12
INTERVAL = 3


def _launch(
    out: Path, mode: str, kill_step: int, restart_policy: str, steps: int = STEPS
) -> subprocess.Popen[str]:
    """Start ``strategyjob run`` of the 2-worker job."""
    out.mkdir()
    command = [str(WORKER), str(out), mode, str(kill_step), str(steps)]
    manifest = preemptible_workers("preempt", command, restart_policy)
    return start_strategyjob_run(
        manifest, out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finish(launcher: subprocess.Popen[str], timeout: float = 280) -> tuple[int, str]:
    try:
        output = launcher.communicate(timeout=timeout)[0]
    finally:
        stop_strategyjob_run(launcher)
    return launcher.returncode, output


def _run_job(
    out: Path, mode: str, kill_step: int, restart_policy: str, steps: int = STEPS
) -> tuple[int, str]:
    """``strategyjob run`` of the 2-worker job; returns its exit code and output."""
    return _finish(_launch(out, mode, kill_step, restart_policy, steps))


def _results(output: str, rank: int) -> list[dict]:
    prefix = f"[worker-{rank}] RESULT "
    return [
        json.loads(line[len(prefix) :]) for line in output.splitlines() if line.startswith(prefix)
    ]


def _final(out: Path, rank: int) -> dict:
    return torch.load(out / f"final-{rank}.pt", weights_only=True)


def _assert_bit_identical(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    momenta_a = [s["momentum_buffer"] for _, s in sorted(a["optimizer"]["state"].items())]
    momenta_b = [s["momentum_buffer"] for _, s in sorted(b["optimizer"]["state"].items())]
    assert len(momenta_a) == len(momenta_b) == 4
    assert all(torch.equal(x, y) for x, y in zip(momenta_a, momenta_b))
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    code, output = _run_job(out, "none", -1, "ExitCode")
    assert code == 0, output[-6000:]
    for rank in (0, 1):
        (result,) = _results(output, rank)
        assert result == {"attempt": 1, "first": 0, "ran": list(range(STEPS))}
    _assert_bit_identical(_final(out, 0), _final(out, 1))
    return out


def test_sigterm_saves_at_one_step_and_resumes_bit_identical(tmp_path, uninterrupted):
    kill_step = 4  # signalled before step 4; the agreement answers at the next call: saved at 5
    out = tmp_path / "run"
    code, output = _run_job(out, "sigterm", kill_step, "ExitCode")
    assert code == 0, output[-6000:]
    lines = output.splitlines()
    # both workers saved after the same number of steps, worker 1 knowing it was signalled
    saved = [line for line in lines if "saving a checkpoint after" in line]
    assert sorted(saved) == [
        "[worker-0] /job:worker/task:0: termination notice received (a peer); saving a "
        "checkpoint after 5 run calls.",
        "[worker-1] /job:worker/task:1: termination notice received (this worker); saving a "
        "checkpoint after 5 run calls.",
    ], output[-6000:]
    # exit 143 is retryable under ExitCode: the launcher restarts the whole job once
    restarts = [line for line in lines if "restarting the whole job" in line]
    assert len(restarts) == 1, output[-6000:]
    assert "exited with code 143; restarting the whole job (restart 1 of 1)" in restarts[0]
    for rank in (0, 1):
        (result,) = _results(output, rank)  # the first attempt exited before its RESULT
        assert result == {"attempt": 2, "first": 5, "ran": list(range(5, STEPS))}
        _assert_bit_identical(_final(out, rank), _final(uninterrupted, 0))


def test_sigkill_resumes_from_the_last_periodic_checkpoint(tmp_path, uninterrupted):
    kill_step = 9  # steps 0-8 done; periodic checkpoints at steps 1, 4, 7: resumes at 7
    out = tmp_path / "run"
    code, output = _run_job(out, "sigkill", kill_step, "OnFailure")
    assert code == 0, output[-6000:]
    assert "worker-1 was killed by SIGKILL (exit code 137); restarting the whole job" in output
    assert "saving a checkpoint after" not in output  # no notice, no preemption save
    for rank in (0, 1):
        (result,) = _results(output, rank)
        assert result["attempt"] == 2
        assert kill_step - INTERVAL <= result["first"] == 7  # lost at most INTERVAL steps
        assert result["ran"] == list(range(7, STEPS))
        _assert_bit_identical(_final(out, rank), _final(uninterrupted, 0))


LONG = 300  # paced steps: a window for a signal from outside


def test_sigterm_from_outside_mid_step_resumes_bit_identical(tmp_path):
    """SIGTERM sent to worker 1 by another process, whenever it lands in the step: the workers
    still agree on one step, and the resumed job ends bit-identical to an uninterrupted one."""
    reference = tmp_path / "reference"
    code, output = _run_job(reference, "none", -1, "ExitCode", steps=LONG)
    assert code == 0, output[-6000:]

    out = tmp_path / "run"
    launcher = _launch(out, "mark", 20, "ExitCode", steps=LONG)
    try:
        marker = out / "running-1"
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert launcher.poll() is None, launcher.communicate()[0][-6000:]
            assert time.monotonic() < deadline, "worker 1 never reached step 20"
            time.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGTERM)
    finally:
        code, output = _finish(launcher)
    assert code == 0, output[-6000:]
    saves = [line for line in output.splitlines() if "saving a checkpoint after" in line]
    assert len(saves) == 2, output[-6000:]
    (saved,) = {int(line.rsplit(" after ", 1)[1].split()[0]) for line in saves}
    assert 20 < saved < LONG
    assert output.count("exited with code 143; restarting the whole job (restart 1 of 1)") == 1
    for rank in (0, 1):
        (result,) = _results(output, rank)
        assert result["attempt"] == 2 and result["first"] == saved
        assert result["ran"] == list(range(saved, LONG))
        _assert_bit_identical(_final(out, rank), _final(reference, 0))
