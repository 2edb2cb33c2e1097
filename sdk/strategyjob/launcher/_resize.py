"""The pure rules of a local resize (``strategyjob scale NAME --replicas N --local``, issue 30):
which requests are refused and the job at its new size. The launcher (:mod:`._runner`) starts
and stops the processes and writes the chief's cluster file (``jobspec.cluster_spec``)."""

from __future__ import annotations

import dataclasses

from strategyjob.jobspec import REFORMED_STRATEGIES, RESIZABLE_STRATEGIES, StrategyJob
from strategyjob.jobspec import messages as msg


def refusal(job: StrategyJob, replicas: object, tfjob: bool = False) -> str | None:
    """Why ``replicas`` workers cannot be asked of the running ``job`` (None: they can), in
    the words the API server uses for a cluster job."""
    if tfjob:
        return "a TFJob run by strategyjob run cannot be resized; run it as a StrategyJob"
    if job.strategy not in RESIZABLE_STRATEGIES + REFORMED_STRATEGIES:
        return msg.NOT_RESIZABLE.format(strategy=job.strategy, value=replicas)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        return f"--replicas must be a whole number of workers, 1 or more (got {replicas!r})"
    spec = job.replica_specs["worker"]
    if spec.min_replicas is not None and replicas < spec.min_replicas:
        return msg.BELOW_MIN_REPLICAS.format(value=replicas, minimum=spec.min_replicas)
    if spec.max_replicas is not None and replicas > spec.max_replicas:
        return msg.ABOVE_MAX_REPLICAS.format(value=replicas, maximum=spec.max_replicas)
    return None


def with_workers(job: StrategyJob, replicas: int) -> StrategyJob:
    """``job`` with ``replicas`` workers."""
    worker = dataclasses.replace(job.replica_specs["worker"], replicas=replicas)
    return dataclasses.replace(job, replica_specs={**job.replica_specs, "worker": worker})
