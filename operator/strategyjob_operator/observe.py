"""What the operator sees of a job's pods, reduced to what its decisions need."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c

#: Container waiting reasons that do not clear by themselves: the pod stays Pending until
#: someone fixes the image, the Secret or ConfigMap, or the container's spec.
STUCK_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
#: The PodScheduled=False reason of a pod no node can take.
UNSCHEDULABLE = "Unschedulable"
#: The pod condition Kubernetes sets on a pod it is about to delete or stop for reasons of
#: its own (preemption, eviction, node drain or taint, node shutdown, pod garbage collection).
DISRUPTION_TARGET = "DisruptionTarget"
#: The pod's ``status.reason`` after the kubelet evicted it (node pressure) on clusters that
#: do not set DisruptionTarget.
EVICTED = "Evicted"


@dataclass(frozen=True)
class Replica:
    """One existing pod of the job, as far as decisions are concerned."""

    replica_type: str
    index: int
    name: str
    #: The replica's phase: the pod's, except that a terminated training container
    #: decides Succeeded (exit 0) or Failed while a sidecar keeps the pod Running.
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    terminating: bool = False
    exit_code: int | None = None
    reason: str | None = None  # e.g. OOMKilled, Error, Evicted
    #: The failed training container's termination message: what it wrote to
    #: ``/dev/termination-log``, else (``FallbackToLogsOnError``) its last log lines.
    message: str | None = None
    finished_at: str | None = None
    #: The pod's own phase when it differs from ``phase`` (a sidecar still running).
    pod_phase: str | None = None
    created_at: str | None = None
    #: Why the pod cannot start (e.g. ImagePullBackOff, Unschedulable), and the detail.
    stuck_reason: str | None = None
    stuck_message: str | None = None
    #: Why the cluster took the pod away (the DisruptionTarget condition's reason, e.g.
    #: PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager,
    #: TerminationByKubelet; or Evicted): not the program's failure.
    disruption: str | None = None
    #: When the DisruptionTarget condition appeared (orders failures: the root cause first).
    disrupted_at: str | None = None
    uid: str | None = None
    #: The node the pod was bound to (``spec.nodeName``); None before it is scheduled.
    node_name: str | None = None
    #: ``metadata.deletionTimestamp``: when the grace period of a deleted pod ends (the API
    #: server sets it to the deletion's time plus that grace).
    deletion_timestamp: str | None = None
    #: ``metadata.deletionGracePeriodSeconds`` of a deleted pod; 0 once force-deleted.
    deletion_grace_seconds: int | None = None
    #: Since when a pod in phase Unknown (its node is unreachable) has been so: the time its
    #: Ready condition went False or Unknown, else when this operator first saw it so.
    unknown_since: str | None = None
    #: The job's attempt the pod was made for (its ``restart-attempt`` label; None without).
    attempt: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.replica_type, self.index)

    @property
    def label(self) -> str:
        """How messages name the replica, e.g. ``worker-3``."""
        return f"{self.replica_type}-{self.index}"

    @property
    def pod_finished(self) -> bool:
        """Whether the pod itself stopped (not only its training container)."""
        return (self.pod_phase or self.phase) in ("Succeeded", "Failed")


def _unknown_since(pod: Mapping[str, Any]) -> str | None:
    """When a pod in phase Unknown lost its readiness (the node lifecycle controller marks
    the pods of an unreachable node not Ready); None when its status does not say."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "Ready"
            and condition.get("status") != "True"
        ):
            since = condition.get("lastTransitionTime")
            return since if isinstance(since, str) and since else None
    return None


#: What the operator makes of a pod's node (:func:`node_state`).
NODE_READY = "Ready"
NODE_NOT_READY = "NotReady"
NODE_GONE = "Gone"


