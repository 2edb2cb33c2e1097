"""Gang scheduling: ``runPolicy.schedulingPolicy`` handed to a batch scheduler.

A collective job whose pods start one by one can hold half a cluster's GPUs while it waits
for the rest; a gang scheduler binds all of a job's pods or none. As TFJob does with
``--gang-scheduler-name``, the operator, when told which scheduler the cluster runs, creates a
``PodGroup`` per job (``minMember`` = ``schedulingPolicy.minAvailable``, default every replica;
Volcano also takes the ``queue`` and ``priorityClass``) and points every pod at the scheduler
and the group. Without one, ``minAvailable`` and ``queue`` cannot be honoured, and the job
gets a Warning Event saying so rather than silence.

A gang must also get all its pods past a namespace's ResourceQuota, or none: pods created one
by one under a quota can leave several gangs each holding part of it and none able to start.
So (as Kueue admits a workload only when its whole quota is free) the operator creates a gang's
pods only when every quota has room for all of them (:mod:`.quota`), one gang of a namespace at
a time; checks a waiting gang again as soon as a quota of its namespace frees room (the quota's
own update wakes it, past its creation back-off, as Kueue re-admits when quota frees); undoes
a creation the quota refuses part-way (another workload took the room first);
and deletes the PodGroup of a suspended job, so the scheduler reserves nothing for it (the
next pass after the resume creates it again). The functions at the end do that I/O for the
reconciler; the rest are pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strategyjob import jobspec

from strategyjob_operator import constants as c
from strategyjob_operator import quota
from strategyjob_operator.plan import Event, Plan

if TYPE_CHECKING:
    from strategyjob_operator.kube import KubeApi

logger = logging.getLogger("strategyjob_operator")

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
    takes_schedule_timeout: bool = False
    """Whether its PodGroup has ``scheduleTimeoutSeconds`` (a TFJob's schedulingPolicy)."""


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
    takes_schedule_timeout=True,
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
    """``minAvailable``, else every replica of the job (a collective job needs them all),
    counting the workers at their ``minReplicas`` when the spec bounds them: a job resized
    down to its minimum still runs, so the scheduler need not wait for more."""
    explicit = job.run_policy.scheduling_policy.min_available
    if explicit is not None:
        return explicit
    worker = job.replica_specs.get("worker")
    if worker is not None and worker.min_replicas is not None:
        return job.total_replicas - worker.replicas + min(worker.min_replicas, worker.replicas)
    return job.total_replicas


def build_pod_group(
    job: jobspec.StrategyJob,
    owner: Mapping[str, Any],
    scheduler: GangScheduler,
    tfjob: jobspec.TFJob | None = None,
) -> dict[str, Any]:
    """The job's PodGroup; a TFJob's has its ``schedulingPolicy.minResources`` and (where
    the scheduler's PodGroup has it) ``scheduleTimeoutSeconds``, as training-operator's."""
    policy = job.run_policy.scheduling_policy
    spec: dict[str, Any] = {"minMember": min_member(job)}
    if scheduler.takes_queue:
        if policy.queue:
            spec["queue"] = policy.queue
        if policy.priority_class:
            spec["priorityClassName"] = policy.priority_class
    if tfjob is not None and tfjob.min_resources:
        spec["minResources"] = dict(tfjob.min_resources)
    timeout = tfjob.schedule_timeout_seconds if tfjob is not None else None
    if scheduler.takes_schedule_timeout and timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
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


def pod_group_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that gives PodGroup ``current`` the spec fields the operator sets in
    ``wanted`` (:func:`build_pod_group`), or None when they agree: a TFJob's ``replicas``
    edit changes ``minMember``, which the scheduler must see before it places the new pods."""
    spec = current.get("spec") or {}
    changed = {k: v for k, v in wanted["spec"].items() if spec.get(k) != v}
    return {"spec": changed} if changed else None


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


# --- ResourceQuota: all of a gang's pods or none --------------------------------------------


#: The reason of the CreateFailed condition and Event of a gang that waits for quota.
REASON_WAITING_FOR_QUOTA = quota.REASON_WAITING_FOR_QUOTA


class QuotaShortfall(Exception):
    """The namespace's quotas cannot hold all of the gang's pods: none is created (the
    CreateFailed condition and Event say which quota and resource, as the API server would)."""


def quota_pod_specs(
    job: jobspec.StrategyJob, replicas: Iterable[tuple[str, int]]
) -> list[tuple[dict[str, Any], int]]:
    """What a quota sees of the pods of ``replicas``: each replica type's template spec (with
    the scheduling policy's priority class where it sets none, as the pods get it) and how
    many of its pods; cheap for any size of job (no TF_CONFIG is built)."""
    counts = Counter(t for t, _ in replicas)
    priority_class = job.run_policy.scheduling_policy.priority_class
    out = []
    for replica_type, count in sorted(counts.items()):
        spec = dict((job.replica_specs[replica_type].template or {}).get("spec") or {})
        if priority_class and not spec.get("priorityClassName"):
            spec["priorityClassName"] = priority_class
        out.append((spec, count))
    return out


def quota_refusal(error: BaseException) -> bool:
    """Whether the API server refused a pod because a ResourceQuota is used up."""
    return getattr(error, "status", None) == 403 and "exceeded quota" in str(error)


_ADMISSION: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.asynccontextmanager
async def admission(scheduler: GangScheduler | None, namespace: str) -> AsyncIterator[None]:
    """Hold the namespace's gang admission (with a gang ``scheduler``; without, nothing):
    one gang's quota check and pod creation at a time, so two gangs of the operator never
    both see the same room and both get only part of it."""
    if scheduler is None:
        yield
        return
    locks = _ADMISSION.setdefault(asyncio.get_running_loop(), {})
    async with locks.setdefault(namespace, asyncio.Lock()):
        yield


async def quota_shortfall(
    api: KubeApi,
    job: jobspec.StrategyJob,
    replicas: Sequence[tuple[str, int]],
    scheduler: GangScheduler | None,
) -> QuotaShortfall | None:
    """Why the pods of ``replicas`` must wait (None: create them): with a gang scheduler,
    the namespace's ResourceQuotas cannot hold all of them. Quotas that cannot be read (RBAC
    of an older chart) do not stop the gang: the API server still enforces them."""
    if scheduler is None or not replicas:
        return None
    try:
        quotas = await api.list_resource_quotas(job.namespace)
    except Exception as e:  # a check the API server repeats; log, go on
        logger.warning(
            "StrategyJob %s/%s: cannot read the namespace's ResourceQuotas (%s); creating its "
            "pods without checking that all of them fit",
            job.namespace,
            job.name,
            e,
        )
        return None
    found = quota.shortfalls(quotas, quota_pod_specs(job, replicas))
    if not found:
        return None
    return QuotaShortfall(
        f"{quota.waiting_message(found)} (none of the gang's pods is created until all fit)"
    )


def waiting_what(plan: Plan) -> str:
    """What the CreateFailed message says could not be created for a gang that waits."""
    n = len(plan.create)
    return f"the gang's {n} pods" if n != 1 else "the gang's pod"


async def undo_partial_creation(
    api: KubeApi,
    job: jobspec.StrategyJob,
    created: Sequence[str],
    failed: Sequence[tuple[str, BaseException]],
    scheduler: GangScheduler | None,
) -> tuple[int, Event | None]:
    """After the quota refused some of a gang's pods (another workload took the room between
    the check and the creation), delete the pods this attempt ``created``: a gang holding
    part of the quota blocks others and cannot start itself. The next attempt (after the
    creation back-off) creates all of them again. Returns how many went and the Event."""
    refused = sorted(name for name, e in failed if quota_refusal(e))
    if scheduler is None or not refused or not created:
        return 0, None
    deleted = 0
    for name in created:
        try:
            if await api.delete(api.core_path(job.namespace, "pods", name), grace_seconds=0):
                deleted += 1
        except Exception as e:  # the next pass sees the pod and tries again
            logger.warning("Deleting pod %s/%s failed: %s", job.namespace, name, e)
    message = (
        f"The ResourceQuota refused pod {refused[0]} while the gang's pods were being created "
        f"(another workload took the room first): deleted the {deleted} pods created in this "
        "attempt, so that the gang holds no quota while it waits; it tries again after a "
        "back-off."
    )
    logger.warning("StrategyJob %s/%s: %s", job.namespace, job.name, message)
    return deleted, Event("Warning", quota.REASON_WAITING_FOR_QUOTA, message)


async def release_pod_group(
    api: KubeApi, job: jobspec.StrategyJob, uid: str | None, scheduler: GangScheduler | None
) -> bool:
    """Delete the PodGroup of a suspended job (only the one this job controls): the scheduler
    then reserves nothing for it (Volcano enqueues a PodGroup by its minResources). The pass
    after the resume creates it again. True when one was deleted."""
    if scheduler is None or uid is None:
        return False
    path = api.group_path(scheduler.api_version, job.namespace, "podgroups", pod_group_name(job))
    try:
        existing = await api.get_metadata(path)
        if existing is None or existing["metadata"].get("deletionTimestamp"):
            return False
        refs = existing["metadata"].get("ownerReferences") or []
        if not any(r.get("controller") and r.get("uid") == uid for r in refs):
            return False  # not this job's: never the operator's to delete
        gone = await api.delete(path, uid=existing["metadata"].get("uid"))
    except Exception as e:  # retried by the next pass of the suspended job
        logger.warning(
            "StrategyJob %s/%s: cannot delete its PodGroup while suspended: %s",
            job.namespace,
            job.name,
            e,
        )
        return False
    if gone:
        logger.info("StrategyJob %s/%s: suspended; deleted its PodGroup", job.namespace, job.name)
    return gone
