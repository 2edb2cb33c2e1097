"""Resizing a running job, as pure decisions the reconciler carries out.

* TFJob ``replicas`` edits, as training-operator handles them: the indices added are
  created, the pods and Services at an index the job no longer has are deleted. Replicas
  that exist keep their ``TF_CONFIG`` (the cluster they were made with).
* A ParameterServerStrategy StrategyJob's workers (issue 30; ``kubectl scale``): the same
  for its worker pods, and the chief follows the workers without a restart through the
  job's members ConfigMap, mounted as the file ``STRATEGYJOB_CLUSTER_FILE`` names. A new
  worker joins it once its pod is Ready (before, the chief would wait on an address that
  does not answer); a removed one leaves it before its pod is deleted. The CRD keeps every
  other count, and the workers of other strategies, immutable.
* A TFJob with ``enableDynamicWorker``, a chief (``Chief`` or ``Master``) and ``PS``
  replicas (so ParameterServerStrategy-shaped): its ``Worker`` edits go the StrategyJob
  way, its chief following the TFJob's own cluster (its per-replica Services) in the same
  members file; the edits of its other types stay training-operator's. Every other TFJob
  keeps training-operator's edits alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c
from strategyjob_operator.observe import Replica
from strategyjob_operator.replica_status import format_indexes, parse_indexes
from strategyjob_operator.stalls import cannot_start, first_names

#: Where the chief of a resizable job finds the workers it follows, and the ConfigMap's keys:
#: the file (TF_CONFIG's ``cluster``, workers as ``{index: address}``), the workers in it, and
#: the worker count the job's pods were last made for.
MEMBERS_DIR = "/etc/strategyjob/members"
MEMBERS_FILE_KEY = "cluster.json"
WORKERS_KEY = "workers"
REPLICAS_KEY = "replicas"
#: On the chief's pod: the workers it was last told of. Changing an annotation makes the
#: kubelet sync the pod at once, which refreshes its ConfigMap volume (else it waits for its
#: periodic sync, about a minute).
ANNOTATION_MEMBERS = f"{c.GROUP}/members"


def running(status: Mapping[str, Any], suspended: bool) -> bool:
    """Whether the job's pods were all created and it is neither suspended nor over: a job
    not yet started, or suspended, creates what it lacks as usual."""
    conds = status.get("conditions") or []
    over = any(
        x.get("type") in (c.SUCCEEDED, c.FAILED) and x.get("status") == "True" for x in conds
    )
    return bool(status.get("launched")) and not (suspended or over)


def scaled(status: Mapping[str, Any], generation: int, suspended: bool) -> bool:
    """Whether the spec changed since the last pass decided (``observedGeneration``) of a
    running job: then its ``replicas`` may have changed."""
    seen = status.get("observedGeneration")
    return seen not in (None, generation) and running(status, suspended)


def _names(job: jobspec.StrategyJob) -> set[str]:
    return {job.pod_name(t, i) for t, i in job.replicas()}


def surplus(
    job: jobspec.StrategyJob, objs: Iterable[Mapping[str, Any]], uid: str
) -> list[tuple[str, str | None]]:
    """``(name, uid)`` of the objects (pods, Services) that job ``uid`` controls and that no
    replica of the job has any more (an index at or above its ``replicas``)."""
    wanted = _names(job)
    out: list[tuple[str, str | None]] = []
    for obj in objs:
        meta = obj.get("metadata") or {}
        refs = meta.get("ownerReferences") or []
        mine = any(r.get("controller") and r.get("uid") == uid for r in refs)
        if mine and meta.get("name") not in wanted and not meta.get("deletionTimestamp"):
            out.append((meta["name"], meta.get("uid")))
    return sorted(out)


def added(job: jobspec.StrategyJob, services: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """The replicas the job gained: those without a Service yet (a TFJob's replicas each get
    one when created; a replica whose pod is gone but whose Service is there lost its pod,
    which the decisions count as a failure)."""
    have = {(s.get("metadata") or {}).get("name") for s in services}
    return [(t, i) for t, i in job.replicas() if job.pod_name(t, i) not in have]


# --- a ParameterServerStrategy StrategyJob's workers ------------------------------------------


def reforms(job: jobspec.StrategyJob, tfjob: jobspec.TFJob | None) -> bool:
    """Whether a change of the job's worker count re-forms it: every pod stops (saving its
    checkpoint at the next step boundary) and the job resumes at the new size. A TFJob's
    ``replicas`` edits follow training-operator instead (:func:`surplus`, :func:`added`)."""
    return tfjob is None and job.strategy in jobspec.REFORMED_STRATEGIES


def resizable(job: jobspec.StrategyJob, tfjob: jobspec.TFJob | None) -> bool:
    """Whether the job's chief follows its workers as they join and leave while it runs: a
    ParameterServerStrategy StrategyJob (the CRD lets only its workers change their count),
    and a TFJob under ``enableDynamicWorker`` with a chief and ps (a TFJob's strategy is
    ParameterServerStrategy when it has ps); never a TFJob without a chief to tell."""
    if job.strategy not in jobspec.RESIZABLE_STRATEGIES or "worker" not in job.replica_specs:
        return False
    return tfjob is None or (tfjob.enable_dynamic_worker and "chief" in job.replica_specs)


@dataclass(frozen=True)
class Members:
    """What the job's members ConfigMap says: the workers the chief follows and the worker
    count the pods were made for."""

    workers: tuple[int, ...]
    replicas: int


def initial_members(job: jobspec.StrategyJob) -> Members:
    """At creation: every worker of the spec, as in every pod's TF_CONFIG."""
    count = job.num_replicas("worker")
    return Members(tuple(range(count)), count)


