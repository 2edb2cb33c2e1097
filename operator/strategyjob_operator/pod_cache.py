"""The pods of each job as the operator last saw them (from the watch, or read), so that a
pass reads from the API server only its pods' metadata and fetches only the pods that
changed since: at 1000 workers that is the difference between decoding every pod's whole
spec and status on the event loop at every pass, and decoding their names and versions.

What a pass gets is exactly what one list of the job's pods would have given: the metadata
list is the snapshot (which pods exist, at which ``resourceVersion``), and a remembered pod
is used only when its uid and ``resourceVersion`` are the ones listed (the API server
changes the ``resourceVersion`` on every write); any other is read again, by name when
they are few, else with one full list. A stale or missed watch event thus costs a read,
never a wrong decision. Only jobs that have had a pass are remembered, until their loop
ends (:meth:`PodCache.forget`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from strategyjob_operator import children
from strategyjob_operator import constants as c
from strategyjob_operator.kube import bounded_gather, observed_part

#: Changed pods are read one GET each when they are at most this many or a tenth of the
#: job's pods (a GET costs about what listing ten pods does), and at most half of them;
#: more are read with one list of the job's pods.
FETCH_ONE_BY_ONE = 8

JobRef = tuple[str, str]
"""``(namespace, job name)``."""


class PodReader(Protocol):
    """What the cache needs of the API client (:class:`~strategyjob_operator.kube.KubeApi`)."""

    max_in_flight: int

    def core_path(self, namespace: str, plural: str, name: str = "") -> str: ...

    async def get(self, path: str) -> dict[str, Any] | None: ...

    async def list_metadata(self, path: str, label_selector: str) -> list[dict[str, Any]]: ...

    # last: in the class body below it, ``list`` names this method
    async def list(self, path: str, label_selector: str) -> list[dict[str, Any]]: ...


def _version(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    meta = obj.get("metadata") or {}
    return meta.get("uid"), meta.get("resourceVersion")


def _job_of(pod: Mapping[str, Any]) -> JobRef | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(c.LABEL_JOB_NAME)
    namespace = meta.get("namespace")
    return (namespace, job) if namespace and job else None


def match(
    listed: Sequence[Mapping[str, Any]], known: Mapping[str, dict[str, Any]]
) -> tuple[list[dict[str, Any] | None], list[str]]:
    """For each listed pod (metadata only), the remembered pod when it is that very version
    (same uid and ``resourceVersion``; a pod without a ``resourceVersion`` never matches),
    else None; and the names of the pods to read again."""
    found: list[dict[str, Any] | None] = []
    missing: list[str] = []
    for item in listed:
        name = (item.get("metadata") or {}).get("name") or ""
        pod = known.get(name)
        uid, version = _version(item)
        if pod is not None and version and _version(pod) == (uid, version):
            found.append(pod)
        else:
            found.append(None)
            missing.append(name)
    return found, missing


def one_by_one(missing: int, listed: int) -> bool:
    """Whether reading ``missing`` of ``listed`` pods by name beats one list of them all."""
    return 0 < missing <= max(FETCH_ONE_BY_ONE, listed // 10) and 2 * missing <= listed


class PodCache:
    """The pods of each job the operator reconciles, by job and pod name."""

    def __init__(self, api: PodReader) -> None:
        self.api = api
        self._jobs: dict[JobRef, dict[str, dict[str, Any]]] = {}

    def watched(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A watch event of a pod: remembered (or forgotten, when deleted) if its job is."""
        job = _job_of(pod)
        known = self._jobs.get(job) if job else None
        if known is None:
            return
        name = (pod.get("metadata") or {}).get("name") or ""
        if event_type == "DELETED":
            if name in known and _version(known[name])[0] == _version(pod)[0]:
                del known[name]
        else:
            known[name] = observed_part(pod)

    def forget(self, namespace: str, job: str) -> None:
        """Drop a job's pods, once its loop ends."""
        self._jobs.pop((namespace, job), None)

    def remembered(self) -> set[JobRef]:
        return set(self._jobs)

    async def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The job's pods (those with its job-name label), as one list of them would be."""
        api = self.api
        path = api.core_path(namespace, "pods")
        selector = children.job_selector(job)
        listed = await api.list_metadata(path, selector)
        found, missing = match(listed, self._jobs.get((namespace, job), {}))
        if one_by_one(len(missing), len(listed)):
            fetched = await self._read(namespace, job, missing)
            current = []
            for pod, item in zip(found, listed, strict=True):
                if pod is None:
                    pod = fetched.get((item.get("metadata") or {}).get("name") or "")
                if pod is not None:
                    current.append(pod)
        elif missing:
            current = await api.list(path, selector)
        else:
            current = [pod for pod in found if pod is not None]
        self._jobs[(namespace, job)] = {
            (pod.get("metadata") or {}).get("name") or "": pod for pod in current
        }
        return current

    async def _read(self, namespace: str, job: str, names: list[str]) -> dict[str, dict[str, Any]]:
        """The named pods, read one by one; those gone since the list, or no longer the
        job's, left out (as a later list would leave them)."""
        api = self.api

        def reader(name: str) -> Callable[[], Awaitable[dict[str, Any] | None]]:
            return lambda: api.get(api.core_path(namespace, "pods", name))

        reads = await bounded_gather([reader(n) for n in names], api.max_in_flight)
        out: dict[str, dict[str, Any]] = {}
        for name, result in zip(names, reads, strict=True):
            if isinstance(result, BaseException):
                raise result
            if result is not None and _job_of(result) == (namespace, job):
                out[name] = observed_part(result)
        return out
