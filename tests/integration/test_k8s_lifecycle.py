"""Failures, restarts, success, deadline, TTL, suspend/resume and cascade delete, with
pod phases written through the API (no kubelet runs here)."""

from __future__ import annotations

import time

import pytest
from integration_harness import manifest, wait_for

pytestmark = pytest.mark.timeout(90)


def start(kube, m, total):
    kube.create_job(m)
    name = m["metadata"]["name"]
    pods = kube.wait_pods(name, total)
    wait_for("launched", lambda: (kube.job(name).get("status") or {}).get("launched"))
    for pod in pods:
        kube.set_phase(pod, "Running")
    kube.wait_condition(name, "Running")
    return pods


def new_uids(kube, job, old, total, timeout=30.0):
    """Wait until every pod of ``job`` is a new one (uid not in ``old``)."""

    def done():
        pods = kube.pods(job)
        live = {n: p for n, p in pods.items() if not p.metadata.deletion_timestamp}
        fresh = [p for p in live.values() if p.metadata.uid not in old]
        return live if len(live) == total and len(fresh) == total else None

    return wait_for(f"{total} new pods of {job}", done, timeout=timeout)


def explained(operator, kube, job):
    """What the operator logged about ``job`` and the job's conditions, for a failure message."""
    lines = [line for line in operator.output().splitlines() if f"/{job}" in line]
    conditions = ((kube.job(job) or {}).get("status") or {}).get("conditions")
    return "\n".join([*lines[-25:], f"conditions: {conditions}"])


def test_chief_success_succeeds_the_job_and_cleans_running_pods(kube, operator):
    start(kube, manifest("ok", "MultiWorkerMirroredStrategy", {"chief": 1, "worker": 2}), 3)
    kube.set_phase("ok-worker-0", "Succeeded", exit_code=0)
    kube.set_phase("ok-chief-0", "Succeeded", exit_code=0)
    cond = kube.wait_condition("ok", "Succeeded")
    assert "chief-0 completed" in cond["message"]
    status = kube.job("ok")["status"]
    assert status["state"] == "Succeeded" and status["completionTime"]
    # cleanPodPolicy Running (default): worker-1 was still running, so it is deleted
    wait_for("running pod deleted", lambda: "ok-worker-1" not in kube.pods("ok"))
    assert "ok-chief-0" in kube.pods("ok")
    kube.wait_events("ok", "StrategyJobCreated", "StrategyJobSucceeded")


def test_all_workers_success_policy_waits_for_every_worker(kube, operator):
    m = manifest("allw", "MultiWorkerMirroredStrategy", {"worker": 2}, successPolicy="AllWorkers")
    start(kube, m, 2)
    kube.set_phase("allw-worker-0", "Succeeded", exit_code=0)
    wait_for(
        "worker-0 counted",
        lambda: kube.job("allw")["status"]["replicaStatuses"]["worker"]["succeeded"] == 1,
    )
    assert kube.condition("allw", "Succeeded") is None
    kube.set_phase("allw-worker-1", "Succeeded", exit_code=0)
    kube.wait_condition("allw", "Succeeded")


def test_never_policy_fails_the_job_naming_replica_and_exit_code(kube, operator):
    start(kube, manifest("nev", "MultiWorkerMirroredStrategy", {"worker": 2}), 2)
    kube.set_phase("nev-worker-1", "Failed", exit_code=3)
    cond = kube.wait_condition("nev", "Failed")
    assert cond["reason"] == "ReplicaFailed"
    assert "worker-1 exited with code 3" in cond["message"]
    assert "restartPolicy Never" in cond["message"]


@pytest.mark.parametrize(
    ("policy", "exit_code", "restarts"),
    [
        pytest.param("OnFailure", 1, True, id="onfailure-1"),
        pytest.param("Always", 2, True, id="always-2"),
        pytest.param("ExitCode", 137, True, id="exitcode-137"),
        pytest.param("ExitCode", 1, False, id="exitcode-1"),
    ],
)
def test_collective_retryable_failure_restarts_the_whole_job(
    kube, operator, policy, exit_code, restarts
):
    pods = start(
        kube,
        manifest("col", "MultiWorkerMirroredStrategy", {"worker": 3}, restart_policy=policy),
        3,
    )
    old = {p.metadata.uid for p in pods.values()}
    kube.set_phase(
        "col-worker-2",
        "Failed",
        exit_code=exit_code,
        reason="OOMKilled" if exit_code == 137 else None,
    )
    if not restarts:
        cond = kube.wait_condition("col", "Failed")
        assert "worker-2 exited with code 1" in cond["message"] and "ExitCode" in cond["message"]
        return
    new_uids(kube, "col", old, 3)  # every pod recreated, not just worker-2
    status = kube.job("col")["status"]
    assert status["restartCount"] == 1
    assert status["replicaStatuses"]["worker"]["restarts"] == 1
    cond = kube.condition("col", "Restarting")
    assert cond and cond["reason"] == "JobRestarting" and "worker-2" in cond["message"]
    assert kube.condition("col", "Running") is None  # mutually exclusive with Restarting


