"""What the operator sees of a job's pods, reduced to what its decisions need."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c


@dataclass(frozen=True)
class Replica:
    """One existing pod of the job, as far as decisions are concerned."""

    replica_type: str
    index: int
    name: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    terminating: bool = False
    exit_code: int | None = None
    reason: str | None = None  # e.g. OOMKilled, Error, Evicted
    finished_at: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.replica_type, self.index)

    @property
    def label(self) -> str:
        """How messages name the replica, e.g. ``worker-3``."""
        return f"{self.replica_type}-{self.index}"


def _terminated_state(pod: Mapping[str, Any], container_name: str) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    chosen = next((s for s in statuses if s.get("name") == container_name), None)
    if chosen is None:
        chosen = next((s for s in statuses if (s.get("state") or {}).get("terminated")), None)
    if chosen is None:
        return {}
    return (chosen.get("state") or {}).get("terminated") or {}


def replica_from_pod(pod: Mapping[str, Any], training_container_name: str) -> Replica | None:
    """The pod's replica, or None when it does not carry the job's labels."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    replica_type = labels.get(c.LABEL_REPLICA_TYPE)
    index = labels.get(c.LABEL_REPLICA_INDEX)
    if replica_type not in jobspec.REPLICA_TYPES or index is None or not index.isdigit():
        return None
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    terminated = _terminated_state(pod, training_container_name)
    exit_code = terminated.get("exitCode") if phase == "Failed" else None
    reason = terminated.get("reason") or status.get("reason") if phase == "Failed" else None
    return Replica(
        replica_type=replica_type,
        index=int(index),
        name=meta.get("name", ""),
        phase=phase,
        terminating=bool(meta.get("deletionTimestamp")),
        exit_code=exit_code,
        reason=reason,
        finished_at=terminated.get("finishedAt"),
    )


def _owned_by(pod: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == owner_uid for r in refs)


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid of the StrategyJob that controls ``obj`` (None: no StrategyJob does)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller") and ref.get("kind") == c.KIND:
            return ref.get("uid")
    return None


def left_by_earlier_job(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """True for a child of an earlier StrategyJob of the same name (deleted, then created
    again before the garbage collector removed its children)."""
    uid = controller_uid(obj)
    return uid is not None and uid != owner_uid


def observe(
    job: jobspec.StrategyJob, pods: Iterable[Mapping[str, Any]], owner_uid: str | None = None
) -> dict[tuple[str, int], Replica]:
    """The job's replicas that have a pod, keyed by ``(type, index)``.

    Pods of indices the job does not have are ignored, and so are pods another object
    controls (e.g. those of an earlier job of the same name that the garbage collector
    has not removed yet): their names block creation until they are gone.
    """
    wanted = set(job.replicas())
    names = {
        t: jobspec.training_container(spec.template).get("name", "")
        for t, spec in job.replica_specs.items()
    }
    seen: dict[tuple[str, int], Replica] = {}
    for pod in pods:
        if owner_uid is not None and not _owned_by(pod, owner_uid):
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        replica = replica_from_pod(pod, names.get(labels.get(c.LABEL_REPLICA_TYPE, ""), ""))
        if replica is not None and replica.key in wanted:
            seen[replica.key] = replica
    return seen
