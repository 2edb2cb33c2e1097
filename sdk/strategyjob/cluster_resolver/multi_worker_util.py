"""Roles in a multi-worker cluster (TF's ``multi_worker_util``): validation, who is
chief, a task's id among the workers, and the collective/coordination leaders.

The messages are TensorFlow's, word for word.
"""

from __future__ import annotations

from typing import Any

from strategyjob.cluster_resolver._cluster_spec import ClusterSpec

ALLOWED_TASK_TYPES: tuple[str | None, ...] = ("chief", "worker", "evaluator", "ps", None)


def normalize_cluster_spec(cluster_spec: Any) -> ClusterSpec:
    """``cluster_spec`` as a :class:`ClusterSpec` (from a dict or a ClusterSpec)."""
    if isinstance(cluster_spec, dict):
        return ClusterSpec(cluster_spec)
    if not isinstance(cluster_spec, ClusterSpec):
        raise ValueError(
            "`cluster_spec' should be dict or a `tf.train.ClusterSpec` or a "
            "`tf.train.ClusterDef` object"
        )
    return cluster_spec


def task_count(cluster_spec: Any, task_type: str) -> int:
    """Number of tasks of ``task_type``; 0 when the job is absent."""
    try:
        return normalize_cluster_spec(cluster_spec).num_tasks(task_type)
    except ValueError:
        return 0


def validate_cluster_spec(cluster_spec: Any, task_type: str | None, task_id: int | None) -> None:
    """Raise ``ValueError`` unless the cluster has only chief/worker/evaluator/ps
    jobs, at most one chief and one evaluator, and contains ``(task_type, task_id)``
    (an evaluator may be absent from the cluster)."""
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if any(job not in ALLOWED_TASK_TYPES for job in cluster_spec.jobs):
        raise ValueError(
            f"Disallowed task type found in cluster spec. Allowed types are "
            f"{ALLOWED_TASK_TYPES} and the cluster spec is {cluster_spec}."
        )
    if task_type not in ALLOWED_TASK_TYPES:
        raise ValueError(
            f"Unrecognized task_type: {task_type}, valid task types are: {ALLOWED_TASK_TYPES}"
        )
    if task_type and task_type not in cluster_spec.jobs and task_type != "evaluator":
        raise ValueError(f"`task_type` {task_type!r} not found in cluster_spec.")
    if task_count(cluster_spec, "chief") > 1:
        raise ValueError("There must be at most one 'chief' job.")
    if task_count(cluster_spec, "evaluator") > 1:
        raise ValueError("There must be at most one 'evaluator' job.")
    if (
        task_type is not None
        and task_id is not None
        and task_type in cluster_spec.jobs
        and task_id >= task_count(cluster_spec, task_type)
    ):
        raise ValueError(f"The `task_id` {task_id} exceeds the maximum id of {task_type}.")


# TF's private name, for code ported from it.
_validate_cluster_spec = validate_cluster_spec


def is_chief(cluster_spec: Any = None, task_type: str | None = None, task_id: int = 0) -> bool:
    """The chief, the evaluator (its own chief), or worker 0 when there is no chief."""
    validate_cluster_spec(cluster_spec, task_type, task_id)
    jobs = normalize_cluster_spec(cluster_spec).jobs
    if task_type in ("chief", "evaluator"):
        return True
    return "chief" not in jobs and task_type == "worker" and task_id == 0


def collective_leader(cluster_spec: Any, task_type: str | None, task_id: int | None) -> str:
    """Device prefix of the task that leads collectives; ``""`` locally or for the evaluator."""
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if not cluster_spec.as_dict():
        return ""
    validate_cluster_spec(cluster_spec, task_type, task_id)
    if task_type == "evaluator":
        return ""
    if "chief" in cluster_spec.jobs:
        return "/job:chief/replica:0/task:0"
    assert "worker" in cluster_spec.jobs
    return "/job:worker/replica:0/task:0"


def coordination_leader(cluster_spec: Any) -> str:
    """Device prefix of the coordination-service leader: ps 0, else the chief, else worker 0."""
    cluster_spec = normalize_cluster_spec(cluster_spec)
    if not cluster_spec.as_dict():
        return ""
    if "ps" in cluster_spec.jobs:
        return "/job:ps/replica:0/task:0"
    if "chief" in cluster_spec.jobs:
        return "/job:chief/replica:0/task:0"
    assert "worker" in cluster_spec.jobs
    return "/job:worker/replica:0/task:0"


def worker_count(cluster_spec: Any, task_type: str | None) -> int:
    """Workers that train together: #chief + #worker (#evaluator for the evaluator)."""
    validate_cluster_spec(cluster_spec, task_type, task_id=0)
    cluster = normalize_cluster_spec(cluster_spec).as_dict()
    if task_type not in ("chief", "worker", "evaluator"):
        raise ValueError(f"Unexpected `task_type` {task_type!r}")
    if task_type == "evaluator":
        return len(cluster["evaluator"])
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def id_in_cluster(cluster_spec: Any, task_type: str | None, task_id: int) -> int:
    """A worker's id in ``[0, worker_count)``: chief 0, worker ``i`` after the chief."""
    validate_cluster_spec(cluster_spec, task_type, task_id)
    cluster = normalize_cluster_spec(cluster_spec).as_dict()
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return task_id + len(cluster.get("chief", []))
    if task_type == "evaluator":
        return task_id
    raise ValueError(f"There is no id for task_type {task_type!r}")
