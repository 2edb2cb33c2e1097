"""MultiWorkerMirroredStrategy with real processes over gloo on 127.0.0.1, from TF_CONFIG."""

from __future__ import annotations

import json
import re
import time

import pytest

from ._cluster import cluster_of, run_cluster

pytestmark = pytest.mark.multiprocess


def _results(runs) -> list[dict]:
    for run in runs:
        assert run.returncode == 0, f"{run.task} exited {run.returncode}:\n{run.output[-4000:]}"
    return [run.result for run in runs]


@pytest.fixture(scope="module")
def two_workers() -> list[dict]:
    return _results(run_cluster("collectives", cluster_of(2), timeout=120))


@pytest.fixture(scope="module")
def chief_and_two_workers() -> list[dict]:
    return _results(run_cluster("collectives", cluster_of(3, with_chief=True), timeout=120))


@pytest.mark.timeout(150)
def test_roles_from_tf_config(two_workers, chief_and_two_workers):
    assert [r["worker_index"] for r in two_workers] == [0, 1]
    assert [r["should_checkpoint"] for r in two_workers] == [True, False]  # worker 0 is chief
    tasks = [r["task"] for r in chief_and_two_workers]
    assert tasks == [["chief", 0], ["worker", 0], ["worker", 1]]
    assert [r["worker_index"] for r in chief_and_two_workers] == [0, 1, 2]  # id_in_cluster
    assert [r["should_checkpoint"] for r in chief_and_two_workers] == [True, False, False]
    for r in two_workers + chief_and_two_workers:
        assert r["num_replicas_in_sync"] == r["num_workers"]
        assert r["multi_worker_mode"] is True
        assert r["between_graph"] is True


@pytest.mark.timeout(150)
def test_reduce_across_workers(two_workers, chief_and_two_workers):
    for results, w in ((two_workers, 2), (chief_and_two_workers, 3)):
        for r in results:
            assert r["reduce_sum_host"] == float(w)  # TF: 2 workers, reduce(SUM, 1.0) == 2.0
            assert r["reduce_mean"] == pytest.approx(sum(range(w)) / w)
            # worker i contributes arange(i + 1): MEAN over all elements, not over workers
            values = [v for i in range(w) for v in range(i + 1)]
            assert r["reduce_sum_axis0"] == sum(values)
            assert r["reduce_mean_axis0"] == pytest.approx(sum(values) / len(values))


@pytest.mark.timeout(150)
def test_replica_context_collectives(two_workers, chief_and_two_workers):
    for results, w in ((two_workers, 2), (chief_and_two_workers, 3)):
        for i, r in enumerate(results):
            rep = r["replica"]
            assert rep["id"] == i
            assert rep["sum"] == sum(range(1, w + 1))
            assert rep["mean"] == pytest.approx(sum(range(1, w + 1)) / w)
            assert rep["nest"] == [[float(w), float(w)], [sum(range(w))]]
            factor = sum(range(1, w + 1))
            assert rep["small"] == {
                "new_tensor": True,
                "input_untouched": True,
                "transposed": [[k * factor, (k + 3) * factor] for k in range(3)],
                # TF's MEAN is a true division (truediv): ints give a float, never floored
                "int_mean": [sum(3 * k + 1 for k in range(w)) / w],
            }
            # a 10 MB tensor (the out-of-place ring): exact, a new tensor, the input untouched,
            # the SUM result intact after the MEAN (its memory is not reused while held)
            assert r["ring"] == dict.fromkeys(
                ("sum_exact", "mean_close", "input_untouched", "new_tensor"), True
            )
            expected = [float(k) for k in range(w) for _ in range(k + 1)]
            assert rep["all_gather"] == expected  # sizes differ along the axis, rank order
            assert r["gather"] == [[float(k)] * 2 for k in range(w) for _ in range(k + 1)]
            assert r["values_from_function"] == [i * 10 + w]  # global replica ids


@pytest.mark.timeout(150)
def test_initial_values_come_from_the_chief(two_workers, chief_and_two_workers):
    for results in (two_workers, chief_and_two_workers):
        assert all(r["variable"] == [5.0, 1.0] for r in results)  # chief's i + 5 == 5
        checksums = {r["module_checksum"] for r in results}
        assert len(checksums) == 1, checksums


@pytest.mark.timeout(150)
def test_dataset_is_sharded_across_workers(two_workers):
    # strategy_common_test: range(14).batch(8), 2 workers x 1 replica
    chief, worker = (r["dataset"] for r in two_workers)
    assert chief == [[[0, 1, 2, 3]], [[8, 9, 10]]], chief
    assert worker == [[[4, 5, 6, 7]], [[11, 12, 13]]], worker


