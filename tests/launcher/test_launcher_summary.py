"""``strategyjob.summary`` in a real 2-worker job under ``strategyjob run``: every worker runs
the same ported ``tf.summary`` loop, and only worker 0 (the job's writer, as
``should_checkpoint``) leaves event files; their values are the global ones. The run names
the directory at its end, and ``strategyjob tensorboard --logdir`` serves it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from tests.launcher.test_launcher_run import cli_env, run_cli, write_job
from tests.support.processes import default_interrupts

pytestmark = pytest.mark.timeout(150)

SCRIPT = """
import os, torch
import strategyjob as sj
from strategyjob import summary

strategy = sj.MultiWorkerMirroredStrategy()
rank = int(os.environ["RANK"])
writer = summary.create_file_writer(f"logs/{rank}")
with writer.as_default():
    for step in range(3):
        local = strategy.run(lambda: torch.tensor(float(rank + step)))
        loss = strategy.reduce("MEAN", local, axis=None)
        summary.scalar("loss", loss, step=step)
print("wrote", os.listdir("logs"))
"""


def test_only_the_jobs_writer_leaves_event_files_with_global_values(tmp_path):
    result = run_cli(write_job(tmp_path, {"worker": (2, SCRIPT)}), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["0"]
    events = EventAccumulator(str(tmp_path / "logs" / "0"), size_guidance={"tensors": 0})
    events.Reload()
    loss = [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors("loss")
    ]
    assert loss == [(0, 0.5), (1, 1.5), (2, 2.5)]  # the mean over both workers


TRAIN_AND_VALIDATE = """
import strategyjob as sj
from strategyjob import summary

train = summary.create_file_writer("logs/train")
validation = summary.create_file_writer("logs/validation")
for step in range(3):
    with train.as_default(step=step):
        summary.scalar("loss", 1.0 / (step + 1))
    with validation.as_default(step=step):
        summary.scalar("loss", 2.0 / (step + 1))
    sj.report(step, total_steps=3, loss=1.0 / (step + 1))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_run_names_its_logdir_and_strategyjob_tensorboard_serves_it(tmp_path):
    """Two writers (train, validation): the run's closing lines name their common directory
    (TensorBoard's --logdir), which ``strategyjob tensorboard --logdir`` serves as two runs;
    Ctrl-C stops it and TensorBoard with it."""
    result = run_cli(write_job(tmp_path, {"worker": (1, TRAIN_AND_VALIDATE)}), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    logdir = tmp_path / "logs"
    closing = result.stdout.splitlines()[-1]
    assert closing == (
        f"strategyjob:   summaries in {logdir}; see them with strategyjob tensorboard "
        f"--logdir {logdir}"
    )
    port = free_port()
    serve = ["--port", str(port), "--host", "127.0.0.1"]
    log = tmp_path / "served.log"  # a file, not a pipe that nobody reads until the end
    with log.open("w") as out:
        served = subprocess.Popen(
            [sys.executable, "-m", "strategyjob", "tensorboard", "--logdir", str(logdir), *serve],
            env=cli_env() | {"PYTHONFAULTHANDLER": "1"},  # SIGABRT dumps every thread
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_interrupts,  # Ctrl-C works even where this run ignores SIGINT
        )
    try:
        deadline, tags = time.monotonic() + 60, None
        while tags is None:
            assert served.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "TensorBoard did not answer within 60 s"
            try:
                url = f"http://127.0.0.1:{port}/data/plugin/scalars/tags"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    tags = json.load(answer) or None
            except OSError:
                time.sleep(0.2)
        assert {run: sorted(t) for run, t in tags.items()} == {
            "train": ["loss"],
            "validation": ["loss"],
        }
        served.send_signal(signal.SIGINT)
        try:
            assert served.wait(30) == 0, log.read_text()
        except subprocess.TimeoutExpired:
            served.send_signal(signal.SIGABRT)  # where it hangs, for the failure's message
            served.wait(10)
            raise AssertionError(f"still running 30 s after SIGINT:\n{log.read_text()}") from None
        said = log.read_text()
        assert f"TensorBoard over {logdir} at http://127.0.0.1:{port}/" in said
    finally:
        if served.poll() is None:
            os.killpg(served.pid, signal.SIGKILL)  # and TensorBoard, in its session
        served.wait()
    children = subprocess.run(
        ["pgrep", "-f", f"tensorboard.main --logdir {logdir}"], capture_output=True, text=True
    )
    assert children.stdout.strip() == "", "TensorBoard was left behind"
