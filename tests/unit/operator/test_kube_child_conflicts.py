"""A 409 on creating one of a job's children is success only when the job controls the object
that is there; otherwise the job says what blocks it (condition and one Event), and its pods
wait. Against a real API server: tests/integration/test_k8s_real_clusters.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from strategyjob_operator.kube import KubeApi
from strategyjob_operator.metrics import Registry
from strategyjob_operator.outcome import (
    BLOCKED_RETRY_SECONDS,
    REASON_NOT_CONTROLLED,
    REPLICA_FAILURE,
    blocked_message,
)
from strategyjob_operator.reconcile import Reconciler

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
TEMPLATE = {"spec": {"containers": [{"name": "strategyjob", "image": "x"}]}}


def job_obj() -> dict[str, Any]:
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {"worker": {"replicas": 2, "template": TEMPLATE}},
        },
        "status": {},
    }


class TakenApi:
    """The API server, with objects already holding some names: ``taken`` maps a name to
    its ownerReferences."""

    core_path = staticmethod(KubeApi.core_path)
    group_path = staticmethod(KubeApi.group_path)

    def __init__(self, taken: dict[str, list[dict[str, Any]]]) -> None:
        self.job = job_obj()
        self.taken = taken
        self.labels: dict[str, dict[str, str]] = {}
        self.calls: list[tuple[str, ...]] = []

    async def get(self, path: str) -> dict[str, Any]:
        return self.job

    async def list(self, path: str, selector: str) -> list[dict[str, Any]]:
        return []

    async def create(self, path: str, obj: dict[str, Any]) -> bool:
        name = obj["metadata"]["name"]
        self.calls.append(("create", obj["kind"], name))
        self.labels[name] = obj["metadata"].get("labels") or {}  # the one there has the same
        if (obj["kind"], name) in self.taken or name in self.taken:
            return False
        return True

    async def get_metadata(self, path: str) -> dict[str, Any] | None:
        name = path.rsplit("/", 1)[-1]
        self.calls.append(("get", name))
        refs = next(v for k, v in self.taken.items() if name in (k, k[1]))
        labels = self.labels.get(name, {})
        return {"metadata": {"name": name, "ownerReferences": refs, "labels": labels}}

    async def delete(self, path: str, grace_seconds: int | None = None) -> bool:
        self.calls.append(("delete", path.rsplit("/", 1)[-1]))
        return True

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch",))
        self.job = {**self.job, "status": patch["status"]}
        return {}

    async def post_event(self, involved, type_, reason, message, now) -> None:
        self.calls.append(("event", reason, message))

    def condition(self) -> dict[str, Any] | None:
        conds = (self.job.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == REPLICA_FAILURE), None)

    def events(self, reason: str) -> list[str]:
        return [c[2] for c in self.calls if c[0] == "event" and c[1] == reason]


def run(api: TakenApi) -> float | None:
    return asyncio.run(Reconciler(api, clock=lambda: NOW, registry=Registry()).reconcile("ns", "j"))


REPLICA_SET = {"kind": "ReplicaSet", "name": "web-1", "uid": "rs", "controller": True}


def test_an_uncontrolled_pod_is_named_once_and_blocks_only_its_replica():
    api = TakenApi({"j-worker-1": [REPLICA_SET]})
    assert run(api) == BLOCKED_RETRY_SECONDS
    message = (
        "Pod ns/j-worker-1 (controlled by ReplicaSet web-1) has a name StrategyJob j needs "
        "and is not controlled by it: delete it, or give the job another name."
    )
    cond = api.condition()
    assert cond is not None and (cond["status"], cond["reason"], cond["message"]) == (
        "True",
        REASON_NOT_CONTROLLED,
        message,
    )
    assert api.events(REASON_NOT_CONTROLLED) == [message]
    assert ("create", "Pod", "j-worker-0") in api.calls
    assert not [c for c in api.calls if c[0] == "delete"]  # not the operator's to delete

    api.calls.clear()
    run(api)  # still there: no second Event, no status write
    assert api.events(REASON_NOT_CONTROLLED) == []
    assert ("patch",) not in api.calls

    api.taken.clear()  # deleted: the pod is created, the condition goes
    assert run(api) is None
    assert ("create", "Pod", "j-worker-1") in api.calls
    assert api.condition() is None


def test_someone_elses_service_keeps_the_pods_from_being_created():
    api = TakenApi({("Service", "j"): []})
    run(api)
    assert not [c for c in api.calls if c[:2] == ("create", "Pod")]
    cond = api.condition()
    assert cond is not None and cond["message"].startswith("Service ns/j (no controller) has")


def test_a_pod_this_job_controls_is_taken_as_created():
    mine = {"kind": "StrategyJob", "name": "j", "uid": "u", "controller": True}
    api = TakenApi({"j-worker-0": [mine]})
    assert run(api) is None
    assert api.condition() is None and api.events(REASON_NOT_CONTROLLED) == []


def test_a_pod_of_that_name_being_deleted_is_waited_for_quietly():
    api = TakenApi({"j-worker-0": []})

    async def going(path: str) -> dict[str, Any]:
        return {"metadata": {"name": "j-worker-0", "deletionTimestamp": "2026-01-01T11:59:59Z"}}

    api.get_metadata = going  # type: ignore[method-assign]
    assert run(api) == 1.0
    assert api.condition() is None and not [c for c in api.calls if c[0] == "delete"]


def test_many_blockers_are_counted_and_a_few_named():
    names = [f"Pod ns/j-worker-{i} (no controller)" for i in range(8)]
    message = blocked_message("j", names)
    assert message.startswith("8 objects have names StrategyJob j needs and are not controlled")
    assert "j-worker-4 (no controller) and 3 more." in message and "j-worker-5" not in message
    assert "strategyjob.dev/job-name=j" in message and "\n" not in message


def test_an_object_another_live_job_controls_is_reported_not_deleted():
    """Only an earlier job of the same name leaves objects the operator may delete."""
    other = {"kind": "StrategyJob", "name": "k", "uid": "other", "controller": True}
    api = TakenApi({("Service", "j"): [other]})
    run(api)
    cond = api.condition()
    assert cond is not None
    assert cond["message"].startswith("Service ns/j (controlled by StrategyJob k) has a name")
    assert not [c for c in api.calls if c[0] == "delete"]