@pytest.mark.timeout(150)
@pytest.mark.parametrize("num_workers", [2, 3])
def test_training_equals_single_process_on_the_global_batch(num_workers):
    results = _results(run_cluster("train", cluster_of(num_workers), timeout=120))
    for r in results:
        assert r["max_abs_diff"] < 1e-5, r
        assert r["accumulated_max_abs_diff"] < 1e-5, r  # two backward passes per step
        assert r["zeroed_in_place_max_abs_diff"] < 1e-5, r  # zero_grad(set_to_none=False)
        assert r["checkpointed_max_abs_diff"] < 1e-5, r  # a reentrant checkpoint's backward
        # clip_grad_norm_ between backward and step clips the averaged gradient
        assert r["clipped_max_abs_diff"] < 1e-5 and r["clipping_changed_training"], r
        assert r["kept_grads_intact"] is True  # .grad tensors kept by the caller stay as they were
        assert r["unused_grad_is_none"] is True  # an unused layer neither hangs nor gets 0s
    assert len({json.dumps(r["losses"]) for r in results}) == 1
    assert len({r["checksum"] for r in results}) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("tasks", "with_chief", "victim", "dead", "collective"),
    [
        (3, True, 2, "/job:worker/replica:0/task:1", "step"),
        (2, False, 0, "/job:worker/replica:0/task:0", "step"),  # the leader, store host
        (3, True, 2, "/job:worker/replica:0/task:1", "ring"),  # large all_reduce: send/recv
    ],
    ids=["worker-of-three", "leader-of-two", "worker-of-three-in-large-all-reduce"],
)
def test_killed_peer_gives_clear_error_naming_it(tasks, with_chief, victim, dead, collective):
    timeout = 10.0
    start = time.monotonic()
    runs = run_cluster(
        "peer_dies",
        cluster_of(tasks, with_chief=with_chief),
        timeout=90,
        extra_env={
            "MWMS_TEST_TIMEOUT": str(timeout),
            "MWMS_TEST_VICTIM": str(victim),
            "MWMS_TEST_COLLECTIVE": collective,
        },
    )
    elapsed = time.monotonic() - start
    assert runs[victim].returncode == -9
    survivors = [run for k, run in enumerate(runs) if k != victim]
    for run in survivors:
        assert run.returncode == 0, run.output[-4000:]
        error = run.result["error"]
        assert error is not None, "the surviving task did not notice the dead peer"
        assert error["type"] == "UnavailableError"
        # TF's message; a survivor that already exited after its own error may be named too
        named = re.match(r"cluster check alive failed, (.+?) is down", error["message"])
        assert named and dead in named.group(1).split(", "), error["message"]
        assert run.result["seconds"] < timeout
    assert elapsed < 80


@pytest.mark.timeout(120)
def test_frozen_peer_is_named_down_long_before_the_collective_timeout(tmp_path):
    # SIGSTOPped: its kernel still completes connections, but its liveness listener never
    # answers, as a lost node's would not; taken as down after the unresponsive grace (3 s
    # here, 30 s by default), not after the collective timeout (60 s here, 30 minutes default).
    runs = run_cluster(
        "peer_dies",
        cluster_of(2),
        timeout=90,
        extra_env={
            "MWMS_TEST_TIMEOUT": "60",
            "MWMS_TEST_MODE": "frozen",
            "MWMS_TEST_VICTIM_PID": str(tmp_path / "victim.pid"),
            "STRATEGYJOB_UNRESPONSIVE_PEER_SECONDS": "3",
        },
    )
    survivor, victim = runs
    assert victim.returncode == -9  # killed by the survivor once it had its error
    assert survivor.returncode == 0, survivor.output[-4000:]
    error = survivor.result["error"]
    assert error is not None and error["type"] == "UnavailableError", error
    assert error["message"].startswith(
        "cluster check alive failed, /job:worker/replica:0/task:1 is down"
    ), error
    assert 3 <= survivor.result["seconds"] < 20


