"""A job that has finished: the pods ``cleanPodPolicy`` deletes, and the job's deletion once
``ttlSecondsAfterFinished`` has passed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.observe import Replica
from strategyjob_operator.plan import Action, Event, Plan, add_seconds, parse_time


def cleanup_pods(
    policy: str, replicas: Mapping[tuple[str, int], Replica], *, stop_active: bool = False
) -> tuple[str, ...]:
    """Pods to delete when the job finishes, per ``cleanPodPolicy`` (None keeps all,
    Running deletes Pending and Running ones, All deletes every pod). ``stop_active``
    stops active pods whatever the policy (a deadline means stop)."""
    out = []
    for r in replicas.values():
        if r.terminating:
            continue
        active = not r.pod_finished  # a sidecar may keep a finished replica's pod running
        if policy == "All" or (active and (policy == "Running" or stop_active)):
            out.append(r.name)
    return tuple(sorted(out))


def decide_finished(
    job: jobspec.StrategyJob,
    status: Mapping[str, Any],
    replicas: Mapping[tuple[str, int], Replica],
    now: datetime,
) -> Plan:
    """A finished job only waits for its TTL (and completes a cleanup a crash cut short)."""
    conds = status.get("conditions") or []
    stop = (cond.get(conds, c.FAILED) or {}).get("reason") == c.REASON_DEADLINE
    leftovers = cleanup_pods(job.run_policy.clean_pod_policy, replicas, stop_active=stop)
    ttl = job.run_policy.ttl_seconds_after_finished
    expire = (
        None if ttl is None else add_seconds(parse_time(status.get("completionTime")) or now, ttl)
    )
    if expire is None:
        return Plan(Action.NONE, dict(status), delete_pods=leftovers)
    if now >= expire:
        msg = f"StrategyJob {job.name} finished {ttl}s ago (ttlSecondsAfterFinished); deleting it."
        return Plan(
            Action.DELETE_JOB,
            dict(status),
            events=(Event("Normal", c.REASON_TTL, msg),),
            delete_job=True,
        )
    return Plan(
        Action.NONE,
        dict(status),
        delete_pods=leftovers,
        requeue_after=(expire - now).total_seconds(),
    )