def test_parameter_server_worker_is_recreated_alone(kube, operator):
    m = manifest(
        "pss",
        "ParameterServerStrategy",
        {"chief": 1, "worker": 2, "ps": 1},
        restart_policy="OnFailure",
    )
    pods = start(kube, m, 4)
    uids = {n: p.metadata.uid for n, p in pods.items()}
    kube.set_phase("pss-worker-1", "Failed", exit_code=1)

    def recreated():
        now = kube.pods("pss")
        w = now.get("pss-worker-1")
        return (
            w is not None
            and w.metadata.uid != uids["pss-worker-1"]
            and not w.metadata.deletion_timestamp
        )

    wait_for("worker-1 recreated", recreated)
    now = kube.pods("pss")
    for n in ("pss-chief-0", "pss-worker-0", "pss-ps-0"):
        assert now[n].metadata.uid == uids[n], f"{n} must survive a worker failure"
    status = kube.job("pss")["status"]
    assert status["restartCount"] == 1
    # Restarting is brief here: the other replicas still run, so Running comes straight back
    events = kube.wait_events("pss", "ReplicaRestarting")
    restarts = [e for e in events if e.reason == "ReplicaRestarting"]
    assert restarts and "recreates worker-1" in restarts[0].message


def test_parameter_server_ps_failure_restarts_the_job(kube, operator):
    m = manifest(
        "pps",
        "ParameterServerStrategy",
        {"chief": 1, "worker": 1, "ps": 1},
        restart_policy="OnFailure",
    )
    pods = start(kube, m, 3)
    kube.set_phase("pps-ps-0", "Failed", exit_code=1)
    new_uids(kube, "pps", {p.metadata.uid for p in pods.values()}, 3)
    assert kube.condition("pps", "Restarting")["reason"] == "JobRestarting"


