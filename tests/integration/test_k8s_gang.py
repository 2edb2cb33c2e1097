"""Gang scheduling against the real API server: the PodGroup Volcano reads, owned by the job;
pods sent to the gang scheduler; a clear error when the scheduler's API is missing; a Warning
Event when no gang scheduler is configured but the job asks for one."""

from __future__ import annotations

import pytest
from integration_harness import (
    VOLCANO_GROUP,
    VOLCANO_VERSION,
    OperatorProcess,
    manifest,
    wait_for,
)


def pod_groups(kube):
    return kube.custom.list_namespaced_custom_object(
        VOLCANO_GROUP, VOLCANO_VERSION, kube.ns, "podgroups"
    )["items"]


@pytest.mark.timeout(120)
def test_volcano_gets_a_pod_group_owned_by_the_job(own_kube, control_plane, volcano_pod_group_crd):
    kube = own_kube
    op = OperatorProcess(
        control_plane, "--standalone", "-n", kube.ns, env={"STRATEGYJOB_GANG_SCHEDULER": "volcano"}
    ).start()
    try:
        policy = {"minAvailable": 2, "queue": "research"}
        m = manifest(
            "gang",
            "MultiWorkerMirroredStrategy",
            {"worker": 3},
            run_policy={"schedulingPolicy": policy},
        )
        uid = kube.create_job(m)["metadata"]["uid"]
        pods = kube.wait_pods("gang", 3)
        (group,) = pod_groups(kube)
        assert group["metadata"]["name"] == "gang"
        assert group["spec"] == {"minMember": 2, "queue": "research"}
        (ref,) = group["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("StrategyJob", uid, True)
        for pod in pods.values():
            assert pod.spec.scheduler_name == "volcano"
            assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == "gang"
        assert not [e for e in kube.events("gang") if e.type == "Warning"]

        kube.delete_job("gang")
        wait_for("PodGroup garbage-collected", lambda: not pod_groups(kube), timeout=60)
    finally:
        op.stop()


# A configured gang scheduler whose PodGroup API is missing: test_k8s_create_errors.py
# (test_a_setup_error_reaches_the_status_and_one_event) checks the status, Event and log.


@pytest.mark.timeout(60)
def test_without_a_gang_scheduler_the_job_is_warned_and_still_runs(kube, operator):
    m = manifest(
        "hint",
        "MultiWorkerMirroredStrategy",
        {"worker": 2},
        run_policy={"schedulingPolicy": {"minAvailable": 2}},
    )
    kube.create_job(m)
    pods = kube.wait_pods("hint", 2)
    assert all(p.spec.scheduler_name == "default-scheduler" for p in pods.values())

    def warning():
        return [e for e in kube.events("hint") if e.reason == "GangSchedulingUnavailable"]

    (event,) = wait_for("the Warning Event", warning, timeout=30)
    assert event.type == "Warning"
    assert event.message.startswith(
        "spec.runPolicy.schedulingPolicy: minAvailable (2) will not be honoured"
    )


@pytest.mark.timeout(120)
def test_a_tfjob_replicas_edit_moves_its_pod_groups_min_member(
    own_kube, control_plane, volcano_pod_group_crd
):
    """A served TFJob scaled 2 → 4 → 1 workers: the PodGroup's minMember follows each edit
    (the scheduler would otherwise hold the new pods until a gang of the old size, or admit a
    gang too small), and the queue it was created with stays."""
    kube = own_kube
    env = {"STRATEGYJOB_GANG_SCHEDULER": "volcano", "STRATEGYJOB_SERVE_TFJOBS": "true"}
    op = OperatorProcess(control_plane, "--standalone", "-n", kube.ns, env=env).start()
    tfjobs = ("kubeflow.org", "v1", kube.ns, "tfjobs")
    try:
        container = {"name": "tensorflow", "image": "busybox"}
        worker = {"replicas": 2, "template": {"spec": {"containers": [container]}}}
        kube.custom.create_namespaced_custom_object(
            *tfjobs,
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJob",
                "metadata": {"name": "elastic"},
                "spec": {
                    "runPolicy": {"schedulingPolicy": {"queue": "research"}},
                    "tfReplicaSpecs": {"Worker": worker},
                },
            },
        )

        def min_member(n: int):
            groups = pod_groups(kube)
            return groups if groups and groups[0]["spec"].get("minMember") == n else None

        wait_for("the PodGroup of 2", lambda: min_member(2), timeout=30)
        for name in kube.wait_pods("elastic", 2):
            kube.set_phase(name, "Running")

        def running():
            obj = kube.custom.get_namespaced_custom_object(*tfjobs, "elastic")
            return (obj.get("status") or {}).get("state") == "Running"

        wait_for("the TFJob running", running, timeout=30)
        for count in (4, 1):
            patch = {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": count}}}}
            kube.custom.patch_namespaced_custom_object(*tfjobs, "elastic", patch)
            (group,) = wait_for(f"minMember {count}", lambda n=count: min_member(n), timeout=30)
            assert group["spec"]["queue"] == "research"
    finally:
        op.stop()


@pytest.mark.timeout(120)
def test_a_resizable_jobs_pod_group_counts_its_workers_at_their_minimum(
    own_kube, control_plane, volcano_pod_group_crd
):
    """A ParameterServerStrategy job with workers bounded by minReplicas 2: its PodGroup's
    minMember counts 2 workers (chief + ps + 2 = 4, not its 5 pods), so the scheduler admits
    the job at any size it may be resized to; scaled 3 -> 4 -> 2, minMember stays, and the
    added worker's pod joins the same gang."""
    kube, cp = own_kube, control_plane
    env = {"STRATEGYJOB_GANG_SCHEDULER": "volcano"}
    op = OperatorProcess(cp, "--standalone", "-n", kube.ns, env=env).start()
    try:
        m = manifest("bounded", "ParameterServerStrategy", {"chief": 1, "ps": 1, "worker": 3})
        m["spec"]["replicaSpecs"]["worker"].update({"minReplicas": 2, "maxReplicas": 4})
        kube.create_job(m)
        kube.wait_pods("bounded", 5)
        (group,) = pod_groups(kube)
        assert group["spec"]["minMember"] == 4
        for count, pods in ((4, 6), (2, 4)):
            done = cp.kubectl("scale", "sjob/bounded", f"--replicas={count}", "-n", kube.ns)
            assert done.returncode == 0, done.stderr
            found = kube.wait_pods("bounded", pods)
            (group,) = pod_groups(kube)
            assert group["spec"]["minMember"] == 4
            for pod in found.values():
                assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == "bounded"
    finally:
        op.stop()
