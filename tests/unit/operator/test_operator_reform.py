"""A MultiWorkerMirroredStrategy job re-formed at a new worker count (issue 30,
``decide._reform``): every pod is stopped and the group created at the new size, not counted
as a restart; the size the pods form is in ``status.workers``; ``Resizing`` says it. Growing,
the new workers' pods start first and the job trains on at its old size until they run."""

from __future__ import annotations

import dataclasses

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide
from strategyjob_operator.observe import Replica
from strategyjob_operator.replica_status import restart_attempt

from tests.unit.operator.test_operator_decide import LAUNCHED, NOW, job, pods


def test_the_size_the_pods_form_is_recorded_at_creation():
    j = job(replicas={"worker": 2})
    plan = decide(j, 1, {}, {}, NOW, reforms=True)
    assert plan.action is Action.CREATE and plan.status["workers"] == 2
    assert "workers" not in decide(j, 1, {}, {}, NOW).status  # a job that does not re-form


def group(j, attempt=0, phase="Running"):
    """The job's pods, made for ``attempt``."""
    return {k: dataclasses.replace(r, attempt=attempt) for k, r in pods(j, phase).items()}


STOP_MESSAGE = (
    "StrategyJob j re-forms with {wanted} workers (it ran {before}): every pod stops, saving a "
    "checkpoint at its next step boundary, and the job resumes from it (not counted against "
    "backoffLimit)."
)


def test_a_smaller_count_stops_every_pod_and_counts_a_resize_not_a_restart():
    three, two = job(replicas={"worker": 3}), job(replicas={"worker": 2})
    status = {**LAUNCHED, "workers": 3, "restartCount": 0}
    plan = decide(two, 2, status, group(three), NOW, reforms=True)
    assert plan.action is Action.RESTART_JOB
    assert plan.delete_pods == ("j-worker-0", "j-worker-1", "j-worker-2")
    st = plan.status
    assert (st["launched"], st["resizes"], st["restartCount"]) == (False, 1, 0)
    assert restart_attempt(st) == 1  # the new pods are the next run's
    resizing = cond.get(st["conditions"], c.RESIZING)
    assert resizing["status"] == "True"
    assert resizing["message"] == STOP_MESSAGE.format(wanted=2, before=3)
    assert [e.reason for e in plan.events] == [c.REASON_RESIZING]
    # without reforms (a TFJob: training-operator's semantics, its pods made by the
    # reconciler's scaling) no re-forming is decided
    assert "resizes" not in decide(two, 2, status, group(three), NOW).status


def grow(status, replicas):
    return decide(job(replicas={"worker": 3}), 2, status, replicas, NOW, reforms=True)


def test_a_larger_count_starts_the_new_pods_first_while_the_group_trains_on():
    two = job(replicas={"worker": 2})
    plan = grow({**LAUNCHED, "workers": 2, "restartCount": 0}, group(two))
    assert plan.action is Action.CREATE and plan.create == (("worker", 2),)
    assert plan.delete_pods == ()
    st = plan.status
    assert (st["launched"], st["workers"], st["resizes"], st["restartCount"]) == (True, 2, 1, 0)
    assert restart_attempt(st) == 1  # worker-2 is the next run's: it waits for it
    resizing = cond.get(st["conditions"], c.RESIZING)
    assert (resizing["status"], resizing["reason"]) == ("True", c.REASON_RESIZING)
    assert resizing["message"] == (
        "StrategyJob j re-forms with 3 workers (it ran 2): its new pods start first, and it "
        "trains on with 2 workers until they run; waiting for j-worker-2."
    )
    assert [e.reason for e in plan.events].count(c.REASON_RESIZING) == 1

    # worker-2 Pending: nothing more; the count is not moved again, no Event repeated
    ahead = {**group(two), ("worker", 2): Replica("worker", 2, "j-worker-2", "Pending", attempt=1)}
    waiting = grow(st, ahead)
    assert waiting.action is Action.NONE and waiting.delete_pods == ()
    assert (waiting.status["resizes"], waiting.status["workers"]) == (1, 2)
    assert c.REASON_RESIZING not in [e.reason for e in waiting.events]


