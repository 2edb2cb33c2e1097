"""One reconcile pass of one StrategyJob: read the job and its pods, :func:`decide`,
then carry the plan out. Deletions come first, then creations (concurrent, bounded),
then exactly one status write, then the Events, so that an Event never reports a state
that was not persisted and a crash at any point leaves a state the next pass finishes.
This module only does that I/O: what follows from it (the status written, the Events
added, when the next pass is due) is decided by :mod:`.outcome`'s pure functions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import (
    children,
    decide,
    flavor,
    gang,
    history,
    observe,
    outcome,
    progress,
    scaling,
    undecodable,
)
from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.flavor import STRATEGYJOB, Flavor, Loaded
from strategyjob_operator.kube import ApiError, KubeApi, bounded_gather
from strategyjob_operator.metrics import REGISTRY, Registry
from strategyjob_operator.outcome import STALE_RETRY_SECONDS
from strategyjob_operator.pod_cache import PodCache

logger = logging.getLogger("strategyjob_operator")

#: Seconds until the pass after one that created the pods a TFJob's scale-up added.
SCALE_RETRY_SECONDS = 0.1

#: A job's per-job state is the job's, not its name's: (namespace, name, uid).
JobKey = tuple[str, str, str]


class JobGone(Exception):
    """A pass for one job (by uid) read it deleted, or replaced by a namesake: the job's
    loop ends, as on its DELETED watch event, which a watch can miss (an event lost while
    it reconnected)."""


#: Longest wait between passes after an unexpected error.
MAX_ERROR_BACKOFF = 60.0
#: The operator's periodic resync of each active job (``STRATEGYJOB_RESYNC_SECONDS``).
DEFAULT_RESYNC_SECONDS = 60.0
#: Longest wait of a job's loop that nothing is due for (a finished or suspended job): its
#: pass then reads the job, so a deletion whose watch event was lost ends the loop anyway.
IDLE_CHECK_SECONDS = 600.0
#: The pods' grace period when their template sets none
#: (``STRATEGYJOB_TERMINATION_GRACE_SECONDS``): room for a preemption checkpoint.
DEFAULT_TERMINATION_GRACE_SECONDS = 60

#: Shortest wait before looking again at a pod that stays terminating on a Ready node.
LOST_RECHECK_SECONDS = 5.0


class StaleChildError(Exception):
    """An object of an earlier job of the same name was in the way (now being deleted); the
    pass is retried."""


class ChildBlockedError(Exception):
    """An object with one of the job's names exists and the job does not control it (an
    orphaned pod, someone else's Service): nothing the operator may delete."""


def _blocker(obj: dict[str, Any], existing: dict[str, Any]) -> str:
    """How a message names an object in the job's way, e.g. ``Pod ns/j-worker-0 (no
    controller)`` or ``Service ns/j (controlled by Deployment web)``."""
    meta = obj["metadata"]
    refs = (existing.get("metadata") or {}).get("ownerReferences") or []
    controller = next((r for r in refs if r.get("controller")), None)
    held = (
        f"controlled by {controller.get('kind')} {controller.get('name')}"
        if controller
        else "no controller"
    )
    return f"{obj['kind']} {meta['namespace']}/{meta['name']} ({held})"


