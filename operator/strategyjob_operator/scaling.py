"""TFJob ``replicas`` edits, as training-operator handles them: the indices added are
created, the pods and Services at an index the job no longer has are deleted. Replicas
that exist keep their ``TF_CONFIG`` (the cluster they were made with). Pure: the reconciler
reads the objects and carries the result out. StrategyJobs cannot be scaled (their CRD
keeps ``replicas`` immutable)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c


def scaled(status: Mapping[str, Any], generation: int, suspended: bool) -> bool:
    """Whether the spec changed since the last pass decided (``observedGeneration``) of a job
    whose pods run: then its ``replicas`` may have changed. (A job not yet started, or
    suspended, creates what it lacks as usual.)"""
    seen = status.get("observedGeneration")
    conds = status.get("conditions") or []
    over = any(
        x.get("type") in (c.SUCCEEDED, c.FAILED) and x.get("status") == "True" for x in conds
    )
    return (
        seen not in (None, generation) and bool(status.get("launched")) and not (suspended or over)
    )


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