def node_state(node: Mapping[str, Any] | None) -> str:
    """:data:`NODE_GONE` when the Node object does not exist (None), :data:`NODE_READY` when
    its Ready condition is True, else :data:`NODE_NOT_READY` (False, or Unknown: the node
    lifecycle controller heard nothing from its kubelet)."""
    if node is None:
        return NODE_GONE
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return NODE_READY if condition.get("status") == "True" else NODE_NOT_READY
    return NODE_NOT_READY


def _container_status(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if isinstance(s, Mapping) and s.get("name") == name), None)


def _terminated(container_status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if container_status is None:
        return {}
    return (container_status.get("state") or {}).get("terminated") or {}


def _any_terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first terminated container's state: the exit of a failed pod whose training
    container has no status under its name."""
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = _terminated(s if isinstance(s, Mapping) else None)
        if terminated:
            return terminated
    return {}


def _every_container_terminated(pod: Mapping[str, Any]) -> bool:
    """Whether every container of the pod's spec has terminated: the pod is over (its
    ``restartPolicy`` is Never), though a real kubelet writes the containers' states a few
    seconds before it moves the phase from Running (no sidecar keeps it running then)."""
    names = [
        x.get("name")
        for x in (pod.get("spec") or {}).get("containers") or []
        if isinstance(x, Mapping)
    ]
    return bool(names) and all(_terminated(_container_status(pod, str(n))) for n in names)


def _stuck(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(reason, message)`` when the pod cannot start without help: a container waiting
    for an image or config that will not come, or no node that can take the pod."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for s in status.get(key) or []:
            if not isinstance(s, Mapping):
                continue
            waiting = (s.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in STUCK_WAITING_REASONS:
                detail = waiting.get("message") or ""
                return reason, f"container {s.get('name', '?')}: {detail}".rstrip(": ")
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return UNSCHEDULABLE, condition.get("message") or ""
    return None


def disruption(pod: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """``(reason, since)`` when the cluster is taking the pod away, else None: the reason
    and transition time of a true DisruptionTarget condition (set before a preemption, an
    eviction, a node drain or taint, a node shutdown), else the kubelet's Evicted."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == DISRUPTION_TARGET
            and condition.get("status") == "True"
        ):
            since = condition.get("lastTransitionTime")
            return str(condition.get("reason") or DISRUPTION_TARGET), since
    if status.get("reason") == EVICTED:
        return EVICTED, None
    return None


