"""The operator's decisions, as a pure function of the job, its status, its pods and
the time: :func:`decide` returns a :class:`Plan` (the new status, the pods to delete and
to create, the Events to post) and the reconciler carries it out.

Failure handling knows the strategy. Collective strategies (every strategy but
ParameterServerStrategy) cannot survive losing one replica, so a retryable failure
restarts the whole job. Under ParameterServerStrategy a failed worker or evaluator is
recreated alone, and a failed chief or ps restarts the job. Every restart is counted
against ``runPolicy.backoffLimit``, except one whose root cause is a disruption (the
cluster preempted, evicted or drained a pod: its DisruptionTarget condition), which is
not the program's failure: such a restart happens whatever the restart policy, is
counted in ``status.preemptions`` instead (as Kubernetes Jobs' podFailurePolicy
``Ignore`` on DisruptionTarget), and its condition and Event say so. An evaluator never
fails the job: it is recreated alone (per its restart policy, at most ``backoffLimit``
times, not counted against the job's budget), then only reported.

A replica's outcome is its training container's exit, remembered in the status
(``completedIndexes``) so that a finished pod deleted later is neither recreated nor a
failure. Pods that cannot start (an image that does not pull, a missing Secret, no node
that fits) are named in the Stalled condition and one Warning Event per cause, and fail
the job after ``runPolicy.pendingTimeoutSeconds``.

Node failure: a pod in phase Unknown (its node unreachable) fails its replica after the
operator's lost-pod timeout, and a deleted pod that stays terminating that long past its
grace period on a node that is gone or NotReady is force-deleted (:func:`force_deletions`),
so a restart never waits forever for a kubelet that is gone. What the API server refuses to
create is reported in the CreateFailed condition and backed off (:func:`after_create_failure`).

The decision is split by concern, each module pure functions on plain data: :mod:`.plan` (what a
decision returns, status times and counters), :mod:`.draft` (the status a decision builds, how a
job ends), :mod:`.replica_status` (``replicaStatuses``, finished indices), :mod:`.failures`
(restart policy, failures, restarts), :mod:`.stalls` (pods that cannot start),
:mod:`.lost_pods` (node failure), :mod:`.finished_job` (cleanup and TTL) and
:mod:`.create_backoff` (refused creations). This module joins them; the names the reconciler
and the tests use are importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.create_backoff import (
    CREATE_BACKOFF_MAX_SECONDS,
    CREATE_BACKOFF_SECONDS,
    CREATE_PERMANENT_RETRY_SECONDS,
    CreateBackoff,
    after_create_failure,
    create_failed_message,
    create_hold,
    permanent_create_error,
    quota_waiters,
    released,
    with_create_failure,
)
from strategyjob_operator.draft import Draft
from strategyjob_operator.failures import (
    OPTIONAL_TYPES,
    Failure,
    decide_evaluators,
    decide_failures,
    describe_disruption,
    find_failures,
    is_retryable,
)
from strategyjob_operator.finished_job import decide_finished
from strategyjob_operator.lost_pods import (
    DEFAULT_LOST_POD_SECONDS,
    force_deletions,
    lost_seconds_left,
    overdue_terminating,
)
from strategyjob_operator.observe import Replica
from strategyjob_operator.plan import (
    Action,
    Event,
    Plan,
    add_seconds,
    as_count,
    parse_time,
    seconds_since,
    timestamp,
)
from strategyjob_operator.replica_status import (
    FinishedReplicas,
    finished_replicas,
    forget_finished,
    format_indexes,
    parse_indexes,
    replica_counts,
    restart_attempt,
)
from strategyjob_operator.stalls import (
    STUCK_NAMED,
    cannot_start,
    first_names,
    report_stalled,
    stuck_cause,
)

#: What the reconciler, the handlers and the tests import from here.
__all__ = [
    "CREATE_BACKOFF_MAX_SECONDS",
    "CREATE_BACKOFF_SECONDS",
    "CREATE_PERMANENT_RETRY_SECONDS",
    "DEFAULT_LOST_POD_SECONDS",
    "STUCK_NAMED",
    "Action",
    "CreateBackoff",
    "Event",
    "Failure",
    "Plan",
    "after_create_failure",
    "create_failed_message",
    "create_hold",
    "decide",
    "describe_disruption",
    "force_deletions",
    "format_indexes",
    "is_retryable",
    "overdue_terminating",
    "parse_indexes",
    "parse_time",
    "permanent_create_error",
    "quota_waiters",
    "released",
    "restart_attempt",
    "seconds_since",
    "timestamp",
    "with_create_failure",
]

logger = logging.getLogger("strategyjob_operator")


def decide(
    job: jobspec.StrategyJob,
    generation: int,
    status: Mapping[str, Any],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
    *,
    lost_pod_seconds: float = DEFAULT_LOST_POD_SECONDS,
    optional_types: tuple[str, ...] = OPTIONAL_TYPES,
    reforms: bool = False,
    joining: frozenset[tuple[str, int]] = frozenset(),
) -> Plan:
    """The next step for ``job``, given its current ``status``, the pods that exist
    (``replicas``) and the time ``now``. Pure: the caller carries the plan out.
    ``lost_pod_seconds``: how long a pod may be in phase Unknown before its replica fails.
    ``reforms``: a change of the worker count re-forms the job (:func:`_reform`).
    ``joining``: workers a resize added that the running job does not use yet (a
    ParameterServerStrategy job's chief takes them once Ready): one that cannot start
    neither stalls nor fails the job, which runs on at its old size (the Resizing
    condition says why).

    Never raises for what a job or its status holds: a value no check foresaw fails the
    job once, with a Failed condition and Event naming the problem, instead of an
    exception on every pass that leaves the job stuck without a word."""
    try:
        return _decide(
            job,
            generation,
            status,
            replicas,
            now,
            lost_pod_seconds,
            optional_types,
            reforms,
            joining,
        )
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as e:
        logger.exception("StrategyJob %s/%s: cannot decide", job.namespace, job.name)
        return _undecidable(job, generation, status, replicas, now, e)


def _undecidable(
    job: jobspec.StrategyJob,
    generation: int,
    status: Mapping[str, Any],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
    error: Exception,
) -> Plan:
    """The plan when deciding raised: fail the job (once) with the error in one line."""
    conds = [dict(x) for x in status.get("conditions") or [] if isinstance(x, Mapping)]
    if cond.is_true(conds, c.SUCCEEDED) or cond.is_true(conds, c.FAILED):
        return Plan(Action.NONE, dict(status))  # already reported; nothing more to say
    detail = (str(error).splitlines() or [""])[0][:200]
    msg = (
        f"StrategyJob {job.name} cannot be run: {type(error).__name__}: {detail}. "
        "Fix its spec (or status) and create the job again."
    )
    draft = Draft(job, {**status, "observedGeneration": generation}, conds, now)
    try:
        draft.status["replicaStatuses"] = replica_counts(job, replicas, {})
    except Exception:  # the counts are only informative here
        draft.status["replicaStatuses"] = {}
    return draft.finish(
        replicas,
        succeeded=False,
        reason=c.REASON_INVALID_SPEC,
        message=msg,
        stop_active=True,
    )


@dataclass
class _Pass:
    """One decision pass: what every phase reads, the draft they write, and the soonest time
    (seconds) a phase wants the job looked at again."""

    job: jobspec.StrategyJob
    replicas: Mapping[tuple[str, int], Replica]
    now: datetime
    lost_after: float
    optional_types: tuple[str, ...]
    draft: Draft
    finished: FinishedReplicas
    requeue: float | None = None
    #: A change of the worker count re-forms the job (jobspec.REFORMED_STRATEGIES).
    reforms: bool = False
    #: Workers a resize added that the job does not use yet (see :func:`decide`).
    joining: frozenset[tuple[str, int]] = frozenset()
    #: A growing re-form's new workers that need pods, started ahead while the running group
    #: trains on (:func:`_start_ahead`); ``ahead``: whether that phase is under way.
    ahead_missing: tuple[tuple[str, int], ...] = ()
    ahead: bool = False

    @property
    def status(self) -> dict[str, Any]:
        return self.draft.status

    def look_again_in(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)


def _decide(
    job: jobspec.StrategyJob,
    generation: int,
    status: Mapping[str, Any],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
    lost_after: float = DEFAULT_LOST_POD_SECONDS,
    optional_types: tuple[str, ...] = OPTIONAL_TYPES,
    reforms: bool = False,
    joining: frozenset[tuple[str, int]] = frozenset(),
) -> Plan:
    """The decision ladder: a finished job is cleaned up; otherwise each phase in turn either
    returns the plan (it decided) or None (the next phase decides), and the last one keeps the
    job's pods there and running."""
    conds: list[dict[str, Any]] = [dict(x) for x in status.get("conditions") or []]
    if cond.is_true(conds, c.SUCCEEDED) or cond.is_true(conds, c.FAILED):
        return decide_finished(job, status, replicas, now)
    p = _open_pass(job, generation, status, conds, replicas, now, lost_after, optional_types)
    p.reforms, p.joining = reforms, joining
    for phase in (
        _suspend_or_start,
        _past_deadline,
        _succeeded,
        _reform,
        _failed,
        _pending_too_long,
    ):
        plan = phase(p)
        if plan is not None:
            return plan
    return _create_or_run(p)


def _open_pass(
    job: jobspec.StrategyJob,
    generation: int,
    status: Mapping[str, Any],
    conds: list[dict[str, Any]],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
    lost_after: float,
    optional_types: tuple[str, ...],
) -> _Pass:
    """The draft status every phase starts from: counters read back, the replicas' counts
    and finished indices, and the Created condition on the first pass."""
    draft = Draft(job, dict(status), conds, now)
    st = draft.status
    st["observedGeneration"] = generation
    st["restartCount"] = as_count(st.get("restartCount", 0))
    st["launched"] = st.get("launched") is True
    old_counts = status.get("replicaStatuses")
    finished = finished_replicas(job, replicas, old_counts, st["launched"])
    st["replicaStatuses"] = replica_counts(job, replicas, old_counts, finished)
    if not cond.is_true(conds, c.CREATED):
        msg = f"StrategyJob {job.name} ({job.strategy}, {job.total_replicas} replicas) is created."
        draft.set(c.CREATED, True, c.REASON_CREATED, msg)
        draft.event("Normal", c.REASON_CREATED, msg)
        draft.metrics.append("jobs_created")
    return _Pass(job, replicas, now, lost_after, optional_types, draft, finished)


def _suspend_or_start(p: _Pass) -> Plan | None:
    """Suspend: no pods. Resume: recreate them with a fresh start time (how Kueue admits).
    Otherwise the job's start time, set on its first pass."""
    job, draft, st = p.job, p.draft, p.status
    if job.run_policy.suspend:
        if not cond.is_true(draft.conditions, c.SUSPENDED):
            msg = f"StrategyJob {job.name} is suspended; its pods are deleted."
            draft.set(c.SUSPENDED, True, c.REASON_SUSPENDED, msg)
            draft.set(c.RUNNING, False, c.REASON_SUSPENDED, msg)
            draft.set(c.RESTARTING, False, c.REASON_SUSPENDED, msg)
            draft.event("Normal", c.REASON_SUSPENDED, msg)
        st["launched"] = False
        forget_finished(st["replicaStatuses"])
        for counts in st["replicaStatuses"].values():
            counts["active"] = counts["ready"] = 0
        draft.set(c.STALLED, False, c.REASON_SUSPENDED, f"StrategyJob {job.name} is suspended.")
        st.pop("stalledReasons", None)
        live = tuple(sorted(r.name for r in p.replicas.values() if not r.terminating))
        return draft.plan(Action.SUSPEND, delete_pods=live)
    if cond.is_true(draft.conditions, c.SUSPENDED):
        msg = f"StrategyJob {job.name} is resumed; its pods are recreated."
        draft.set(c.SUSPENDED, False, c.REASON_RESUMED, msg)
        draft.event("Normal", c.REASON_RESUMED, msg)
        st["startTime"] = timestamp(p.now)
    if parse_time(st.get("startTime")) is None:  # not started yet, or unreadable
        st["startTime"] = timestamp(p.now)
    return None


def _past_deadline(p: _Pass) -> Plan | None:
    """activeDeadlineSeconds, enforced from the clock, not from whatever event arrives."""
    deadline = p.job.run_policy.active_deadline_seconds
    started = parse_time(p.status.get("startTime")) or p.now
    due = add_seconds(started, deadline) if deadline is not None else None
    if due is None:  # no deadline, or one past the last date (never due)
        return None
    left = (due - p.now).total_seconds()
    if left > 0:
        p.look_again_in(left)
        return None
    msg = (
        f"StrategyJob {p.job.name} ran longer than activeDeadlineSeconds={deadline}; "
        "its running pods are stopped."
    )
    return p.draft.finish(
        p.replicas, succeeded=False, reason=c.REASON_DEADLINE, message=msg, stop_active=True
    )


def _succeeded(p: _Pass) -> Plan | None:
    """The chief (worker 0 without one), or every worker under AllWorkers, completed; a
    replica that completed stays completed when its pod is deleted afterwards."""
    winners = jobspec.success_replicas(p.job)
    if not all(i in p.finished.completed.get(t, ()) for t, i in winners):
        return None
    who = ", ".join(f"{t}-{i}" for t, i in winners[:3])
    if len(winners) > 3:
        who = f"all {len(winners)} workers"
    msg = f"StrategyJob {p.job.name} succeeded: {who} completed."
    return p.draft.finish(p.replicas, succeeded=True, reason=c.REASON_SUCCEEDED, message=msg)


def _reform(p: _Pass) -> Plan | None:
    """A MultiWorkerMirroredStrategy or TPUStrategy job whose worker count changed
    (``kubectl scale``) re-forms at the new size: every pod is stopped (SIGTERM:
    ``strategyjob.train`` and the preemption handler save a checkpoint at the next step
    boundary), then the new group is created and resumes from it. Not a failure: counted in
    ``status.resizes``. A job that grows first starts its new workers' pods
    (:func:`_start_ahead`) and trains on at its old size until they all run, so a pod that
    cannot start (quota, no node fits, an image that does not pull) costs it nothing."""
    job, st = p.job, p.status
    before, wanted = st.get("workers"), job.num_replicas("worker")
    if not (p.reforms and st["launched"] and isinstance(before, int)) or before == wanted:
        return None
    started_ahead = wanted > before
    if started_ahead and not _start_ahead(p, before, wanted):
        return None  # the running group trains on; the later phases watch over it
    st["launched"] = False
    if not started_ahead:
        st["resizes"] = as_count(st.get("resizes", 0)) + 1
    msg = (
        f"StrategyJob {job.name} re-forms with {wanted} workers (it ran {before}): every pod "
        "stops, saving a checkpoint at its next step boundary, and the job resumes from it "
        "(not counted against backoffLimit)."
    )
    p.draft.set(c.RESIZING, True, c.REASON_RESIZING, msg)
    p.draft.event("Normal", c.REASON_RESIZING, msg)
    forget_finished(st["replicaStatuses"])
    attempt = restart_attempt(st)
    doomed = tuple(
        sorted(
            r.name
            for r in p.replicas.values()
            if not r.terminating and not (started_ahead and r.attempt == attempt)
        )
    )
    return p.draft.plan(Action.RESTART_JOB, delete_pods=doomed, requeue_after=p.requeue)


def _start_ahead(p: _Pass, before: int, wanted: int) -> bool:
    """Growing from ``before`` to ``wanted`` workers: the new workers' pods are made first, for
    the next attempt (their tasks wait until the running group's leader is gone:
    ``collective.process_group``), while the running group trains on. True once every one of
    them runs: then the running group stops. Until then, ``Resizing`` says what the job waits
    for (``ResizeStalled`` with the cause when a pod cannot start), and those pods neither
    stall nor fail the job by staying Pending."""
    job, st, draft = p.job, p.status, p.draft
    ahead = tuple(("worker", i) for i in range(before, wanted))
    attempt = restart_attempt(st)
    if not any(r.attempt != attempt for r in p.replicas.values() if not r.terminating):
        # every pod is the running group's: its attempt is the current one; the new pods
        # are the next attempt's (counted as this re-forming)
        st["resizes"] = as_count(st.get("resizes", 0)) + 1
    there = [r for k in ahead if (r := p.replicas.get(k)) is not None and not r.terminating]
    if len(there) == len(ahead) and all(r.phase == "Running" for r in there):
        return True
    p.ahead, p.joining = True, p.joining | frozenset(ahead)
    p.ahead_missing = tuple(k for k in ahead if k not in p.replicas)
    running = {r.key for r in there if r.phase == "Running"}
    waiting = [job.pod_name(t, i) for t, i in ahead if (t, i) not in running]
    msg = (
        f"StrategyJob {job.name} re-forms with {wanted} workers (it ran {before}): its new pods "
        f"start first, and it trains on with {before} workers until they run; waiting for "
        f"{first_names(waiting)}."
    )
    stuck = [r for r in there if r.stuck_reason]
    if not stuck:
        if not cond.is_true(draft.conditions, c.RESIZING):
            draft.event("Normal", c.REASON_RESIZING, msg)
        draft.set(c.RESIZING, True, c.REASON_RESIZING, msg)
        return False
    draft.set(c.RESIZING, True, c.REASON_RESIZE_STALLED, msg + cannot_start(stuck, before))
    return False


def _failed(p: _Pass) -> Plan | None:
    """Failures, root cause first. An evaluator never fails the job nor uses its budget. A
    worker that a resize adds and whose pod is not made yet has not failed."""
    launched = bool(p.status["launched"])
    failures = [
        f
        for f in find_failures(p.job, p.replicas, launched, p.finished.keys(), p.now, p.lost_after)
        if f.replica is not None or (f.replica_type, f.index) not in p.joining
    ]
    evaluators = [f for f in failures if f.replica_type in p.optional_types]
    failures = [f for f in failures if f.replica_type not in p.optional_types]
    if failures:
        return decide_failures(p.draft, failures, p.replicas, p.requeue)
    if evaluators:
        return decide_evaluators(p.draft, evaluators, p.replicas, p.finished, p.requeue)
    return None


def _pending_too_long(p: _Pass) -> Plan | None:
    """Pods Pending longer than pendingTimeoutSeconds fail the job; stuck ones are named
    (once per cause) meanwhile, and a pod in phase Unknown is looked at again when the
    lost-pod timeout fails its replica."""
    job = p.job
    pending = [
        r
        for k in job.replicas()
        if (r := p.replicas.get(k)) is not None
        and not r.terminating
        and r.phase == "Pending"
        and k not in p.joining  # the job runs without it: the Resizing condition names it
    ]
    timeout = job.run_policy.pending_timeout_seconds
    if timeout is not None:
        for r in pending:
            due = add_seconds(parse_time(r.created_at) or p.now, timeout)
            if due is None:
                continue
            left = (due - p.now).total_seconds()
            if left <= 0:
                why = f" ({stuck_cause(r)})" if r.stuck_reason else ""
                msg = (
                    f"StrategyJob {job.name} failed: pod {r.name} was Pending longer than "
                    f"pendingTimeoutSeconds={timeout}{why}; its pods are stopped. Fix what "
                    "keeps it from starting and create the job again."
                )
                return p.draft.finish(
                    p.replicas,
                    succeeded=False,
                    reason=c.REASON_PENDING_TIMEOUT,
                    message=msg,
                    stop_active=True,
                )
            p.look_again_in(left)
    report_stalled(p.draft, [r for r in pending if r.stuck_reason])
    for r in p.replicas.values():
        lost_left = lost_seconds_left(r, p.now, p.lost_after)
        if lost_left is not None and lost_left > 0:
            p.look_again_in(lost_left)
    return None


def _create_or_run(p: _Pass) -> Plan:
    """Create what is missing, but not while pods of the run before (a whole-job restart)
    are still terminating: a new replica would meet the old ones at the same names and
    ports. Running once every pod exists and one is ready."""
    job, draft, st = p.job, p.draft, p.status
    missing = tuple(k for k in job.replicas() if k not in p.replicas and k not in p.finished.keys())
    terminating = any(r.terminating for r in p.replicas.values())
    action = Action.NONE
    if p.ahead_missing and not terminating:  # a growing re-form's new pods, made first
        action = Action.CREATE
        missing = p.ahead_missing
    elif not st["launched"] and not terminating:
        if missing:
            action = Action.CREATE
        else:
            st["launched"] = True
            msg = f"All {job.total_replicas} pods of {job.name} exist."
            draft.event("Normal", c.REASON_PODS_CREATED, msg)
    if p.reforms and not p.ahead and (st["launched"] or action is Action.CREATE):
        st["workers"] = job.num_replicas("worker")  # the group its pods form
    if cond.is_true(draft.conditions, c.RESIZING) and st["launched"] and not (missing or p.ahead):
        draft.set(
            c.RESIZING,
            False,
            c.REASON_RESIZED,
            f"StrategyJob {job.name} runs {job.num_replicas('worker')} workers.",
        )
    running = sum(v["ready"] for v in st["replicaStatuses"].values())
    if st["launched"] and running > 0 and not cond.is_true(draft.conditions, c.RUNNING):
        draft.set(c.RUNNING, True, c.REASON_RUNNING, f"StrategyJob {job.name} is running.")
        draft.event("Normal", c.REASON_RUNNING, f"StrategyJob {job.name} is running.")
    return draft.plan(
        action,
        create=missing if action is Action.CREATE else (),
        requeue_after=p.requeue,
        ensure_service=action is Action.CREATE,
    )
