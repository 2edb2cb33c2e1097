"""Replica failures and what the strategy allows after them: which replicas failed (root cause
first), whether their restart policy retries them, and the plan that fails the job, restarts it
whole, or recreates replicas alone (ParameterServerStrategy workers, evaluators). A disruption (the
cluster preempted, evicted or drained a pod) is retried whatever the policy and is not counted
against ``backoffLimit``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from strategyjob import jobspec
from strategyjob.errors import exit_error_line

from strategyjob_operator import constants as c
from strategyjob_operator.draft import Draft
from strategyjob_operator.lost_pods import (
    DEFAULT_LOST_POD_SECONDS,
    describe_lost,
    lost_seconds_left,
)
from strategyjob_operator.observe import Replica
from strategyjob_operator.plan import Action, Plan, as_count
from strategyjob_operator.replica_status import FinishedReplicas, forget_finished, format_indexes


@dataclass(frozen=True)
class Failure:
    replica: Replica | None
    replica_type: str
    index: int
    retryable: bool
    description: str  # e.g. "exited with code 137 (OOMKilled)"
    #: The cluster took the replica away (e.g. PreemptionByScheduler): not counted.
    disruption: str | None = None

    @property
    def label(self) -> str:
        return f"{self.replica_type}-{self.index}"


def is_retryable(restart_policy: str, exit_code: int | None) -> bool:
    """Whether a replica failure may be retried under its restart policy.

    ``ExitCode``: 128 and above (killed by a signal: OOM, preemption) retry, 1-127 (the
    program's own error) do not; a pod that vanished or was evicted has no exit code and
    retries.
    """
    if restart_policy == "Never":
        return False
    if restart_policy == "ExitCode":
        return exit_code is None or exit_code >= 128
    return True  # OnFailure, Always


#: How a message says what the cluster did, per DisruptionTarget reason.
_DISRUPTIONS = {
    "PreemptionByScheduler": "was preempted by a higher-priority pod",
    "EvictionByEvictionAPI": "was evicted (node drain or the Eviction API)",
    "DeletionByTaintManager": "was deleted for a NoExecute taint on its node",
    "DeletionByPodGC": "was deleted by the pod garbage collector (its node is gone)",
    "TerminationByKubelet": "was stopped by the kubelet (node pressure or shutdown)",
    "Evicted": "was evicted by the kubelet",
}


def describe_disruption(reason: str) -> str:
    """E.g. ``was preempted by a higher-priority pod (PreemptionByScheduler)``."""
    return f"{_DISRUPTIONS.get(reason, 'was disrupted by the cluster')} ({reason})"


def _describe(replica: Replica) -> str:
    """E.g. ``exited with code 1 (Error): ValueError: bad batch``: the exit, then the error
    line of the container's termination message (its last log lines), if it has one."""
    if replica.disruption:
        text = describe_disruption(replica.disruption)
        if replica.exit_code is not None:
            text += f" and exited with code {replica.exit_code}"
    elif replica.exit_code is not None:
        text = f"exited with code {replica.exit_code}"
        text = f"{text} ({replica.reason})" if replica.reason else text
    else:
        text = f"failed ({replica.reason or 'no exit code'})"
    error = exit_error_line(replica.exit_code, (replica.message or "").splitlines())
    return f"{text}: {error}" if error else text


def find_failures(
    job: jobspec.StrategyJob,
    replicas: Mapping[tuple[str, int], Replica],
    launched: bool,
    finished: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset(),
    now: datetime | None = None,
    lost_after: float = DEFAULT_LOST_POD_SECONDS,
) -> list[Failure]:
    """Failed replicas, earliest first (the root cause leads); once every pod of the run
    was created, a missing pod counts as a failure of its replica, unless the replica
    had already ``finished`` (completed, or an evaluator given up). A pod in phase Unknown
    (its node lost) fails its replica once it has been so for ``lost_after`` seconds, as
    if it had no exit code (its restart policy decides). A replica that serves until the
    job ends (a ps, a ParameterServerStrategy worker) fails when it exits at all: with
    code 0 it is retried by ``OnFailure`` and ``Always`` only, as an exit code below 128."""
    found: list[tuple[str, Failure]] = []
    for t, i in job.replicas():
        if (t, i) in finished:
            continue
        policy = job.replica_specs[t].restart_policy
        r = replicas.get((t, i))
        if r is None:
            if launched:
                found.append(("", Failure(None, t, i, is_retryable(policy, None), "was deleted")))
        elif r.disruption and (launched or not r.terminating) and r.phase != "Succeeded":
            # Taken away by the cluster: a failure as soon as it is known (a preempted pod
            # is still terminating), retried whatever the policy, not the program's fault.
            at = r.disrupted_at or r.finished_at or ""
            found.append((at, Failure(r, t, i, True, _describe(r), disruption=r.disruption)))
        elif r.phase == "Failed" and not r.terminating:
            desc = _describe(r)
            found.append(
                (r.finished_at or "", Failure(r, t, i, is_retryable(policy, r.exit_code), desc))
            )
        elif r.phase == "Succeeded" and not r.terminating and jobspec.serves_until_stopped(job, t):
            early = Failure(r, t, i, is_retryable(policy, 0), jobspec.early_exit(t))
            found.append((r.finished_at or "", early))
        elif (
            now is not None
            and (left := lost_seconds_left(r, now, lost_after)) is not None
            and left <= 0
        ):
            lost = Failure(r, t, i, is_retryable(policy, None), describe_lost(r, now, lost_after))
            found.append((r.unknown_since or "", lost))
    found.sort(key=lambda pair: pair[0] or "~")  # unknown times last, order otherwise kept
    return [f for _, f in found]


def decide_failures(
    draft: Draft,
    failures: list[Failure],
    replicas: Mapping[tuple[str, int], Replica],
    requeue: float | None,
) -> Plan:
    """Fail the job, or restart what the strategy allows, for ``failures`` (root first)."""
    job, st = draft.job, draft.status
    root = failures[0]
    # A disruption first: what failed after it (peers losing it) followed from it.
    preempted = root.disruption is not None
    permanent = [] if preempted else [f for f in failures if not f.retryable]
    if permanent:
        p = permanent[0]
        policy = job.replica_specs[p.replica_type].restart_policy
        msg = (
            f"StrategyJob {job.name} failed: {p.label} {p.description}; "
            f"restartPolicy {policy} does not retry it."
        )
        if root is not p:
            msg += f" First failure: {root.label} {root.description}."
        return draft.finish(replicas, succeeded=False, reason=c.REASON_REPLICA_FAILED, message=msg)

    limit = job.run_policy.backoff_limit
    if not preempted and st["restartCount"] >= limit:
        msg = (
            f"StrategyJob {job.name} failed: {root.label} {root.description}, and "
            f"backoffLimit={limit} is reached after {st['restartCount']} restarts."
        )
        return draft.finish(replicas, succeeded=False, reason=c.REASON_BACKOFF_LIMIT, message=msg)

    # Who may restart alone: the evaluator always (it is outside training); under
    # ParameterServerStrategy the workers too (the coordinator reschedules their work).
    collective = job.strategy in jobspec.COLLECTIVE_STRATEGIES
    alone = {"evaluator"} if collective else {"worker", "evaluator"}
    whole_job = any(f.replica_type not in alone for f in failures)
    st["launched"] = False
    for f in failures:
        st["replicaStatuses"][f.replica_type]["restarts"] += 1
    if preempted:
        st["preemptions"] = as_count(st.get("preemptions", 0)) + 1
        progress = (
            f"(a disruption, not counted against backoffLimit={limit}; {st['preemptions']} so far)"
        )
    else:
        st["restartCount"] += 1
        progress = f"(restart {st['restartCount']} of {limit})"
    if whole_job:
        why = f"{job.strategy} cannot lose a replica" if collective else f"a {root.replica_type}"
        what = f"restarts all {job.total_replicas} pods ({why})"
        reason = c.REASON_JOB_PREEMPTED if preempted else c.REASON_JOB_RESTARTING
        action = Action.RESTART_JOB
        doomed = tuple(sorted(r.name for r in replicas.values() if not r.terminating))
        forget_finished(st["replicaStatuses"])
    else:
        what = "recreates " + ", ".join(f.label for f in failures)
        reason = c.REASON_REPLICA_PREEMPTED if preempted else c.REASON_REPLICA_RESTARTING
        action = Action.RECREATE_REPLICAS
        doomed = tuple(
            sorted(f.replica.name for f in failures if f.replica and not f.replica.terminating)
        )
    msg = f"StrategyJob {job.name} {what}: {root.label} {root.description} {progress}."
    draft.set(c.RESTARTING, True, reason, msg)
    draft.event("Warning", reason, msg)
    draft.metrics.append("jobs_restarted")
    if preempted:
        draft.metrics.append("jobs_preempted")
    return draft.plan(action, delete_pods=doomed, requeue_after=requeue)


#: Replica types whose failure never fails the job (:data:`jobspec.OPTIONAL_REPLICA_TYPES`,
#: shared with ``strategyjob run``; a TFJob with ``enableDynamicWorker`` adds its workers, as
#: training-operator ignores their failures).
OPTIONAL_TYPES: tuple[str, ...] = jobspec.OPTIONAL_REPLICA_TYPES


def decide_evaluators(
    draft: Draft,
    failures: list[Failure],
    replicas: Mapping[tuple[str, int], Replica],
    finished: FinishedReplicas,
    requeue: float | None,
) -> Plan | None:
    """Recreate a failed evaluator (or other replica of :data:`OPTIONAL_TYPES`' kind) alone
    while its restart policy allows and the restarts of its type stay under
    ``backoffLimit`` (the job's restarts are not touched); otherwise report it once and go
    on without it. None: nothing to do but carry on."""
    job, st = draft.job, draft.status
    limit = job.run_policy.backoff_limit
    again: list[Failure] = []
    for f in failures:
        t = f.replica_type
        counts = st["replicaStatuses"][t]
        if f.disruption:  # the cluster took it away: recreated, not counted
            again.append(f)
            continue
        if f.retryable and counts["restarts"] < limit:
            again.append(f)
            counts["restarts"] += 1
            continue
        policy = job.replica_specs[t].restart_policy
        why = (
            f"restartPolicy {policy} does not retry it"
            if not f.retryable
            else f"it was recreated {counts['restarts']} times (backoffLimit={limit})"
        )
        msg = (
            f"StrategyJob {job.name}: {f.label} {f.description}; {why}. The job goes on "
            f"without it ({_never_fails(t)})."
        )
        reason = c.REASON_EVALUATOR_FAILED if t == "evaluator" else c.REASON_REPLICA_FAILED
        draft.event("Warning", reason, msg)
        finished.given_up.setdefault(t, set()).add(f.index)
    for t in {f.replica_type for f in failures}:
        given_up = finished.given_up.get(t, set())
        if given_up:
            counts = st["replicaStatuses"][t]
            counts["failedIndexes"] = format_indexes(given_up)
            failed_pods = {
                r.index for r in replicas.values() if r.replica_type == t and r.phase == "Failed"
            }
            counts["failed"] = len(failed_pods | given_up)
    if not again:
        return None
    st["launched"] = False
    labels = ", ".join(f.label for f in again)
    root = again[0]
    if all(f.disruption for f in again):
        detail = "a disruption, not counted"
    else:
        restarts = st["replicaStatuses"][root.replica_type]["restarts"]
        detail = f"{_optional(root.replica_type)} restart {restarts} of {limit}"
    msg = (
        f"StrategyJob {job.name} recreates {labels}: {root.label} {root.description} "
        f"({detail}; {_optional(root.replica_type)} restarts do not count against the job's "
        "backoffLimit)."
    )
    reason = (
        c.REASON_EVALUATOR_RESTARTING
        if root.replica_type == "evaluator"
        else c.REASON_REPLICA_RESTARTING
    )
    draft.event("Warning", reason, msg)
    doomed = tuple(sorted(f.replica.name for f in again if f.replica and not f.replica.terminating))
    return draft.plan(Action.RECREATE_REPLICAS, delete_pods=doomed, requeue_after=requeue)


def _never_fails(replica_type: str) -> str:
    if replica_type == "evaluator":
        return "an evaluator never fails the job"
    return f"with enableDynamicWorker, a {replica_type} never fails the job"


def _optional(replica_type: str) -> str:
    """How a message names a replica whose failure never fails the job."""
    return replica_type if replica_type == "evaluator" else f"dynamic {replica_type}"
