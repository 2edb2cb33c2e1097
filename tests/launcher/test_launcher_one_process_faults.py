"""The fault matrix of the one-process strategies (MirroredStrategy, CentralStorageStrategy):
their replicas are threads of one process, so "a peer's fault" is an exception in one replica
thread, and Ctrl-C lands in the main thread while replica threads compute. Either ends the
process promptly, its error naming the replica (docs/guide/faults.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.launcher.test_launcher_run import run_cli, write_job
from tests.support.processes import child_env, default_interrupts, stop
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

STRATEGIES = ["MirroredStrategy", "CentralStorageStrategy"]

# Two replicas on the CPU; replica 1 does what MODE says after the first all-reduce.
TRAIN = """
import os, sys, time
import strategyjob, torch
strategy = getattr(strategyjob, os.environ["STRATEGY"])(["/cpu:0", "/cpu:1"])

def step():
    context = strategyjob.get_replica_context()
    context.all_reduce("SUM", torch.ones(1))
    if int(context.replica_id_in_sync_group) == 1:
        if os.environ["MODE"] == "raise":
            raise ValueError("bad batch")
        print("BUSY", flush=True)
        time.sleep(300)  # a long computation of replica 1's own
    return context.all_reduce("SUM", torch.ones(1))

print("started", flush=True)
strategy.run(step)
"""


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_error_in_one_replica_thread_ends_the_job_naming_the_replica(tmp_path, strategy):
    """TensorFlow re-raises a replica thread's error in the main thread; ours notes which
    replica raised it, and the summary quotes the error."""
    manifest = write_job(tmp_path, {"worker": (1, TRAIN)}, strategy=strategy)
    env = child_env(STRATEGY=strategy, MODE="raise")
    started = time.monotonic()
    result = run_cli(manifest, env=env)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    error = lines.index("[worker-0] ValueError: bad batch")
    assert lines[error + 1] == "[worker-0] (raised in replica 1, local replica 1 of 2)"
    assert lines[-1].endswith(": worker-0 exited with code 1: ValueError: bad batch"), lines
    print(f"{strategy}: job failed {took:.1f} s after the start")
    assert took < 45


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ctrl_c_during_run_ends_the_process_while_a_replica_computes(tmp_path, strategy):
    """Ctrl-C reaches the main thread, which waits for the replicas: it ends the run at once
    instead of waiting for replica 1's computation (before: 300 s, until its sleep ended)."""
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    log = tmp_path / "log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "train.py"],
            cwd=tmp_path,
            env=child_env(STRATEGY=strategy, MODE="busy"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_interrupts,
        )
    try:
        wait_for("replica 1's computation", lambda: "BUSY" in log.read_text(), 60)
        time.sleep(0.3)  # the main thread is back in its wait for the replicas
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 20 s after Ctrl-C:\n{log.read_text()[-2000:]}")
        took = time.monotonic() - sent
        output = log.read_text()
        assert proc.returncode == -signal.SIGINT, output[-2000:]
        assert output.rstrip().splitlines()[-1] == "KeyboardInterrupt", output[-2000:]
        print(f"{strategy}: SIGINT to exit {took:.2f} s")
        assert took < 3
    finally:
        stop(proc)
