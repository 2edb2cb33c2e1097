"""Input distribution across two real worker processes (MultiWorkerMirroredStrategy, gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port

WORKER = Path(__file__).with_name("mwms_input_worker.py")
SDK = Path(__file__).resolve().parents[3] / "sdk"

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def start_two_workers(*args: str) -> list[subprocess.Popen]:
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    procs = []
    for index in range(2):
        env = dict(os.environ)
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            env.pop(name, None)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SDK), env.get("PYTHONPATH")]))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def run_two_workers(*args: str) -> list[dict]:
    procs = start_two_workers(*args)
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err[-3000:]
            line = next(x for x in out.splitlines() if x.startswith("RESULT "))
            results.append(json.loads(line[len("RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sorted(results, key=lambda r: r["worker"])


def test_mwms_range14_batch8_two_workers() -> None:
    chief, worker = run_two_workers("range")
    assert chief["steps"] == [[0, 1, 2, 3], [8, 9, 10]]
    assert worker["steps"] == [[4, 5, 6, 7], [11, 12, 13]]
    assert chief["totals"] == worker["totals"] == [28, 63]


def test_mwms_file_sharding_with_uneven_files(tmp_path: Path) -> None:
    counts = [4, 1]
    for i, count in enumerate(counts):
        (tmp_path / f"part-{i}.txt").write_text("".join(f"{100 * i + k}\n" for k in range(count)))
    chief, worker = run_two_workers("files", str(tmp_path))
    assert chief["steps"] == [[0], [1], [2], [3]]
    # The worker ran out after one step and stepped on with empty batches until the chief was done.
    assert worker["steps"] == [[100], [], [], []]
    assert chief["totals"] == worker["totals"] == [100, 1, 2, 3]


def test_mwms_dataloader_data_sharding_loads_only_own_examples() -> None:
    chief, worker = run_two_workers("loader")
    assert chief["steps"] == [[0, 1], [4, 5], [8]]
    assert worker["steps"] == [[2, 3], [6, 7], [9]]
    assert chief["loaded"] == [0, 1, 4, 5, 8]
    assert worker["loaded"] == [2, 3, 6, 7, 9]
    # Both know their 3 steps: the end of the pass is the only agreement.
    assert chief["agreements"] == worker["agreements"] == [False]


def test_mwms_uneven_dataloaders_agree_per_step_only_beyond_the_smallest_count() -> None:
    chief, worker = run_two_workers("uneven_loaders")
    assert chief["steps"] == [[0, 1], [2, 3], [4]]
    assert worker["steps"] == [[10, 11], [], []]
    assert chief["totals"] == worker["totals"] == [22, 5, 4]
    assert chief["agreements"] == [True, True, False]
    assert worker["agreements"] == [False, False, False]


def test_mwms_input_shorter_than_its_len_fails_on_both_workers_naming_it() -> None:
    procs = start_two_workers("lying_len")
    try:
        outputs = [proc.communicate(timeout=90) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    (_, chief_err), (_, worker_err) = outputs
    assert procs[1].returncode != 0
    assert "worker 1 ended after 1 steps although its len() promised 3" in worker_err
    # The chief learns of it as a peer gone in the middle of the pass, not by hanging.
    assert procs[0].returncode != 0
    assert "/job:worker/replica:0/task:1 is down" in chief_err, chief_err[-2000:]


def test_mwms_pass_left_midway_then_a_new_pass() -> None:
    chief, worker = run_two_workers("abandon")
    assert chief["steps"] == [[i, i + 1] for i in range(0, 32, 4)]
    assert worker["steps"] == [[i + 2, i + 3] for i in range(0, 32, 4)]
    assert chief["totals"] == worker["totals"] == [4 * i + 6 for i in range(0, 32, 4)]