def test_a_new_pod_that_cannot_start_leaves_the_job_training_at_its_old_size():
    two = job(replicas={"worker": 2})
    st = grow({**LAUNCHED, "workers": 2}, group(two)).status
    stuck = Replica(
        "worker",
        2,
        "j-worker-2",
        "Pending",
        attempt=1,
        created_at="2026-01-01T10:00:00Z",  # long past any pending timeout
        stuck_reason="Unschedulable",
        stuck_message="0/1 nodes are available: 1 Insufficient cpu.",
    )
    three = job(replicas={"worker": 3}, pendingTimeoutSeconds=60)
    plan = decide(three, 2, st, {**group(two), ("worker", 2): stuck}, NOW, reforms=True)
    assert plan.action is Action.NONE and plan.delete_pods == ()
    conds = plan.status["conditions"]
    assert not cond.is_true(conds, c.FAILED) and not cond.is_true(conds, c.STALLED)
    resizing = cond.get(conds, c.RESIZING)
    assert resizing["reason"] == c.REASON_RESIZE_STALLED
    assert "Pod j-worker-2 cannot start: " in resizing["message"]
    assert "Insufficient cpu" in resizing["message"]
    assert resizing["message"].endswith("the job runs on with 2 workers meanwhile.")


def test_once_the_new_pods_run_the_old_group_stops_and_is_made_anew_at_the_new_size():
    two, three = job(replicas={"worker": 2}), job(replicas={"worker": 3})
    st = grow({**LAUNCHED, "workers": 2}, group(two)).status
    worker2 = Replica("worker", 2, "j-worker-2", "Running", attempt=1)
    plan = grow(st, {**group(two), ("worker", 2): worker2})
    assert plan.action is Action.RESTART_JOB
    assert plan.delete_pods == ("j-worker-0", "j-worker-1")  # worker-2 is kept: it waits
    st = plan.status
    assert (st["launched"], st["resizes"]) == (False, 1)  # counted once
    assert cond.get(st["conditions"], c.RESIZING)["message"] == STOP_MESSAGE.format(
        wanted=3, before=2
    )
    # the old pods gone: the rest of the group is made, for the same attempt as worker-2
    made = grow(st, {("worker", 2): worker2})
    assert made.action is Action.CREATE
    assert made.create == (("worker", 0), ("worker", 1))
    assert made.status["workers"] == 3 and restart_attempt(made.status) == 1
    settled = decide(three, 2, made.status, group(three, attempt=1), NOW, reforms=True)
    assert cond.get(settled.status["conditions"], c.RESIZING)["status"] == "False"


def test_a_failure_of_the_running_group_meanwhile_restarts_the_whole_job():
    two = job(replicas={"worker": 2})
    st = grow({**LAUNCHED, "workers": 2}, group(two)).status
    crashed = dataclasses.replace(
        group(two)[("worker", 1)], phase="Failed", exit_code=1, finished_at="2026-01-01T11:59:00Z"
    )
    replicas = {
        **group(two),
        ("worker", 1): crashed,
        ("worker", 2): Replica("worker", 2, "j-worker-2", "Pending", attempt=1),
    }
    plan = grow(st, replicas)
    assert plan.action is Action.RESTART_JOB
    assert "j-worker-2" in plan.delete_pods and "j-worker-0" in plan.delete_pods
    assert plan.status["restartCount"] == 1


def test_the_new_group_created_and_running_ends_resizing():
    three = job(replicas={"worker": 3})
    status = {**LAUNCHED, "launched": False, "workers": 2, "resizes": 1}
    status["conditions"] = [
        *LAUNCHED["conditions"],
        {"type": c.RESIZING, "status": "True", "reason": c.REASON_RESIZING, "message": "m"},
    ]
    created = decide(three, 2, status, {}, NOW, reforms=True)
    assert created.action is Action.CREATE and created.status["workers"] == 3
    running = decide(three, 2, {**created.status}, pods(three), NOW, reforms=True)
    resizing = cond.get(running.status["conditions"], c.RESIZING)
    assert resizing["status"] == "False"
    assert resizing["message"] == "StrategyJob j runs 3 workers."
