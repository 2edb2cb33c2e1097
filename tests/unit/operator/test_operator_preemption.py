"""Preemption, eviction and node drain (the pod's DisruptionTarget condition) restart the
job or the replica without counting against backoffLimit, whatever the restart policy, and
the condition, Event and status say so; pods get room for a checkpoint between SIGTERM
and SIGKILL. Pure: decide() and observe() on plain values, the reconciler with a fake API."""

from __future__ import annotations

import asyncio

import pytest
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide
from strategyjob_operator.metrics import Registry
from strategyjob_operator.observe import Replica, observe, replica_from_pod
from strategyjob_operator.reconcile import (
    DEFAULT_TERMINATION_GRACE_SECONDS,
    OperatorSettings,
    Reconciler,
    with_grace_period,
)
from strategyjob_operator.settings import grace_seconds

from tests.support import manifests, pods
from tests.support.fake_api import FakeApi
from tests.support.manifests import TEMPLATE, job
from tests.support.pods import NOW

LAUNCHED = {
    "launched": True,
    "startTime": "2026-01-01T11:00:00Z",
    "conditions": [{"type": c.CREATED, "status": "True", "reason": c.REASON_CREATED}],
}


def running(j):
    return {(t, i): Replica(t, i, j.pod_name(t, i), "Running") for t, i in j.replicas()}


def disrupted(t, i, reason="PreemptionByScheduler", *, terminating=True, at="11:59:00", **kw):
    return Replica(
        t,
        i,
        f"j-{t}-{i}",
        kw.pop("phase", "Running"),
        terminating=terminating,
        disruption=reason,
        disrupted_at=f"2026-01-01T{at}Z",
        **kw,
    )


def test_a_preempted_worker_restarts_the_job_without_using_the_backoff_budget():
    j = job(backoffLimit=3)
    pods = {**running(j), ("worker", 1): disrupted("worker", 1)}
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.RESTART_JOB
    assert plan.delete_pods == ("j-worker-0",)  # the preempted one is already going
    assert plan.status["restartCount"] == 0 and plan.status["preemptions"] == 1
    restarting = next(x for x in plan.status["conditions"] if x["type"] == c.RESTARTING)
    assert restarting["reason"] == c.REASON_JOB_PREEMPTED
    event = plan.events[-1]
    assert (event.type, event.reason) == ("Warning", c.REASON_JOB_PREEMPTED)
    assert "worker-1 was preempted by a higher-priority pod (PreemptionByScheduler)" in (
        event.message
    )
    assert "not counted against backoffLimit=3; 1 so far" in event.message
    assert "jobs_preempted" in plan.metrics and "jobs_restarted" in plan.metrics


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("EvictionByEvictionAPI", "was evicted (node drain or the Eviction API)"),
        ("DeletionByTaintManager", "was deleted for a NoExecute taint on its node"),
        ("TerminationByKubelet", "was stopped by the kubelet (node pressure or shutdown)"),
        ("SomethingNew", "was disrupted by the cluster (SomethingNew)"),
    ],
)
def test_every_disruption_reason_is_named(reason, words):
    j = job()
    pods = {**running(j), ("worker", 0): disrupted("worker", 0, reason)}
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.RESTART_JOB and words in plan.events[-1].message


def test_preemption_restarts_even_at_the_backoff_limit_and_under_restart_policy_never():
    j = job(policy="Never", backoffLimit=1)
    status = {**LAUNCHED, "restartCount": 1, "preemptions": 4}
    pods = {**running(j), ("worker", 0): disrupted("worker", 0, "EvictionByEvictionAPI")}
    plan = decide(j, 1, status, pods, NOW)
    assert plan.action is Action.RESTART_JOB
    assert plan.status["restartCount"] == 1 and plan.status["preemptions"] == 5


def test_a_kubelet_eviction_seen_as_a_failed_pod_is_a_preemption():
    j = job(policy="ExitCode", backoffLimit=0)
    evicted = disrupted(
        "worker", 1, "TerminationByKubelet", terminating=False, phase="Failed", exit_code=143
    )
    plan = decide(j, 1, dict(LAUNCHED), {**running(j), ("worker", 1): evicted}, NOW)
    assert plan.action is Action.RESTART_JOB and plan.status["preemptions"] == 1
    assert "and exited with code 143" in plan.events[-1].message


def test_peers_failing_after_the_preemption_do_not_fail_the_job():
    """The survivors of a collective lose their peer and exit 1 (ExitCode: not retryable);
    the disruption came first, so the restart is the preemption's."""
    j = job(policy="ExitCode", backoffLimit=0)
    peer = Replica(
        "worker", 0, "j-worker-0", "Failed", exit_code=1, finished_at="2026-01-01T11:59:30Z"
    )
    pods = {("worker", 0): peer, ("worker", 1): disrupted("worker", 1, at="11:59:00")}
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.RESTART_JOB and plan.status["restartCount"] == 0
    assert "): worker-1 was preempted" in plan.events[-1].message  # the root cause leads


def test_a_failure_before_the_preemption_still_counts():
    j = job(policy="ExitCode")
    peer = Replica(
        "worker", 0, "j-worker-0", "Failed", exit_code=1, finished_at="2026-01-01T11:58:00Z"
    )
    pods = {("worker", 0): peer, ("worker", 1): disrupted("worker", 1, at="11:59:00")}
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.FAIL and plan.status.get("preemptions") is None


