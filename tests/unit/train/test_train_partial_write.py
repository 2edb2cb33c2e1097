"""A process SIGKILLed while saving leaves either the complete checkpoint or none: the previous
complete checkpoint is the latest and restores (real processes, real SIGKILL)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from strategyjob import train

pytestmark = pytest.mark.timeout(120)

CHILD = Path(__file__).resolve().parent / "save_child.py"
SDK = Path(__file__).resolve().parents[3] / "sdk"


def _start(*args: str) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(SDK), env.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill_when(proc: subprocess.Popen, condition, timeout: float, what: str) -> None:
    """SIGKILL ``proc`` as soon as ``condition()`` holds (polled with a deadline)."""
    deadline = time.monotonic() + timeout
    try:
        while not condition():
            if proc.poll() is not None:
                output = proc.stdout.read().decode(errors="replace")
                pytest.fail(f"the saver exited {proc.returncode} before {what}:\n{output[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:g} s")
            time.sleep(0.001)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def _restored(path: str) -> torch.Tensor:
    value = torch.full((8 * 1024 * 1024,), -1.0)
    train.Checkpoint(value=value).restore(path).assert_consumed()
    return value


def test_killed_before_the_rename_restores_the_previous_checkpoint(tmp_path):
    directory, marker = tmp_path / "ckpts", tmp_path / "marker"
    proc = _start(str(directory), "block", str(marker))
    _kill_when(proc, marker.exists, 90, "second save under way")

    leftovers = glob.glob(str(directory / ".ckpt-2.tmp-*"))
    assert len(leftovers) == 1 and os.path.getsize(leftovers[0]) > 32 * 1024 * 1024
    assert not (directory / "ckpt-2").exists()
    latest = train.latest_checkpoint(directory)
    assert latest == str(directory / "ckpt-1")
    assert torch.all(_restored(latest) == 1.0)

    # a restarted program resumes from ckpt-1; its first save clears the leftover
    value = torch.zeros(8 * 1024 * 1024)
    ckpt = train.Checkpoint(value=value)
    manager = train.CheckpointManager(ckpt, directory, max_to_keep=2)
    assert manager.restore_or_initialize() == latest and value[0].item() == 1.0
    assert manager.save() == str(directory / "ckpt-2")
    assert sorted(os.listdir(directory)) == ["checkpoint", "ckpt-1", "ckpt-2"]


def test_killed_at_any_point_of_a_write_leaves_only_complete_checkpoints(tmp_path):
    directory = tmp_path / "ckpts"

    def writing_after_first() -> bool:
        if not (directory / "ckpt-1").exists():
            return False
        return any(os.path.getsize(p) > 0 for p in glob.glob(str(directory / ".ckpt-*.tmp-*")))

    proc = _start(str(directory), "loop")
    _kill_when(proc, writing_after_first, 90, "write after the first checkpoint")

    latest = train.latest_checkpoint(directory)
    assert latest is not None
    number = int(latest.rsplit("-", 1)[1])
    assert torch.all(_restored(latest) == float(number))  # complete, and the listed one
    for path in train.get_checkpoint_state(directory).all_model_checkpoint_paths:
        n = int(path.rsplit("-", 1)[1])
        assert torch.all(_restored(path) == float(n))


def test_atomic_write_path_replaces_or_leaves_the_file(tmp_path) -> None:
    """A writer that takes a path (Keras's save_weights) gets a temporary path ending as the
    target does; its file replaces the target, and a failed write leaves the target as it was
    and no temporary behind."""
    from strategyjob.train._storage import atomic_write_path

    target = tmp_path / "ckpt-1.weights.h5"
    target.write_text("old")
    seen = []

    def fail(path: str) -> None:
        seen.append(path)
        Path(path).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write_path(str(target), fail)
    assert seen[0].endswith(".weights.h5") and Path(seen[0]).parent == tmp_path
    assert target.read_text() == "old" and os.listdir(tmp_path) == [target.name]
    assert atomic_write_path(str(target), lambda path: Path(path).write_text("new")) == 3
    assert target.read_text() == "new" and os.listdir(tmp_path) == [target.name]