def read_members(data: Mapping[str, Any] | None) -> Members | None:
    """The members a ConfigMap's ``data`` holds; None when it has none (not created yet)."""
    if not data or REPLICAS_KEY not in data:
        return None
    try:
        replicas = int(data[REPLICAS_KEY])
    except (TypeError, ValueError):
        return None
    workers = parse_indexes(data.get(WORKERS_KEY) or "", replicas)
    return Members(tuple(sorted(workers)), replicas)


def members_data(
    job: jobspec.StrategyJob, members: Members, tfjob: jobspec.TFJob | None = None
) -> dict[str, str]:
    """The ConfigMap's ``data`` for ``members``: the chief's file is TF_CONFIG's cluster with
    the workers as ``{index: address}`` (the sparse form TensorFlow's ``ClusterSpec`` takes).
    A TFJob's is its own cluster: its Services' addresses, its type names (``master``), as
    its dense ``TF_CONFIG`` would write them."""
    addresses_of = jobspec.cluster_for_kubernetes(job) if tfjob is None else tfjob.cluster()
    cluster: dict[str, Any] = {t: a for t, a in addresses_of.items() if t != "evaluator"}
    addresses = cluster.get("worker") or []
    cluster["worker"] = {str(i): addresses[i] for i in members.workers if i < len(addresses)}
    if tfjob is not None:
        cluster = {tfjob.type_name(t): a for t, a in cluster.items()}
    return {
        MEMBERS_FILE_KEY: json.dumps(cluster, sort_keys=True, separators=(",", ":")),
        WORKERS_KEY: format_indexes(members.workers),
        REPLICAS_KEY: str(members.replicas),
    }


def ready_workers(pods: Iterable[Mapping[str, Any]]) -> set[int]:
    """The indices of the worker pods whose Ready condition holds (and that are not going)."""
    out: set[int] = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(c.LABEL_REPLICA_TYPE) != "worker" or meta.get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(x.get("type") == "Ready" and x.get("status") == "True" for x in conditions):
            try:
                out.add(int(labels.get(c.LABEL_REPLICA_INDEX, "")))
            except ValueError:
                continue
    return out


