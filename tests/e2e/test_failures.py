"""Failures, as the operator must handle them on a real cluster: a ParameterServerStrategy
worker killed mid-training is replaced alone and the job still succeeds; a
MultiWorkerMirroredStrategy worker killed mid-training restarts the whole job, which
resumes from the chief's backup, and so does one frozen (SIGSTOP), which its peer reports as
down and exits; a connection cut between two MultiWorkerMirroredStrategy workers ends the job
naming the peer; a frozen ParameterServerStrategy ps restarts the job, named by the chief, and
a killed chief ends it once its backoffLimit is spent; a job past its deadline fails with the
reason."""

from __future__ import annotations

import re
import time

import pytest

from e2e.e2e_support import (
    STEP_LINE,
    Namespace,
    assert_loss_goes_down,
    example,
    losses,
    wait_for,
    worker_image,
)
from tests.support.kind import report

RESUMED = re.compile(r"restored the backup of epoch (\d+); resuming")


def events(ns: Namespace, job: str) -> list[tuple[str, str]]:
    items = ns.cluster.core.list_namespaced_event(
        ns.name, field_selector=f"involvedObject.name={job}"
    ).items
    return [(e.reason, e.message) for e in items]


def restarts(ns: Namespace, job: str) -> list[str]:
    """The messages of the job's JobRestarting Events."""
    return [m for r, m in events(ns, job) if r == "JobRestarting"]


def freeze_until_restart(ns: Namespace, pod: str, job: str, timeout: float) -> tuple[str, float]:
    """SIGSTOP the pod's process and wait for the job's (one) JobRestarting Event: its
    message and the seconds it took."""
    frozen = time.monotonic()
    ns.signal(pod, "STOP")
    (message,) = wait_for("the job restarting", lambda: restarts(ns, job), timeout, 0.5)
    return message, time.monotonic() - frozen


def condition(job: dict, kind: str) -> dict:
    return next(c for c in job["status"]["conditions"] if c["type"] == kind)


def wait_stopped(ns: Namespace, job: str, timeout: float) -> float:
    """Wait until no pod of the job runs (cleanPodPolicy Running deletes those still running
    when it ends; those that ended stay); returns the seconds it took."""
    began = time.monotonic()

    def running() -> list[str]:
        return [p.metadata.name for p in ns.pods(job) if p.status.phase not in _ENDED]

    wait_for(f"every pod of {job} stopped", lambda: not running(), timeout, interval=0.5)
    return time.monotonic() - began


_ENDED = ("Succeeded", "Failed")


@pytest.mark.timeout(240)
def test_parameter_server_worker_killed_mid_training_job_succeeds(ns: Namespace):
    # Long enough that the chief is still training when the operator replaces the worker.
    ns.apply(example("digits_ps", env={"chief": {"STEPS": "1200", "LOG_EVERY": "60"}}))
    ns.wait_log("digits-ps-chief-0", r"step 120/1200", timeout=150)
    chief_uid = ns.pod("digits-ps-chief-0").metadata.uid
    ns.kill("digits-ps-worker-1")

    job = ns.wait_job("digits-ps", "Succeeded", timeout=180)
    # Only the worker was replaced: the chief (the coordinator) ran on to the end.
    assert job["status"]["replicaStatuses"]["worker"]["restarts"] == 1
    assert job["status"]["replicaStatuses"]["chief"]["restarts"] == 0
    assert ns.pod("digits-ps-chief-0").metadata.uid == chief_uid
    reasons = events(ns, "digits-ps")
    assert any(r == "ReplicaRestarting" and "worker-1" in m for r, m in reasons), reasons
    assert not any(r == "JobRestarting" for r, _ in reasons), reasons
    chief = ns.logs("digits-ps-chief-0")
    points = losses(chief, STEP_LINE)
    assert [step for step, _ in points] == list(range(60, 1201, 60)), chief
    assert_loss_goes_down(points, "chief-0")