def _uid(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("uid")


#: The labels that say which job and replica a pod is.
_IDENTITY_LABELS = (c.LABEL_JOB_NAME, c.LABEL_REPLICA_TYPE, c.LABEL_REPLICA_INDEX)


def _relabelled(wanted: dict[str, Any], existing: dict[str, Any]) -> bool:
    """Whether the existing pod's identity labels differ from those it was created with."""
    have = (existing.get("metadata") or {}).get("labels") or {}
    want = wanted["metadata"].get("labels") or {}
    return any(have.get(k) != want.get(k) for k in _IDENTITY_LABELS)


def with_grace_period(pod: dict[str, Any], seconds: int | None) -> None:
    """Give the pod ``seconds`` between SIGTERM and SIGKILL unless its template says
    (the template's value wins): a preempted or restarted replica saves its checkpoint."""
    spec = pod.setdefault("spec", {})
    if seconds is not None and spec.get("terminationGracePeriodSeconds") is None:
        spec["terminationGracePeriodSeconds"] = seconds


@dataclass
class PodCreation:
    """What creating a job's missing pods came to (the pods themselves are not kept)."""

    created: int = 0
    #: Objects with the job's pod names that it does not control (:func:`_blocker`).
    blocked: list[str] = field(default_factory=list)
    #: A pod of an earlier job of the same name was in the way (being deleted).
    stale: bool = False
    #: ``(pod name, error)`` of each pod the API server refused.
    failed: list[tuple[str, Exception]] = field(default_factory=list)
    #: The pods created (a gang's are deleted again when the quota refuses some).
    created_names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Creations:
    """What creating a job's objects and pods came to in one pass."""

    #: Objects with the job's names that it does not control (:func:`_blocker`), by name.
    blocked: list[str] = field(default_factory=list)
    #: What could not be created and why (None: nothing failed).
    failure: outcome.CreateFailure | None = None
    #: A pod of an earlier job of the same name was in the way (being deleted).
    stale: bool = False


def _failure(reason: str, what: str, error: BaseException) -> outcome.CreateFailure:
    """What could not be created, with the API server's status and message when it refused."""
    if isinstance(error, ApiError):
        return outcome.CreateFailure(reason, what, error, error.status, error.detail)
    return outcome.CreateFailure(reason, what, error, None, str(error))


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class OperatorSettings:
    """Settings of the reconciler."""

    max_in_flight: int = 50
    """Requests in flight at once while creating or deleting a job's pods."""
    metrics_port: int | None = 8080
    """Port of the Prometheus endpoint; None disables it."""
    min_reconcile_interval: float = 0.05
    """Seconds between two passes of one job, so a burst of pod events costs one pass."""
    max_error_backoff: float = MAX_ERROR_BACKOFF
    """Longest wait of a job's loop after a pass that failed unexpectedly (the wait doubles
    from 1 s up to it)."""
    gang_scheduler: gang.GangScheduler | None = None
    """The batch scheduler that gets each job's PodGroup; None: the default scheduler."""
    resync_seconds: float | None = None
    """Seconds between passes of an active job that no event woke (jittered by 10% so
    1000 jobs do not resync at once): it notices what no watch event reported (a pod
    orphaned and relabelled, an event lost while the watch reconnected). None: never
    (the operator's command line uses :data:`DEFAULT_RESYNC_SECONDS`)."""
    idle_check_seconds: float | None = IDLE_CHECK_SECONDS
    """Longest wait of a job's loop between passes when nothing is due (a finished or
    suspended job): the pass reads the job, and a job deleted while the watch missed its
    DELETED event ends its loop (:class:`JobGone`) instead of idling until a restart."""
    termination_grace_seconds: int | None = None
    """``terminationGracePeriodSeconds`` of pods whose template sets none: the time between
    SIGTERM (preemption, drain, a restart) and SIGKILL, in which the training saves its
    checkpoint. None: Kubernetes' 30 s (the operator's command line uses
    :data:`DEFAULT_TERMINATION_GRACE_SECONDS`)."""
    lost_pod_seconds: float = decide.DEFAULT_LOST_POD_SECONDS
    """Seconds a pod may be in phase Unknown before its replica fails, and may stay
    terminating past its grace period on a node that is gone or NotReady before it is
    force-deleted (``STRATEGYJOB_LOST_POD_SECONDS``)."""
    serve_tfjobs: bool = False
    """Whether the operator serves Kubeflow ``kubeflow.org/v1`` TFJobs too
    (``STRATEGYJOB_SERVE_TFJOBS``; the chart's ``tfjob.enabled``)."""
    cluster_domain: str = ""
    """What a served TFJob's ``TF_CONFIG`` addresses end with, after ``.svc``
    (``CUSTOM_CLUSTER_DOMAIN``, as under training-operator; the chart's
    ``tfjob.clusterDomain``). Empty: none."""


class Reconciler:
    def __init__(
        self,
        api: KubeApi,
        settings: OperatorSettings | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
        registry: Registry = REGISTRY,
        pod_cache: PodCache | None = None,
        flavor: Flavor = STRATEGYJOB,
    ) -> None:
        self.api = api
        #: The kind of job this reconciler serves (StrategyJobs; Kubeflow TFJobs).
        self.flavor = flavor
        #: The jobs' pods as last seen (the operator's watch feeds it): a pass then reads
        #: only their metadata. None: a pass lists its job's pods in full.
        self.pod_cache = pod_cache
        self.settings = settings or OperatorSettings()
        self.clock = clock
        self.metrics = registry
        #: Per job, since when its pods in phase Unknown were seen so (by pod uid).
        self._unknown_seen: dict[JobKey, dict[str, str]] = {}
        #: Per job, when to try again to create what the API server refused.
        self._create_backoff: dict[JobKey, decide.CreateBackoff] = {}
        #: Per namespace, how many times one of its ResourceQuotas freed room
        #: (:meth:`wake_quota_waiters`): a pass that saw a quota before it freed room knows.
        self._quota_frees: Counter[str] = Counter()

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Free what the reconciler keeps about a job, once its loop ends (the job deleted):
        else an operator that runs for months holds an entry per job it ever saw."""
        key = (namespace, name, uid)
        self._unknown_seen.pop(key, None)
        self._create_backoff.pop(key, None)
        if self.pod_cache is not None:
            self.pod_cache.forget(namespace, name)

    def wake_quota_waiters(self, namespace: str) -> list[str]:
        """A ResourceQuota of ``namespace`` freed room: end the creation back-off of its jobs
        that wait for quota, so that their next pass (the caller wakes them) checks the
        quotas again at once; returns their names. A pass that read the quotas just before
        the room freed ends the wait it starts too (:meth:`_note_creation`)."""
        self._quota_frees[namespace] += 1
        now = self.clock()
        waiting = decide.quota_waiters(self._create_backoff, namespace)
        for key in waiting:
            self._create_backoff[key] = decide.released(self._create_backoff[key], now)
        return [name for _, name, _ in waiting]

    def remembered(self) -> set[JobKey]:
        """The jobs the reconciler keeps state about (what :meth:`forget` frees)."""
        return {*self._unknown_seen, *self._create_backoff}

    async def reconcile(self, namespace: str, name: str, uid: str | None = None) -> float | None:
        """One pass; returns seconds until a time-driven pass is due (None: none). With
        ``uid``, a pass only for that job: it raises :class:`JobGone` when the job is
        deleted, or replaced by a namesake (whose own loop runs: it is left alone)."""
        started = time.perf_counter()
        try:
            return await self._reconcile(namespace, name, uid)
        finally:
            self.metrics.observe_reconcile(time.perf_counter() - started)

    async def _reconcile(self, namespace: str, name: str, uid: str | None) -> float | None:
        """Read the job and its pods, carry out a resize, :func:`decide`, delete, create,
        then write the status :mod:`.outcome` settles on (once) and post the Events. It
        reads whole as the order of a pass's I/O; every decision is in decide and outcome."""
        job_obj = await self._read_job(namespace, name, uid)
        if job_obj is None:
            return None
        now = self.clock()
        written = job_obj.get("status") or {}
        loaded = await self._load(job_obj, written, now)
        if loaded is None:
            return None
        job, meta, kind = loaded.job, job_obj["metadata"], self.flavor.kind
        status = self.flavor.internal_status(written, loaded)
        pods = await self._pods(namespace, name)
        uid, generation = meta.get("uid"), meta.get("generation", 0)
        key: JobKey = (namespace, name, uid or "")
        stale = [p for p in pods if uid and observe.left_by_earlier_job(p, uid, name, kind)]
        if stale:
            return await self._remove_stale_pods(namespace, name, stale)
        resize_events: list[decide.Event] = []
        scaled, members = await self._resize(loaded, job_obj, pods, status, resize_events, now)
        if scaled:
            return SCALE_RETRY_SECONDS  # decide once the new pods are there
        replicas = self._observe(key, job, pods, uid, now)
        plan = decide.decide(
            job,
            generation,
            status,
            replicas,
            now,
            lost_pod_seconds=self.settings.lost_pod_seconds,
            optional_types=loaded.optional_types,
            reforms=scaling.reforms(job, loaded.tfjob),
            joining=scaling.joining(job, members),
        )
        if plan.action is not decide.Action.NONE:
            logger.info("StrategyJob %s/%s: %s", namespace, name, plan.action.value)
        await self._delete_for(plan, job, uid, replicas)
        events: list[decide.Event] = []
        lost_wait = await self._force_delete_lost(namespace, replicas, now, events)
        hold = decide.create_hold(self._create_backoff.get(key), generation, now)
        plan, hold = outcome.held_back(plan, hold)
        quota_frees = self._quota_frees[namespace]  # a quota freeing room from here on ends a wait
        plan, created = await self._create(loaded, job_obj, plan, status, events)
        note = self._note_creation(key, generation, plan, created.failure, now, quota_frees)
        resizable = scaling.resizable(job, loaded.tfjob)
        resize = outcome.Resize(job, replicas, members) if resizable else None
        settled = outcome.settle(plan, name, note.status, created.blocked, resize, now)
        if settled.event is not None:
            logger.warning("StrategyJob %s/%s: %s", namespace, name, settled.event.message)
        new_status = await self._with_progress(job, job_obj, pods, status, settled.status)
        patch = outcome.status_write(self.flavor, loaded, written, status, new_status, now)
        if patch is not None:
            path = self.flavor.job_path(namespace, name, "status")
            await self.api.merge_patch(path, {"status": patch})
        posted = (*plan.events, *events, note.event, settled.event, *resize_events)
        await self._post_events(job_obj, tuple(e for e in posted if e is not None), now)
        for metric in plan.metrics:
            self.metrics.inc(metric, namespace)
        if plan.delete_job:
            await self.api.delete(self.flavor.job_path(namespace, name))
            return None
        jitter = random.uniform(0.9, 1.1)
        resync = outcome.resync_wait(plan, self.settings.resync_seconds, jitter)
        stale_wait = STALE_RETRY_SECONDS if created.stale else None
        waits = (plan.requeue_after, hold, stale_wait, note.delay, settled.retry, lost_wait)
        return outcome.next_pass(*waits, resync)

    async def _delete_for(
        self,
        plan: decide.Plan,
        job: jobspec.StrategyJob,
        uid: str | None,
        replicas: Mapping[tuple[str, int], observe.Replica],
    ) -> None:
        """The plan's deletions: its pods (each only if still the pod the pass saw), and a
        suspended job's PodGroup (the scheduler reserves nothing for it). They come before
        the status write: the decision is persisted only once its deletions happened."""
        if plan.delete_pods:
            uids = {r.name: r.uid for r in replicas.values()}
            deleted = await self._delete_pods(job.namespace, plan.delete_pods, uids=uids)
            self.metrics.inc("pods_deleted", job.namespace, deleted)
        if plan.action is decide.Action.SUSPEND:
            await gang.release_pod_group(self.api, job, uid, self.settings.gang_scheduler)

    async def _read_job(self, namespace: str, name: str, uid: str | None) -> dict[str, Any] | None:
        """The job to pass over; None when it is gone or being deleted. With ``uid``, a job
        gone or replaced by a namesake raises :class:`JobGone`."""
        job_obj = await self.api.get(self.flavor.job_path(namespace, name))
        if uid is not None and (job_obj is None or job_obj["metadata"].get("uid") != uid):
            raise JobGone(f"{self.flavor.kind} {namespace}/{name} (uid {uid}) is gone")
        if job_obj is None or job_obj["metadata"].get("deletionTimestamp"):
            return None
        return job_obj

    async def _load(
        self, job_obj: dict[str, Any], written: dict[str, Any], now: datetime
    ) -> Loaded | None:
        """The job's spec; None when the pass has nothing to do: a spec that jobspec rejects
        (the job failed, once and for good) or a TFJob another controller (MultiKueue)
        manages."""
        try:
            loaded = self.flavor.load(job_obj, self.settings.cluster_domain)
        except jobspec.ManifestError as e:
            await self._invalid(job_obj, written, str(e), now)
            return None  # failed for good: nothing to requeue
        return loaded if loaded.served else None

    async def _pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The job's pods: their metadata from the watch's cache, or listed in full."""
        if self.pod_cache is not None:
            return await self.pod_cache.job_pods(namespace, name)
        api = self.api
        return await api.list(api.core_path(namespace, "pods"), children.job_selector(name))

    def _observe(
        self,
        key: JobKey,
        job: jobspec.StrategyJob,
        pods: Sequence[Mapping[str, Any]],
        uid: str | None,
        now: datetime,
    ) -> dict[tuple[str, int], observe.Replica]:
        """The job's replicas as its pods show them, those in phase Unknown stamped with
        when they were first seen so (kept per job between passes)."""
        replicas = observe.observe(job, pods, uid)
        replicas, seen = observe.stamp_unknown(
            replicas, self._unknown_seen.pop(key, {}), decide.timestamp(now)
        )
        if seen:
            self._unknown_seen[key] = seen
        return replicas

    async def _resize(
        self,
        loaded: Loaded,
        job_obj: dict[str, Any],
        pods: Sequence[Mapping[str, Any]],
        status: Mapping[str, Any],
        events: list[decide.Event],
        now: datetime,
    ) -> tuple[bool, scaling.Members | None]:
        """Carry out a change of the job's size before deciding (:mod:`.scaling`): a
        resizable job follows its workers (:meth:`_follow_workers`), a TFJob's ``replicas``
        edit is carried out (:meth:`_scale`), a re-forming job's workers above its count
        go. Returns whether pods were created (the pass ends: the next one decides with
        them) and the workers the chief follows (None: no resizable job's)."""
        job, tfjob, meta = loaded.job, loaded.tfjob, job_obj["metadata"]
        suspended = job.run_policy.suspend
        edited = scaling.scaled(status, meta.get("generation", 0), suspended)
        followed = None
        if scaling.resizable(job, tfjob) and scaling.running(status, suspended):
            followed = await self._follow_workers(loaded, job_obj, pods, edited, events)
        if followed is not None:
            members, added = followed
            if added:
                await self._add_workers(loaded, job_obj, added, status, events, now)
            return bool(added), members
        if tfjob is not None and edited:
            return await self._scale(loaded, job_obj, pods, status), None
        if scaling.reforms(job, tfjob) and (
            gone := scaling.surplus(job, pods, meta.get("uid") or "")
        ):
            # scaled down: the workers above the new count stop with the rest (decide's
            # re-forming) and are not made again
            await self._delete_pods(job.namespace, [n for n, _ in gone], uids=dict(gone))
        return False, None

    async def _create(
        self,
        loaded: Loaded,
        job_obj: dict[str, Any],
        plan: decide.Plan,
        status: Mapping[str, Any],
        events: list[decide.Event],
    ) -> tuple[decide.Plan, Creations]:
        """Create what the plan asks for: the job's objects, then (unless something blocks
        them: without its own Service etc., pods would not work) its pods, a gang's all or
        none. Adds its Events to ``events``; returns the plan as carried out (without pods
        when the job's objects could not be created) and what the creation came to."""
        job, scheduler = loaded.job, self.settings.gang_scheduler
        failure: outcome.CreateFailure | None = None
        blocked: list[str] = []
        if plan.ensure_service:
            try:
                blocked = await self._ensure_job_objects(loaded, job_obj)
            except ApiError as e:  # RBAC, no PodGroup API, a webhook: in the status, no pods
                failure = _failure(c.REASON_SETUP_FAILED, "the job's objects", e)
                plan = dataclasses.replace(plan, create=())
            warning = gang.unhonoured_policy(job, scheduler)
            if warning and not status.get("conditions"):  # once, when the job is new
                events.append(decide.Event("Warning", gang.REASON_NO_GANG_SCHEDULER, warning))
        if not plan.create or blocked:
            return plan, Creations(blocked, failure)
        async with gang.admission(scheduler, job.namespace):  # a gang: all its pods or none
            waiting = await gang.quota_shortfall(self.api, job, plan.create, scheduler)
            pods = PodCreation()
            if waiting is None:
                pods = await self._create_pods(loaded, job_obj, plan.create, plan.status)
        if waiting is not None:
            failure = _failure(gang.REASON_WAITING_FOR_QUOTA, gang.waiting_what(plan), waiting)
        self.metrics.inc("pods_created", job.namespace, pods.created)
        if pods.failed:
            failure = await self._pods_failed(job, job_obj, pods, events)
        # blocked by name: the same message on every pass; a stale pod's name: soon, quietly
        return plan, Creations(sorted(pods.blocked), failure, pods.stale)

    async def _pods_failed(
        self,
        job: jobspec.StrategyJob,
        job_obj: dict[str, Any],
        pods: PodCreation,
        events: list[decide.Event],
    ) -> outcome.CreateFailure:
        """Log the pods the API server refused, delete those of a gang that were created (all
        or none, :func:`gang.undo_partial_creation`), and say what failed: the first pod by
        name, so that the same failure reads the same on every attempt."""
        ns, failed = job.namespace, pods.failed
        self.metrics.inc("pod_create_errors", ns, len(failed))
        first_name, first_error = failed[0]
        logger.warning(
            "StrategyJob %s/%s: %d pods not created; first: %s: %s",
            ns,
            job.name,
            len(failed),
            first_name,
            first_error,
        )
        pod_name, error = min(failed, key=lambda f: f[0])
        error = undecodable.naming_fields(error, job_obj.get("spec") or {})
        undone, event = await gang.undo_partial_creation(
            self.api, job, pods.created_names, failed, self.settings.gang_scheduler
        )
        self.metrics.inc("pods_deleted", ns, undone)
        events.extend([event] if event is not None else [])
        return _failure(c.REASON_CREATE_FAILED, f"pod {pod_name}", error)

    async def _with_progress(
        self,
        job: jobspec.StrategyJob,
        job_obj: dict[str, Any],
        pods: Sequence[Mapping[str, Any]],
        before: Mapping[str, Any],
        status: dict[str, Any],
    ) -> dict[str, Any]:
        """``status`` with the progress the job's leader reports (:mod:`.progress`); a new
        report goes into the metric history first (:meth:`_record_history`)."""
        report = progress.leader_report(job, pods, job_obj["metadata"].get("uid"))
        if report is None:
            return status
        new = progress.with_progress(status, progress.aggregate(report, before.get("progress")))
        if new.get("progress") != before.get("progress"):  # a new report
            await self._record_history(job, job_obj, report)
        return new

    async def _scale(
        self,
        loaded: Loaded,
        job_obj: dict[str, Any],
        pods: Sequence[Mapping[str, Any]],
        status: Mapping[str, Any],
    ) -> bool:
        """Carry out a TFJob's ``replicas`` edit (:mod:`.scaling`): delete the pods and
        Services at indices it no longer has, create the Services, cluster ConfigMap and
        pods of the indices it gained; under a gang scheduler its PodGroup's ``minMember``
        follows (through the job's objects when pods are created, else here). True when
        pods were created (the pass ends: the next one decides with them)."""
        job, uid = loaded.job, job_obj["metadata"]["uid"]
        ns = job.namespace
        services = await self._delete_surplus(job, uid, pods, tfjob_services=True)
        new = scaling.added(job, services)
        if not new:  # no creation pass: nothing else brings the PodGroup
            await self._follow_pod_group(job, job_obj, loaded.tfjob)
            return False
        # _ensure_job_objects finds the job's PodGroup and moves its minMember first
        logger.info("%s %s/%s scaled up: creating %s", self.flavor.kind, ns, job.name, new)
        await self._ensure_job_objects(loaded, job_obj)
        outcome = await self._create_pods(loaded, job_obj, new, status)
        self.metrics.inc("pods_created", ns, outcome.created)
        return True

    async def _delete_surplus(
        self,
        job: jobspec.StrategyJob,
        uid: str,
        pods: Sequence[Mapping[str, Any]],
        *,
        tfjob_services: bool,
    ) -> list[dict[str, Any]]:
        """Delete the pods at indices the job no longer has (:func:`scaling.surplus`), then,
        for a TFJob (``tfjob_services``), their Services; returns the Services the job had
        (a TFJob's, by metadata; none for a StrategyJob, whose one Service stays)."""
        api, ns = self.api, job.namespace
        services: list[dict[str, Any]] = []
        if tfjob_services:
            selector = f"{flavor.TF_LABEL_JOB_NAME}={job.name}"
            services = await api.list_metadata(api.core_path(ns, "services"), selector)
        doomed = scaling.surplus(job, pods, uid)
        if doomed:
            logger.info("%s %s/%s scaled down: deleting %s", self.flavor.kind, ns, job.name, doomed)
            await self._delete_pods(ns, [n for n, _ in doomed], uids=dict(doomed))
        for name, service_uid in scaling.surplus(job, services, uid):
            await self._delete(api.core_path(ns, "services", name), uid=service_uid)
        return services

    async def _follow_workers(
        self,
        loaded: Loaded,
        job_obj: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        edited: bool,
        events: list[decide.Event],
    ) -> tuple[scaling.Members, list[tuple[str, int]]] | None:
        """A resizable job's workers (:mod:`.scaling`): tell the chief of the workers that
        joined (pod Ready) or left (the spec's count went down) through the members
        ConfigMap, then delete the pods (a TFJob's: and Services) of the replicas that left;
        returns what the chief follows now and the replicas a resize added that need pods
        (a TFJob's Services are looked at only after an edit of its spec, ``edited``).
        None for a TFJob without its members ConfigMap (made by an operator before its chief
        could follow): its edits stay training-operator's (:meth:`_scale`)."""
        job, tfjob = loaded.job, loaded.tfjob
        api, ns, uid = self.api, job.namespace, job_obj["metadata"]["uid"]
        path = api.core_path(ns, "configmaps", children.members_config_map_name(job))
        current = await api.get(path)
        if current is None or observe.controller_uid(current, self.flavor.kind) != uid:
            # made by an operator before resizing, or not yet; or a ConfigMap that is not
            # this job's (never overwritten: the job's objects report it as blocking)
            return None if tfjob is not None else (scaling.initial_members(job), [])
        before = scaling.read_members(current.get("data")) or scaling.initial_members(job)
        added = scaling.added_workers(job, before, pods)
        after = scaling.next_members(job, before, scaling.ready_workers(pods))
        if added:  # the count the pods were made for moves once they all exist
            after = dataclasses.replace(after, replicas=before.replicas)
        if after != before:
            await api.merge_patch(path, {"data": scaling.members_data(job, after, tfjob)})
            if after.workers != before.workers:
                await self._nudge_chief(job, after)
                message = scaling.resized_message(job, before.workers, after.workers)
                logger.info("%s %s/%s: %s", self.flavor.kind, ns, job.name, message)
                events.append(decide.Event("Normal", c.REASON_RESIZED, message))
        # after the chief was told: it sends the workers that left nothing more
        by_service = tfjob is not None and edited
        services = await self._delete_surplus(job, uid, pods, tfjob_services=by_service)
        if scaling.surplus(job, pods, uid):
            await self._follow_pod_group(job, job_obj, tfjob)
        others = scaling.added_others(job, services) if by_service else []
        return after, [*added, *others]

    async def _add_workers(
        self,
        loaded: Loaded,
        job_obj: dict[str, Any],
        added: Sequence[tuple[str, int]],
        status: Mapping[str, Any],
        events: list[decide.Event],
        now: datetime,
    ) -> None:
        """Create the pods of the workers a resize added (with the cluster ConfigMap of the
        new count). One that cannot be created is a Warning Event and is tried again on the
        next pass; the job trains on with the workers it has meanwhile."""
        job = loaded.job
        await self._ensure_job_objects(loaded, job_obj)
        outcome = await self._create_pods(loaded, job_obj, added, status)
        self.metrics.inc("pods_created", job.namespace, outcome.created)
        if outcome.failed:
            first, error = min(outcome.failed, key=lambda f: f[0])
            why = f"StrategyJob {job.name}: resizing: pod {first} not created: {error}"
            events = [*events, decide.Event("Warning", c.REASON_CREATE_FAILED, why)]
        await self._post_events(job_obj, tuple(events), now)

    async def _nudge_chief(self, job: jobspec.StrategyJob, members: scaling.Members) -> None:
        """Annotate the chief's pod with its workers: the kubelet syncs a pod whose
        annotations change, and refreshes its ConfigMap volume then (within a second or two
        instead of its periodic sync). A chief not there (being replaced) reads the file
        when it starts."""
        path = self.api.core_path(job.namespace, "pods", job.pod_name("chief", 0))
        value = ",".join(str(i) for i in members.workers)
        try:
            await self.api.merge_patch(
                path, {"metadata": {"annotations": {scaling.ANNOTATION_MEMBERS: value}}}
            )
        except ApiError as e:
            if e.status != 404:
                raise

    async def _record_history(
        self, job: jobspec.StrategyJob, job_obj: Mapping[str, Any], report: Mapping[str, Any]
    ) -> None:
        """Fold a new report into the job's metric history (:mod:`.history`), before the
        status says it was seen: a pass that stops in between folds it in again, which
        changes nothing. A failure is logged, never the job's: it trains on without it."""
        api, ns = self.api, job.namespace
        name = jobspec.metrics_config_map_name(job.name)
        path = api.core_path(ns, "configmaps", name)
        try:
            current = await api.get(path)
            uid = job_obj["metadata"].get("uid")
            if current is not None and observe.controller_uid(current, self.flavor.kind) != uid:
                logger.warning(  # not this job's: someone else's data, never overwritten
                    "StrategyJob %s/%s: metric history not kept: ConfigMap %s is not this "
                    "job's (delete or rename it)",
                    ns,
                    job.name,
                    name,
                )
                return
            previous = ((current or {}).get("data") or {}).get(jobspec.METRICS_HISTORY_KEY)
            text, warning = history.updated(previous, report)
            if warning:
                logger.warning("StrategyJob %s/%s: %s", ns, job.name, warning)
            if text is None:
                return
            data = {jobspec.METRICS_HISTORY_KEY: text}
            if current is None:
                owner = children.owner_reference(job_obj)
                obj = children.build_metrics_config_map(job, owner, data)
                await self._create_child(api.core_path(ns, "configmaps"), obj, owner["uid"])
            else:
                await api.merge_patch(path, {"data": data})
        except (ApiError, ChildBlockedError) as e:
            logger.warning("StrategyJob %s/%s: metric history not kept: %s", ns, job.name, e)

    async def _follow_pod_group(
        self, job: jobspec.StrategyJob, job_obj: Mapping[str, Any], tfjob: jobspec.TFJob | None
    ) -> None:
        """Under a gang scheduler, the job's PodGroup as its spec now asks (a scale-down
        lowers ``minMember``; a scale-up moves it through the job's objects, before the new
        pods)."""
        scheduler = self.settings.gang_scheduler
        if scheduler is not None:
            owner = children.owner_reference(job_obj)
            group = gang.build_pod_group(job, owner, scheduler, tfjob)
            await self._sync_pod_group(scheduler, group)

    async def _sync_pod_group(self, scheduler: gang.GangScheduler, group: dict[str, Any]) -> None:
        """Patch the job's existing PodGroup where it differs from ``group``, what the job now
        asks for (:func:`gang.pod_group_patch`): a TFJob's ``replicas`` edit moves its
        ``minMember``. A missing one is left to :meth:`_create_pod_group`."""
        meta = group["metadata"]
        path = self.api.group_path(
            scheduler.api_version, meta["namespace"], "podgroups", meta["name"]
        )
        current = await self.api.get(path)
        change = gang.pod_group_patch(current, group) if current is not None else None
        if change is not None:
            await self.api.merge_patch(path, change)

    async def _create_pods(
        self,
        loaded: Loaded,
        job_obj: dict[str, Any],
        replicas: Sequence[tuple[str, int]],
        status: Mapping[str, Any],
    ) -> PodCreation:
        """Create the pods of ``replicas`` as a stream: at most ``max_in_flight`` requests at
        once, each pod built just before its request and dropped after it, so that creating
        a job of 1000 pods holds ``max_in_flight`` of them at a time, never all."""
        job = loaded.job
        owner = children.owner_reference(job_obj)
        pods = children.iter_missing_pods(
            job,
            owner,
            replicas,
            self.settings.gang_scheduler,
            decide.restart_attempt(dict(status)),
            loaded.tfjob,
        )
        grace = self.settings.termination_grace_seconds
        path = self.api.core_path(job.namespace, "pods")
        uid = job_obj["metadata"]["uid"]
        outcome = PodCreation()

        async def create_some() -> None:
            # One shared generator: building a pod never awaits, so each next() hands one
            # pod to one of these loops.
            for pod in pods:
                with_grace_period(pod, grace)
                pod_name = pod["metadata"]["name"]
                try:
                    if await self._create_child(path, pod, uid):
                        outcome.created += 1
                        outcome.created_names.append(pod_name)
                except ChildBlockedError as e:
                    outcome.blocked.append(str(e))
                except StaleChildError:
                    outcome.stale = True
                except Exception as e:  # reported once per pass, retried by the next
                    outcome.failed.append((pod_name, e))
                del pod

        loops = max(1, min(self.settings.max_in_flight, len(replicas)))
        await asyncio.gather(*(create_some() for _ in range(loops)))
        return outcome

    async def _ensure_job_objects(self, loaded: Loaded, job_obj: dict[str, Any]) -> list[str]:
        """The job's headless Service, the ConfigMap its pods read the cluster from, its
        security objects (ServiceAccount, Role, RoleBinding, token Secret, NetworkPolicy) and
        its PodGroup, before its pods: all owned by the job, created once (an existing one of
        this job answers 409 and is kept, so the token stays). Returns what blocks the job:
        objects with its names that it does not control. A TFJob gets a headless Service per
        replica instead of the job's one (:func:`children.build_replica_services`)."""
        job, tfjob = loaded.job, loaded.tfjob
        api, ns = self.api, job.namespace
        owner = children.owner_reference(job_obj)
        rbac, net = "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1"
        token = secrets.token_urlsafe(32)
        services = (
            [children.build_service(job, owner)]
            if tfjob is None
            else children.build_replica_services(tfjob, owner)
        )
        config_map = children.build_cluster_config_map(job, owner, tfjob)
        wanted = [
            *((api.core_path(ns, "services"), service) for service in services),
            (api.core_path(ns, "serviceaccounts"), children.build_service_account(job, owner)),
            (api.core_path(ns, "secrets"), children.build_token_secret(job, owner, token)),
            (api.group_path(net, ns, "networkpolicies"), children.build_network_policy(job, owner)),
            (api.core_path(ns, "configmaps"), config_map),
        ]
        if scaling.resizable(job, tfjob):  # the workers its chief follows, from the start
            initial = scaling.initial_members(job)
            members = children.build_members_config_map(job, owner, initial, tfjob)
            wanted.append((api.core_path(ns, "configmaps"), members))
        uid = job_obj["metadata"]["uid"]
        calls: list[Callable[[], Awaitable[object]]] = [
            functools.partial(self._create_child, p, o, uid) for p, o in wanted
        ]
        # The RoleBinding once its Role exists: the API server lets the operator bind a Role
        # only after checking that it holds the Role's rights, which it reads (absent: 404).
        role = (api.group_path(rbac, ns, "roles"), children.build_role(job, owner))
        bind = children.build_role_binding(job, owner)
        binding = (api.group_path(rbac, ns, "rolebindings"), bind)
        calls.insert(2, functools.partial(self._create_children_in_order, (role, binding), uid))
        scheduler = self.settings.gang_scheduler
        if scheduler is not None:
            group = gang.build_pod_group(job, owner, scheduler, tfjob)
            calls.append(functools.partial(self._create_pod_group, scheduler, group, uid))
        results: list[Any] = []
        for r in await bounded_gather(calls, self.settings.max_in_flight):
            results.extend(r if isinstance(r, list) else [r])  # the Role's pair: two results
        errors = [
            r
            for r in results
            if isinstance(r, BaseException) and not isinstance(r, ChildBlockedError)
        ]
        if errors:  # pods without their ServiceAccount or Secret would not start
            raise errors[0]
        return [str(r) for r in results if isinstance(r, ChildBlockedError)]

    async def _create_children_in_order(
        self, objs: tuple[tuple[str, dict[str, Any]], ...], uid: str
    ) -> list[bool | BaseException]:
        """Create the objects one after the other (:meth:`_create_child` each): a result
        or error per object, as :func:`bounded_gather` gives them. After an error the rest
        are not tried, except after a name held by another object (which still exists)."""
        out: list[bool | BaseException] = []
        for collection, obj in objs:
            try:
                out.append(await self._create_child(collection, obj, uid))
            except ChildBlockedError as e:
                out.append(e)
            except Exception as e:
                out.append(e)
                break
        return out

    async def _create_pod_group(
        self, scheduler: gang.GangScheduler, group: dict[str, Any], uid: str
    ) -> bool:
        """The job's PodGroup; a cluster without the scheduler's API gets an error naming it."""
        path = self.api.group_path(
            scheduler.api_version, group["metadata"]["namespace"], "podgroups"
        )
        try:
            created = await self._create_child(path, group, uid)
            if not created:  # this job's already: a replicas edit may have moved minMember
                await self._sync_pod_group(scheduler, group)
            return created
        except ApiError as e:
            if e.status != 404:
                raise
            raise ApiError(
                404,
                "POST",
                path,
                f"no PodGroup API {scheduler.api_version} in this cluster: install "
                f"{scheduler.name}, or unset the operator's gangScheduler "
                f"(STRATEGYJOB_GANG_SCHEDULER)",
            ) from e

    async def _create_child(self, collection: str, obj: dict[str, Any], uid: str) -> bool:
        """Create one of the job's objects; True when created, False when this job already
        has it. One that an earlier job of the same name left is deleted and the pass retried
        (the garbage collector would remove it from under this job later); one that this job
        does not control at all raises :class:`ChildBlockedError`: it is not the operator's
        to delete, and keeping it would leave the job without it (a pod that never reports
        to this job, a Service that is not the job's headless one)."""
        if await self.api.create(collection, obj):
            return True
        meta = obj["metadata"]
        path = f"{collection}/{meta['name']}"
        existing = await self.api.get_metadata(path)
        what = f"{obj['kind']} {meta['namespace']}/{meta['name']}"
        job_name = meta["ownerReferences"][0]["name"]
        if existing is None or existing["metadata"].get("deletionTimestamp"):
            raise StaleChildError(f"{what} is being deleted; will create it again once it is gone")
        holder = observe.controller_uid(existing, self.flavor.kind)  # the job controlling it
        if holder == uid:
            if obj["kind"] == "Pod" and _relabelled(obj, existing):
                # This job's pod that no longer says which replica it is (relabelled by
                # hand): not one of its replicas any more, but it holds the name.
                await self._delete_pods(
                    meta["namespace"], [meta["name"]], uids={meta["name"]: _uid(existing)}
                )
                raise StaleChildError(
                    f"{what} no longer carries this job's labels; deleted it, and will create "
                    "it again"
                )
            return False
        refs = existing["metadata"].get("ownerReferences") or []
        same_name = any(
            r.get("uid") == holder and r.get("name", job_name) == job_name for r in refs
        )
        if holder is None or not same_name:  # no controller, another kind, another job
            raise ChildBlockedError(_blocker(obj, existing))
        await self._delete(path, uid=_uid(existing))
        raise StaleChildError(
            f"{what} was left by an earlier StrategyJob of the same name; deleted it, and will "
            "create it again"
        )

    async def _remove_stale_pods(
        self, namespace: str, name: str, stale: list[dict[str, Any]]
    ) -> float:
        """Delete what is left of the pods of an earlier job of the same name before this job
        creates any: they hold its pod names, and their later removal would look like failures
        of this job's replicas."""
        live = [p["metadata"]["name"] for p in stale if not p["metadata"].get("deletionTimestamp")]
        logger.info(
            "StrategyJob %s/%s: waiting for %d pods of an earlier job of the same name to go",
            namespace,
            name,
            len(stale),
        )
        uids = {p["metadata"]["name"]: _uid(p) for p in stale}
        await self._delete_pods(namespace, live, grace_seconds=0, uids=uids)
        return STALE_RETRY_SECONDS

    def _note_creation(
        self,
        key: JobKey,
        generation: int,
        plan: decide.Plan,
        failure: outcome.CreateFailure | None,
        now: datetime,
        quota_frees: int,
    ) -> outcome.CreationNote:
        """Note the pass's creation (:func:`outcome.note_creation`): keep the job's back-off
        and log a failure. ``quota_frees``: the namespace's count of quotas freeing room
        when the pass read them; a wait for quota started after one freed room since is
        over at once."""
        freed = self._quota_frees[key[0]] != quota_frees
        previous = self._create_backoff.get(key)
        note = outcome.note_creation(plan, previous, generation, failure, now, freed_since=freed)
        if note.backoff is None:
            self._create_backoff.pop(key, None)
        else:
            self._create_backoff[key] = note.backoff
        if note.message is not None:
            logger.warning("StrategyJob %s/%s: %s", *key[:2], note.message)
        elif failure is not None:
            logger.info(
                "StrategyJob %s/%s: cannot create %s (%s); again in %gs",
                *key[:2],
                failure.what,
                failure.error,
                note.delay,
            )
        return note

    async def _force_delete_lost(
        self,
        namespace: str,
        replicas: Mapping[tuple[str, int], observe.Replica],
        now: datetime,
        events: list[decide.Event],
    ) -> float | None:
        """Force-delete the job's pods that stay terminating on a node that is gone or
        NotReady (:func:`decide.force_deletions`), adding an Event per pod to ``events``;
        returns the seconds until terminating pods need another look (None: never)."""
        lost_after = self.settings.lost_pod_seconds
        overdue, wait = decide.overdue_terminating(replicas, now, lost_after)
        if not overdue:
            return wait
        nodes: dict[str, str] = {}
        for node in sorted({r.node_name for r in overdue if r.node_name}):
            try:
                nodes[node] = observe.node_state(await self.api.get(f"/api/v1/nodes/{node}"))
            except ApiError as e:  # e.g. 403 without the chart's rule: never force-delete
                logger.warning("Cannot read Node %s, so its stuck pods stay: %s", node, e)
        doomed = decide.force_deletions(namespace, overdue, nodes, now)
        for r, event in doomed:
            path = self.api.core_path(namespace, "pods", r.name)
            try:
                if await self._delete(path, grace_seconds=0, uid=r.uid):
                    logger.warning("%s", event.message)
                    events.append(event)
                    self.metrics.inc("pods_deleted", namespace)
            except ApiError as e:
                logger.warning("Force-deleting pod %s/%s failed: %s", namespace, r.name, e)
        if len(doomed) < len(overdue):  # on a Ready (slow) or unreadable node: look again
            again = max(lost_after, LOST_RECHECK_SECONDS)
            wait = again if wait is None else min(wait, again)
        return wait

    async def _delete(
        self, path: str, *, grace_seconds: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete the object at ``path`` only if it is still the one with ``uid`` (a
        precondition the API server checks): never a namesake created since it was read."""
        if uid is None:
            return await self.api.delete(path, grace_seconds=grace_seconds)
        return await self.api.delete(path, grace_seconds=grace_seconds, uid=uid)

    async def _delete_pods(
        self,
        namespace: str,
        names: list[str] | tuple[str, ...],
        grace_seconds: int | None = None,
        uids: dict[str, str | None] | None = None,
    ) -> int:
        """Delete the pods concurrently (bounded), each only if it is still the pod the pass
        saw (``uids``); raise the first failure; how many went."""
        api, uids = self.api, uids or {}
        results = await bounded_gather(
            [
                functools.partial(
                    self._delete,
                    api.core_path(namespace, "pods", n),
                    grace_seconds=grace_seconds,
                    uid=uids.get(n),
                )
                for n in names
            ],
            self.settings.max_in_flight,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return sum(1 for r in results if r is True)

    async def _invalid(
        self, job_obj: dict[str, Any], status: dict[str, Any], problem: str, now: datetime
    ) -> None:
        """A job the API server accepted but jobspec rejects (e.g. a CRD installed without
        its validation rules): fail it once, with the problems as the message."""
        if cond.is_true(status.get("conditions") or [], c.FAILED):
            return None
        ts = decide.timestamp(now)
        conds = cond.set_condition(
            status.get("conditions") or [], c.FAILED, True, c.REASON_INVALID_SPEC, problem, ts
        )
        meta = job_obj["metadata"]
        new = {**status, "conditions": conds, "state": c.FAILED, "completionTime": ts}
        await self.api.merge_patch(
            self.flavor.job_path(meta["namespace"], meta["name"], "status"), {"status": new}
        )
        await self._post_events(
            job_obj, (decide.Event("Warning", c.REASON_INVALID_SPEC, problem),), now
        )
        self.metrics.inc("jobs_failed", meta["namespace"])
        return None

    async def _post_events(
        self, job_obj: dict[str, Any], events: tuple[decide.Event, ...], now: datetime
    ) -> None:
        ts = decide.timestamp(now)
        for event in events:
            try:
                reason = self.flavor.reason(event.reason)
                message = self.flavor.message(event.message, job_obj["metadata"]["name"])
                await self.api.post_event(job_obj, event.type, reason, message, ts)
            except ApiError as e:  # an Event is worth a log line, not a failed pass
                logger.warning("Posting event %s failed: %s", event.reason, e)
