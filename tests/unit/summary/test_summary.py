"""``strategyjob.summary`` against TensorBoard's own event reader: what ``tf.summary`` code
writes reads back with its tags, steps, values and plugins; the default writer and step,
``record_if``, replica 0 only, and bad input that never stops training."""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import strategyjob as sj
import torch
from strategyjob import summary
from strategyjob.summary import _state, _writer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


@pytest.fixture(autouse=True)
def _fresh_summary_state() -> Iterator[None]:
    _state.reset_for_tests()
    _writer._WARNED.clear()
    yield
    _state.reset_for_tests()


def read(logdir: Path) -> EventAccumulator:
    events = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    events.Reload()
    return events


def series(events: EventAccumulator, tag: str) -> list[tuple[int, Any]]:
    return [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]


def test_a_ported_tf_summary_loop_reads_back_in_tensorboard(tmp_path: Path) -> None:
    """The TF custom-training tutorial's pattern: a writer, ``as_default(step=...)``,
    ``scalar``/``histogram``/``text``; TensorBoard sees each under its plugin."""
    writer = summary.create_file_writer(str(tmp_path / "train"))
    weights = torch.arange(100, dtype=torch.float32)
    before = time.time()
    for step in range(3):
        with writer.as_default(step=step):
            assert summary.scalar("loss", torch.tensor(1.0 / (step + 1))) is True
            assert summary.histogram("weights", weights + step, buckets=4) is True
    with writer.as_default():
        assert summary.text("notes", "lr **0.1**", step=2, description="run notes") is True
    events = read(tmp_path / "train")
    assert sorted(events.Tags()["tensors"]) == ["loss", "notes", "weights"]
    loss = series(events, "loss")
    assert [s for s, _ in loss] == [0, 1, 2]
    assert [float(v) for _, v in loss] == pytest.approx([1.0, 0.5, 1 / 3])
    assert all(before <= e.wall_time <= time.time() for e in events.Tensors("loss"))
    step, table = series(events, "weights")[2]
    assert step == 2 and table.shape == (4, 3)
    assert table[:, 0].tolist() == pytest.approx([2.0, 26.75, 51.5, 76.25])
    assert table[-1, 1] == pytest.approx(101.0) and table[:, 2].sum() == 100
    assert series(events, "notes")[0][1] == b"lr **0.1**"
    plugins = {
        tag: events.SummaryMetadata(tag).plugin_data.plugin_name
        for tag in ("loss", "weights", "notes")
    }
    assert plugins == {"loss": "scalars", "weights": "histograms", "notes": "text"}
    assert events.SummaryMetadata("notes").summary_description == "run notes"
    (name,) = os.listdir(tmp_path / "train")
    assert name.startswith("events.out.tfevents.") and name.endswith(".v2")


def test_without_a_writer_or_when_not_recording_nothing_is_written(tmp_path: Path) -> None:
    assert summary.scalar("loss", 1.0, step=0) is False  # no default writer
    assert summary.should_record_summaries() is False
    writer = summary.create_file_writer(str(tmp_path))
    calls = []
    with writer.as_default(step=0):
        with summary.record_if(False):
            assert summary.scalar("off", 1.0) is False
            with summary.record_if(lambda: calls.append(1) or True):  # innermost decides
                assert summary.scalar("on", 1.0) is True
        with summary.record_if(lambda: summary.experimental.get_step() % 2 == 0):
            for step in range(4):
                summary.experimental.set_step(step)
                summary.scalar("even", float(step))
    events = read(tmp_path)
    assert "off" not in events.Tags()["tensors"] and calls == [1]
    assert [s for s, _ in series(events, "even")] == [0, 2]
    with summary.create_noop_writer().as_default(step=0):
        assert summary.scalar("noop", 1.0) is False


def test_the_default_step_and_tensorflows_error_without_one(tmp_path: Path) -> None:
    writer = summary.create_file_writer(str(tmp_path))
    writer.set_as_default()
    with pytest.raises(ValueError, match=r"^No step set\. Please specify one either through"):
        summary.scalar("loss", 1.0)
    step = torch.tensor(7)  # e.g. an optimizer's step counter: read when each summary is made
    summary.experimental.set_step(step)
    assert summary.experimental.get_step() is step
    summary.scalar("loss", 1.0)
    step += 1
    summary.scalar("loss", 2.0)
    summary.flush()
    assert [s for s, _ in series(read(tmp_path), "loss")] == [7, 8]


def test_only_replica_zero_writes_under_a_mirrored_strategy(tmp_path: Path) -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    writer = summary.create_file_writer(str(tmp_path))

    def step_fn() -> bool:
        ctx = sj.get_replica_context()
        return summary.scalar("replica", float(ctx.replica_id_in_sync_group))

    with writer.as_default(step=0):
        wrote = strategy.experimental_local_results(strategy.run(step_fn))
    assert list(wrote) == [True, False]
    assert [float(v) for _, v in series(read(tmp_path), "replica")] == [0.0]


def test_bad_input_never_stops_training(tmp_path: Path, caplog: Any) -> None:
    """Not a scalar: one warning per tag, skipped; NaN: written as TF writes it; a step that
    goes back: one warning, written; a directory it cannot write: one warning, no writer."""
    writer = summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        with pytest.warns(RuntimeWarning, match=r"scalar\('loss'\): the data must be a single"):
            assert summary.scalar("loss", torch.ones(3), step=0) is False
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second time: no second warning
            assert summary.scalar("loss", torch.ones(3), step=1) is False
            assert summary.scalar("loss", float("nan"), step=2) is True
            assert summary.scalar("acc", 0.5, step=10) is True
        with pytest.warns(RuntimeWarning, match=r"'acc' at step 3 comes after step 10"):
            assert summary.scalar("acc", 0.6, step=3) is True
        with pytest.warns(RuntimeWarning, match=r"text\('t'\): the data must be strings"):
            assert summary.text("t", 3, step=0) is False
    events = read(tmp_path)
    assert [(s, math.isnan(float(v))) for s, v in series(events, "loss")] == [(2, True)]
    assert [s for s, _ in series(events, "acc")] == [10, 3]

    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match=r"cannot write summaries to .*; training goes on"):
        noop = summary.create_file_writer(str(blocked / "logs"))
    with noop.as_default(step=0):
        assert summary.scalar("loss", 1.0) is False


def test_histogram_buckets_are_tensorboards_table() -> None:
    table = summary._ops.histogram_buckets(np.array([1.0, 1.0, 1.0]), 3)
    assert table.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 3.0]]
    assert summary._ops.histogram_buckets(np.array([]), 2).tolist() == [[0, 0, 0], [0, 0, 0]]
    table = summary._ops.histogram_buckets(np.array([0.0, 1.0, 2.0, 3.0, np.inf]), 3)
    assert table[:, 2].tolist() == [1.0, 1.0, 2.0]  # the greatest value in the last bucket


def test_queued_summaries_reach_the_file_at_exit(tmp_path: Path) -> None:
    """Nothing is lost by a program that never flushes (TensorFlow flushes at exit)."""
    import subprocess
    import sys

    code = (
        "from strategyjob import summary\n"
        f"w = summary.create_file_writer({str(tmp_path)!r}, max_queue=1000, flush_millis=10**9)\n"
        "w.set_as_default(step=0)\n"
        "[summary.scalar('loss', float(i), step=i) for i in range(50)]\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TF_CONFIG", None)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)
    assert len(series(read(tmp_path), "loss")) == 50
