"""kopf wiring: one daemon per StrategyJob runs its reconcile loop; watch events on the
job and on its pods only wake that loop. So passes of one job never overlap, a burst of
1000 pod events costs a few passes, and deadlines and TTLs fire on time because the loop
sleeps exactly until the next one is due. A pod's event wakes the job its label names and
the job that controls it (they differ for a pod relabelled by hand), and an active job is
passed over every ``STRATEGYJOB_RESYNC_SECONDS`` (60) anyway, to notice what no event
reported (bench/bench_operator.py --resync measures the cost)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

import kopf

from strategyjob_operator import constants as c
from strategyjob_operator import metrics, quota
from strategyjob_operator.flavor import FLAVORS, STRATEGYJOB, TFJOB, Flavor
from strategyjob_operator.kube import LIST_PAGE_SIZE, ApiError, Credentials, KubeApi
from strategyjob_operator.pod_cache import PodCache
from strategyjob_operator.reconcile import (
    JobGone,
    OperatorSettings,
    Reconciler,
)
from strategyjob_operator.settings import settings_from_env

logger = logging.getLogger("strategyjob_operator")

#: Longest wait between passes after an unexpected error.
MAX_ERROR_BACKOFF = 60.0
#: Passes of one job in a row that the API server refuses (HTTP 403) before the operator
#: gives up: its RBAC was taken away after the startup check (about 7 s with the backoff;
#: one refusal may be an API server restarting during an upgrade).
FORBIDDEN_PASSES = 4
#: The finalizer earlier versions put on every StrategyJob (kopf's, for its daemons). None is
#: needed: a job's children go by garbage collection (owner references) and nothing is due
#: before a job goes, so ``kubectl delete`` and ``helm uninstall`` never wait for the
#: operator. kopf still knows its name, to take it off the jobs that carry it.
FINALIZER = f"{c.GROUP}/operator"


#: A job's loop: (plural, namespace, name).
JobRef = tuple[str, str, str]


class _State:
    """What the handlers share within one operator process."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.reconciler: Reconciler | None = None
        #: The reconciler of TFJobs (``STRATEGYJOB_SERVE_TFJOBS``), sharing the API client
        #: and the pod cache with :attr:`reconciler`; None when TFJobs are not served.
        self.tfjob_reconciler: Reconciler | None = None
        #: Per (plural, namespace, name): a StrategyJob and a TFJob may share a name.
        self.wakeups: dict[JobRef, asyncio.Event] = {}
        #: The uid of the job whose daemon runs, per (plural, namespace, name): the daemon of
        #: a job that was deleted, or replaced by a namesake, sees it is gone and ends.
        self.daemons: dict[JobRef, str] = {}
        self.metrics_server: Any = None
        #: Set to stop ``kopf.run`` (see :func:`give_up`); ``__main__`` passes it as stop_flag.
        self.stop_flag: concurrent.futures.Future[None] = concurrent.futures.Future()
        #: Why the operator gave up, for ``__main__`` to print once kopf has stopped.
        self.fatal: str | None = None
        #: The room of each ResourceQuota seen, per (namespace, name) (:func:`quota_changed`).
        self.quotas: dict[tuple[str, str], dict[str, Any]] = {}


STATE = _State()


def give_up(message: str) -> None:
    """Stop the operator with ``message``: kopf waits forever for credentials when its login
    fails, so an operator whose kubeconfig broke would hang without a word."""
    logger.error(message)
    STATE.fatal = STATE.fatal or message
    if not STATE.stop_flag.done():
        STATE.stop_flag.set_result(None)


#: The authorizer's refusal (RBAC), not an admission webhook's 403 about one object.
_RBAC_REFUSAL = re.compile(r'is forbidden: User ".*" cannot \S+ resource')


def is_rbac_refusal(error: BaseException) -> bool:
    """A 403 from the API server's authorizer: the account may not make this call at all."""
    status = error.status if isinstance(error, ApiError) else getattr(error, "status", None)
    return status == 403 and _RBAC_REFUSAL.search(str(error)) is not None


def forbidden_message(error: BaseException) -> str:
    """Why the operator stops when the API server forbids what it needs after startup."""
    detail = error.detail if isinstance(error, ApiError) else one_line(error)
    return (
        f"The API server forbids a request the operator needs (HTTP 403: {detail}): "
        "its account lost RBAC since it started; give it the Helm chart's ClusterRole and Roles "
        "back, then restart the operator."
    )


class _GiveUpOnForbidden(logging.Handler):
    """kopf logs a watch or its peering that the API server forbids (after its retries) and
    goes on without it, so the operator would serve no job, silently: stop it instead."""

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if record.levelno >= logging.ERROR and error is not None and is_rbac_refusal(error):
            give_up(forbidden_message(error))


def give_up_on_kopfs_forbidden_requests() -> None:
    """Install :class:`_GiveUpOnForbidden` on kopf's loggers (once)."""
    kopf_logger = logging.getLogger("kopf")
    if not any(isinstance(h, _GiveUpOnForbidden) for h in kopf_logger.handlers):
        kopf_logger.addHandler(_GiveUpOnForbidden())