def replica_from_pod(pod: Mapping[str, Any], training_container_name: str) -> Replica | None:
    """The pod's replica, or None when it does not carry the job's labels.

    The training container's exit decides the replica's outcome, not the pod's phase: a
    sidecar (a log shipper, a mesh proxy) keeps the pod Running after training ended."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    replica_type = labels.get(c.LABEL_REPLICA_TYPE)
    index = labels.get(c.LABEL_REPLICA_INDEX)
    if replica_type not in jobspec.REPLICA_TYPES or index is None or not index.isdigit():
        return None
    status = pod.get("status") or {}
    pod_phase = status.get("phase") or "Pending"
    terminated = _terminated(_container_status(pod, training_container_name))
    code = terminated.get("exitCode")
    phase = pod_phase
    if isinstance(code, int) and not isinstance(code, bool):
        phase = "Succeeded" if code == 0 else "Failed"
        if pod_phase == "Running" and _every_container_terminated(pod):
            pod_phase = phase  # finished: cleanPodPolicy Running must not delete it
    elif pod_phase == "Failed" and not terminated:
        terminated = _any_terminated(pod)
    exit_code = terminated.get("exitCode") if phase == "Failed" else None
    reason = (terminated.get("reason") or status.get("reason")) if phase == "Failed" else None
    message = terminated.get("message") if phase == "Failed" else None
    stuck = _stuck(pod) if phase == "Pending" else None
    disrupted = disruption(pod)
    grace = meta.get("deletionGracePeriodSeconds")
    return Replica(
        replica_type=replica_type,
        index=int(index),
        name=meta.get("name", ""),
        phase=phase,
        terminating=bool(meta.get("deletionTimestamp")),
        exit_code=exit_code,
        reason=reason,
        message=message if isinstance(message, str) and message else None,
        finished_at=terminated.get("finishedAt"),
        pod_phase=pod_phase if pod_phase != phase else None,
        created_at=meta.get("creationTimestamp"),
        stuck_reason=stuck[0] if stuck else None,
        stuck_message=stuck[1] if stuck else None,
        disruption=disrupted[0] if disrupted else None,
        disrupted_at=disrupted[1] if disrupted else None,
        uid=meta.get("uid"),
        node_name=(pod.get("spec") or {}).get("nodeName") or None,
        deletion_timestamp=meta.get("deletionTimestamp") or None,
        deletion_grace_seconds=grace if isinstance(grace, int) else None,
        unknown_since=_unknown_since(pod) if phase == "Unknown" else None,
        attempt=_attempt(labels.get(c.LABEL_RESTART_ATTEMPT)),
    )


def _attempt(label: object) -> int | None:
    return int(label) if isinstance(label, str) and label.isdigit() else None


def _owned_by(pod: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == owner_uid for r in refs)


def controller_uid(obj: Mapping[str, Any], kind: str = c.KIND) -> str | None:
    """The uid of the job of ``kind`` (a StrategyJob; a TFJob) that controls ``obj`` (None:
    no job of that kind does)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("controller") and ref.get("kind") == kind:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def controller_ref(obj: Mapping[str, Any], kind: str = c.KIND) -> Mapping[str, Any] | None:
    """The owner reference of the job of ``kind`` that controls ``obj`` (None: none does)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller") and r.get("kind") == kind), None)


def left_by_earlier_job(
    obj: Mapping[str, Any], owner_uid: str, job_name: str, kind: str = c.KIND
) -> bool:
    """True for a child of an earlier StrategyJob of the same name (deleted, then created
    again before the garbage collector removed its children): its controller is a
    StrategyJob named ``job_name`` whose uid is not ``owner_uid``. A child of another
    StrategyJob (say one relabelled by hand to this job's name) is not: that job is alive
    and the pod is its own. (``kind``: the job's; a TFJob's namesake StrategyJob is another
    job.)"""
    ref = controller_ref(obj, kind)
    if ref is None or ref.get("uid") in (None, owner_uid):
        return False
    return bool(ref.get("name", job_name) == job_name)


def observe(
    job: jobspec.StrategyJob, pods: Iterable[Mapping[str, Any]], owner_uid: str | None = None
) -> dict[tuple[str, int], Replica]:
    """The job's replicas that have a pod, keyed by ``(type, index)``.

    Pods of indices the job does not have are ignored, and so are pods another object
    controls (e.g. those of an earlier job of the same name that the garbage collector
    has not removed yet, or another job's pod relabelled with this job's name) and pods
    whose labels do not match their names (relabelled by hand): their names block
    creation until they are gone.
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
        if replica is None or replica.key not in wanted:
            continue
        if replica.name != job.pod_name(*replica.key):
            continue  # e.g. worker-1's pod relabelled as index 0: not worker-0's pod
        seen[replica.key] = replica
    return seen


def stamp_unknown(
    replicas: Mapping[tuple[str, int], Replica], seen: Mapping[str, str], now: str
) -> tuple[dict[tuple[str, int], Replica], dict[str, str]]:
    """Replicas in phase Unknown whose pod does not say since when get the time the operator
    first saw them so (``seen``, by pod uid; ``now`` for new ones), so that the lost-pod
    timeout runs from then. Returns the replicas and what to remember for the next pass:
    the pods that are Unknown now (a restarted operator starts their clocks again)."""
    out: dict[tuple[str, int], Replica] = {}
    remember: dict[str, str] = {}
    for key, r in replicas.items():
        if r.phase == "Unknown" and r.unknown_since is None and r.uid:
            since = seen.get(r.uid, now)
            remember[r.uid] = since
            r = replace(r, unknown_since=since)
        out[key] = r
    return out, remember
