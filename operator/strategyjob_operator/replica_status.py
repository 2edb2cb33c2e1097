"""``status.replicaStatuses``: per replica type, its pods by phase, its restarts and the indices
whose run is over (``completedIndexes``, ``failedIndexes``), remembered so that a finished pod
deleted later is neither recreated nor counted as a failure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c
from strategyjob_operator.observe import Replica
from strategyjob_operator.plan import as_count


def restart_attempt(status: Mapping[str, Any]) -> int:
    """The run the job's new pods belong to: its restarts plus its preemption restarts and
    re-formings at a new size (``STRATEGYJOB_RESTART_ATTEMPT`` and the ``restart-attempt``
    label of its pods)."""
    return sum(as_count(status.get(k, 0)) for k in ("restartCount", "preemptions", "resizes"))


def format_indexes(indexes: Iterable[int]) -> str:
    """Indices as Kubernetes Job's ``completedIndexes`` writes them: ``"0-3,5,7-8"``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def parse_indexes(value: Any, count: int) -> set[int]:
    """The indices below ``count`` that ``value`` (``format_indexes``' form) names; parts
    that cannot be read are skipped (a status edited by hand must not stop every pass)."""
    out: set[int] = set()
    if not isinstance(value, str):
        return out
    for part in value.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or not (last or first).isdigit():
            continue
        lo, hi = int(first), min(int(last or first), count - 1)
        out.update(range(lo, hi + 1))
    return out


@dataclass
class FinishedReplicas:
    """Per replica type, the indices whose run is over: completed (training container
    exited 0) and given up (an evaluator that is not restarted any more)."""

    completed: dict[str, set[int]]
    given_up: dict[str, set[int]]

    def keys(self) -> set[tuple[str, int]]:
        return {(t, i) for t, ix in (*self.completed.items(), *self.given_up.items()) for i in ix}


def finished_replicas(
    job: jobspec.StrategyJob, replicas: Mapping[tuple[str, int], Replica], old: Any, launched: bool
) -> FinishedReplicas:
    """What the status remembers plus what the pods show now. A deleted pod that is still
    terminating counts only in a launched run: right after a restart it is the old run's."""
    completed: dict[str, set[int]] = {}
    given_up: dict[str, set[int]] = {}
    for t in job.replica_specs:
        prev = old.get(t) if isinstance(old, Mapping) else None
        prev = prev if isinstance(prev, Mapping) else {}
        n = job.num_replicas(t)
        if jobspec.serves_until_stopped(job, t):
            # Never completes: its exit is a failure (failures.find_failures).
            completed[t], given_up[t] = set(), set()
            continue
        done = parse_indexes(prev.get("completedIndexes"), n)
        done |= {
            r.index
            for r in replicas.values()
            if r.replica_type == t and r.phase == "Succeeded" and (launched or not r.terminating)
        }
        completed[t] = done
        given_up[t] = parse_indexes(prev.get("failedIndexes"), n) - done
    return FinishedReplicas(completed, given_up)


def replica_counts(
    job: jobspec.StrategyJob,
    replicas: Mapping[tuple[str, int], Replica],
    old: Any,
    finished: FinishedReplicas | None = None,
) -> dict[str, Any]:
    """``status.replicaStatuses``: per replica type, its pods by phase, its restarts and the
    indices whose run is over (``finished``; by default, those whose pod succeeded)."""
    if finished is None:
        finished = finished_replicas(job, replicas, {}, launched=False)
    out: dict[str, Any] = {}
    for t in job.replica_specs:
        mine = [r for r in replicas.values() if r.replica_type == t]
        prev = old.get(t) if isinstance(old, Mapping) else None
        prev = prev if isinstance(prev, Mapping) else {}
        completed = finished.completed.get(t, set())
        given_up = finished.given_up.get(t, set())
        out[t] = {
            "active": sum(
                1 for r in mine if r.phase in ("Pending", "Running") and not r.terminating
            ),
            "ready": sum(1 for r in mine if r.phase == "Running" and not r.terminating),
            "succeeded": len(completed),
            "failed": len({r.index for r in mine if r.phase == "Failed"} | given_up),
            "restarts": as_count(prev.get("restarts", 0)),
            "selector": f"{c.LABEL_JOB_NAME}={job.name},{c.LABEL_REPLICA_TYPE}={t}",
        }
        if completed:
            out[t]["completedIndexes"] = format_indexes(completed)
        if given_up:
            out[t]["failedIndexes"] = format_indexes(given_up)
    return out


def forget_finished(counts: Mapping[str, Any]) -> None:
    """A new run (whole-job restart, resume) runs every replica again."""
    for entry in counts.values():
        entry.pop("completedIndexes", None)
        entry.pop("failedIndexes", None)
        entry["succeeded"] = 0
