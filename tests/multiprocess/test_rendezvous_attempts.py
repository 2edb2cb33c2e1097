"""A task started ahead of a re-forming (``STRATEGYJOB_RESTART_ATTEMPT`` one past the running
group's) never joins the running group's rendezvous: it waits, saying so, until that group's
leader is gone, then forms the new group with its own attempt's leader. A task left over from
an earlier attempt is refused by a later attempt's leader's store, naming both attempts. Real
processes, a real TCPStore and gloo group."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_ports
from tests.support.processes import child_env, stop
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

# Joins the group, waits for the file HOLD, all-reduces its attempt and prints the sum.
TASK = """
import os, sys, time
import torch
import strategyjob as sj
strategy = sj.MultiWorkerMirroredStrategy()
print("JOINED", strategy.num_replicas_in_sync, flush=True)
while not os.path.exists(os.environ["HOLD"]):
    time.sleep(0.05)
attempt = float(os.environ["STRATEGYJOB_RESTART_ATTEMPT"])
total = strategy.reduce("SUM", strategy.run(lambda: torch.tensor(attempt)), axis=None)
print("SUM", float(total), flush=True)
"""


class Task:
    def __init__(self, tmp: Path, name: str, cluster: dict, index: int, attempt: int, hold: Path):
        self.log = tmp / f"{name}.log"
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = child_env(
            TF_CONFIG=json.dumps(tf_config),
            STRATEGYJOB_RESTART_ATTEMPT=str(attempt),
            STRATEGYJOB_WAITING_REPORT_SECONDS="1",
            STRATEGYJOB_RENDEZVOUS_TIMEOUT="20",
            HOLD=str(hold),
        )
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", TASK], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def text(self) -> str:
        return self.log.read_text()

    def finish(self, timeout: float = 60) -> str:
        assert self.proc.wait(timeout) == 0, self.text
        return self.text


def test_a_task_of_the_next_attempt_waits_for_the_running_group_then_forms_the_new_one(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    release_old, release_new = tmp_path / "release-0", tmp_path / "release-1"
    release_new.touch()
    tasks: list[Task] = []
    try:
        old = [Task(tmp_path, f"old-{i}", cluster, i, 0, release_old) for i in range(2)]
        tasks += old
        wait_for("the running group formed", lambda: all("JOINED 2" in t.text for t in old), 60)
        ahead = Task(tmp_path, "ahead-1", cluster, 1, 1, release_new)
        tasks.append(ahead)
        waiting = (
            "/job:worker/replica:0/task:1 (attempt 1) waiting for the collective leader "
            "/job:worker/replica:0/task:0 of attempt 0 to stop: the job re-forms"
        )
        wait_for("the task ahead says it waits", lambda: waiting in ahead.text, 30)
        assert "JOINED" not in ahead.text

        release_old.touch()  # the running group is undisturbed: both its tasks, sum 0
        for t in old:
            assert "SUM 0.0" in t.finish()
        assert ahead.proc.poll() is None and "JOINED" not in ahead.text

        started = time.monotonic()
        leader = Task(tmp_path, "new-0", cluster, 0, 1, release_new)
        tasks.append(leader)
        assert "SUM 2.0" in leader.finish()  # attempt 1 + attempt 1: the new group
        assert "SUM 2.0" in ahead.finish()
        assert time.monotonic() - started < 30
    finally:
        for t in tasks:
            stop(t.proc)


def test_a_task_left_over_from_an_earlier_attempt_is_refused_naming_both(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    hold = tmp_path / "never"
    tasks: list[Task] = []
    try:
        leader = Task(tmp_path, "leader", cluster, 0, 3, hold)
        tasks.append(leader)
        stale = Task(tmp_path, "stale", cluster, 1, 2, hold)
        tasks.append(stale)
        assert stale.proc.wait(60) != 0
        assert (
            "/job:worker/replica:0/task:1 belongs to attempt 2 of this job "
            "(STRATEGYJOB_RESTART_ATTEMPT), but its collective leader "
            f"/job:worker/replica:0/task:0 at 127.0.0.1:{ports[0]} to attempt 3: this process is "
            "left over from an earlier attempt."
        ) in stale.text
        assert "could not reach" not in stale.text  # said as it is, not as a timeout
        assert "JOINED" not in leader.text
    finally:
        for t in tasks:
            stop(t.proc)
