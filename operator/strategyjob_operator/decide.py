"""The operator's decisions, as a pure function of the job, its status, its pods and
the time: :func:`decide` returns a :class:`Plan` (the new status, the pods to delete and
to create, the Events to post) and the reconciler carries it out.

Failure handling knows the strategy. Collective strategies (every strategy but
ParameterServerStrategy) cannot survive losing one replica, so a retryable failure
restarts the whole job. Under ParameterServerStrategy a failed worker or evaluator is
recreated alone, and a failed chief or ps restarts the job. Every restart is counted
against ``runPolicy.backoffLimit``. An evaluator never fails the job: it only reports.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from strategyjob import jobspec
from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.observe import Replica


class Action(enum.Enum):
    """What a reconcile pass does, in one word (logs, metrics, tests)."""

    NONE = "none"
    CREATE = "create"  # create missing pods (first start, resume, after a restart)
    RECREATE_REPLICAS = "recreate-replicas"  # ParameterServerStrategy worker/evaluator
    RESTART_JOB = "restart-job"
    SUCCEED = "succeed"
    FAIL = "fail"
    SUSPEND = "suspend"
    DELETE_JOB = "delete-job"  # ttlSecondsAfterFinished expired


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    action: Action
    status: dict[str, Any]
    delete_pods: tuple[str, ...] = ()
    create: tuple[tuple[str, int], ...] = ()
    events: tuple[Event, ...] = ()
    #: Counter names to increment: jobs_created, jobs_succeeded, jobs_failed, jobs_restarted.
    metrics: tuple[str, ...] = ()
    #: Seconds until the next time-driven decision (deadline, TTL); None when none.
    requeue_after: float | None = None
    delete_job: bool = False
    ensure_service: bool = False


@dataclass(frozen=True)
class Failure:
    replica: Replica | None
    replica_type: str
    index: int
    retryable: bool
    description: str  # e.g. "exited with code 137 (OOMKilled)"

    @property
    def label(self) -> str:
        return f"{self.replica_type}-{self.index}"


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


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


def _describe(replica: Replica) -> str:
    if replica.exit_code is not None:
        text = f"exited with code {replica.exit_code}"
        return f"{text} ({replica.reason})" if replica.reason else text
    return f"failed ({replica.reason or 'no exit code'})"


def _failures(
    job: jobspec.StrategyJob, replicas: Mapping[tuple[str, int], Replica], launched: bool
) -> list[Failure]:
    """Failed replicas, earliest first (the root cause leads); once every pod of the run
    was created, a missing pod counts as a failure of its replica."""
    found: list[tuple[str, Failure]] = []
    for t, i in job.replicas():
        policy = job.replica_specs[t].restart_policy
        r = replicas.get((t, i))
        if r is None:
            if launched:
                found.append(("", Failure(None, t, i, is_retryable(policy, None), "was deleted")))
        elif r.phase == "Failed" and not r.terminating:
            desc = _describe(r)
            found.append((r.finished_at or "", Failure(r, t, i, is_retryable(policy, r.exit_code), desc)))
    found.sort(key=lambda pair: pair[0] or "~")  # unknown times last, order otherwise kept
    return [f for _, f in found]


def _counts(
    job: jobspec.StrategyJob, replicas: Mapping[tuple[str, int], Replica], old: Mapping[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in job.replica_specs:
        mine = [r for r in replicas.values() if r.replica_type == t]
        prev = old.get(t) or {}
        out[t] = {
            "active": sum(1 for r in mine if r.phase in ("Pending", "Running") and not r.terminating),
            "ready": sum(1 for r in mine if r.phase == "Running" and not r.terminating),
            "succeeded": sum(1 for r in mine if r.phase == "Succeeded"),
            "failed": sum(1 for r in mine if r.phase == "Failed"),
            "restarts": int(prev.get("restarts", 0)),
            "selector": f"{c.LABEL_JOB_NAME}={job.name},{c.LABEL_REPLICA_TYPE}={t}",
        }
    return out


def _cleanup(
    policy: str, replicas: Mapping[tuple[str, int], Replica], *, stop_active: bool = False
) -> tuple[str, ...]:
    """Pods to delete when the job finishes, per ``cleanPodPolicy`` (None keeps all,
    Running deletes Pending and Running ones, All deletes every pod). ``stop_active``
    stops active pods whatever the policy (a deadline means stop)."""
    out = []
    for r in replicas.values():
        if r.terminating:
            continue
        active = r.phase not in ("Succeeded", "Failed")
        if policy == "All" or (active and (policy == "Running" or stop_active)):
            out.append(r.name)
    return tuple(sorted(out))


def _finish_plan(
    job: jobspec.StrategyJob,
    status: dict[str, Any],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
    *,
    succeeded: bool,
    reason: str,
    message: str,
    stop_active: bool = False,
) -> Plan:
    ts = timestamp(now)
    conds = status["conditions"]
    conds = cond.set_condition(conds, c.RUNNING, False, reason, message, ts)
    conds = cond.set_condition(conds, c.RESTARTING, False, reason, message, ts)
    conds = cond.set_condition(conds, c.SUCCEEDED if succeeded else c.FAILED, True, reason, message, ts)
    status = {**status, "conditions": conds, "completionTime": ts}
    status["state"] = cond.state(conds)
    ttl = job.run_policy.ttl_seconds_after_finished
    return Plan(
        action=Action.SUCCEED if succeeded else Action.FAIL,
        status=status,
        delete_pods=_cleanup(job.run_policy.clean_pod_policy, replicas, stop_active=stop_active),
        events=(Event("Normal" if succeeded else "Warning", reason, message),),
        metrics=("jobs_succeeded" if succeeded else "jobs_failed",),
        requeue_after=float(ttl) if ttl is not None else None,
    )


def decide(
    job: jobspec.StrategyJob,
    generation: int,
    status: Mapping[str, Any],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
) -> Plan:
    """The next step for ``job``, given its current ``status``, the pods that exist
    (``replicas``) and the time ``now``. Pure: the caller performs the plan."""
    ts = timestamp(now)
    st: dict[str, Any] = {k: v for k, v in status.items()}
    conds: list[dict[str, Any]] = [dict(x) for x in status.get("conditions") or []]
    events: list[Event] = []
    metrics: list[str] = []
    total = job.total_replicas

    # Finished jobs only wait for their TTL (and finish a cleanup a crash interrupted).
    if cond.is_true(conds, c.SUCCEEDED) or cond.is_true(conds, c.FAILED):
        stop = (cond.get(conds, c.FAILED) or {}).get("reason") == c.REASON_DEADLINE
        leftovers = _cleanup(job.run_policy.clean_pod_policy, replicas, stop_active=stop)
        ttl = job.run_policy.ttl_seconds_after_finished
        finished = parse_time(st.get("completionTime")) or now
        if ttl is not None:
            expire = finished + timedelta(seconds=ttl)
            if now >= expire:
                msg = f"StrategyJob {job.name} finished {ttl}s ago (ttlSecondsAfterFinished); deleting it."
                return Plan(Action.DELETE_JOB, dict(status), events=(Event("Normal", c.REASON_TTL, msg),), delete_job=True)
            return Plan(Action.NONE, dict(status), delete_pods=leftovers, requeue_after=(expire - now).total_seconds())
        return Plan(Action.NONE, dict(status), delete_pods=leftovers)

    st["observedGeneration"] = generation
    st.setdefault("restartCount", 0)
    st.setdefault("launched", False)
    if not cond.is_true(conds, c.CREATED):
        msg = f"StrategyJob {job.name} ({job.strategy}, {total} replicas) is created."
        conds = cond.set_condition(conds, c.CREATED, True, c.REASON_CREATED, msg, ts)
        events.append(Event("Normal", c.REASON_CREATED, msg))
        metrics.append("jobs_created")
    st["replicaStatuses"] = _counts(job, replicas, status.get("replicaStatuses") or {})

    def finish_status() -> dict[str, Any]:
        st["conditions"] = conds
        st["state"] = cond.state(conds)
        ready = sum(v["ready"] for v in st["replicaStatuses"].values())
        st["ready"] = f"{ready}/{total}"
        return st

    # Suspend: no pods; resume: recreate them with a fresh start time (how Kueue admits).
    if job.run_policy.suspend:
        live = tuple(sorted(r.name for r in replicas.values() if not r.terminating))
        if not cond.is_true(conds, c.SUSPENDED):
            msg = f"StrategyJob {job.name} is suspended; its pods are deleted."
            conds = cond.set_condition(conds, c.SUSPENDED, True, c.REASON_SUSPENDED, msg, ts)
            conds = cond.set_condition(conds, c.RUNNING, False, c.REASON_SUSPENDED, msg, ts)
            conds = cond.set_condition(conds, c.RESTARTING, False, c.REASON_SUSPENDED, msg, ts)
            events.append(Event("Normal", c.REASON_SUSPENDED, msg))
        st["launched"] = False
        for counts in st["replicaStatuses"].values():
            counts["active"] = counts["ready"] = 0
        return Plan(Action.SUSPEND, finish_status(), delete_pods=live, events=tuple(events), metrics=tuple(metrics))
    if cond.is_true(conds, c.SUSPENDED):
        msg = f"StrategyJob {job.name} is resumed; its pods are recreated."
        conds = cond.set_condition(conds, c.SUSPENDED, False, c.REASON_RESUMED, msg, ts)
        events.append(Event("Normal", c.REASON_RESUMED, msg))
        st["startTime"] = ts
    st.setdefault("startTime", ts)
    started = parse_time(st["startTime"]) or now

    # Deadline: enforced from the clock, not from whatever event arrives.
    deadline = job.run_policy.active_deadline_seconds
    requeue = None
    if deadline is not None:
        remaining = (started + timedelta(seconds=deadline) - now).total_seconds()
        if remaining <= 0:
            msg = (
                f"StrategyJob {job.name} ran longer than activeDeadlineSeconds={deadline}; "
                "its running pods are stopped."
            )
            st["conditions"] = conds
            plan = _finish_plan(job, st, replicas, now, succeeded=False, reason=c.REASON_DEADLINE, message=msg, stop_active=True)
            plan.status["ready"] = f"0/{total}"
            return Plan(**{**plan.__dict__, "events": (*events, *plan.events), "metrics": (*metrics, *plan.metrics)})
        requeue = remaining

    # Success: the chief (worker 0 without one), or every worker under AllWorkers.
    winners = jobspec.success_replicas(job)
    if all((replicas.get(k) is not None and replicas[k].phase == "Succeeded") for k in winners):
        who = ", ".join(f"{t}-{i}" for t, i in winners) if len(winners) <= 3 else f"all {len(winners)} workers"
        msg = f"StrategyJob {job.name} succeeded: {who} completed."
        st["conditions"] = conds
        plan = _finish_plan(job, st, replicas, now, succeeded=True, reason=c.REASON_SUCCEEDED, message=msg)
        plan.status["ready"] = f"0/{total}"
        return Plan(**{**plan.__dict__, "events": (*events, *plan.events), "metrics": (*metrics, *plan.metrics)})

    # Failures: root cause first.
    failures = _failures(job, replicas, bool(st["launched"]))
    evaluator_permanent = [f for f in failures if f.replica_type == "evaluator" and not f.retryable]
    failures = [f for f in failures if not (f.replica_type == "evaluator" and not f.retryable)]
    for f in evaluator_permanent:
        prev = ((status.get("replicaStatuses") or {}).get("evaluator") or {}).get("failed", 0)
        if prev == 0:
            events.append(Event("Warning", c.REASON_EVALUATOR_FAILED, f"evaluator-{f.index} {f.description}; the job goes on without it."))
    if failures:
        permanent = [f for f in failures if not f.retryable]
        root = failures[0]
        if permanent:
            p = permanent[0]
            policy = job.replica_specs[p.replica_type].restart_policy
            msg = f"StrategyJob {job.name} failed: {p.label} {p.description}; restartPolicy {policy} does not retry it."
            if root is not p:
                msg += f" First failure: {root.label} {root.description}."
            st["conditions"] = conds
            plan = _finish_plan(job, st, replicas, now, succeeded=False, reason=c.REASON_REPLICA_FAILED, message=msg)
            return Plan(**{**plan.__dict__, "events": (*events, *plan.events), "metrics": (*metrics, *plan.metrics)})
        limit = job.run_policy.backoff_limit
        if st["restartCount"] >= limit:
            msg = (
                f"StrategyJob {job.name} failed: {root.label} {root.description}, and backoffLimit={limit} "
                f"is reached after {st['restartCount']} restarts."
            )
            st["conditions"] = conds
            plan = _finish_plan(job, st, replicas, now, succeeded=False, reason=c.REASON_BACKOFF_LIMIT, message=msg)
            return Plan(**{**plan.__dict__, "events": (*events, *plan.events), "metrics": (*metrics, *plan.metrics)})
        alone = {"evaluator"} if job.strategy in jobspec.COLLECTIVE_STRATEGIES else {"worker", "evaluator"}
        whole_job = any(f.replica_type not in alone for f in failures)
        st["restartCount"] += 1
        st["launched"] = False
        rs = st["replicaStatuses"]
        rs[root.replica_type]["restarts"] += 1
        if whole_job:
            msg = (
                f"StrategyJob {job.name} restarts all {total} pods ({job.strategy} cannot lose a replica): "
                f"{root.label} {root.description} (restart {st['restartCount']} of {limit})."
            )
            reason, action = c.REASON_JOB_RESTARTING, Action.RESTART_JOB
            doomed = tuple(sorted(r.name for r in replicas.values() if not r.terminating))
        else:
            labels = ", ".join(f.label for f in failures)
            msg = f"StrategyJob {job.name} recreates {labels}: {root.label} {root.description} (restart {st['restartCount']} of {limit})."
            reason, action = c.REASON_REPLICA_RESTARTING, Action.RECREATE_REPLICAS
            doomed = tuple(sorted(f.replica.name for f in failures if f.replica is not None))
        conds = cond.set_condition(conds, c.RESTARTING, True, reason, msg, ts)
        events.append(Event("Warning", reason, msg))
        metrics.append("jobs_restarted")
        return Plan(action, finish_status(), delete_pods=doomed, events=tuple(events), metrics=tuple(metrics), requeue_after=requeue)

    # Create what is missing; pods still terminating (after a restart) are waited for.
    missing = tuple(k for k in job.replicas() if k not in replicas)
    terminating = any(r.terminating for r in replicas.values())
    action = Action.NONE
    if not st["launched"]:
        if missing:
            action = Action.CREATE
        elif not terminating:
            st["launched"] = True
            msg = f"StrategyJob {job.name}: all {total} pods exist."
            events.append(Event("Normal", c.REASON_PODS_CREATED, msg))
    running = sum(v["ready"] for v in st["replicaStatuses"].values())
    if st["launched"] and running > 0:
        msg = f"StrategyJob {job.name} is running: {running}/{total} replicas running."
        already = cond.is_true(conds, c.RUNNING)
        conds = cond.set_condition(conds, c.RUNNING, True, c.REASON_RUNNING, f"StrategyJob {job.name} is running.", ts)
        if not already:
            events.append(Event("Normal", c.REASON_RUNNING, msg))
    return Plan(
        action,
        finish_status(),
        create=missing if action is Action.CREATE else (),
        events=tuple(events),
        metrics=tuple(metrics),
        requeue_after=requeue,
        ensure_service=action is Action.CREATE,
    )
