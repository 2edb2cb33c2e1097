"""kopf's handlers (importing this module registers them): one daemon per StrategyJob runs its
reconcile loop (:mod:`.job_loop`); watch events on the job and on its pods only wake that
loop. A pod's event wakes the job its label names and the job that controls it (they differ
for a pod relabelled by hand), and an active job is passed over every
``STRATEGYJOB_RESYNC_SECONDS`` (60) anyway, to notice what no event reported
(bench/bench_operator.py --resync measures the cost). What the handlers share is the
operator's state (:mod:`.state`); the settings come from the environment at startup
(:mod:`.settings`), the credentials from kopf's login (:mod:`.cluster_login`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from strategyjob_operator import cluster_login, job_loop, metrics, quota, state
from strategyjob_operator import constants as c
from strategyjob_operator.flavor import STRATEGYJOB, TFJOB
from strategyjob_operator.kube import LIST_PAGE_SIZE, Credentials, KubeApi
from strategyjob_operator.pod_cache import PodCache
from strategyjob_operator.reconcile import Reconciler
from strategyjob_operator.settings import settings_from_env
from strategyjob_operator.stopping import give_up, give_up_on_kopfs_forbidden_requests, one_line

logger = logging.getLogger("strategyjob_operator")

#: The finalizer earlier versions put on every StrategyJob (kopf's, for its daemons). None is
#: needed: a job's children go by garbage collection (owner references) and nothing is due
#: before a job goes, so ``kubectl delete`` and ``helm uninstall`` never wait for the
#: operator. kopf still knows its name, to take it off the jobs that carry it.
FINALIZER = f"{c.GROUP}/operator"


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    current = state.current()
    try:
        current.settings = settings_from_env()
    except ValueError as e:  # a bad setting: say which, and stop (kopf alone would hang)
        give_up(str(e))
        raise kopf.PermanentError(str(e)) from None
    give_up_on_kopfs_forbidden_requests()
    settings.posting.enabled = False  # the reconciler posts its own Events, not log lines
    settings.persistence.finalizer = FINALIZER
    # Only the job's pods, filtered by the API server.
    settings.watching.label_selectors[lambda r: r.group == "" and r.plural == "pods"] = (
        c.LABEL_JOB_NAME
    )
    # kopf lists what exists before it watches: a page at a time, so that an operator started
    # beside large jobs (up to 1000 pods each) never holds them all.
    settings.watching.chunk_size = LIST_PAGE_SIZE
    if current.settings.gang_scheduler is not None:
        watch_resource_quotas()
    if current.settings.serve_tfjobs:
        serve_tfjobs()
    port = current.settings.metrics_port
    if port is not None and current.metrics_server is None:
        current.metrics_server = metrics.serve(port)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own login; the reconciler's client reuses the same credentials, and logs in
    the same way again when the API server refuses them (an expired token)."""
    current = state.current()
    try:
        info = cluster_login.connection_info(**kwargs)
        if info is None:
            return None
        creds = Credentials.from_kopf(info)
        if current.reconciler is None:
            _start_reconcilers(current, creds, kwargs)
        else:  # kopf logs in again when its own requests are refused
            current.reconciler.api.use(creds)
    except Exception as e:  # a kubeconfig or exec plugin broken since startup: final
        message = f"Cannot use the cluster credentials: {one_line(e)}"
        give_up(message)
        raise kopf.PermanentError(message) from e
    return info


def _start_reconcilers(
    current: state.OperatorState, creds: Credentials, login_kwargs: dict[str, Any]
) -> None:
    """The reconcilers (of StrategyJobs; of TFJobs when served), sharing one API client and
    one pod cache."""
    settings = current.settings
    api = KubeApi(
        creds,
        max_in_flight=settings.max_in_flight,
        refresh=lambda: asyncio.to_thread(cluster_login.credentials, login_kwargs),
    )
    cache = PodCache(api)
    current.reconciler = Reconciler(api, settings, pod_cache=cache)
    if settings.serve_tfjobs:
        current.tfjob_reconciler = Reconciler(api, settings, pod_cache=cache, flavor=TFJOB)


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    """Close the API client and the metrics server, and raise the stop flag: after SIGTERM
    or SIGINT kopf leaves its task that waits for that flag pending, then waits 5 s for it
    (a "hung" task) before it exits, which a rolling upgrade would wait for."""
    current = state.current()
    if current.reconciler is not None:
        await current.reconciler.api.close()
    if current.metrics_server is not None:
        current.metrics_server.shutdown()
        current.metrics_server = None
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # give_up raced us
        if not current.stop_flag.done():
            current.stop_flag.set_result(None)


