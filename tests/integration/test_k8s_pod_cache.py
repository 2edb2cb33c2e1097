"""The reconciler's pod cache against the real kube-apiserver: a pass reads the job's pods'
metadata (``PartialObjectMetadataList``) and only the pods written since, and what it gets
is what a full list of the job's pods returns at that moment. The reconciler runs in this
process (no watch feeds the cache here: the reads alone must keep it right); no kubelet, so
the test writes the pods' phases."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from integration_harness import manifest
from strategyjob_operator import children
from strategyjob_operator.kube import PARTIAL_METADATA_LIST, Credentials, KubeApi
from strategyjob_operator.metrics import Registry
from strategyjob_operator.pod_cache import PodCache
from strategyjob_operator.reconcile import OperatorSettings, Reconciler

pytestmark = pytest.mark.timeout(120)

WORKERS = 4


class RecordingApi(KubeApi):
    """The real client, recording each request's method, path and Accept header."""

    def __init__(self, creds: Credentials) -> None:
        super().__init__(creds)
        self.requests: list[tuple[str, str, str]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append((method, path, kwargs.get("accept") or ""))
        return await super().request(method, path, **kwargs)

    def pod_reads(self) -> list[tuple[str, str, str]]:
        return [r for r in self.requests if "/pods" in r[1] and r[0] == "GET"]


def test_a_pass_reads_only_the_pods_written_since_and_sees_what_a_list_sees(
    control_plane, own_kube
):
    kube, cp = own_kube, control_plane
    job = manifest("cached", "MultiWorkerMirroredStrategy", {"worker": WORKERS})
    # no scheduler takes them (its Unschedulable notes would be writes the test does not make)
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["schedulerName"] = "nobody"
    kube.create_job(job)
    api = RecordingApi(Credentials(server=cp.server, token=cp.token, ca_path=str(cp.ca_path)))
    cache = PodCache(api)
    reconciler = Reconciler(
        api, OperatorSettings(metrics_port=None), registry=Registry(), pod_cache=cache
    )
    path = api.core_path(kube.ns, "pods")
    selector = children.job_selector("cached")

    def shape(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # a pod read alone (or watched) names its kind and apiVersion; a list's items do not
        return [{k: v for k, v in p.items() if k not in ("kind", "apiVersion")} for p in pods]

    async def same_as_a_list() -> list[dict[str, Any]]:
        pods = await cache.job_pods(kube.ns, "cached")
        assert shape(pods) == shape(await api.list(path, selector))
        return pods

    async def scenario() -> None:
        try:
            await reconciler.reconcile(kube.ns, "cached")  # creates the pods
            await asyncio.to_thread(kube.wait_pods, "cached", WORKERS, 60)

            api.requests.clear()
            first = await same_as_a_list()
            assert len(first) == WORKERS
            assert all("managedFields" not in p["metadata"] for p in first)
            assert api.pod_reads() == [
                ("GET", path, PARTIAL_METADATA_LIST),  # the cache's
                ("GET", path, ""),  # pods the cache had not seen: one full list
                ("GET", path, ""),  # the test's own list
            ]

            api.requests.clear()  # nothing written since: the metadata alone
            await same_as_a_list()
            assert api.pod_reads() == [("GET", path, PARTIAL_METADATA_LIST), ("GET", path, "")]

            # the kubelet writes one pod's status: that pod alone is read again
            await asyncio.to_thread(kube.set_phase, "cached-worker-2", "Running")
            api.requests.clear()
            pods = await same_as_a_list()
            assert api.pod_reads() == [
                ("GET", path, PARTIAL_METADATA_LIST),
                ("GET", f"{path}/cached-worker-2", ""),
                ("GET", path, ""),
            ]
            assert pods[2]["status"]["phase"] == "Running"

            # every pod Running: the reconciler, reading through the cache, sees the job run
            for i in range(WORKERS):
                await asyncio.to_thread(kube.set_phase, f"cached-worker-{i}", "Running")
            deadline = asyncio.get_running_loop().time() + 60
            while (kube.job("cached").get("status") or {}).get("state") != "Running":
                assert asyncio.get_running_loop().time() < deadline, kube.job("cached")
                await reconciler.reconcile(kube.ns, "cached")
            await same_as_a_list()

            # a pod deleted is gone from what the next pass sees
            await asyncio.to_thread(
                kube.core.delete_namespaced_pod, "cached-worker-3", kube.ns, grace_period_seconds=0
            )
            names = [p["metadata"]["name"] for p in await same_as_a_list()]
            assert names == [f"cached-worker-{i}" for i in range(WORKERS - 1)]
        finally:
            await api.close()

    asyncio.run(scenario())