@pytest.mark.timeout(120)
def test_stuck_peer_ends_in_deadline_exceeded_naming_it():
    # Worker 2 is alive but never reaches the next collective: the others say every second
    # that they wait for it, and their DeadlineExceededError names it (its liveness listener
    # says it is in no collective), not only "one is stuck".
    timeout = 4.0
    runs = run_cluster(
        "peer_dies",
        cluster_of(3),
        timeout=90,
        extra_env={
            "MWMS_TEST_TIMEOUT": str(timeout),
            "MWMS_TEST_MODE": "stuck",
            "MWMS_TEST_LINGER": "3",
            "STRATEGYJOB_WAITING_REPORT_SECONDS": "1",
        },
    )
    stuck = "/job:worker/replica:0/task:2"
    for index, survivor in enumerate(runs[:2]):
        assert survivor.returncode == 0, survivor.output[-4000:]
        error = survivor.result["error"]
        assert error is not None and error["type"] == "DeadlineExceededError", error
        assert re.match(
            r"Collective gradient all-reduce did not complete within 4 seconds "
            rf"\(CommunicationOptions.timeout_seconds\). Not arrived: {stuck} \(not in a "
            r"collective for [4-9] s\)\. ",
            error["message"],
        ), error
        assert "/task:0 (" not in error["message"] and "/task:1 (" not in error["message"]
        assert timeout <= survivor.result["seconds"] < timeout + 5
        own = f"/job:worker/replica:0/task:{index}"
        lines = [line for line in survivor.output.splitlines() if " in gradient " in line]
        assert lines and all(
            re.fullmatch(
                rf"strategyjob: {own} waiting \d+ s in gradient all-reduce for {stuck} "
                r"\(not in a collective for \d+ s\)",
                line,
            )
            for line in lines
        ), lines
        assert 2 <= len(lines) <= 4, lines  # every second until the 4 s timeout


#: The adaptive stuck-peer bound, made small: max(4 s, 4 x the longest pause seen so far).
_STUCK_KNOBS = {"STRATEGYJOB_STUCK_PEER_SECONDS": "4", "STRATEGYJOB_STUCK_PEER_FACTOR": "4"}


def _run_with_pauses(pauses: str) -> list:
    """Three workers without timeout_seconds, the last one pausing as ``pauses`` says
    (``step:seconds,...``); every process ended by itself."""
    env = {"MWMS_TEST_PAUSES": pauses, **_STUCK_KNOBS}
    runs = run_cluster("pauses", cluster_of(3), timeout=120, extra_env=env)
    for run in runs:
        assert run.returncode == 0, run.output[-4000:]
    return runs


@pytest.mark.timeout(150)
def test_stuck_peer_without_timeout_seconds_ends_within_the_adaptive_bound():
    # No timeout_seconds: worker 2 stops reaching collectives after 25 steps (50+ collectives,
    # history enough). Both others end with the same verdict naming it, 4 s after it stalled
    # (the floor: the steps' pauses are far shorter), not after 30 minutes; neither blames
    # the other, though the first to decide exits first (the verdict is shared).
    stalled = "/job:worker/replica:0/task:2"
    runs = _run_with_pauses("25:20")
    (stalled_at,) = runs[2].result["paused_at"]
    messages = set()
    for survivor in runs[:2]:
        error = survivor.result["error"]
        assert error is not None and error["type"] == "DeadlineExceededError", error
        assert survivor.result["steps"] == 25
        messages.add(error["message"])
    (message,) = messages  # one verdict, taken up by both
    verdict = re.match(
        rf"Collective gradient all-reduce did not complete: Not arrived: {stalled} \(not in a "
        r"collective for (\d+) s\), longer than this job's stuck-peer bound of (\d+) s, the "
        r"larger of STRATEGYJOB_STUCK_PEER_SECONDS \(4 s\) and STRATEGYJOB_STUCK_PEER_FACTOR "
        r"\(4\) x the longest time a worker spent outside collectives so far \(\d+\.\d s\)\. ",
        message,
    )
    assert verdict, message
    bound = int(verdict.group(2))  # 4 s unless a step of the loaded machine took over 1 s
    assert 4 <= bound <= int(verdict.group(1)) < bound + 2, message
    for survivor in runs[:2]:
        after = survivor.result["ended_at"] - stalled_at
        print(f"{survivor.task}: ended {after:.1f} s after the stall (bound {bound} s)")
        assert bound <= after < bound + 4, after
    assert "/task:0" not in message and "/task:1" not in message
    assert "raise STRATEGYJOB_STUCK_PEER_SECONDS" in message


@pytest.mark.timeout(150)
def test_pause_within_the_adaptive_bound_does_not_end_the_job():
    # Worker 2 pauses 1.5 s at step 10 (the job's history: the bound becomes max(4, 4 x 1.5)
    # = 6 s), then 4.5 s at step 30: longer than the floor, which alone would be a verdict,
    # but within what the job's history allows, so the job runs to its end.
    for run in _run_with_pauses("10:1.5,30:4.5"):
        assert run.result["error"] is None, run.result
        assert run.result["steps"] == 40