def test_the_preempted_pod_still_terminating_after_the_restart_is_not_counted_again():
    j = job()
    status = {**LAUNCHED, "launched": False, "preemptions": 1}
    pods = {("worker", 0): disrupted("worker", 0)}
    plan = decide(j, 1, status, pods, NOW)
    # not counted again; and the new run waits for the old one's last pod to go
    assert plan.action is Action.NONE and plan.create == ()
    assert plan.status["preemptions"] == 1
    plan = decide(j, 1, status, {}, NOW)
    assert plan.action is Action.CREATE and plan.status["preemptions"] == 1


def test_a_preempted_parameter_server_worker_is_recreated_alone():
    j = job({"chief": 1, "worker": 2, "ps": 1}, strategy="ParameterServerStrategy", backoffLimit=0)
    pods = {**running(j), ("worker", 1): disrupted("worker", 1, "DeletionByTaintManager")}
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.RECREATE_REPLICAS and plan.delete_pods == ()
    assert plan.events[-1].reason == c.REASON_REPLICA_PREEMPTED
    assert plan.status["restartCount"] == 0 and plan.status["preemptions"] == 1


def test_a_preempted_evaluator_is_recreated_without_using_its_restarts():
    j = job({"worker": 2, "evaluator": 1}, backoffLimit=0)
    pods = {**running(j), ("evaluator", 0): disrupted("evaluator", 0)}
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.RECREATE_REPLICAS
    assert plan.status["replicaStatuses"]["evaluator"]["restarts"] == 0
    assert "a disruption, not counted" in plan.events[-1].message


def test_a_deleted_pod_without_disruption_still_counts():
    j = job(backoffLimit=2)
    pods = running(j)
    del pods[("worker", 1)]
    plan = decide(j, 1, dict(LAUNCHED), pods, NOW)
    assert plan.action is Action.RESTART_JOB and plan.status["restartCount"] == 1
    assert plan.events[-1].reason == c.REASON_JOB_RESTARTING


def pod(conditions=(), reason=None, phase="Running", deleting=False):
    """worker-0's pod (uid ``p0``), controlled by the job of uid ``u``."""
    deleted = "2026-01-01T11:59:10Z" if deleting else None
    return pods.pod(
        "worker",
        0,
        phase,
        conditions=conditions,
        reason=reason,
        uid="p0",
        owner="u",
        deleted=deleted,
    )


def test_observe_reads_the_disruption_target_condition():
    cond = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "lastTransitionTime": "2026-01-01T11:59:09Z",
    }
    r = observe(job(), [pod([cond], deleting=True)], "u")[("worker", 0)]
    assert (r.disruption, r.disrupted_at, r.terminating, r.uid) == (
        "PreemptionByScheduler",
        "2026-01-01T11:59:09Z",
        True,
        "p0",
    )
    assert replica_from_pod(pod([{**cond, "status": "False"}]), "strategyjob").disruption is None
    assert replica_from_pod(pod(), "strategyjob").disruption is None
    evicted = replica_from_pod(pod(reason="Evicted", phase="Failed"), "strategyjob")
    assert evicted.disruption == "Evicted"


def test_pods_get_room_for_a_checkpoint_unless_their_template_says():
    bare = {"spec": {"containers": []}}
    with_grace_period(bare, 60)
    assert bare["spec"]["terminationGracePeriodSeconds"] == 60
    own = {"spec": {"terminationGracePeriodSeconds": 5}}
    with_grace_period(own, 60)
    assert own["spec"]["terminationGracePeriodSeconds"] == 5  # the template's value wins
    zero = {"spec": {"terminationGracePeriodSeconds": 0}}
    with_grace_period(zero, 60)
    assert zero["spec"]["terminationGracePeriodSeconds"] == 0
    untouched = {"spec": {}}
    with_grace_period(untouched, None)
    assert "terminationGracePeriodSeconds" not in untouched["spec"]
    assert DEFAULT_TERMINATION_GRACE_SECONDS == 60 and grace_seconds("90") == 90
    with pytest.raises(ValueError, match="is not a whole number of seconds: set it to"):
        grace_seconds("1m")


def test_the_reconciler_creates_pods_with_the_grace_period():
    manifest = manifests.manifest({"chief": 1, "worker": 1}, policy=None, uid="u", generation=1)
    chief = manifest["spec"]["replicaSpecs"]["chief"]
    chief["template"] = {"spec": {**TEMPLATE["spec"], "terminationGracePeriodSeconds": 7}}
    api = FakeApi(manifest)
    settings = OperatorSettings(termination_grace_seconds=60)
    reconciler = Reconciler(api, settings, clock=lambda: NOW, registry=Registry())
    asyncio.run(reconciler.reconcile("ns", "j"))
    assert api.created["j-worker-0"]["spec"]["terminationGracePeriodSeconds"] == 60
    assert api.created["j-chief-0"]["spec"]["terminationGracePeriodSeconds"] == 7


def test_the_restart_attempt_counts_restarts_and_preemptions():
    from strategyjob_operator.decide import restart_attempt

    assert restart_attempt({}) == 0
    assert restart_attempt({"restartCount": 2, "preemptions": 1}) == 3
    assert restart_attempt({"restartCount": "x", "preemptions": -4}) == 0  # hand-edited status