def wake(namespace: str | None, name: str | None, plural: str | None = None) -> None:
    """Wake the loop of job ``name`` (of each kind served, unless ``plural`` says which)."""
    plurals = [plural] if plural else [f.plural for f in FLAVORS.values()]
    for p in plurals:
        event = STATE.wakeups.get((p, namespace or "", name or ""))
        if event is not None:
            event.set()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    try:
        STATE.settings = settings_from_env()
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
    if STATE.settings.gang_scheduler is not None:
        watch_resource_quotas()
    if STATE.settings.serve_tfjobs:
        serve_tfjobs()
    port = STATE.settings.metrics_port
    if port is not None and STATE.metrics_server is None:
        STATE.metrics_server = metrics.serve(port)


def _authenticates(info: kopf.ConnectionInfo) -> bool:
    return bool(
        info.token
        or info.certificate_path
        or info.certificate_data
        or (info.username and info.password)
    )


def connection_info(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's logins, most direct first: the pod's ServiceAccount; the kubeconfig as written
    (token, CA and client certificate and key as files or as base64 data, basic auth); and
    for a kubeconfig user whose credentials come from a program (an exec plugin, as GKE, EKS
    and AKS write them, an auth provider, a tokenFile), the kubernetes client library, which
    runs it."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None and not _authenticates(info):
        info = kopf.login_via_client(**kwargs) or info
        if not _authenticates(info):  # the client library logs a failed exec plugin, no more
            raise kopf.LoginError(
                f"the kubeconfig's user for {info.server} has no credentials, or its exec "
                "plugin or auth provider gave none (it failed: see the lines above)"
            )
    return info


def _credentials(kwargs: dict[str, Any]) -> Credentials | None:
    info = connection_info(**kwargs)
    return None if info is None else Credentials.from_kopf(info)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own login; the reconciler's client reuses the same credentials, and logs in
    the same way again when the API server refuses them (an expired token)."""
    try:
        info = connection_info(**kwargs)
        if info is None:
            return None
        creds = Credentials.from_kopf(info)
        if STATE.reconciler is None:
            api = KubeApi(
                creds,
                max_in_flight=STATE.settings.max_in_flight,
                refresh=lambda: asyncio.to_thread(_credentials, kwargs),
            )
            cache = PodCache(api)
            STATE.reconciler = Reconciler(api, STATE.settings, pod_cache=cache)
            if STATE.settings.serve_tfjobs:
                STATE.tfjob_reconciler = Reconciler(
                    api, STATE.settings, pod_cache=cache, flavor=TFJOB
                )
        else:  # kopf logs in again when its own requests are refused
            STATE.reconciler.api.use(creds)
    except Exception as e:  # a kubeconfig or exec plugin broken since startup: final
        message = f"Cannot use the cluster credentials: {one_line(e)}"
        give_up(message)
        raise kopf.PermanentError(message) from e
    return info


def one_line(error: BaseException) -> str:
    """An error as one line: its type when its text says nothing on its own."""
    text = " ".join(str(error).split())
    if isinstance(error, KeyError) or not text:
        return f"{type(error).__name__} {text}".strip()
    return text


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    """Close the API client and the metrics server, and raise the stop flag: after SIGTERM
    or SIGINT kopf leaves its task that waits for that flag pending, then waits 5 s for it
    (a "hung" task) before it exits, which a rolling upgrade would wait for."""
    if STATE.reconciler is not None:
        await STATE.reconciler.api.close()
    if STATE.metrics_server is not None:
        STATE.metrics_server.shutdown()
        STATE.metrics_server = None
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # give_up raced us
        if not STATE.stop_flag.done():
            STATE.stop_flag.set_result(None)


def jobs_to_wake(labels: Mapping[str, str], meta: Mapping[str, Any] | None) -> set[str]:
    """The jobs a pod event concerns: the one its label names and the job (StrategyJob or
    TFJob) that controls it. They differ for a pod relabelled by hand: the job that lost it must
    notice, and the one whose name it now carries must see that it is not its own."""
    names = {labels.get(c.LABEL_JOB_NAME) or ""}
    for ref in (meta or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in FLAVORS:
            names.add(ref.get("name") or "")
    names.discard("")
    return names


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
    reconciler = STATE.reconciler
    if reconciler is not None and reconciler.pod_cache is not None:
        reconciler.pod_cache.watched(type, body)  # before the wake: the pass may use it
    for name in jobs_to_wake(labels or {}, meta):
        wake(namespace, name)


def _job_changed(flavor: Flavor, namespace: str | None, name: str, uid: str, type: str) -> None:
    if namespace is None:  # kopf's type allows cluster-scoped objects; jobs are not
        return
    key = (flavor.plural, namespace, name)
    if type == "DELETED" and STATE.daemons.get(key) == uid:
        del STATE.daemons[key]  # its daemon ends (no finalizer makes kopf stop it)
    wake(namespace, name, flavor.plural)


@kopf.on.event(c.GROUP, c.VERSION, c.PLURAL)
async def job_changed(*, namespace: str | None, name: str, uid: str, type: str, **_: Any) -> None:
    _job_changed(STRATEGYJOB, namespace, name, uid, type)


async def tfjob_changed(*, namespace: str | None, name: str, uid: str, type: str, **_: Any) -> None:
    _job_changed(TFJOB, namespace, name, uid, type)


@kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, cancellation_timeout=1.0)
async def run_job(
    *, namespace: str | None, name: str, uid: str, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """A StrategyJob's reconcile loop (:func:`_run_loop`)."""
    await _run_loop(STRATEGYJOB, namespace, name, uid, stopped)


async def run_tfjob(
    *, namespace: str | None, name: str, uid: str, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """A TFJob's reconcile loop (:func:`_run_loop`), when the operator serves TFJobs."""
    await _run_loop(TFJOB, namespace, name, uid, stopped)


def _reconciler(flavor: Flavor) -> Reconciler | None:
    return STATE.reconciler if flavor is STRATEGYJOB else STATE.tfjob_reconciler


async def _run_loop(
    flavor: Flavor, namespace: str | None, name: str, uid: str, stopped: kopf.DaemonStopped
) -> None:
    """The job's reconcile loop, alive while the job exists (and this replica leads). It
    ends itself when the job is deleted: kopf stops a daemon only for an object that has
    its finalizer, and StrategyJobs carry none (:func:`no_finalizer_for_daemons`). On the
    job's DELETED event, or when a pass reads the job gone (the event lost: a watch that
    reconnected), it ends and the reconciler forgets the job."""
    if namespace is None:  # kopf's type allows cluster-scoped objects; jobs are not
        return
    key = (flavor.plural, namespace, name)
    STATE.daemons[key] = uid  # a namesake's older daemon sees it and ends, once woken:
    older = STATE.wakeups.get(key)
    if older is not None:
        older.set()
    event = STATE.wakeups[key] = asyncio.Event()
    event.set()
    delay: float | None = None
    errors = forbidden = 0
    gone = False
    try:
        while not stopped:
            timed = False
            try:
                timeout = delay if delay is not None else STATE.settings.idle_check_seconds
                await asyncio.wait_for(event.wait(), timeout=timeout)
            except TimeoutError:
                timed = True
            if STATE.daemons.get(key) != uid:  # deleted, or replaced by a namesake
                gone = True
                return
            event.clear()
            reconciler = _reconciler(flavor)
            if reconciler is None:  # not logged in yet
                delay = 1.0
                continue
            if timed:
                reconciler.metrics.inc("timed_passes", namespace)
            started = asyncio.get_running_loop().time()
            try:
                delay = await reconciler.reconcile(namespace, name, uid)
                errors = forbidden = 0
            except JobGone:  # its DELETED event missed, or not yet here
                logger.info("%s %s/%s is gone; its reconcile loop ends.", flavor.kind, *key[1:])
                gone = True
                return
            except Exception as e:  # keep the loop alive; the next pass retries
                forbidden = forbidden + 1 if is_rbac_refusal(e) else 0
                if forbidden >= FORBIDDEN_PASSES:  # RBAC taken away: no pass can work
                    give_up(forbidden_message(e))
                    return
                errors += 1
                delay = min(MAX_ERROR_BACKOFF, 0.5 * 2**errors)
                logger.warning(
                    "Reconciling %s %s/%s failed (%s); retrying in %.1fs.",
                    flavor.kind,
                    namespace,
                    name,
                    e,
                    delay,
                )
            # a job whose passes are long (1000 pods) rests as long as its last pass took:
            # while its pods keep changing it takes at most half the operator's time
            took = asyncio.get_running_loop().time() - started
            await asyncio.sleep(max(STATE.settings.min_reconcile_interval, took))
    finally:
        if STATE.daemons.get(key) == uid:
            del STATE.daemons[key]
        if STATE.wakeups.get(key) is event:  # else it is a namesake's daemon's
            del STATE.wakeups[key]
        reconciler = _reconciler(flavor)
        if gone and reconciler is not None:
            reconciler.forget(namespace, name, uid)


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
    key = (namespace, name)
    before = STATE.quotas.get(key)
    after = None if type == "DELETED" else quota.quota_room(body)
    if after is None:
        STATE.quotas.pop(key, None)
    else:
        STATE.quotas[key] = after
    reconciler = STATE.reconciler
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
        wake(namespace, job)


def _watches_with(registry: kopf.OperatorRegistry, handler: Any) -> bool:
    """Whether ``handler`` is already registered as a watch-event handler (registered once)."""
    return any(h.fn is handler for h in registry._watching.get_all_handlers())


def watch_resource_quotas(registry: kopf.OperatorRegistry | None = None) -> None:
    """Register :func:`quota_changed` (once). Only an operator with a gang scheduler watches
    ResourceQuotas (from :func:`configure`, before kopf looks at what to watch): only then
    does the chart grant it, and a watch the API server forbids stops the operator
    (:class:`_GiveUpOnForbidden`)."""
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
