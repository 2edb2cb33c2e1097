"""A MultiWorkerMirroredStrategy job re-formed at a new worker count (issue 30,
``decide._reform``): every pod is stopped and the group created at the new size, not counted
as a restart; the size the pods form is in ``status.workers``; ``Resizing`` says it."""

from __future__ import annotations

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide
from strategyjob_operator.replica_status import restart_attempt

from tests.unit.operator.test_operator_decide import LAUNCHED, NOW, job, pods


def test_the_size_the_pods_form_is_recorded_at_creation():
    j = job(replicas={"worker": 2})
    plan = decide(j, 1, {}, {}, NOW, reforms=True)
    assert plan.action is Action.CREATE and plan.status["workers"] == 2
    assert "workers" not in decide(j, 1, {}, {}, NOW).status  # a job that does not re-form


def test_a_new_count_stops_every_pod_and_counts_a_resize_not_a_restart():
    two, three = job(replicas={"worker": 2}), job(replicas={"worker": 3})
    status = {**LAUNCHED, "workers": 2, "restartCount": 0}
    plan = decide(three, 2, status, pods(two), NOW, reforms=True)
    assert plan.action is Action.RESTART_JOB
    assert plan.delete_pods == ("j-worker-0", "j-worker-1")
    st = plan.status
    assert (st["launched"], st["resizes"], st["restartCount"]) == (False, 1, 0)
    assert restart_attempt(st) == 1  # the new pods are the next run's
    resizing = cond.get(st["conditions"], c.RESIZING)
    assert resizing["status"] == "True" and resizing["message"] == (
        "StrategyJob j re-forms with 3 workers (it ran 2): every pod stops, saving a checkpoint "
        "at its next step boundary, and the job resumes from it (not counted against "
        "backoffLimit)."
    )
    assert [e.reason for e in plan.events] == [c.REASON_RESIZING]
    # without reforms (a TFJob: training-operator's semantics, its pods made by the
    # reconciler's scaling) no re-forming is decided
    assert "resizes" not in decide(three, 2, status, pods(two), NOW).status


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
