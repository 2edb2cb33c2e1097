"""``strategyjob.summary`` in a real 2-worker job under ``strategyjob run``: every worker runs
the same ported ``tf.summary`` loop, and only worker 0 (the job's writer, as
``should_checkpoint``) leaves event files; their values are the global ones."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from tests.launcher.test_launcher_run import run_cli, write_job

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
