"""Gang scheduling: the PodGroup per job, the pods' scheduler and group, and the warning when
a scheduling policy cannot be honoured."""

from __future__ import annotations

import dataclasses

import pytest
from strategyjob import jobspec
from strategyjob_operator import children, gang
from strategyjob_operator import constants as c
from strategyjob_operator.settings import settings_from_env

OWNER = {"apiVersion": "strategyjob.dev/v1alpha1", "kind": "StrategyJob", "name": "g", "uid": "u"}


def make_job(scheduling: dict | None = None, scheduler_name: str | None = None):
    spec: dict = {"containers": [{"name": "strategyjob", "image": "x"}]}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    run_policy = {"schedulingPolicy": scheduling} if scheduling else {}
    return jobspec.load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "g", "namespace": "ml"},
            "spec": {
                "strategy": "MultiWorkerMirroredStrategy",
                "replicaSpecs": {
                    "chief": {"replicas": 1, "template": {"spec": spec}},
                    "worker": {"replicas": 3, "template": {"spec": spec}},
                },
                "runPolicy": run_policy,
            },
        }
    )


def test_volcano_pod_group_takes_min_available_queue_and_priority():
    job = make_job({"minAvailable": 3, "queue": "research", "priorityClass": "high"})
    group = gang.build_pod_group(job, OWNER, gang.VOLCANO)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "g" and group["metadata"]["namespace"] == "ml"
    assert group["metadata"]["ownerReferences"] == [OWNER]
    assert group["metadata"]["labels"] == {c.LABEL_JOB_NAME: "g"}
    assert group["spec"] == {"minMember": 3, "queue": "research", "priorityClassName": "high"}


def test_min_member_defaults_to_every_replica():
    assert gang.build_pod_group(make_job(), OWNER, gang.VOLCANO)["spec"] == {"minMember": 4}
    group = gang.build_pod_group(make_job({"queue": "q"}), OWNER, gang.SCHEDULER_PLUGINS)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 4}  # the coscheduling PodGroup has no queue


def test_min_member_counts_the_workers_at_their_minimum():
    """A job kubectl scale may take down to minReplicas workers runs with that many: the
    gang needs no more (issue 30); minAvailable, when set, still decides."""
    job = make_job()
    bounded = dataclasses.replace(
        job,
        replica_specs={
            **job.replica_specs,
            "worker": dataclasses.replace(job.replica_specs["worker"], min_replicas=1),
        },
    )
    assert gang.min_member(bounded) == 2  # the chief and one worker
    assert gang.build_pod_group(bounded, OWNER, gang.VOLCANO)["spec"] == {"minMember": 2}
    explicit = dataclasses.replace(bounded, run_policy=make_job({"minAvailable": 3}).run_policy)
    assert gang.min_member(explicit) == 3


def test_pods_join_the_gang_of_each_scheduler():
    job = make_job()
    replicas = [("chief", 0), ("worker", 2)]
    for pod in children.missing_pods(job, OWNER, replicas, gang.VOLCANO):
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "g"
    for pod in children.missing_pods(job, OWNER, replicas, gang.SCHEDULER_PLUGINS):
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "g"
        assert pod["metadata"]["labels"][c.LABEL_JOB_NAME] == "g"  # the operator's own stay
    for pod in children.missing_pods(job, OWNER, replicas):
        assert "schedulerName" not in pod["spec"]


def test_a_template_scheduler_name_is_kept():
    (pod,) = children.missing_pods(
        make_job(scheduler_name="my-sched"), OWNER, [("worker", 0)], gang.VOLCANO
    )
    assert pod["spec"]["schedulerName"] == "my-sched"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "g"


def test_unhonoured_policy_names_the_fields_and_the_fix():
    assert gang.unhonoured_policy(make_job(), None) is None
    assert gang.unhonoured_policy(make_job({"priorityClass": "high"}), None) is None
    assert gang.unhonoured_policy(make_job({"minAvailable": 2, "queue": "q"}), gang.VOLCANO) is None
    warning = gang.unhonoured_policy(make_job({"minAvailable": 2, "queue": "q"}), None)
    assert warning.startswith(
        "spec.runPolicy.schedulingPolicy: minAvailable (2) and queue ('q') will not be honoured: "
        "the operator runs without a gang scheduler."
    )
    assert "STRATEGYJOB_GANG_SCHEDULER" in warning
    warning = gang.unhonoured_policy(make_job({"queue": "q"}), gang.SCHEDULER_PLUGINS)
    assert "queue ('q')" in warning and "scheduler-plugins has no queues" in warning


def test_operator_setting_from_the_environment(monkeypatch):
    monkeypatch.delenv("STRATEGYJOB_GANG_SCHEDULER", raising=False)
    assert settings_from_env().gang_scheduler is None
    monkeypatch.setenv("STRATEGYJOB_GANG_SCHEDULER", "scheduler-plugins")
    assert settings_from_env().gang_scheduler is gang.SCHEDULER_PLUGINS
    monkeypatch.setenv("STRATEGYJOB_GANG_SCHEDULER", "kueue")
    with pytest.raises(ValueError, match="'kueue' is not a gang scheduler the operator knows"):
        settings_from_env()


def test_pod_group_patch_brings_only_what_changed() -> None:
    """After a TFJob's replicas edit the PodGroup's minMember follows; fields the scheduler
    added (status, its own defaults) are left alone, and an agreeing group needs no patch."""
    wanted = gang.build_pod_group(make_job({"queue": "q"}), OWNER, gang.VOLCANO)
    assert wanted["spec"]["minMember"] == 4
    current = {"spec": {"minMember": 3, "queue": "q", "minTaskMember": {"x": 1}}, "status": {}}
    assert gang.pod_group_patch(current, wanted) == {"spec": {"minMember": 4}}
    current["spec"]["minMember"] = 4
    assert gang.pod_group_patch(current, wanted) is None
    assert gang.pod_group_patch({}, wanted) == {"spec": wanted["spec"]}
