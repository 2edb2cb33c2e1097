"""Each job's reconcile loop, and what wakes it: watch events only wake a job's loop
(:func:`wake`), so passes of one job never overlap, a burst of 1000 pod events costs a few
passes, and deadlines and TTLs fire on time because the loop sleeps exactly until the next one
is due. The loops and their wakeups live in the operator's state (:mod:`.state`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from strategyjob_operator import constants as c
from strategyjob_operator import state
from strategyjob_operator.flavor import FLAVORS, STRATEGYJOB, Flavor
from strategyjob_operator.reconcile import JobGone, Reconciler
from strategyjob_operator.state import JobRef, OperatorState
from strategyjob_operator.stopping import forbidden_message, give_up, is_rbac_refusal

logger = logging.getLogger("strategyjob_operator")

#: Passes of one job in a row that the API server refuses (HTTP 403) before the operator
#: gives up: its RBAC was taken away after the startup check (about 7 s with the backoff;
#: one refusal may be an API server restarting during an upgrade).
FORBIDDEN_PASSES = 4


class Stopped(Protocol):
    """kopf's ``DaemonStopped``: true once the operator stops this daemon."""

    def __bool__(self) -> bool: ...


def wake(namespace: str | None, name: str | None, plural: str | None = None) -> None:
    """Wake the loop of job ``name`` (of each kind served, unless ``plural`` says which)."""
    wakeups = state.current().wakeups
    plurals = [plural] if plural else [f.plural for f in FLAVORS.values()]
    for p in plurals:
        event = wakeups.get((p, namespace or "", name or ""))
        if event is not None:
            event.set()


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


def job_changed(flavor: Flavor, namespace: str | None, name: str, uid: str, type: str) -> None:
    """A job's watch event: wake its loop, which ends when the event is the job's deletion."""
    if namespace is None:  # kopf's type allows cluster-scoped objects; jobs are not
        return
    daemons, key = state.current().daemons, (flavor.plural, namespace, name)
    if type == "DELETED" and daemons.get(key) == uid:
        del daemons[key]  # its daemon ends (no finalizer makes kopf stop it)
    wake(namespace, name, flavor.plural)


def _reconciler(current: OperatorState, flavor: Flavor) -> Reconciler | None:
    return current.reconciler if flavor is STRATEGYJOB else current.tfjob_reconciler


async def run_loop(
    flavor: Flavor, namespace: str | None, name: str, uid: str, stopped: Stopped
) -> None:
    """The job's reconcile loop, alive while the job exists (and this replica leads). It
    ends itself when the job is deleted: kopf stops a daemon only for an object that has
    its finalizer, and StrategyJobs carry none (``handlers.no_finalizer_for_daemons``). On
    the job's DELETED event, or when a pass reads the job gone (the event lost: a watch that
    reconnected), it ends and the reconciler forgets the job."""
    if namespace is None:  # kopf's type allows cluster-scoped objects; jobs are not
        return
    current, key = state.current(), (flavor.plural, namespace, name)
    current.daemons[key] = uid  # a namesake's older daemon sees it and ends, once woken:
    older = current.wakeups.get(key)
    if older is not None:
        older.set()
    event = current.wakeups[key] = asyncio.Event()
    event.set()
    gone = False
    try:
        gone = await _passes(current, flavor, key, uid, event, stopped)
    finally:
        if current.daemons.get(key) == uid:
            del current.daemons[key]
        if current.wakeups.get(key) is event:  # else it is a namesake's daemon's
            del current.wakeups[key]
        reconciler = _reconciler(current, flavor)
        if gone and reconciler is not None:
            reconciler.forget(namespace, name, uid)


async def _passes(
    current: OperatorState,
    flavor: Flavor,
    key: JobRef,
    uid: str,
    event: asyncio.Event,
    stopped: Stopped,
) -> bool:
    """Pass over the job each time it is woken or a pass is due, until it is gone (True) or
    the operator stops it (False)."""
    _, namespace, name = key
    delay: float | None = None
    errors = ErrorBackoff(current.settings.max_error_backoff)
    while not stopped:
        timeout = delay if delay is not None else current.settings.idle_check_seconds
        timed = not await _woken(event, timeout)
        if current.daemons.get(key) != uid:  # deleted, or replaced by a namesake
            return True
        event.clear()
        reconciler = _reconciler(current, flavor)
        if reconciler is None:  # not logged in yet
            delay = 1.0
            continue
        if timed:
            reconciler.metrics.inc("timed_passes", namespace)
        started = asyncio.get_running_loop().time()
        try:
            delay = await reconciler.reconcile(namespace, name, uid)
            errors = ErrorBackoff(current.settings.max_error_backoff)
        except JobGone:  # its DELETED event missed, or not yet here
            logger.info("%s %s/%s is gone; its reconcile loop ends.", flavor.kind, *key[1:])
            return True
        except Exception as e:  # keep the loop alive; the next pass retries
            delay = errors.backoff(e)
            if delay is None:  # RBAC taken away: no pass can work
                give_up(forbidden_message(e))
                return False
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
        await asyncio.sleep(max(current.settings.min_reconcile_interval, took))
    return False


async def _woken(event: asyncio.Event, timeout: float | None) -> bool:
    """Whether ``event`` was set within ``timeout`` seconds (None: waits for it)."""
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout)
    except TimeoutError:
        return False
    return True


@dataclass
class ErrorBackoff:
    """A job's passes that failed in a row: the wait before the next, and when to give up."""

    #: The longest wait (the settings' ``max_error_backoff``).
    longest: float
    failed: int = 0
    forbidden: int = 0

    def backoff(self, error: BaseException) -> float | None:
        """Seconds until the next pass after ``error`` (doubling up to :attr:`longest`);
        None after :data:`FORBIDDEN_PASSES` RBAC refusals in a row: the operator gives up."""
        self.forbidden = self.forbidden + 1 if is_rbac_refusal(error) else 0
        if self.forbidden >= FORBIDDEN_PASSES:
            return None
        self.failed += 1
        # the exponent capped: a float of 2**1024 would overflow after a day of failures
        return min(self.longest, 0.5 * 2.0 ** min(self.failed, 30))
