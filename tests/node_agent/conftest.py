"""Fixtures of the node agent's own tests: a local cluster (control plane + agent) for the
session and a fresh namespace per test, with helpers that create and watch plain pods."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.harness import LocalCluster, skip_reason
from tests.support.waiting import wait_for

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="package")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if reason := skip_reason():
        pytest.skip(reason)
    cluster = LocalCluster(tmp_path_factory.mktemp("agent-cluster")).start()
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"the node agent left these behind (now removed): {left}"


class Pods:
    """Plain pods in a fresh namespace."""

    def __init__(self, cluster: LocalCluster) -> None:
        from kubernetes import client, config

        self.cluster = cluster
        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.ns = f"agent-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": self.ns}})

    def create(self, name: str, script: str, **spec: Any) -> None:
        """A pod whose one container runs ``python -c script`` (``spec`` adds to the pod
        spec; ``container`` adds to the container)."""
        container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", script]}
        container.update(spec.pop("container", {}))
        body = {
            "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec},
        }
        self.core.create_namespaced_pod(self.ns, body)

    def get(self, name: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_pod(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def wait_phase(self, name: str, phase: str, timeout: float = 60.0) -> Any:
        def reached() -> Any:
            pod = self.get(name)
            return pod if pod is not None and pod.status.phase == phase else None

        return wait_for(f"pod {name} to be {phase}", reached, timeout)

    def logs(self, name: str, previous: bool = False) -> str:
        return self.core.read_namespaced_pod_log(name, self.ns, previous=previous)

    def kubectl(self, *args: str) -> str:
        return self.cluster.control_plane.kubectl("-n", self.ns, *args).stdout


@pytest.fixture
def pods(local_cluster: LocalCluster) -> Iterator[Pods]:
    p = Pods(local_cluster)
    try:
        yield p
    finally:
        p.core.delete_namespace(p.ns)
        p.api.close()
