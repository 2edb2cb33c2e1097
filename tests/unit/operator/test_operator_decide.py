"""decide(): failure handling per strategy and policy, success, deadline, TTL, suspend.
Pure: the time is passed in, pods are Replica values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from strategyjob import jobspec
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide, is_retryable
from strategyjob_operator.observe import Replica

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
TEMPLATE = {"spec": {"containers": [{"name": "strategyjob", "image": "x"}]}}


def job(strategy="MultiWorkerMirroredStrategy", replicas=None, policy="OnFailure", **run_policy):
    replicas = replicas or {"worker": 3}
    return jobspec.load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {
                "strategy": strategy,
                "replicaSpecs": {
                    t: {"replicas": n, "restartPolicy": policy, "template": TEMPLATE}
                    for t, n in replicas.items()
                },
                "runPolicy": run_policy,
            },
        }
    )


def pods(j, phase="Running", **overrides):
    out = {}
    for t, i in j.replicas():
        out[(t, i)] = Replica(t, i, j.pod_name(t, i), phase)
    for label, replica in overrides.items():
        t, i = label.rsplit("_", 1)
        out[(t, int(i))] = replica
    return out


def failed(t, i, code, reason=None, at="2026-01-01T11:59:00Z"):
    return Replica(t, i, f"j-{t}-{i}", "Failed", exit_code=code, reason=reason, finished_at=at)


LAUNCHED = {
    "launched": True,
    "startTime": "2026-01-01T11:00:00Z",
    "conditions": [{"type": c.CREATED, "status": "True", "reason": c.REASON_CREATED}],
}


@pytest.mark.parametrize(
    ("policy", "code", "expected"),
    [
        pytest.param("Never", 137, False, id="never"),
        pytest.param("OnFailure", 1, True, id="onfailure"),
        pytest.param("Always", 1, True, id="always"),
        pytest.param("ExitCode", 1, False, id="exitcode-1-permanent"),
        pytest.param("ExitCode", 127, False, id="exitcode-127-permanent"),
        pytest.param("ExitCode", 128, True, id="exitcode-128-retryable"),
        pytest.param("ExitCode", 137, True, id="exitcode-137-retryable"),
        pytest.param("ExitCode", None, True, id="exitcode-deleted-retryable"),
    ],
)
def test_retryable_follows_restart_policy(policy, code, expected):
    assert is_retryable(policy, code) is expected


def test_first_pass_creates_every_pod_and_the_service():
    j = job()
    plan = decide(j, 1, {}, {}, NOW)
    assert plan.action is Action.CREATE
    assert plan.create == (("worker", 0), ("worker", 1), ("worker", 2))
    assert plan.ensure_service
    assert plan.status["launched"] is False
    assert [e.reason for e in plan.events] == [c.REASON_CREATED]
    assert plan.metrics == ("jobs_created",)


def test_missing_pods_before_launch_are_created_not_failures():
    j = job()
    some = {k: v for k, v in pods(j).items() if k != ("worker", 2)}
    plan = decide(j, 1, {"launched": False, "conditions": []}, some, NOW)
    assert plan.action is Action.CREATE and plan.create == (("worker", 2),)


def test_all_pods_existing_marks_launched_and_running():
    j = job()
    plan = decide(j, 1, {"launched": False}, pods(j), NOW)
    assert plan.status["launched"] is True
    assert plan.status["state"] == c.RUNNING
    assert plan.status["ready"] == "3/3"


def test_collective_failure_restarts_the_whole_job():
    j = job()
    plan = decide(j, 1, LAUNCHED, pods(j, worker_1=failed("worker", 1, 137, "OOMKilled")), NOW)
    assert plan.action is Action.RESTART_JOB
    assert plan.delete_pods == ("j-worker-0", "j-worker-1", "j-worker-2")
    assert plan.status["restartCount"] == 1 and plan.status["launched"] is False
    assert plan.status["replicaStatuses"]["worker"]["restarts"] == 1
    assert "worker-1 exited with code 137 (OOMKilled)" in plan.events[-1].message
    assert plan.status["state"] == c.RESTARTING


def test_parameter_server_worker_failure_recreates_it_alone():
    j = job("ParameterServerStrategy", {"chief": 1, "worker": 2, "ps": 1})
    plan = decide(j, 1, LAUNCHED, pods(j, worker_1=failed("worker", 1, 1)), NOW)
    assert plan.action is Action.RECREATE_REPLICAS
    assert plan.delete_pods == ("j-worker-1",)


@pytest.mark.parametrize("replica_type", ["chief", "ps"])
def test_parameter_server_chief_or_ps_failure_restarts_the_job(replica_type):
    j = job("ParameterServerStrategy", {"chief": 1, "worker": 2, "ps": 1})
    overrides = {f"{replica_type}_0": failed(replica_type, 0, 1)}
    plan = decide(j, 1, LAUNCHED, pods(j, **overrides), NOW)
    assert plan.action is Action.RESTART_JOB
    assert len(plan.delete_pods) == 4


def test_root_cause_is_the_earliest_failure():
    j = job()
    replicas = pods(
        j,
        worker_0=failed("worker", 0, 1, at="2026-01-01T11:59:30Z"),
        worker_2=failed("worker", 2, 137, at="2026-01-01T11:59:00Z"),
    )
    plan = decide(j, 1, LAUNCHED, replicas, NOW)
    assert "worker-2 exited with code 137" in plan.events[-1].message


def test_permanent_failure_fails_the_job_naming_replica_and_code():
    j = job(policy="ExitCode")
    plan = decide(j, 1, LAUNCHED, pods(j, worker_2=failed("worker", 2, 3)), NOW)
    assert plan.action is Action.FAIL
    cond = plan.status["conditions"][-1]
    assert cond["type"] == c.FAILED and cond["reason"] == c.REASON_REPLICA_FAILED
    assert "worker-2 exited with code 3" in cond["message"]
    assert plan.status["completionTime"] == "2026-01-01T12:00:00Z"
    assert plan.metrics == ("jobs_failed",)


def test_backoff_limit_reached_fails_the_job():
    j = job(backoffLimit=2)
    status = {**LAUNCHED, "restartCount": 2}
    plan = decide(j, 1, status, pods(j, worker_0=failed("worker", 0, 1)), NOW)
    assert plan.action is Action.FAIL
    assert "backoffLimit=2 is reached after 2 restarts" in plan.status["conditions"][-1]["message"]


def test_pod_missing_after_launch_is_a_failure_of_its_replica():
    j = job()
    some = {k: v for k, v in pods(j).items() if k != ("worker", 1)}
    plan = decide(j, 1, LAUNCHED, some, NOW)
    assert plan.action is Action.RESTART_JOB
    assert "worker-1 was deleted" in plan.events[-1].message


def test_evaluator_failure_never_fails_the_job():
    j = job(replicas={"worker": 1, "evaluator": 1}, policy="Never")
    plan = decide(j, 1, LAUNCHED, pods(j, evaluator_0=failed("evaluator", 0, 1)), NOW)
    assert plan.action is Action.NONE
    assert c.REASON_EVALUATOR_FAILED in [e.reason for e in plan.events]
    assert all(cond["type"] != c.FAILED for cond in plan.status["conditions"])


@pytest.mark.parametrize(
    ("success_policy", "done", "succeeds"),
    [
        pytest.param("", ["worker_0"], True, id="default-worker0"),
        pytest.param("AllWorkers", ["worker_0"], False, id="allworkers-one"),
        pytest.param("AllWorkers", ["worker_0", "worker_1", "worker_2"], True, id="allworkers-all"),
    ],
)
def test_success_policy(success_policy, done, succeeds):
    j = job()
    j = jobspec.load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {
                "strategy": j.strategy,
                "successPolicy": success_policy,
                "replicaSpecs": {"worker": {"replicas": 3, "template": TEMPLATE}},
            },
        }
    )
    overrides = {d: Replica("worker", int(d[-1]), f"j-worker-{d[-1]}", "Succeeded") for d in done}
    plan = decide(j, 1, LAUNCHED, pods(j, **overrides), NOW)
    assert (plan.action is Action.SUCCEED) is succeeds


def test_deadline_fails_the_job_and_stops_active_pods_whatever_the_clean_policy():
    j = job(activeDeadlineSeconds=60, cleanPodPolicy="None")
    plan = decide(j, 1, {**LAUNCHED, "startTime": "2026-01-01T11:59:00Z"}, pods(j), NOW)
    assert plan.action is Action.FAIL
    assert plan.status["conditions"][-1]["reason"] == c.REASON_DEADLINE
    assert len(plan.delete_pods) == 3


def test_deadline_not_reached_asks_to_be_woken_on_time():
    j = job(activeDeadlineSeconds=120)
    plan = decide(j, 1, {**LAUNCHED, "startTime": "2026-01-01T11:59:00Z"}, pods(j), NOW)
    assert plan.action is Action.NONE
    assert plan.requeue_after == pytest.approx(60.0)


def test_ttl_deletes_the_job_once_expired():
    j = job(ttlSecondsAfterFinished=30)
    done = {
        "completionTime": "2026-01-01T11:59:00Z",
        "conditions": [{"type": c.SUCCEEDED, "status": "True"}],
    }
    assert decide(j, 1, done, {}, NOW).delete_job
    early = decide(j, 1, done, {}, NOW - timedelta(seconds=45))
    assert not early.delete_job and early.requeue_after == pytest.approx(15.0)


def test_suspend_deletes_pods_and_resume_resets_start_time():
    j = job(suspend=True)
    plan = decide(j, 1, LAUNCHED, pods(j), NOW)
    assert plan.action is Action.SUSPEND and len(plan.delete_pods) == 3
    assert plan.status["state"] == c.SUSPENDED and plan.status["launched"] is False
    resumed = decide(job(), 1, plan.status, {}, NOW + timedelta(seconds=10))
    assert resumed.action is Action.CREATE
    assert resumed.status["startTime"] == "2026-01-01T12:00:10Z"
    assert resumed.status["restartCount"] == 0


def test_unchanged_job_gives_unchanged_status():
    j = job()
    first = decide(j, 1, {"launched": False}, pods(j), NOW)
    second = decide(j, 1, first.status, pods(j), NOW + timedelta(seconds=5))
    assert second.status == first.status and second.events == ()
