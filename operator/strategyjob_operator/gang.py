"""Gang scheduling: ``runPolicy.schedulingPolicy`` handed to a batch scheduler.

A collective job whose pods start one by one can hold half a cluster's GPUs while it waits
for the rest; a gang scheduler binds all of a job's pods or none. As TFJob does with
``--gang-scheduler-name``, the operator, when told which scheduler the cluster runs, creates a
``PodGroup`` per job (``minMember`` = ``schedulingPolicy.minAvailable``, default every replica;
Volcano also takes the ``queue`` and ``priorityClass``) and points every pod at the scheduler
and the group. Without one, ``minAvailable`` and ``queue`` cannot be honoured, and the job
gets a Warning Event saying so rather than silence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c

#: Event reason of the warning for a scheduling policy no scheduler will honour.
REASON_NO_GANG_SCHEDULER = "GangSchedulingUnavailable"


@dataclass(frozen=True)
class GangScheduler:
    """A batch scheduler the operator can hand jobs to."""

    name: str
    """The operator's setting (``STRATEGYJOB_GANG_SCHEDULER``)."""
    scheduler_name: str
    """``spec.schedulerName`` of the pods (the scheduler's default deployment name)."""
    api_version: str
    """Group/version of its ``PodGroup``."""
    takes_queue: bool
    pod_label: str | None = None
    pod_annotation: str | None = None


VOLCANO = GangScheduler(
    name="volcano",
    scheduler_name="volcano",
    api_version="scheduling.volcano.sh/v1beta1",
    takes_queue=True,
    pod_annotation="scheduling.k8s.io/group-name",
)
SCHEDULER_PLUGINS = GangScheduler(
    name="scheduler-plugins",
    scheduler_name="scheduler-plugins-scheduler",
    api_version="scheduling.x-k8s.io/v1alpha1",
    takes_queue=False,
    pod_label="scheduling.x-k8s.io/pod-group",
)
GANG_SCHEDULERS = {s.name: s for s in (VOLCANO, SCHEDULER_PLUGINS)}


def gang_scheduler(name: str | None) -> GangScheduler | None:
    """The scheduler named by the operator's setting; empty means none."""
    if not name:
        return None
    try:
        return GANG_SCHEDULERS[name]
    except KeyError:
        raise ValueError(
            f"{c.ENV_GANG_SCHEDULER}={name!r} is not a gang scheduler the operator knows; "
            f"use one of {sorted(GANG_SCHEDULERS)} or leave it empty for none"
        ) from None


def pod_group_name(job: jobspec.StrategyJob) -> str:
    return job.name


def min_member(job: jobspec.StrategyJob) -> int:
    """``minAvailable``, else every replica of the job (a collective job needs them all)."""
    explicit = job.run_policy.scheduling_policy.min_available
    return explicit if explicit is not None else job.total_replicas


def build_pod_group(
    job: jobspec.StrategyJob, owner: Mapping[str, Any], scheduler: GangScheduler
) -> dict[str, Any]:
    policy = job.run_policy.scheduling_policy
    spec: dict[str, Any] = {"minMember": min_member(job)}
    if scheduler.takes_queue:
        if policy.queue:
            spec["queue"] = policy.queue
        if policy.priority_class:
            spec["priorityClassName"] = policy.priority_class
    return {
        "apiVersion": scheduler.api_version,
        "kind": "PodGroup",
        "metadata": {
            "name": pod_group_name(job),
            "namespace": job.namespace,
            "labels": {c.LABEL_JOB_NAME: job.name},
            "ownerReferences": [dict(owner)],
        },
        "spec": spec,
    }


def join_gang(pod: dict[str, Any], job: jobspec.StrategyJob, scheduler: GangScheduler) -> None:
    """Point ``pod`` at the scheduler (unless its template names one) and at its group."""
    spec = pod["spec"]
    spec.setdefault("schedulerName", scheduler.scheduler_name)
    meta = pod["metadata"]
    if scheduler.pod_label:
        meta.setdefault("labels", {})[scheduler.pod_label] = pod_group_name(job)
    if scheduler.pod_annotation:
        meta.setdefault("annotations", {})[scheduler.pod_annotation] = pod_group_name(job)


def unhonoured_policy(job: jobspec.StrategyJob, scheduler: GangScheduler | None) -> str | None:
    """The warning for scheduling fields that no scheduler will act on, or None."""
    policy = job.run_policy.scheduling_policy
    ignored = []
    if scheduler is None and policy.min_available is not None:
        ignored.append(f"minAvailable ({policy.min_available})")
    if policy.queue and (scheduler is None or not scheduler.takes_queue):
        ignored.append(f"queue ({policy.queue!r})")
    if not ignored:
        return None
    where = (
        "the operator runs without a gang scheduler"
        if scheduler is None
        else f"{scheduler.name} has no queues"
    )
    return (
        f"spec.runPolicy.schedulingPolicy: {' and '.join(ignored)} will not be honoured: "
        f"{where}. Install Volcano or the scheduler-plugins coscheduling plugin and set the "
        f"operator's gangScheduler (STRATEGYJOB_GANG_SCHEDULER), or remove these fields."
    )
