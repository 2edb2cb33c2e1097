"""``ClusterSpec``: a cluster's tasks, organised into jobs (``tf.train.ClusterSpec``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

ClusterLike = Union["ClusterSpec", Mapping[str, Any]]

_BAD_CLUSTER = (
    "`cluster` must be a dictionary mapping one or more job names to lists of network "
    "addresses, or a `ClusterDef` protocol buffer"
)


class ClusterSpec:
    """Jobs (``"worker"``, ``"ps"``, ...) mapped to their tasks' network addresses.

    Each job is either a list of addresses (task ``i`` is the ``i``-th) or a sparse
    ``{task_index: address}`` mapping, so a task can be configured knowing only
    itself::

        ClusterSpec({"worker": {1: "worker1:2222"}, "ps": ["ps0:2222", "ps1:2222"]})
    """

    def __init__(self, cluster: ClusterLike) -> None:
        self._cluster_spec: dict[str, dict[int, str]] = {}
        if isinstance(cluster, ClusterSpec):
            for job_name in cluster.jobs:
                self._cluster_spec[job_name] = {
                    i: cluster.task_address(job_name, i) for i in cluster.task_indices(job_name)
                }
            return
        if not isinstance(cluster, Mapping):
            raise TypeError(_BAD_CLUSTER)
        for job_name, tasks in cluster.items():
            if not isinstance(job_name, str | bytes):
                raise TypeError(f"Job name {job_name!r} must be bytes or unicode")
            if isinstance(job_name, bytes):
                job_name = job_name.decode()
            if isinstance(tasks, Sequence) and not isinstance(tasks, str | bytes):
                job_tasks = dict(enumerate(tasks))
            elif isinstance(tasks, Mapping):
                job_tasks = {int(i): task for i, task in tasks.items()}
            else:
                raise TypeError(
                    f"The tasks for job {job_name!r} must be a list or a dictionary "
                    "from integers to strings."
                )
            for index, address in job_tasks.items():
                if isinstance(address, bytes):
                    job_tasks[index] = address.decode()
                elif not isinstance(address, str):
                    raise TypeError(f"Task address {address!r} must be bytes or unicode")
            self._cluster_spec[job_name] = job_tasks

    def __bool__(self) -> bool:
        return bool(self._cluster_spec)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._cluster_spec == other._cluster_spec
        if isinstance(other, Mapping):
            try:
                return self._cluster_spec == ClusterSpec(other)._cluster_spec
            except (TypeError, ValueError):
                return False
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value type, like TF's

    def __repr__(self) -> str:
        key_values = self.as_dict()
        items = [f"{k!r}: {key_values[k]!r}" for k in sorted(key_values)]
        return "ClusterSpec({" + ", ".join(items) + "})"

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """Jobs to tasks: a list where the task indices are dense, else ``{index: address}``."""
        result: dict[str, list[str] | dict[int, str]] = {}
        for job in self.jobs:
            indices = self.task_indices(job)
            if not indices:
                result[job] = {}
            elif max(indices) + 1 == len(indices):
                result[job] = [self._cluster_spec[job][i] for i in indices]
            else:
                result[job] = {i: self._cluster_spec[job][i] for i in indices}
        return result

    @property
    def jobs(self) -> list[str]:
        """The job names of this cluster."""
        return list(self._cluster_spec)

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._cluster_spec[job_name]
        except (KeyError, TypeError):
            raise ValueError(f"No such job in cluster: {job_name!r}") from None

    def num_tasks(self, job_name: str) -> int:
        """Number of tasks of ``job_name``; ``ValueError`` for an unknown job."""
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """Sorted task indices of ``job_name``; ``ValueError`` for an unknown job."""
        return sorted(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """Address of task ``task_index`` of ``job_name``; ``ValueError`` if there is none."""
        job = self._job(job_name)
        try:
            return job[task_index]
        except (KeyError, TypeError):
            raise ValueError(f"No task with index {task_index!r} in job {job_name!r}") from None

    def job_tasks(self, job_name: str) -> list[str | None]:
        """Addresses indexed by task id, ``None`` where a sparse job has a gap."""
        job = self._job(job_name)
        tasks: list[str | None] = [None] * (max(job) + 1 if job else 0)
        for index, address in job.items():
            tasks[index] = address
        return tasks