# No label filter here: the watch already selects pods with the job-name label, and the
# event of a pod that lost it (the API server sends it as a deletion) must still wake the
# job that controls it.
@kopf.on.event("", "v1", "pods")
async def pod_changed(
    *,
    namespace: str | None,
    labels: Mapping[str, str],
    meta: kopf.Meta,
    body: kopf.Body,
    type: str | None,
    **_: Any,
) -> None:
    reconciler = state.current().reconciler
    if reconciler is not None and reconciler.pod_cache is not None:
        reconciler.pod_cache.watched(type, body)  # before the wake: the pass may use it
    for name in job_loop.jobs_to_wake(labels or {}, meta):
        job_loop.wake(namespace, name)


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def job_changed(*, namespace: str | None, name: str, uid: str, type: str, **_: Any) -> None:
    job_loop.job_changed(STRATEGYJOB, namespace, name, uid, type)


async def tfjob_changed(*, namespace: str | None, name: str, uid: str, type: str, **_: Any) -> None:
    job_loop.job_changed(TFJOB, namespace, name, uid, type)


@kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, cancellation_timeout=1.0)
async def run_job(
    *, namespace: str | None, name: str, uid: str, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """A StrategyJob's reconcile loop (:func:`job_loop.run_loop`)."""
    await job_loop.run_loop(STRATEGYJOB, namespace, name, uid, stopped)


async def run_tfjob(
    *, namespace: str | None, name: str, uid: str, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """A TFJob's reconcile loop (:func:`job_loop.run_loop`), when the operator serves TFJobs."""
    await job_loop.run_loop(TFJOB, namespace, name, uid, stopped)


# --- ResourceQuotas: a gang that waits for quota starts as soon as one frees room ------------


async def quota_changed(
    *, namespace: str | None, name: str, body: kopf.Body, type: str | None, **_: Any
) -> None:
    """A ResourceQuota's event (watched only with a gang scheduler, see
    :func:`watch_resource_quotas`): when it freed room (:func:`quota.quota_freed`), wake the
    namespace's jobs that wait for quota, past their creation back-off (up to 5 min). It is
    the quota's own update that wakes them, not the deletion of the pods that held the room:
    the quota controller updates ``status.used`` after those, and a check before it would
    still see the old usage."""
    if namespace is None:
        return
    current, key = state.current(), (namespace, name)
    before = current.quotas.get(key)
    after = None if type == "DELETED" else quota.quota_room(body)
    if after is None:
        current.quotas.pop(key, None)
    else:
        current.quotas[key] = after
    reconciler = current.reconciler
    if reconciler is None or not quota.quota_freed(before, after):
        return
    woken = reconciler.wake_quota_waiters(namespace)
    if woken:
        logger.info(
            "ResourceQuota %s/%s freed room: waking %s, waiting for quota",
            namespace,
            name,
            ", ".join(woken),
        )
    for job in woken:
        job_loop.wake(namespace, job)


# --- Registrations made at startup, and kopf's registry (this module reaches into it) --------


def _watches_with(registry: kopf.OperatorRegistry, handler: Any) -> bool:
    """Whether ``handler`` is already registered as a watch-event handler (registered once)."""
    return any(h.fn is handler for h in registry._watching.get_all_handlers())


def watch_resource_quotas(registry: kopf.OperatorRegistry | None = None) -> None:
    """Register :func:`quota_changed` (once). Only an operator with a gang scheduler watches
    ResourceQuotas (from :func:`configure`, before kopf looks at what to watch): only then
    does the chart grant it, and a watch the API server forbids stops the operator
    (:class:`stopping.GiveUpOnForbidden`)."""
    registry = registry or kopf.get_default_registry()
    if _watches_with(registry, quota_changed):
        return
    kopf.on.event("", "v1", "resourcequotas", registry=registry)(quota_changed)


def serve_tfjobs(registry: kopf.OperatorRegistry | None = None) -> None:
    """Watch Kubeflow TFJobs and run a loop per TFJob (once), as for StrategyJobs: only with
    ``STRATEGYJOB_SERVE_TFJOBS=true`` (from :func:`configure`, before kopf looks at what to
    watch), so that an operator beside Kubeflow's training-operator leaves TFJobs to it."""
    registry = registry or kopf.get_default_registry()
    if _watches_with(registry, tfjob_changed):
        return
    group, version, plural = TFJOB.group, TFJOB.version, TFJOB.plural
    kopf.on.event(group, version, plural, registry=registry)(tfjob_changed)
    kopf.daemon(group, version, plural, cancellation_timeout=1.0, registry=registry)(run_tfjob)
    no_finalizer_for_daemons(registry)


def no_finalizer_for_daemons(registry: Any = None) -> None:
    """kopf puts its finalizer on every object that a daemon serves, so that it can stop the
    daemon before the object goes: then ``kubectl delete`` of a StrategyJob hangs while the
    operator is down or uninstalled. :func:`run_job` ends itself instead, and the jobs'
    children go by garbage collection, so the daemon is registered as needing none; kopf
    then also takes the finalizer off jobs that earlier versions gave one (the upgrade)."""
    spawning = (registry or kopf.get_default_registry())._spawning
    for i, handler in enumerate(spawning._handlers):
        if handler.requires_finalizer:
            spawning._handlers[i] = dataclasses.replace(handler, requires_finalizer=False)


no_finalizer_for_daemons()