@pytest.mark.timeout(300)
def test_mirrored_worker_killed_restarts_the_job_which_resumes_from_its_backup(
    ns: Namespace, shared_dir: str
):
    # On kind the workers run on different nodes, before and after the restart: the backup
    # is read from the storage both nodes share.
    spread = ns.cluster.kind is not None
    env = {"worker": {"EPOCHS": "30"}}
    ns.apply(example("digits_mwms", env=env, checkpoints=shared_dir, keep_pods=True, spread=spread))
    ns.wait_log("digits-mwms-worker-0", r"epoch 3/30", timeout=150)
    before = {p.metadata.name: p.metadata.uid for p in ns.pods("digits-mwms")}
    ns.kill("digits-mwms-worker-1")

    job = ns.wait_job("digits-mwms", "Succeeded", timeout=240)
    assert job["status"]["restartCount"] == 1
    reasons = events(ns, "digits-mwms")
    assert any(r == "JobRestarting" and "worker-1" in m for r, m in reasons), reasons
    if spread:  # killed with SIGKILL from inside its node (elsewhere: force-deleted)
        assert any("worker-1 exited with code 137" in m for _, m in reasons), reasons
    after = {p.metadata.name: p.metadata.uid for p in ns.pods("digits-mwms")}
    assert set(after) == set(before) and not set(after.values()) & set(before.values())
    if spread:
        assert len({p.spec.node_name for p in ns.pods("digits-mwms")}) == 2

    log = ns.logs("digits-mwms-worker-0")
    resumed = RESUMED.search(log)
    assert resumed, log
    backup_epoch = int(resumed.group(1))
    assert backup_epoch >= 3, log
    points = losses(log)
    assert [e for e, _ in points] == list(range(backup_epoch + 1, 31)), log
    # The first epoch after the restart starts from the trained weights: its loss is far
    # below a fresh start's (about 1.7 for the first epoch).
    assert points[0][1] < 0.5, points
    assert "saved checkpoint" in log


@pytest.mark.timeout(300)
def test_a_frozen_mirrored_worker_is_named_its_peer_exits_and_the_job_resumes(
    ns: Namespace, shared_dir: str
):
    """SIGSTOP of worker 1 mid-training: worker 0's next all-reduce finds it down (its
    liveness listener does not answer, about 30 s), worker 0 exits with the error naming
    task 1, and the operator restarts the job (the frozen pod goes with the others), which
    resumes from its backup. Before, worker 0 never exited and the job stayed Running."""
    if ns.cluster.kind is None:
        pytest.skip("a pod's process can be frozen only on kind (from inside its node)")
    env = {"worker": {"EPOCHS": "30"}}
    ns.apply(example("digits_mwms", env=env, checkpoints=shared_dir, keep_pods=True))
    ns.wait_log("digits-mwms-worker-0", r"epoch 3/30", timeout=150)
    message, took = freeze_until_restart(ns, "digits-mwms-worker-1", "digits-mwms", 120)
    report(f"frozen MWMS worker on kind: job restarting {took:.0f} s after SIGSTOP: {message}")
    assert "worker-0 exited with code 1" in message, message
    assert "/job:worker/replica:0/task:1 is down" in message, message
    assert took < 90, took
    job = ns.wait_job("digits-mwms", "Succeeded", timeout=240 - took)
    assert job["status"]["restartCount"] == 1
    assert RESUMED.search(ns.logs("digits-mwms-worker-0")), ns.logs("digits-mwms-worker-0")


#: The grace period of the frozen ps's pod, which cannot handle SIGTERM (see below).
GRACE = 10