def test_a_ps_exiting_0_restarts_the_job_at_once_and_a_failure_quotes_its_error(kube, operator):
    """A ps ends with 0 while the job runs: the job restarts at once naming it (not when the
    chief's timeout notices); then the chief fails and the Failed condition quotes its error
    from the termination message the kubelet fills with its last log lines."""
    m = manifest(
        "pse",
        "ParameterServerStrategy",
        {"chief": 1, "worker": 1, "ps": 1},
        restart_policy="OnFailure",
        run_policy={"backoffLimit": 1},
    )
    pods = start(kube, m, 3)
    created = kube.core.read_namespaced_pod("pse-ps-0", kube.ns)
    assert created.spec.containers[0].termination_message_policy == "FallbackToLogsOnError"
    exited = time.monotonic()
    kube.set_phase("pse-ps-0", "Succeeded", exit_code=0)
    cond = kube.wait_condition("pse", "Restarting")
    print(f"ps exit 0 -> Restarting after {time.monotonic() - exited:.2f}s")
    assert cond["reason"] == "JobRestarting", explained(operator, kube, "pse")
    assert (
        "ps-0 exited with code 0 while the job ran (a ps serves until the job ends) "
        "(restart 1 of 1)" in cond["message"]
    )
    pods = new_uids(kube, "pse", {p.metadata.uid for p in pods.values()}, 3)
    for pod in pods:
        kube.set_phase(pod, "Running")
    traceback = (
        "step 3 loss=0.2\nTraceback (most recent call last):\n"
        '  File "/app/train.py", line 9, in <module>\n'
        '    raise ValueError("bad batch")\nValueError: bad batch\n'
    )
    kube.set_phase("pse-chief-0", "Failed", exit_code=1, message=traceback)
    failed = kube.wait_condition("pse", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert (
        "chief-0 exited with code 1 (Error): ValueError: bad batch, and backoffLimit=1"
        in (failed["message"])
    )


def test_backoff_limit_exhaustion_fails_with_the_last_failure(kube, operator):
    m = manifest(
        "bo",
        "MultiWorkerMirroredStrategy",
        {"worker": 2},
        restart_policy="OnFailure",
        run_policy={"backoffLimit": 1},
    )
    pods = start(kube, m, 2)
    kube.set_phase("bo-worker-0", "Failed", exit_code=1)
    pods = new_uids(kube, "bo", {p.metadata.uid for p in pods.values()}, 2)
    kube.set_phase("bo-worker-1", "Failed", exit_code=143, reason="Error")
    cond = kube.wait_condition("bo", "Failed")
    assert cond["reason"] == "BackoffLimitExceeded"
    assert (
        "worker-1 exited with code 143" in cond["message"] and "backoffLimit=1" in cond["message"]
    )
    kube.wait_events("bo", "BackoffLimitExceeded")


def test_pod_deleted_behind_the_operators_back_is_a_failure(kube, operator):
    m = manifest("del", "MultiWorkerMirroredStrategy", {"worker": 2}, restart_policy="OnFailure")
    pods = start(kube, m, 2)
    kube.core.delete_namespaced_pod("del-worker-1", kube.ns, grace_period_seconds=0)
    new_uids(kube, "del", {p.metadata.uid for p in pods.values()}, 2)
    assert "worker-1 was deleted" in kube.condition("del", "Restarting")["message"]


def test_active_deadline_fails_the_job_on_time_without_any_event(kube, operator):
    m = manifest(
        "dl",
        "MultiWorkerMirroredStrategy",
        {"worker": 1},
        run_policy={"activeDeadlineSeconds": 3, "cleanPodPolicy": "None"},
    )
    start(kube, m, 1)
    cond = kube.wait_condition("dl", "Failed", timeout=15)
    assert cond["reason"] == "DeadlineExceeded"
    # even with cleanPodPolicy None a deadline stops the running pods
    wait_for("pod stopped", lambda: "dl-worker-0" not in kube.pods("dl"))


def test_ttl_deletes_the_finished_job(kube, operator):
    m = manifest(
        "ttl",
        "MultiWorkerMirroredStrategy",
        {"worker": 1},
        run_policy={"ttlSecondsAfterFinished": 2},
    )
    start(kube, m, 1)
    kube.set_phase("ttl-worker-0", "Succeeded", exit_code=0)
    # Succeeded lasts only the TTL (1 - 2 s, completionTime being in whole seconds), too short
    # to poll for under load; its Event outlives the job.
    kube.wait_events("ttl", "StrategyJobSucceeded")
    wait_for("job deleted by TTL", lambda: kube.job("ttl") is None, timeout=20)


def test_suspend_deletes_pods_and_resume_recreates_them(kube, operator):
    pods = start(kube, manifest("sus", "MultiWorkerMirroredStrategy", {"worker": 2}), 2)
    kube.patch_job("sus", {"spec": {"runPolicy": {"suspend": True}}})
    kube.wait_condition("sus", "Suspended")
    wait_for("pods deleted", lambda: not kube.pods("sus"))
    assert kube.condition("sus", "Running") is None
    kube.patch_job("sus", {"spec": {"runPolicy": {"suspend": False}}})
    new_uids(kube, "sus", {p.metadata.uid for p in pods.values()}, 2)
    wait_for("not suspended", lambda: kube.condition("sus", "Suspended") is None)
    assert kube.job("sus")["status"]["restartCount"] == 0  # resuming is not a restart


def test_deleting_the_job_deletes_its_pods_and_service(kube, operator):
    start(kube, manifest("gone", "MultiWorkerMirroredStrategy", {"worker": 2}), 2)
    kube.delete_job("gone")
    wait_for("job gone", lambda: kube.job("gone") is None)
    wait_for("pods garbage-collected", lambda: not kube.pods("gone"), timeout=60)
    services = kube.core.list_namespaced_service(kube.ns).items
    wait_for(
        "service garbage-collected",
        lambda: (
            not [
                s
                for s in kube.core.list_namespaced_service(kube.ns).items
                if s.metadata.name == "gone"
            ]
        ),
        timeout=60,
    )
    assert services is not None


HOLD = "test.strategyjob.dev/hold"


def test_a_job_created_again_before_its_old_children_are_gone_gets_its_own(kube, operator):
    """``kubectl delete`` then ``kubectl apply`` at once: the old pod, Service and Secret are
    still terminating (held here by a finalizer, as a slow garbage collector would leave them).
    The new job waits for them, then creates its own; nothing counts as a failure."""
    old_uid = kube.create_job(manifest("again", "MultiWorkerMirroredStrategy", {"worker": 2}))[
        "metadata"
    ]["uid"]
    kube.wait_pods("again", 2)
    old_secret = f"again-{old_uid}-strategyjob-token"
    wait_for("Secret", lambda: kube.core.read_namespaced_secret(old_secret, kube.ns))
    hold = {"metadata": {"finalizers": [HOLD]}}
    kube.core.patch_namespaced_pod("again-worker-0", kube.ns, hold)
    kube.core.patch_namespaced_service("again", kube.ns, hold)
    kube.core.patch_namespaced_secret(old_secret, kube.ns, hold)
    kube.delete_job("again")
    wait_for("job gone", lambda: kube.job("again") is None)

    new_uid = kube.create_job(manifest("again", "MultiWorkerMirroredStrategy", {"worker": 2}))[
        "metadata"
    ]["uid"]
    wait_for(
        "the operator waiting for the old pod",
        lambda: (
            f"StrategyJob {kube.ns}/again: waiting for 1 pods of an earlier job"
            in operator.output()
        ),
    )
    assert list(kube.pods("again")) == ["again-worker-0"]  # the held old one, nothing new
    old_pod = kube.pods("again")["again-worker-0"]
    assert old_pod.metadata.owner_references[0].uid == old_uid

    release = {"metadata": {"finalizers": None}}
    kube.core.patch_namespaced_pod("again-worker-0", kube.ns, release)
    kube.core.patch_namespaced_service("again", kube.ns, release)
    kube.core.patch_namespaced_secret(old_secret, kube.ns, release)

    def owner(read):
        try:
            return read().metadata.owner_references[0].uid
        except Exception:  # not there (yet)
            return None

    # Its objects may still be going too (the garbage collector's pace): a creation that meets
    # one is retried after a backoff of 5 s and more, which a loaded machine can stretch.
    try:
        pods = new_uids(kube, "again", {old_pod.metadata.uid}, 2, timeout=90)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{explained(operator, kube, 'again')}") from None
    assert {p.metadata.owner_references[0].uid for p in pods.values()} == {new_uid}
    for what, read in [
        ("Service", lambda: kube.core.read_namespaced_service("again", kube.ns)),
        (
            "Secret",
            lambda: kube.core.read_namespaced_secret(f"again-{new_uid}-strategyjob-token", kube.ns),
        ),
        (
            "ServiceAccount",
            lambda: kube.core.read_namespaced_service_account("again-strategyjob-sa", kube.ns),
        ),
    ]:
        wait_for(f"the new job's {what}", lambda read=read: owner(read) == new_uid, timeout=60)
    for pod in pods:
        kube.set_phase(pod, "Running")
    kube.wait_condition("again", "Running")
    status = kube.job("again")["status"]
    assert status["restartCount"] == 0 and kube.condition("again", "Failed") is None


def test_evaluator_failure_does_not_fail_the_job(kube, operator):
    m = manifest("ev", "MultiWorkerMirroredStrategy", {"worker": 1, "evaluator": 1})
    start(kube, m, 2)
    kube.set_phase("ev-evaluator-0", "Failed", exit_code=1)
    wait_for(
        "evaluator counted",
        lambda: kube.job("ev")["status"]["replicaStatuses"]["evaluator"]["failed"] == 1,
    )
    assert kube.condition("ev", "Failed") is None
    kube.set_phase("ev-worker-0", "Succeeded", exit_code=0)
    kube.wait_condition("ev", "Succeeded")


def test_metrics_endpoint_counts_jobs_and_pods(kube, operator):
    start(kube, manifest("met", "MultiWorkerMirroredStrategy", {"worker": 2}), 2)
    text = operator.metrics()
    assert f'strategyjob_operator_pods_created_total{{job_namespace="{kube.ns}"}} 2' in text
    assert f'strategyjob_operator_jobs_created_total{{job_namespace="{kube.ns}"}} 1' in text
    assert "strategyjob_operator_reconcile_duration_seconds_count" in text


@pytest.mark.parametrize(
    ("policy", "left"),
    [
        pytest.param("None", {"cp-worker-0", "cp-worker-1"}, id="none-keeps-all"),
        pytest.param("All", set(), id="all-deletes-all"),
    ],
)
def test_clean_pod_policy_on_completion(kube, operator, policy, left):
    m = manifest(
        "cp", "MultiWorkerMirroredStrategy", {"worker": 2}, run_policy={"cleanPodPolicy": policy}
    )
    start(kube, m, 2)
    kube.set_phase("cp-worker-0", "Succeeded", exit_code=0)
    kube.wait_condition("cp", "Succeeded")
    wait_for(f"pods left: {sorted(left)}", lambda: set(kube.pods("cp")) == left)
