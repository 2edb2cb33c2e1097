"""The status one decision builds, condition by condition, with the Events and metrics it
implies, and how a job ends (Succeeded or Failed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator.finished_job import cleanup_pods
from strategyjob_operator.observe import Replica
from strategyjob_operator.plan import Action, Event, Plan, timestamp


@dataclass
class Draft:
    """The status one decision builds, with the Events and metrics it implies."""

    job: jobspec.StrategyJob
    status: dict[str, Any]
    conditions: list[dict[str, Any]]
    now: datetime
    events: list[Event] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)

    def set(self, type_: str, value: bool, reason: str, message: str) -> None:
        self.conditions = cond.set_condition(
            self.conditions, type_, value, reason, message, timestamp(self.now)
        )

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def plan(self, action: Action, **kwargs: Any) -> Plan:
        st = self.status
        st["conditions"] = self.conditions
        st["state"] = cond.state(self.conditions)
        ready = sum(v["ready"] for v in (st.get("replicaStatuses") or {}).values())
        st["ready"] = f"{ready}/{self.job.total_replicas}"
        return Plan(action, st, events=tuple(self.events), metrics=tuple(self.metrics), **kwargs)

    def finish(
        self,
        replicas: Mapping[tuple[str, int], Replica],
        *,
        succeeded: bool,
        reason: str,
        message: str,
        stop_active: bool = False,
    ) -> Plan:
        """The job ends: Succeeded or Failed, completionTime, cleanPodPolicy applied."""
        self.set(c.RUNNING, False, reason, message)
        self.set(c.RESTARTING, False, reason, message)
        self.set(c.SUCCEEDED if succeeded else c.FAILED, True, reason, message)
        self.set(c.STALLED, False, reason, message)
        self.status.pop("stalledReasons", None)
        self.event("Normal" if succeeded else "Warning", reason, message)
        self.metrics.append("jobs_succeeded" if succeeded else "jobs_failed")
        self.status["completionTime"] = timestamp(self.now)
        for counts in (self.status.get("replicaStatuses") or {}).values():
            counts["ready"] = 0
        policy = self.job.run_policy
        ttl = policy.ttl_seconds_after_finished
        return self.plan(
            Action.SUCCEED if succeeded else Action.FAIL,
            delete_pods=cleanup_pods(policy.clean_pod_policy, replicas, stop_active=stop_active),
            requeue_after=float(min(ttl, jobspec.MAX_INT32)) if ttl is not None else None,
        )
