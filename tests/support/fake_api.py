"""A recording stand-in for the operator's API client, for pure-logic tests of the reconciler:
it serves one job, lists no pods and records what the reconciler creates."""

from __future__ import annotations

from typing import Any

from strategyjob_operator.kube import KubeApi


class FakeApi:
    """Serves ``job`` (None: deleted, a 404) and records each created object (``created``:
    name -> object), or refuses every create with ``refuse`` when set. A status patch
    replaces the job's status, as the API server's merge of it does."""

    core_path = staticmethod(KubeApi.core_path)
    group_path = staticmethod(KubeApi.group_path)

    def __init__(self, job: dict[str, Any] | None) -> None:
        self.job = job
        self.created: dict[str, dict[str, Any]] = {}
        self.refuse: Exception | None = None
        self.gets = 0

    async def get(self, path: str) -> dict[str, Any] | None:
        self.gets += 1
        return self.job

    async def list(self, path: str, selector: str) -> list[dict[str, Any]]:
        return []

    async def create(self, path: str, obj: dict[str, Any]) -> bool:
        if self.refuse is not None:
            raise self.refuse
        self.created[obj["metadata"]["name"]] = obj
        return True

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        if "status" in patch and self.job is not None:
            self.job = {**self.job, "status": patch["status"]}
        return {}

    async def post_event(self, *args: Any) -> None:
        return None
