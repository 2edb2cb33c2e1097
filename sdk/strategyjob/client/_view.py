"""Typed, read-only views of what the API server returns: a submitted job with its status,
its conditions and its replicas' pods. Pure functions of the JSON, so the CLI's tables
and the tests need no cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strategyjob.jobspec import REPLICA_TYPES, training_container

#: The states the operator writes to ``status.state`` (its condition types).
STATES: tuple[str, ...] = ("Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
FINISHED_STATES: tuple[str, ...] = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Condition:
    """One entry of ``status.conditions``."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""

    @property
    def true(self) -> bool:
        return self.status == "True"


@dataclass(frozen=True)
class SubmittedJob:
    """A StrategyJob as the API server holds it. ``raw`` is the whole object; the
    properties read the parts people look at (state, conditions, counts, progress)."""

    raw: Mapping[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        return str(self._meta.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self._meta.get("namespace", ""))

    @property
    def creation_timestamp(self) -> str:
        return str(self._meta.get("creationTimestamp") or "")

    @property
    def strategy(self) -> str:
        return str((self.raw.get("spec") or {}).get("strategy") or "")

    @property
    def status(self) -> Mapping[str, Any]:
        return self.raw.get("status") or {}

    @property
    def state(self) -> str | None:
        """The operator's ``status.state``; None until the operator has seen the job."""
        return self.status.get("state") or None

    @property
    def ready(self) -> str:
        """``ready/total`` replicas as the operator counts them ("" before it has)."""
        return str(self.status.get("ready") or "")

    @property
    def restart_count(self) -> int:
        return int(self.status.get("restartCount") or 0)

    @property
    def conditions(self) -> tuple[Condition, ...]:
        return tuple(
            Condition(
                type=str(c.get("type", "")),
                status=str(c.get("status", "")),
                reason=str(c.get("reason") or ""),
                message=str(c.get("message") or ""),
                last_transition_time=str(c.get("lastTransitionTime") or ""),
            )
            for c in self.status.get("conditions") or []
        )

    def condition(self, type_: str) -> Condition | None:
        """The condition of ``type_`` when it is true."""
        return next((c for c in self.conditions if c.type == type_ and c.true), None)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def failure(self) -> Condition | None:
        """The true ``Failed`` condition: why the job failed."""
        return self.condition("Failed")

    @property
    def progress(self) -> Mapping[str, Any] | None:
        """``status.progress`` (training progress reported by the chief), when present."""
        progress = self.status.get("progress")
        return progress if isinstance(progress, Mapping) and progress else None

    def replica_restarts(self, replica_type: str) -> int:
        """Restarts the operator counted for ``replica_type`` (it recreates pods, so the
        count lives in the job's status, per type, as in TFJob)."""
        counts = (self.status.get("replicaStatuses") or {}).get(replica_type) or {}
        return int(counts.get("restarts") or 0)

    def replicas(self) -> list[tuple[str, int]]:
        """Every ``(replica_type, index)`` the spec asks for, chief first."""
        specs = (self.raw.get("spec") or {}).get("replicaSpecs") or {}
        out: list[tuple[str, int]] = []
        for replica_type in REPLICA_TYPES:
            spec = specs.get(replica_type)
            if isinstance(spec, Mapping):
                count = spec.get("replicas", 1)
                out.extend((replica_type, i) for i in range(int(count or 0)))
        return out

    def pod_name(self, replica_type: str, index: int) -> str:
        return f"{self.name}-{replica_type}-{index}"

    @property
    def _meta(self) -> Mapping[str, Any]:
        return self.raw.get("metadata") or {}


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica of a job and its pod (``phase`` is ``-`` when the pod does not exist,
    e.g. before the operator created it or after ``cleanPodPolicy`` removed it)."""

    name: str
    replica_type: str
    index: int
    phase: str
    restarts: int
    exit_code: int | None = None
    reason: str = ""
    node: str = ""

    @property
    def label(self) -> str:
        """``worker-1``: how logs and messages name the replica."""
        return f"{self.replica_type}-{self.index}"


def replica_infos(job: SubmittedJob, pods: Mapping[str, Mapping[str, Any]]) -> list[ReplicaInfo]:
    """One row per replica of ``job``, given its pods by name (API JSON, camelCase)."""
    rows = []
    for replica_type, index in job.replicas():
        name = job.pod_name(replica_type, index)
        pod = pods.get(name)
        restarts = job.replica_restarts(replica_type)
        if pod is None:
            rows.append(ReplicaInfo(name, replica_type, index, "-", restarts))
            continue
        status = pod.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            phase = "Terminating"
        terminated = _terminated(pod)
        exit_code = terminated.get("exitCode")
        rows.append(
            ReplicaInfo(
                name=name,
                replica_type=replica_type,
                index=index,
                phase=phase,
                restarts=restarts,
                exit_code=int(exit_code) if exit_code is not None else None,
                reason=str(terminated.get("reason") or status.get("reason") or ""),
                node=str((pod.get("spec") or {}).get("nodeName") or ""),
            )
        )
    return rows


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The training container's terminated state, when it has one."""
    try:
        name = training_container(pod).get("name")
    except ValueError:
        name = None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return (status.get("state") or {}).get("terminated") or {}
    return {}
