"""The pod cache (pure logic and its read plan, against a recording fake of the API
client): a pass gets exactly what one list of the job's pods would give, reading in full
only the pods whose uid or resourceVersion changed since the operator last saw them. The
real API server's side is in tests/integration/test_k8s_pod_cache.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from strategyjob_operator import constants as c
from strategyjob_operator.kube import KubeApi
from strategyjob_operator.pod_cache import FETCH_ONE_BY_ONE, PodCache, match, one_by_one


def pod(name: str, version: str | None = "1", *, uid: str = "", job: str = "j") -> dict:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid or f"uid-{name}",
        "labels": {c.LABEL_JOB_NAME: job},
        "managedFields": [{"manager": "kubelet"}],
    }
    if version is not None:
        meta["resourceVersion"] = version
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}]}]},
        "status": {"phase": "Pending", "version": version},
    }


def metadata(p: dict) -> dict:
    return {"metadata": {k: v for k, v in p["metadata"].items() if k != "managedFields"}}


class Server:
    """The API server's pods of namespace ``ns``, and the calls made to read them."""

    core_path = staticmethod(KubeApi.core_path)
    max_in_flight = 4

    def __init__(self, *pods: dict) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.calls: list[tuple[str, str]] = []

    def _selected(self, selector: str) -> list[dict]:
        key, value = selector.split("=")
        return [
            copy.deepcopy(p)
            for _, p in sorted(self.pods.items())
            if p["metadata"]["labels"].get(key) == value
        ]

    async def list_metadata(self, path: str, selector: str) -> list[dict]:
        self.calls.append(("list_metadata", selector))
        return [metadata(p) for p in self._selected(selector)]

    async def list(self, path: str, selector: str) -> list[dict]:
        self.calls.append(("list", selector))
        return self._selected(selector)

    async def get(self, path: str) -> dict | None:
        name = path.rsplit("/", 1)[1]
        self.calls.append(("get", name))
        found = self.pods.get(name)
        return copy.deepcopy(found) if found else None


def read(cache: PodCache, job: str = "j") -> list[dict]:
    return asyncio.run(cache.job_pods("ns", job))


def phases(pods: list[dict]) -> list[tuple[str, Any]]:
    return [(p["metadata"]["name"], p["status"]["version"]) for p in pods]


def test_match_uses_a_remembered_pod_only_at_the_listed_uid_and_version():
    known = {"a": pod("a", "1"), "b": pod("b", "1"), "c": pod("c", "1"), "d": pod("d", None)}
    listed = [
        metadata(pod("a", "1")),  # same version: reused
        metadata(pod("b", "2")),  # written since
        metadata(pod("c", "1", uid="other")),  # deleted and created again
        metadata(pod("d", None)),  # no version: never trusted
        metadata(pod("e", "1")),  # never seen
    ]
    found, missing = match(listed, known)
    assert found[0] is known["a"] and found[1:] == [None, None, None, None]
    assert missing == ["b", "c", "d", "e"]


@pytest.mark.parametrize(
    ("missing", "listed", "expected"),
    [
        (0, 10, False),
        (1, 2, True),
        (2, 2, False),
        (3, 10, True),
        (FETCH_ONE_BY_ONE + 1, 50, False),
        (100, 1000, True),
        (101, 1000, False),
    ],
)
def test_few_changed_pods_are_read_by_name_many_with_one_list(missing, listed, expected):
    assert one_by_one(missing, listed) is expected


def test_the_first_pass_lists_then_unchanged_pods_cost_only_their_metadata():
    server = Server(pod("j-worker-0"), pod("j-worker-1"), pod("other-0", job="other"))
    cache = PodCache(server)
    first = read(cache)
    assert server.calls == [
        ("list_metadata", f"{c.LABEL_JOB_NAME}=j"),
        ("list", f"{c.LABEL_JOB_NAME}=j"),
    ]
    assert [p["metadata"]["name"] for p in first] == ["j-worker-0", "j-worker-1"]
    server.calls.clear()
    assert read(cache) == first
    assert server.calls == [("list_metadata", f"{c.LABEL_JOB_NAME}=j")]


