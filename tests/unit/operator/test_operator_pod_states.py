"""How pod states are read and decided: the training container's exit decides a replica
(a sidecar may keep its pod Running), an evaluator never fails the job nor uses its
budget, completions are remembered when their pods go, and stuck pods are reported once
per cause and fail the job after ``pendingTimeoutSeconds``. Pure: pods are JSON, the time
is passed in."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from strategyjob import jobspec
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide, format_indexes, parse_indexes
from strategyjob_operator.observe import Replica, observe, replica_from_pod

from tests.support import manifests
from tests.support.pods import NOW, STARTED, launched, pod, terminated, waiting

SIDECAR = {"name": "log-shipper", "image": "fluent-bit"}
RUNNING = {"running": {"startedAt": STARTED}}
UNSCHEDULABLE = [
    {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
]


def job(
    replicas: dict[str, int] | None = None,
    *,
    containers: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> jobspec.StrategyJob:
    """:func:`tests.support.manifests.job`, its pods running the training container beside a
    sidecar unless ``containers`` says otherwise."""
    containers = containers or [{"name": "strategyjob", "image": "train"}, SIDECAR]
    return manifests.job(replicas, containers=containers, **kwargs)


def seen(j: jobspec.StrategyJob, *pods: dict[str, Any]) -> dict[tuple[str, int], Replica]:
    return observe(j, pods)


def run(j, status, replicas, now=NOW):
    """One pass, with the status round-tripped through JSON as the API server stores it."""
    plan = decide(j, 1, status, replicas, now)
    return plan, json.loads(json.dumps(plan.status))


# --- 1. the training container decides, not the pod's phase ----------------------------


def test_training_container_exit_0_succeeds_while_a_sidecar_keeps_the_pod_running():
    r = replica_from_pod(pod("worker", 0, "Running", {"strategyjob": terminated(0)}), "strategyjob")
    assert (r.phase, r.pod_phase, r.pod_finished, r.exit_code) == (
        "Succeeded",
        "Running",
        False,
        None,
    )


def test_training_container_exit_code_fails_the_replica_while_the_pod_runs():
    p = pod("worker", 1, "Running", {"strategyjob": terminated(3), "log-shipper": RUNNING})
    r = replica_from_pod(p, "strategyjob")
    assert (r.phase, r.exit_code, r.reason) == ("Failed", 3, "Error")


def test_the_named_training_container_decides_not_the_first_one():
    containers = [SIDECAR, {"name": "strategyjob", "image": "train"}]
    j = job(containers=containers)
    # the sidecar (listed first) ended; training still runs: the replica runs
    p = pod("worker", 0, "Running", {"log-shipper": terminated(1), "strategyjob": RUNNING})
    assert seen(j, p)[("worker", 0)].phase == "Running"


def test_without_a_container_named_strategyjob_the_first_one_trains():
    containers = [{"name": "main", "image": "train"}, SIDECAR]
    j = job(containers=containers)
    p = pod("worker", 0, "Running", {"main": terminated(0), "log-shipper": RUNNING})
    assert seen(j, p)[("worker", 0)].phase == "Succeeded"


def test_a_sidecar_failing_after_training_succeeded_is_still_a_success():
    p = pod("worker", 0, "Failed", {"strategyjob": terminated(0), "log-shipper": terminated(2)})
    assert replica_from_pod(p, "strategyjob").phase == "Succeeded"


def test_an_evicted_pod_without_container_states_fails_with_the_pod_reason():
    r = replica_from_pod(pod("worker", 0, "Failed", reason="Evicted"), "strategyjob")
    assert (r.phase, r.exit_code, r.reason) == ("Failed", None, "Evicted")


def test_a_job_succeeds_while_the_leaders_sidecar_runs_and_that_pod_is_cleaned_up():
    j = job()
    replicas = seen(
        j,
        pod("worker", 0, "Running", {"strategyjob": terminated(0), "log-shipper": RUNNING}),
        pod("worker", 1, "Running", {"strategyjob": RUNNING, "log-shipper": RUNNING}),
    )
    plan, status = run(j, launched(), replicas)
    assert plan.action is Action.SUCCEED
    # cleanPodPolicy Running: the pod the sidecar keeps running goes too
    assert plan.delete_pods == ("j-worker-0", "j-worker-1")
    assert status["replicaStatuses"]["worker"]["succeeded"] == 1


@pytest.mark.parametrize(
    ("code", "action"),
    [
        pytest.param(1, Action.FAIL, id="1-permanent"),
        pytest.param(137, Action.RESTART_JOB, id="137"),
    ],
)
def test_the_training_exit_code_feeds_the_exit_code_policy(code, action):
    j = job(policy="ExitCode")
    replicas = seen(
        j,
        pod("worker", 0, "Running", {"strategyjob": RUNNING, "log-shipper": RUNNING}),
        pod("worker", 1, "Running", {"strategyjob": terminated(code), "log-shipper": RUNNING}),
    )
    plan, _ = run(j, launched(), replicas)
    assert plan.action is action
    assert f"worker-1 exited with code {code}" in plan.events[-1].message
    if action is Action.RESTART_JOB:  # its pod runs on (the sidecar) and must go
        assert "j-worker-1" in plan.delete_pods


# --- 2. an evaluator never fails the job nor uses its backoffLimit ------------------------


def evaluator_job(**run_policy: Any) -> jobspec.StrategyJob:
    return job({"worker": 1, "evaluator": 1}, **run_policy)


def evaluator_failed(j: jobspec.StrategyJob, code: int = 1) -> dict[tuple[str, int], Replica]:
    return seen(
        j,
        pod("worker", 0, "Running", {"strategyjob": RUNNING}),
        pod("evaluator", 0, "Failed", {"strategyjob": terminated(code)}),
    )


def test_an_evaluator_is_recreated_alone_without_using_the_jobs_backoff_limit():
    j = evaluator_job(backoffLimit=2)
    plan, status = run(j, launched(restartCount=2), evaluator_failed(j))  # job budget used up
    assert plan.action is Action.RECREATE_REPLICAS
    assert plan.delete_pods == ("j-evaluator-0",)
    assert status["restartCount"] == 2
    assert status["replicaStatuses"]["evaluator"]["restarts"] == 1
    assert c.FAILED not in {x["type"] for x in status["conditions"]}
    assert status["state"] != c.RESTARTING  # training goes on
    (event,) = plan.events
    assert event.reason == c.REASON_EVALUATOR_RESTARTING
    assert "do not count against the job's backoffLimit" in event.message


def test_an_evaluator_out_of_restarts_is_reported_once_and_the_job_goes_on():
    j = evaluator_job(backoffLimit=1)
    status = launched(replicaStatuses={"evaluator": {"restarts": 1}})
    plan, status = run(j, status, evaluator_failed(j))
    assert plan.action is Action.NONE and plan.delete_pods == ()
    (event,) = plan.events
    assert event.reason == c.REASON_EVALUATOR_FAILED and event.type == "Warning"
    assert "recreated 1 times (backoffLimit=1)" in event.message
    assert "never fails the job" in event.message
    assert status["replicaStatuses"]["evaluator"]["failedIndexes"] == "0"
    assert status["replicaStatuses"]["evaluator"]["failed"] == 1
    assert status["restartCount"] == 0
    again, status = run(j, status, evaluator_failed(j))  # next pass: nothing new
    assert again.action is Action.NONE and again.events == ()
    # its pod deleted later: not a failure, not recreated
    gone = {k: v for k, v in evaluator_failed(j).items() if k[0] != "evaluator"}
    later, status = run(j, status, gone)
    assert later.action is Action.NONE and later.create == () and later.events == ()
    assert status["replicaStatuses"]["evaluator"]["failed"] == 1


@pytest.mark.parametrize("backoff", [0, 3])
def test_an_evaluator_under_never_is_reported_never_fails_the_job(backoff):
    j = job({"worker": 1, "evaluator": 1}, policy={"evaluator": "Never"}, backoffLimit=backoff)
    plan, status = run(j, launched(), evaluator_failed(j, 137))
    assert plan.action is Action.NONE
    assert [e.reason for e in plan.events] == [c.REASON_EVALUATOR_FAILED]
    assert "restartPolicy Never does not retry it" in plan.events[0].message
    assert status["state"] != c.FAILED


def test_a_whole_job_restart_gives_a_given_up_evaluator_a_new_run():
    j = evaluator_job()
    status = launched(replicaStatuses={"evaluator": {"failedIndexes": "0", "restarts": 6}})
    replicas = seen(
        j,
        pod("worker", 0, "Failed", {"strategyjob": terminated(137)}),
        pod("evaluator", 0, "Failed", {"strategyjob": terminated(1)}),
    )
    plan, status = run(j, status, replicas)
    assert plan.action is Action.RESTART_JOB
    assert "failedIndexes" not in status["replicaStatuses"]["evaluator"]


# --- 3. completions are remembered ---------------------------------------------------------


@pytest.mark.parametrize(
    ("indexes", "text"),
    [([], ""), ([0], "0"), ([0, 1, 2, 3, 5, 7, 8], "0-3,5,7-8"), ([4, 2, 3], "2-4")],
)
def test_indexes_are_written_as_kubernetes_completed_indexes(indexes, text):
    assert format_indexes(indexes) == text
    assert parse_indexes(text, 100) == set(indexes)


@pytest.mark.parametrize("text", [5, None, "x", "-3", "3-", "a-b", "9-2", "0-99999999999999"])
def test_unreadable_indexes_are_skipped_and_bounded_by_the_replica_count(text):
    assert parse_indexes(text, 4) <= {0, 1, 2, 3}


def test_a_completed_worker_deleted_later_is_neither_recreated_nor_a_failure():
    j = job({"worker": 3}, success_policy="AllWorkers")
    w = {"strategyjob": RUNNING}
    done = {"strategyjob": terminated(0)}
    first, status = run(
        j,
        launched(),
        seen(
            j,
            pod("worker", 0, "Succeeded", done),
            pod("worker", 1, states=w),
            pod("worker", 2, states=w),
        ),
    )
    assert first.action is Action.NONE
    assert status["replicaStatuses"]["worker"]["completedIndexes"] == "0"
    # worker-0's pod is deleted (by hand, by a node drain): the job goes on
    second, status = run(j, status, seen(j, pod("worker", 1, states=w), pod("worker", 2, states=w)))
    assert second.action is Action.NONE and second.create == () and second.delete_pods == ()
    assert status["restartCount"] == 0
    assert status["replicaStatuses"]["worker"]["succeeded"] == 1
    assert status["replicaStatuses"]["worker"]["failed"] == 0
    # the others complete: the job succeeds, worker-0 included
    third, status = run(
        j, status, seen(j, pod("worker", 1, "Succeeded", done), pod("worker", 2, "Succeeded", done))
    )
    assert third.action is Action.SUCCEED
    assert status["replicaStatuses"]["worker"]["completedIndexes"] == "0-2"


def test_a_completed_replica_is_not_created_again_before_launch():
    j = job({"worker": 2})
    status = launched(launched=False, replicaStatuses={"worker": {"completedIndexes": "1"}})
    plan, _ = run(j, status, {})
    assert plan.create == (("worker", 0),)


def test_a_whole_job_restart_forgets_completions():
    j = job({"worker": 3}, success_policy="AllWorkers")
    status = launched(replicaStatuses={"worker": {"completedIndexes": "0"}})
    replicas = seen(
        j, pod("worker", 1, "Failed", {"strategyjob": terminated(137)}), pod("worker", 2)
    )
    plan, status = run(j, status, replicas)
    assert plan.action is Action.RESTART_JOB
    assert "completedIndexes" not in status["replicaStatuses"]["worker"]
    # the old run's succeeded pod, still terminating, is not a completion of the new run
    old = pod("worker", 0, "Succeeded", {"strategyjob": terminated(0)})
    old["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    plan, status = run(j, status, seen(j, old))
    assert "completedIndexes" not in status["replicaStatuses"]["worker"]
    assert plan.action is Action.NONE and plan.create == ()  # the old run is still going


# --- 4. stuck pods --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
        "InvalidImageName",
    ],
)
def test_a_waiting_container_that_will_not_start_is_stuck(reason):
    p = pod("worker", 0, "Pending", {"strategyjob": waiting(reason, "the detail")})
    r = replica_from_pod(p, "strategyjob")
    assert (r.phase, r.stuck_reason, r.stuck_message) == (
        "Pending",
        reason,
        "container strategyjob: the detail",
    )


def test_an_init_container_that_cannot_pull_is_stuck():
    p = pod(
        "worker",
        0,
        "Pending",
        {"strategyjob": waiting("PodInitializing")},
        init={"setup": waiting("ImagePullBackOff")},
    )
    assert replica_from_pod(p, "strategyjob").stuck_reason == "ImagePullBackOff"


def test_an_unschedulable_pod_is_stuck_with_the_schedulers_message():
    r = replica_from_pod(pod("worker", 0, "Pending", conditions=UNSCHEDULABLE, node=None), "x")
    assert r.stuck_reason == "Unschedulable"
    assert r.stuck_message == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(
            pod("worker", 0, "Pending", {"strategyjob": waiting("ContainerCreating")}),
            id="creating",
        ),
        pytest.param(
            pod("worker", 0, "Running", conditions=UNSCHEDULABLE, node=None), id="running"
        ),
        pytest.param(pod("worker", 0, "Pending", conditions=UNSCHEDULABLE), id="bound"),
    ],
)
def test_pods_on_their_way_are_not_stuck(p):
    assert replica_from_pod(p, "strategyjob").stuck_reason is None


def stuck_pods(j: jobspec.StrategyJob, reason: str = "ImagePullBackOff"):
    return seen(
        j,
        pod(
            "worker",
            0,
            "Pending",
            {"strategyjob": waiting(reason, 'Back-off pulling image "nope"')},
        ),
        pod(
            "worker",
            1,
            "Pending",
            {"strategyjob": waiting(reason, 'Back-off pulling image "nope"')},
        ),
    )


def stalled(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((x for x in status.get("conditions", []) if x["type"] == c.STALLED), None)


def test_stuck_pods_get_a_condition_and_one_warning_event_per_cause():
    j = job()
    plan, status = run(j, launched(), stuck_pods(j))
    assert plan.action is Action.NONE and plan.delete_pods == ()
    (event,) = [e for e in plan.events if e.type == "Warning"]
    assert event.reason == "ImagePullBackOff"
    assert event.message == (
        "Pod ns/j-worker-0 cannot start: ImagePullBackOff: container strategyjob: Back-off "
        'pulling image "nope" (1 more pods of the job too). To fix: check the image name and '
        "tag, and the pod's imagePullSecrets."
    )
    cond = stalled(status)
    assert cond["status"] == "True" and cond["reason"] == "ImagePullBackOff"
    assert cond["message"].startswith("2 of 2 pods of StrategyJob j cannot start: pod j-worker-0: ")
    assert status["stalledReasons"] == ["ImagePullBackOff"]
    # later passes, and the kubelet flipping to ErrImagePull and back: no new Event,
    # no restart (ErrImagePull is no failure)
    for reason in ("ImagePullBackOff", "ErrImagePull", "ImagePullBackOff"):
        plan, status = run(j, status, stuck_pods(j, reason))
        assert plan.action is Action.NONE and plan.delete_pods == ()
        assert [e for e in plan.events if e.type == "Warning"] == []
        assert status["restartCount"] == 0


def test_a_root_image_under_the_default_non_root_context_is_told_how_to_opt_out():
    j = job()
    kubelet = "Error: container has runAsNonRoot and image will run as root (pod: j-worker-0)"
    waiting_root = {"strategyjob": waiting("CreateContainerConfigError", kubelet)}
    replicas = seen(
        j, pod("worker", 0, "Pending", waiting_root), pod("worker", 1, "Pending", waiting_root)
    )
    plan, _ = run(j, launched(), replicas)
    (event,) = [e for e in plan.events if e.type == "Warning"]
    assert event.message.endswith(
        "To fix: the image runs as root, and job pods run as non-root by default: set "
        "securityContext.runAsNonRoot: false (or a runAsUser) in the replica's template, or give "
        "the image a non-root USER."
    )


def test_a_new_cause_gets_its_own_event_and_the_condition_clears_when_pods_start():
    j = job()
    _, status = run(j, launched(), stuck_pods(j))
    replicas = seen(
        j,
        pod("worker", 0, "Pending", {"strategyjob": waiting("ImagePullBackOff", "x")}),
        pod("worker", 1, "Pending", conditions=UNSCHEDULABLE, node=None),
    )
    plan, status = run(j, status, replicas)
    (event,) = plan.events
    assert event.reason == "Unschedulable" and "j-worker-1" in event.message
    assert "nvidia.com/gpu" in event.message and "resource requests" in event.message
    assert status["stalledReasons"] == ["ImagePullBackOff", "Unschedulable"]
    plan, status = run(j, status, seen(j, pod("worker", 0), pod("worker", 1)))
    assert stalled(status)["status"] == "False"
    assert "stalledReasons" not in status
    assert status["state"] == c.RUNNING


def test_a_stuck_pod_fails_the_job_after_the_pending_timeout():
    j = job(pendingTimeoutSeconds=600)
    replicas = stuck_pods(j)  # created at 11:00
    early = NOW.replace(hour=11, minute=5)
    plan, _ = run(j, launched(), replicas, early)
    assert plan.action is Action.NONE and plan.requeue_after == 300.0
    plan, status = run(j, launched(), replicas, NOW)
    assert plan.action is Action.FAIL
    failed = next(x for x in status["conditions"] if x["type"] == c.FAILED)
    assert failed["reason"] == c.REASON_PENDING_TIMEOUT
    assert failed["message"].startswith(
        "StrategyJob j failed: pod j-worker-0 was Pending longer than pendingTimeoutSeconds=600 "
        "(ImagePullBackOff: container strategyjob: "
    )
    assert plan.delete_pods == ("j-worker-0", "j-worker-1")
    assert stalled(status) is None or stalled(status)["status"] == "False"


def test_running_pods_do_not_time_out():
    j = job(pendingTimeoutSeconds=1)
    plan, _ = run(
        j, launched(), seen(j, pod("worker", 0), pod("worker", 1)), NOW + timedelta(days=1)
    )
    assert plan.action is Action.NONE and plan.requeue_after is None


def test_pending_timeout_loads_renders_and_rejects_bad_values():
    j = job(pendingTimeoutSeconds=900)
    assert j.run_policy.pending_timeout_seconds == 900
    assert jobspec.load_manifest(j.to_manifest()) == j
    assert job().run_policy.pending_timeout_seconds is None
    with pytest.raises(jobspec.ManifestError) as e:
        job(pendingTimeoutSeconds=0)
    assert "spec.runPolicy.pendingTimeoutSeconds" in str(e.value)


# --- restarts: one generation at a time ----------------------------------------------------


def test_a_restarted_job_creates_no_pod_while_one_of_the_run_before_terminates():
    # A new worker-0 beside the old worker-1 would meet it at the same names and ports.
    j = job({"worker": 2})
    failed = pod("worker", 1, "Failed", {"strategyjob": terminated(137)})
    plan, status = run(j, launched(), seen(j, pod("worker", 0), failed))
    assert plan.action is Action.RESTART_JOB and not status["launched"]
    old = pod("worker", 1, "Failed", {"strategyjob": terminated(137)})
    old["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    plan, status = run(j, status, seen(j, old))  # worker-0 gone, worker-1 still terminating
    assert plan.action is Action.NONE and plan.create == ()
    plan, status = run(j, status, {})  # the old run is gone: the new one starts whole
    assert plan.action is Action.CREATE and plan.create == (("worker", 0), ("worker", 1))


def test_a_worker_a_resize_added_that_cannot_start_neither_stalls_nor_fails_the_job():
    """A ParameterServerStrategy job scaled 2 -> 3 whose worker-2 finds no node: past the
    pending timeout the job runs on at its old size (the Resizing condition says why, see
    scaling.resize_condition); a worker it already used that cannot start still fails it."""
    j = job(
        {"chief": 1, "worker": 3, "ps": 1},
        strategy="ParameterServerStrategy",
        pendingTimeoutSeconds=600,
    )
    running = [pod(t, i) for t, i in (("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1))]
    new = pod("worker", 2, "Pending", conditions=UNSCHEDULABLE, node=None)
    replicas = seen(j, *running, new)
    plan = decide(j, 1, launched(), replicas, NOW, joining=frozenset({("worker", 2)}))
    assert plan.action is not Action.FAIL
    assert stalled(plan.status) is None or stalled(plan.status)["status"] == "False"
    assert "j-worker-2" not in plan.delete_pods
    plan = decide(j, 1, launched(), replicas, NOW)  # a worker it used: fails as before
    assert plan.action is Action.FAIL