@pytest.mark.timeout(300)
def test_a_frozen_ps_restarts_the_job_naming_it_and_a_killed_chief_ends_it(ns: Namespace):
    """ParameterServerStrategy, two faults in one job (``backoffLimit: 1``). SIGSTOP of the ps
    mid-training: the workers' calls find it lost (gRPC keepalive, 30 s), the chief's step
    raises the UnavailableError naming the ps and exits, and the operator restarts every pod,
    the frozen ps's included. Then SIGKILL of the restarted chief: its backoffLimit spent, the
    job fails naming the chief, and every other pod is stopped."""
    if ns.cluster.kind is None:
        pytest.skip("a pod's process can be frozen only on kind (from inside its node)")
    manifest = example("digits_ps", env={"chief": {"STEPS": "6000", "LOG_EVERY": "30"}})
    manifest["spec"]["runPolicy"]["backoffLimit"] = 1
    # The frozen ps cannot handle the SIGTERM of its pod's deletion (the kubelet sends no
    # SIGCONT): it sits out its pod's grace period (the operator's default: 60 s) before the
    # SIGKILL, and the restarted job's pods wait for it. A short one keeps the test short.
    # (`python -m strategyjob.server` itself stops at once on SIGTERM:
    # tests/ps/test_hardening_server.py.)
    for serving in ("worker", "ps"):
        pod_spec = manifest["spec"]["replicaSpecs"][serving]["template"]["spec"]
        pod_spec["terminationGracePeriodSeconds"] = GRACE
    ns.apply(manifest)
    ns.wait_log("digits-ps-chief-0", r"step 60/6000", timeout=150)
    before = {p.metadata.name: p.metadata.uid for p in ns.pods("digits-ps")}
    assert len(before) == 4
    frozen = time.monotonic()
    message, took = freeze_until_restart(ns, "digits-ps-ps-0", "digits-ps", 150)
    report(f"frozen ps on kind: job restarting {took:.0f} s after SIGSTOP: {message}")
    assert "chief-0 exited with code 1" in message, message
    assert "UnavailableError: Parameter server /job:ps/replica:0/task:0 is unavailable" in message
    assert "(restart 1 of 1)" in message, message
    assert took < 100, took

    gone: dict[str, float] = {}  # old pod -> seconds after the SIGSTOP it was gone

    def replaced() -> bool:
        pods = ns.pods("digits-ps")
        for name, uid in before.items():
            if name not in gone and all(p.metadata.uid != uid for p in pods):
                gone[name] = round(time.monotonic() - frozen)
        return len(pods) == 4 and len(gone) == 4

    # The old pods gone (the grace period) and the new ones created, within 90 s.
    wait_for("every pod replaced, the frozen ps's too", replaced, timeout=90, interval=0.5)
    took = time.monotonic() - frozen
    report(f"frozen ps on kind: every pod replaced {took:.0f} s after SIGSTOP; gone at {gone}")

    ns.wait_log("digits-ps-chief-0", r"step 30/6000", timeout=150)
    killed = time.monotonic()
    ns.kill("digits-ps-chief-0")
    job = ns.wait_job("digits-ps", "Failed", timeout=60)
    failed = condition(job, "Failed")
    took = time.monotonic() - killed
    report(f"killed PS chief on kind: job Failed {took:.1f} s after SIGKILL: {failed['message']}")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert "chief-0 exited with code 137" in failed["message"], failed
    assert "backoffLimit=1 is reached after 1 restarts" in failed["message"], failed
    assert took < 30, took
    # The workers and the ps, which serve until the job ends, are stopped with it.
    stopped = wait_stopped(ns, "digits-ps", timeout=GRACE + 30)
    report(f"killed PS chief on kind: every other pod stopped {stopped:.0f} s later")


@pytest.mark.timeout(240)
def test_a_connection_cut_between_mirrored_workers_names_the_peer_and_ends_the_job(
    ns: Namespace, shared_dir: str
):
    """Every packet between the two workers (on two nodes) dropped mid-training, both alive:
    the all-reduce stalls, the liveness listener of the peer does not answer (30 s), and a
    worker exits with the error naming the other; with ``backoffLimit: 0`` the job fails
    saying so. The rules live in worker 1's network namespace: they go with its pod."""
    if ns.cluster.kind is None:
        pytest.skip("a pod's packets can be filtered only on kind (from inside its node)")
    env = {"worker": {"EPOCHS": "30"}}
    manifest = example("digits_mwms", env=env, checkpoints=shared_dir, spread=True)
    manifest["spec"]["runPolicy"]["backoffLimit"] = 0
    ns.apply(manifest)
    ns.wait_log("digits-mwms-worker-0", r"epoch 2/30", timeout=150)
    with ns.cut("digits-mwms-worker-1", "digits-mwms-worker-0"):
        cut = time.monotonic()
        job = ns.wait_job("digits-mwms", "Failed", timeout=120)
        took = time.monotonic() - cut
    message = condition(job, "Failed")["message"]
    report(f"connection cut between MWMS workers on kind: job Failed {took:.0f} s after: {message}")
    named = re.search(
        r"worker-(\d) exited with code 1 .*/job:worker/replica:0/task:(\d) is down", message
    )
    assert named and named.group(1) != named.group(2), message
    assert "backoffLimit=0" in message, message
    assert took < 90, took
    report(f"connection cut: every pod stopped {wait_stopped(ns, 'digits-mwms', 60):.0f} s later")


@pytest.mark.timeout(120)
def test_job_past_its_deadline_fails_with_the_reason(ns: Namespace):
    sleeper = {
        "name": "strategyjob",
        "image": worker_image(),
        # Stops on SIGTERM as training code does (a PID 1 without a handler ignores it and
        # waits out the pods' grace period, 60 s by default).
        "command": [
            "python", "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
            "time.sleep(600)",
        ],
    }  # fmt: skip
    ns.apply(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "slow"},
            "spec": {
                "strategy": "MultiWorkerMirroredStrategy",
                "replicaSpecs": {
                    "worker": {"replicas": 2, "template": {"spec": {"containers": [sleeper]}}}
                },
                "runPolicy": {"activeDeadlineSeconds": 5},
            },
        }
    )
    job = ns.wait_job("slow", "Failed", timeout=90)
    failed = condition(job, "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds=5" in failed["message"]
    # Its running pods are stopped (SIGTERM) and removed.
    wait_for("the job's pods to be gone", lambda: not ns.pods("slow"), timeout=60)