def test_a_pod_written_since_is_read_again_by_name_and_a_deleted_one_is_gone():
    server = Server(*(pod(f"w{i}") for i in range(4)))
    cache = PodCache(server)
    read(cache)
    server.pods["w1"] = pod("w1", "2")  # the kubelet wrote its status
    del server.pods["w3"]
    server.calls.clear()
    pods = read(cache)
    assert phases(pods) == [("w0", "1"), ("w1", "2"), ("w2", "1")]
    assert server.calls == [("list_metadata", f"{c.LABEL_JOB_NAME}=j"), ("get", "w1")]
    assert "managedFields" not in pods[1]["metadata"]  # what KubeApi.list drops, too
    assert "env" not in pods[1]["spec"]["containers"][0]


def test_many_changed_pods_are_read_with_one_list():
    server = Server(*(pod(f"w{i}") for i in range(4)))
    cache = PodCache(server)
    read(cache)
    for i in range(3):
        server.pods[f"w{i}"] = pod(f"w{i}", "2")
    server.calls.clear()
    assert phases(read(cache)) == [("w0", "2"), ("w1", "2"), ("w2", "2"), ("w3", "1")]
    assert [call for call, _ in server.calls] == ["list_metadata", "list"]


def test_a_watched_version_is_used_without_a_read():
    server = Server(pod("w0"), pod("w1"))
    cache = PodCache(server)
    read(cache)
    server.pods["w0"] = pod("w0", "2")
    cache.watched("MODIFIED", copy.deepcopy(server.pods["w0"]))
    server.calls.clear()
    assert phases(read(cache)) == [("w0", "2"), ("w1", "1")]
    assert server.calls == [("list_metadata", f"{c.LABEL_JOB_NAME}=j")]


def test_a_stale_watch_event_costs_a_read_not_a_wrong_answer():
    server = Server(pod("w0"), pod("w1"))
    cache = PodCache(server)
    server.pods["w0"] = pod("w0", "3")
    read(cache)
    cache.watched("MODIFIED", pod("w0", "2"))  # an older event, delivered late
    server.calls.clear()
    assert phases(read(cache)) == [("w0", "3"), ("w1", "1")]
    assert ("get", "w0") in server.calls


def test_a_pod_gone_or_relabelled_between_the_list_and_its_read_is_left_out():
    server = Server(*(pod(f"w{i}") for i in range(4)))
    cache = PodCache(server)
    read(cache)
    server.pods["w1"] = pod("w1", "2")
    server.pods["w2"] = pod("w2", "2")

    listed = server.list_metadata

    async def list_then_change(path: str, selector: str) -> list[dict]:
        items = await listed(path, selector)
        del server.pods["w1"]
        server.pods["w2"] = pod("w2", "3", job="other")
        return items

    server.list_metadata = list_then_change  # type: ignore[method-assign]
    assert phases(read(cache)) == [("w0", "1"), ("w3", "1")]


def test_only_jobs_read_at_least_once_are_remembered_and_forget_frees_them():
    server = Server(pod("w0"), pod("x0", job="x"))
    cache = PodCache(server)
    cache.watched(None, pod("x0", job="x"))  # no pass of x yet: not kept
    assert cache.remembered() == set()
    read(cache)
    assert cache.remembered() == {("ns", "j")}
    cache.watched("DELETED", pod("w0", uid="an-earlier-namesake"))  # not the one known
    server.calls.clear()
    read(cache)
    assert server.calls == [("list_metadata", f"{c.LABEL_JOB_NAME}=j")]
    cache.watched("DELETED", pod("w0"))
    assert phases(read(cache)) == [("w0", "1")]  # read again: the list still has it
    cache.forget("ns", "j")
    assert cache.remembered() == set()
