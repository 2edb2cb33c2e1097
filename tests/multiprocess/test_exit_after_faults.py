"""Exit means exit: a MultiWorkerMirroredStrategy process ends within seconds of a collective
error whatever its backend threads are blocked on (a frozen peer), and Ctrl-C (SIGINT) stops
it in the rendezvous or in a collective within a second or two, as Python ends a program
on Ctrl-C (a ``KeyboardInterrupt`` traceback, killed by SIGINT: exit status 130).

Each task is a real process ending through interpreter finalisation (``exit_fault_worker.py``),
in a session of its own, killed whole at the end of the test."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from strategyjob.launcher import free_ports

from tests.support.processes import child_env, default_interrupts, listening_ports, stop
from tests.support.waiting import wait_for

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "exit_fault_worker.py"
#: What the tests allow for Ctrl-C to end a process: the rendezvous polls every 0.1 s and
#: a collective is waited for in 1 s slices; the rest is Python's exit with torch loaded
#: (up to 1.5 s on a loaded 2-core machine).
RENDEZVOUS_INTERRUPT_BOUND = 3.0
COLLECTIVE_INTERRUPT_BOUND = 4.0


class Task:
    """One started task: its process and everything it printed so far."""

    def __init__(self, proc: subprocess.Popen[Any], log: IO[str]) -> None:
        self.proc, self.log = proc, log

    @property
    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def exit_within(self, seconds: float) -> float:
        """Wait for the process to exit; the time it took (fails the test past ``seconds``)."""
        start = time.monotonic()
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {seconds:g} s later:\n{self.output[-3000:]}")
        return time.monotonic() - start


@contextmanager
def cluster(
    scenario: str, workers: int, start: int | None = None, **env: str
) -> Iterator[list[Task]]:
    """Start ``scenario``'s tasks of a ``workers``-worker cluster on 127.0.0.1 (only task
    ``start`` when given: its peers never come); every process is killed at the end."""
    ports = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    indices = range(workers) if start is None else [start]
    tasks = []
    try:
        for index in indices:
            config = {"cluster": {"worker": ports}, "task": {"type": "worker", "index": index}}
            log = tempfile.TemporaryFile(mode="w+")
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), scenario],
                env=child_env(CUDA_VISIBLE_DEVICES="", TF_CONFIG=json.dumps(config), **env),
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                preexec_fn=default_interrupts,
            )
            tasks.append(Task(proc, log))
        yield tasks
    finally:
        for task in tasks:
            stop(task.proc)
            task.log.close()


def assert_interrupted(task: Task, elapsed: float, bound: float) -> None:
    """Ended as Python ends a program on Ctrl-C, within ``bound`` seconds."""
    output = task.output
    assert task.proc.returncode == -signal.SIGINT, output[-3000:]
    assert "During handling of the above exception" not in output, output[-3000:]
    last = output.rstrip().splitlines()[-1]
    assert re.fullmatch(r"(\[rank\d+\]: )?KeyboardInterrupt", last), output[-3000:]
    print(f"SIGINT to exit: {elapsed:.2f} s")
    assert elapsed < bound, f"{elapsed:.1f} s to stop"


@pytest.mark.timeout(150)
def test_a_frozen_peer_ends_the_survivor_with_its_error_and_checkpoint(tmp_path):
    # Worker 1 SIGSTOPs itself mid-training. Worker 0's all-reduce is named failed after the
    # unresponsive grace (2 s here), and the process must then exit: gloo's thread stays
    # blocked on the frozen peer, which used to hold the exit for gloo's 30-minute timeout.
    checkpoint = tmp_path / "ckpt.pt"
    with cluster(
        "freeze",
        2,
        EXIT_TEST_CHECKPOINT=str(checkpoint),
        STRATEGYJOB_UNRESPONSIVE_PEER_SECONDS="2",
        STRATEGYJOB_RENDEZVOUS_TIMEOUT="60",
    ) as (survivor, frozen):
        survivor.exit_within(100)
        exited_at = time.time()
        output = survivor.output
        assert survivor.proc.returncode == 1, output[-3000:]
        assert frozen.proc.poll() is None  # still frozen: nothing ended the survivor's wait
        last = output.rstrip().splitlines()[-1]
        assert "UnavailableError: cluster check alive failed, " in last, output[-3000:]
        assert "/job:worker/replica:0/task:1 is down" in last
        assert checkpoint.exists()
        failed_at = float(output.split("FAILED_AT ")[1].split()[0])
        print(f"error to exit: {exited_at - failed_at:.2f} s")
        assert exited_at - failed_at < 5, f"{exited_at - failed_at:.1f} s from error to exit"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", [0, 1], ids=["leader-waits", "follower-connects"])
def test_ctrl_c_stops_a_task_waiting_for_its_peers(index):
    # Its peer never starts: the leader (worker 0) waits for it to join, worker 1 for the
    # leader to listen. torch's rendezvous retries through SIGINT for its whole timeout.
    with cluster("join", 2, start=index, STRATEGYJOB_RENDEZVOUS_TIMEOUT="600") as (task,):
        # The liveness listener opens just before the rendezvous, the leader's store in it.
        wait_for("the rendezvous", lambda: listening_ports(task.proc.pid), 60)
        time.sleep(0.5)  # well into the wait (nothing shows it from outside)
        task.proc.send_signal(signal.SIGINT)
        assert_interrupted(task, task.exit_within(30), RENDEZVOUS_INTERRUPT_BOUND)


@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_task_waiting_in_a_collective():
    # Worker 1 is alive but never reaches the all-reduce worker 0 waits in (timeout 30 min).
    with cluster("stuck", 2, STRATEGYJOB_RENDEZVOUS_TIMEOUT="60") as (waiting, _):
        wait_for("the collective", lambda: "WAITING" in waiting.output, 90)
        time.sleep(0.5)  # in the sliced wait of the all-reduce
        waiting.proc.send_signal(signal.SIGINT)
        assert_interrupted(waiting, waiting.exit_within(30), COLLECTIVE_INTERRUPT_BOUND)
        assert "in wait" in waiting.output  # interrupted in the collective's wait
