"""status.progress from the leader's annotation: parsing, percentage, time left."""

from __future__ import annotations

import json

from strategyjob import jobspec
from strategyjob_operator import progress
from strategyjob_operator.constants import ANNOTATION_PROGRESS


def ann(**fields):
    return json.dumps(fields)


def test_parse_keeps_known_fields_and_rejects_garbage():
    assert progress.parse_report(None) is None
    assert progress.parse_report("not json") is None
    assert progress.parse_report("[1]") is None
    assert progress.parse_report(ann(step=-1)) is None
    assert progress.parse_report(ann(totalSteps=3)) is None
    got = progress.parse_report(
        ann(
            step=5,
            totalSteps=10,
            metrics={"loss": 0.5, "phase": "warmup", "odd": [1]},
            time="2026-11-22T10:00:00Z",
            extra="x",
        )
    )
    assert got == {
        "step": 5,
        "totalSteps": 10,
        "metrics": {"loss": 0.5, "phase": "warmup", "odd": "[1]"},
        "time": "2026-11-22T10:00:00Z",
    }
    assert progress.parse_report(ann(step=1, totalSteps=0, time="yesterday")) == {"step": 1}


def test_first_report_has_percentage_but_no_estimate():
    got = progress.aggregate(
        {"step": 25, "totalSteps": 200, "metrics": {"loss": 1.5}, "time": "2026-11-22T10:00:00Z"},
        None,
    )
    assert got == {
        "step": 25,
        "totalSteps": 200,
        "percentage": 12.5,
        "metrics": {"loss": 1.5},
        "lastReportTime": "2026-11-22T10:00:00Z",
    }


def test_estimate_comes_from_the_rate_between_reports():
    prev = progress.aggregate(
        {"step": 100, "totalSteps": 1000, "time": "2026-11-22T10:00:00Z"}, None
    )
    got = progress.aggregate(
        {"step": 150, "totalSteps": 1000, "time": "2026-11-22T10:00:10Z"}, prev
    )
    # 5 steps/s, 850 steps left
    assert got["estimatedSecondsLeft"] == 170
    assert got["percentage"] == 15.0
    # the same report seen again changes nothing
    again = {"step": 150, "totalSteps": 1000, "time": "2026-11-22T10:00:10Z"}
    assert progress.aggregate(again, got) == got
    # done: nothing left
    done = progress.aggregate(
        {"step": 1000, "totalSteps": 1000, "time": "2026-11-22T10:00:20Z"}, got
    )
    assert done["estimatedSecondsLeft"] == 0 and done["percentage"] == 100.0


def test_restart_drops_the_estimate_and_no_report_keeps_the_last():
    prev = {
        "step": 500,
        "totalSteps": 1000,
        "lastReportTime": "2026-11-22T10:00:00Z",
        "estimatedSecondsLeft": 60,
        "percentage": 50.0,
    }
    back = progress.aggregate(
        {"step": 10, "totalSteps": 1000, "time": "2026-11-22T10:05:00Z"}, prev
    )
    assert "estimatedSecondsLeft" not in back and back["step"] == 10
    assert progress.aggregate(None, prev) == prev
    assert progress.aggregate(None, None) is None
    # no total: step and metrics only
    assert progress.aggregate({"step": 7}, None) == {"step": 7}


def test_merge_patch_nulls_what_the_new_progress_drops():
    old = {"step": 1, "estimatedSecondsLeft": 9, "metrics": {"loss": 1.0, "acc": 0.1}}
    new = {"step": 2, "metrics": {"loss": 0.5}}
    assert progress.merge_patch(old, new) == {
        "step": 2,
        "estimatedSecondsLeft": None,
        "metrics": {"acc": None, "loss": 0.5},
    }
    assert progress.merge_patch(None, new) == new


def test_leader_report_reads_only_the_leaders_own_pod():
    job = jobspec.StrategyJob.build(
        "mw", strategy="MultiWorkerMirroredStrategy", image="x", command=["python"], workers=2
    )

    def pod(name, uid, step):
        return {
            "metadata": {
                "name": name,
                "ownerReferences": [{"uid": uid}],
                "annotations": {ANNOTATION_PROGRESS: ann(step=step)},
            }
        }

    pods = [pod("mw-worker-1", "u", 9), pod("mw-worker-0", "old", 8), pod("mw-worker-0", "u", 3)]
    assert progress.leader_report(job, pods, "u") == {"step": 3}
    assert progress.leader_report(job, pods[:2], "u") is None


def test_the_logdir_is_kept_and_outlives_a_report_without_it():
    """``status.progress.logdir`` (``strategyjob tensorboard NAME``): a path within the CRD's
    bound is kept; a restarted leader reporting before it creates its writer keeps the last."""
    assert progress.parse_report(ann(step=1, logdir="/out/logs"))["logdir"] == "/out/logs"
    for bad in ("", 7, ["/x"], "/" + "x" * progress.MAX_LOGDIR):
        assert "logdir" not in progress.parse_report(ann(step=1, logdir=bad)), bad
    first = progress.aggregate({"step": 5, "logdir": "/out/logs"}, None)
    assert first == {"step": 5, "logdir": "/out/logs"}
    assert progress.aggregate({"step": 2}, first) == {"step": 2, "logdir": "/out/logs"}
