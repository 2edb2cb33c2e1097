"""Gang jobs under a ResourceQuota, against the real API server and its ResourceQuota
admission: two gangs that each fit the quota alone but not together never both hold part of it
(one gets all its pods, the other none and a WaitingForQuota condition and Event, and starts
as soon as the quota's usage drops once the first is gone, not at the end of its creation
back-off); a suspended gang's PodGroup is deleted and created again on resume."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from integration_harness import (
    VOLCANO_GROUP,
    VOLCANO_VERSION,
    OperatorProcess,
    manifest,
    wait_for,
)

QUOTA = "gang-quota"


@pytest.fixture
def gang_operator(own_kube, control_plane, volcano_pod_group_crd) -> Iterator[OperatorProcess]:
    """An operator of the test's namespace whose jobs are gangs for Volcano."""
    op = OperatorProcess(
        control_plane,
        "--standalone",
        "-n",
        own_kube.ns,
        env={"STRATEGYJOB_GANG_SCHEDULER": "volcano"},
    ).start()
    try:
        yield op
    finally:
        op.stop()


def gang_job(name: str, workers: int, cpu: str) -> dict[str, Any]:
    m = manifest(name, "MultiWorkerMirroredStrategy", {"worker": workers})
    container = m["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    return m


def pod_groups(kube) -> list[str]:
    items = kube.custom.list_namespaced_custom_object(
        VOLCANO_GROUP, VOLCANO_VERSION, kube.ns, "podgroups"
    )
    return [
        g["metadata"]["name"] for g in items["items"] if not g["metadata"].get("deletionTimestamp")
    ]


def set_quota_status(kube, used_cpu: str) -> None:
    """Play the quota controller (not running here): the usage the admission plugin checks
    (and adds each admitted pod to), recomputed as the controller would."""
    status = {
        "status": {"hard": {"cpu": "4", "pods": "10"}, "used": {"cpu": used_cpu, "pods": "0"}}
    }
    kube.core.patch_namespaced_resource_quota_status(QUOTA, kube.ns, status)


def quota_attempts(op: OperatorProcess, ns: str, name: str) -> int:
    """How many times the operator found that the gang's pods do not fit (one log line per
    attempt: the first at INFO, the later ones with the CreateFailed message)."""
    pattern = re.compile(
        rf"StrategyJob {re.escape(ns)}/{re.escape(name)}: [Cc]annot create the gang"
    )
    return len(pattern.findall(op.log.read_text(errors="replace")))


def backoff_after(attempts: int) -> float:
    """The creation back-off after the n-th failed attempt (create_backoff's 5 s doubled)."""
    return min(5.0 * 2 ** (attempts - 1), 300.0)


def waiting_condition(kube, name: str) -> dict[str, Any] | None:
    cond = kube.condition(name, "CreateFailed")
    return cond if cond and cond["reason"] == "WaitingForQuota" else None


@pytest.mark.timeout(300)
def test_two_gangs_that_fit_only_one_at_a_time_never_share_the_quota(own_kube, gang_operator):
    """One gang gets all its pods, the other none; the other gets them within seconds of the
    quota's usage dropping once the first is gone."""
    from kubernetes import client

    kube = own_kube
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name=QUOTA),
        spec=client.V1ResourceQuotaSpec(hard={"cpu": "4", "pods": "10"}),
    )
    kube.core.create_namespaced_resource_quota(kube.ns, quota)
    set_quota_status(kube, "0")

    # Both at once (3 cpu each, 4 in the quota): created pod by pod, each could get some.
    kube.create_job(gang_job("first", 3, "1"))
    kube.create_job(gang_job("second", 3, "1"))

    def settled():
        waiting = [n for n in ("first", "second") if waiting_condition(kube, n)]
        return waiting if len(waiting) == 1 else None

    (waiter,) = wait_for("one gang waiting for quota", settled, timeout=90)
    runner = "second" if waiter == "first" else "first"
    assert len(kube.pods(runner)) == 3, "the gang that fits gets all its pods"
    assert kube.pods(waiter) == {}, "the gang that waits holds none of the quota"
    used = kube.core.read_namespaced_resource_quota(QUOTA, kube.ns).status.used
    assert used["cpu"] == "3", used  # the admission plugin's count: only the runner's pods
    cond = waiting_condition(kube, waiter)
    assert cond is not None
    assert (
        "the gang's 3 pods: waiting for quota: needs cpu 3, 1 left in quota gang-quota"
        in (cond["message"])
    ), cond
    events = kube.wait_events(waiter, "WaitingForQuota", timeout=30)
    assert [e.message for e in events if e.reason == "WaitingForQuota"] == [cond["message"]]
    assert not kube.pods(waiter)

    # The first gang goes: its pods are deleted (the garbage collector), and the quota
    # controller gives its cpu back. The waiting gang starts as soon as the quota's usage drops
    # (the quota's update wakes it), not on its next attempt of the creation back-off: the
    # quota is freed just after an attempt whose back-off is at least 20 s.
    kube.delete_job(runner)
    wait_for(f"the pods of {runner} gone", lambda: not kube.pods(runner), timeout=90)
    seen = quota_attempts(gang_operator, kube.ns, waiter)
    attempts = wait_for(
        f"an attempt of {waiter} with a back-off of 20 s or more after it",
        lambda: (n := quota_attempts(gang_operator, kube.ns, waiter)) > seen and n >= 3 and n,
        timeout=120,
        interval=0.05,
    )
    attempt_seen = time.monotonic()
    set_quota_status(kube, "0")  # the quota controller's update: cpu 3 freed
    freed = time.monotonic()
    kube.wait_pods(waiter, 3, timeout=60)
    latency = time.monotonic() - freed
    print(f"quota freed -> pods of the waiting gang created: {latency:.2f}s")
    assert latency <= 10.0, f"{latency:.1f}s after the quota freed (back-off: see the log)"
    assert time.monotonic() - attempt_seen < backoff_after(attempts), "not the back-off's retry"
    woke = f"ResourceQuota {kube.ns}/{QUOTA} freed room: waking {waiter}, waiting for quota"
    assert woke in gang_operator.log.read_text(errors="replace")

    def cleared():
        job = kube.job(waiter) or {}
        conds = (job.get("status") or {}).get("conditions") or []
        return any(x["type"] == "CreateFailed" and x["status"] == "False" for x in conds)

    wait_for("the WaitingForQuota condition cleared", cleared, timeout=30)
    # One Event for the wait: the same message is not posted on every attempt.
    assert len([e for e in kube.events(waiter) if e.reason == "WaitingForQuota"]) == 1


@pytest.mark.timeout(180)
def test_a_suspended_gang_has_no_pod_group_until_it_is_resumed(own_kube, gang_operator):
    kube = own_kube
    kube.create_job(gang_job("pause", 2, "100m"))
    kube.wait_pods("pause", 2, timeout=60)
    assert pod_groups(kube) == ["pause"]

    kube.patch_job("pause", {"spec": {"runPolicy": {"suspend": True}}})
    wait_for("the PodGroup deleted", lambda: not pod_groups(kube), timeout=60)
    wait_for("the pods deleted", lambda: not kube.pods("pause"), timeout=60)
    kube.wait_condition("pause", "Suspended", timeout=30)

    kube.patch_job("pause", {"spec": {"runPolicy": {"suspend": False}}})
    wait_for("the PodGroup back", lambda: pod_groups(kube) == ["pause"], timeout=60)
    kube.wait_pods("pause", 2, timeout=60)