def next_members(job: jobspec.StrategyJob, previous: Members, ready: set[int]) -> Members:
    """The workers the chief should follow now: those it follows that the spec still has,
    plus the spec's workers whose pods became Ready. (A worker it follows whose pod is
    replaced after a failure stays: the chief waits for it, as for any restarted worker.)"""
    count = job.num_replicas("worker")
    kept = {i for i in previous.workers if i < count}
    joined = {i for i in ready if i < count}
    return Members(tuple(sorted(kept | joined)), count)


def added_workers(
    job: jobspec.StrategyJob, previous: Members, pods: Iterable[Mapping[str, Any]]
) -> list[tuple[str, int]]:
    """The worker replicas a resize added that have no pod yet: indices at or above the count
    the pods were made for. (A missing pod below it is a failure, which the decisions count.)
    A pod that is going (a worker removed and added again before it ended) is not the new
    worker's: its pod is made once the old one is gone."""
    have = {
        meta.get("name")
        for p in pods
        if not (meta := p.get("metadata") or {}).get("deletionTimestamp")
    }
    return [
        ("worker", i)
        for i in range(previous.replicas, job.num_replicas("worker"))
        if job.pod_name("worker", i) not in have
    ]


def added_others(
    job: jobspec.StrategyJob, services: Iterable[Mapping[str, Any]]
) -> list[tuple[str, int]]:
    """A resizable TFJob's replicas other than workers that an edit added (:func:`added`):
    its chief follows only workers, so these are created as training-operator creates them."""
    return [(t, i) for t, i in added(job, services) if t != "worker"]


def joining(job: jobspec.StrategyJob, members: Members | None) -> frozenset[tuple[str, int]]:
    """The spec's workers the chief does not follow yet: a resize added them and their pods
    are not Ready (``decide``'s ``joining``)."""
    if members is None:
        return frozenset()
    count = job.num_replicas("worker")
    return frozenset(("worker", i) for i in range(count) if i not in members.workers)


def resize_condition(
    job: jobspec.StrategyJob,
    members: Members | None,
    replicas: Mapping[tuple[str, int], Replica] | None = None,
) -> tuple[bool, str, str]:
    """``Resizing``: (status, reason, message). True while the chief follows other workers
    than the spec's, naming those it waits for, and why when their pods (in the observed
    ``replicas``) cannot start (reason ``ResizeStalled``: the job runs on at its old size
    meanwhile); False once it follows them all, or once the job stopped running (``members``
    None: suspended or over)."""
    if members is None:
        return False, c.REASON_RESIZED, f"StrategyJob {job.name} is not running."
    wanted = tuple(range(job.num_replicas("worker")))
    if members.workers == wanted:
        return False, c.REASON_RESIZED, f"StrategyJob {job.name} runs {len(wanted)} workers."
    waiting = [job.pod_name("worker", i) for i in wanted if i not in members.workers]
    message = (
        f"StrategyJob {job.name}: resizing to {len(wanted)} workers; the chief follows "
        f"{len(members.workers)}, waiting for {first_names(waiting)} to be Ready."
    )
    blocked = [
        r
        for k in sorted(joining(job, members))
        if (r := (replicas or {}).get(k)) is not None and r.stuck_reason
    ]
    if not blocked:
        return True, c.REASON_RESIZING, message
    stalled = message + cannot_start(blocked, len(members.workers))
    return True, c.REASON_RESIZE_STALLED, stalled


def resized_message(job: jobspec.StrategyJob, before: Sequence[int], after: Sequence[int]) -> str:
    """The Event said when the chief's workers change."""
    joined = [i for i in after if i not in before]
    left = [i for i in before if i not in after]
    parts = [f"joined: worker {format_indexes(joined)}"] if joined else []
    parts += [f"left: worker {format_indexes(left)}"] if left else []
    return (
        f"StrategyJob {job.name}: workers {len(before)} -> {len(after)} "
        f"({'; '.join(parts)}); the chief follows them without a restart."
    )
