"""The operator creates a job's pods as a stream (pure logic, against a recording fake of
the API client): each pod is built just before its request and dropped after it, so at most
``max_in_flight`` pods exist at once, never the job's N; and a listed pod is kept without its
containers' env (each TF_CONFIG lists the whole cluster). The real process and its memory
are measured in tests/integration/test_k8s_job_size.py."""

from __future__ import annotations

import asyncio
import copy

import pytest
from strategyjob_operator import children
from strategyjob_operator.kube import observed_part
from strategyjob_operator.metrics import Registry
from strategyjob_operator.reconcile import OperatorSettings, Reconciler

from tests.support.fake_api import FakeApi
from tests.support.manifests import manifest
from tests.support.pods import NOW

WORKERS = 300
IN_FLIGHT = 7


class LivePods:
    """Counts the pods alive at once (a dict subclass whose instances report their end)."""

    def __init__(self) -> None:
        self.live = 0
        self.most = 0
        self.built = 0
        counter = self

        class Pod(dict):
            def __del__(self) -> None:
                counter.live -= 1

        self.Pod = Pod

    def wrap(self, pod: dict) -> dict:
        self.live += 1
        self.built += 1
        self.most = max(self.most, self.live)
        return self.Pod(pod)


class InFlightApi(FakeApi):
    """Counts the creations in flight at once; a request takes a while, others start
    meanwhile."""

    def __init__(self, job: dict) -> None:
        super().__init__(job)
        self.in_flight = self.most_in_flight = 0

    async def create(self, path, obj):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        name = obj["metadata"]["name"]
        for _ in range(3):  # a request takes a while: others start meanwhile
            await asyncio.sleep(0)
        self.in_flight -= 1
        self.created[name] = None  # the name only: the API server keeps the pod, not we
        return True


def test_pods_are_built_as_they_are_created_never_all_at_once(monkeypatch):
    job = manifest({"worker": WORKERS}, name="big", policy=None, uid="u", generation=1)
    pods = LivePods()
    build = children.build_pod
    monkeypatch.setattr(children, "build_pod", lambda *a, **k: pods.wrap(build(*a, **k)))
    api = InFlightApi(job)
    settings = OperatorSettings(max_in_flight=IN_FLIGHT, metrics_port=None)
    reconciler = Reconciler(api, settings, clock=lambda: NOW, registry=Registry())
    asyncio.run(reconciler.reconcile("ns", "big"))

    pod_names = [n for n in api.created if n.startswith("big-worker-")]
    assert sorted(pod_names) == sorted(f"big-worker-{i}" for i in range(WORKERS))
    assert pods.built == WORKERS and pods.live == 0
    assert api.most_in_flight <= IN_FLIGHT
    # one being built by each of the loops, at most, besides those in flight
    assert pods.most <= IN_FLIGHT + 1, pods.most


@pytest.mark.parametrize("key", ["containers", "initContainers"])
def test_a_listed_pod_is_kept_without_its_containers_env_and_managed_fields(key):
    pod = {
        "metadata": {"name": "p", "managedFields": [{"manager": "kubelet"}]},
        "spec": {"nodeName": "n1", key: [{"name": "c", "env": [{"name": "TF_CONFIG"}]}]},
        "status": {"phase": "Running"},
    }
    before = copy.deepcopy(pod)
    assert observed_part(pod) == {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n1", key: [{"name": "c"}]},
        "status": {"phase": "Running"},
    }
    assert pod == before  # a watch event's body is kopf's: left as it was
    assert observed_part({"metadata": {"name": "s"}, "spec": "odd"})["spec"] == "odd"
