"""End-to-end fixtures: the cluster (local control plane + node agent, or the one of
``STRATEGYJOB_E2E_KUBECONFIG``), the operator installed with its Helm chart, and a fresh
namespace per test. See ``e2e_support`` for the helpers."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.e2e_support import (
    CHART,
    ENV_HELM_ARGS,
    ENV_KUBECONFIG,
    ENV_RELEASE,
    Cluster,
    Namespace,
    tool,
)

_HERE = Path(__file__).parent

RELEASE_NAMESPACE, RELEASE = "strategyjob-system", "strategyjob-operator"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster under test; in local mode it is stopped at the end and must leave no
    process, network namespace or link behind."""
    if kubeconfig := os.environ.get(ENV_KUBECONFIG):
        yield Cluster(Path(kubeconfig), tool("kubectl", None), tool("helm", None))
        return
    from node_agent.harness import LocalCluster, skip_reason

    if reason := skip_reason():
        pytest.skip(reason)
    local = LocalCluster(tmp_path_factory.mktemp("cluster")).start()  # node-agent.log
    bin_dir = local.bin_dir
    try:
        yield Cluster(local.kubeconfig, tool("kubectl", bin_dir), tool("helm", bin_dir), local)
    finally:
        left = local.stop()
        assert not left, f"the node agent left these behind (now removed): {left}"


@pytest.fixture(scope="package")
def operator(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """The operator, installed with ``helm install`` of the chart (two replicas with kopf
    peering, its own ServiceAccount and RBAC) unless ``STRATEGYJOB_E2E_RELEASE`` names an
    installed one; yields ``(namespace, release)``."""
    if release := os.environ.get(ENV_RELEASE):
        namespace, name = release.split("/", 1)
        yield namespace, name
        return
    if not (CHART / "Chart.yaml").is_file():
        pytest.fail(f"the operator's Helm chart is missing: {CHART}")
    extra = shlex.split(os.environ.get(ENV_HELM_ARGS, ""))
    cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace",
        "--wait", "--timeout", "3m", *extra,
    )  # fmt: skip
    try:
        yield RELEASE_NAMESPACE, RELEASE
    finally:
        if cluster.local is None:  # a local cluster goes away with everything in it
            cluster.helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")
            cluster.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--wait=false")


@pytest.fixture
def ns(cluster: Cluster, operator: tuple[str, str]) -> Iterator[Namespace]:
    """A fresh namespace; deleted afterwards (which stops whatever still runs in it)."""
    namespace = Namespace(cluster, operator)
    try:
        yield namespace
    finally:
        namespace.delete()


@pytest.fixture
def shared_dir(cluster: Cluster, ns: Namespace, tmp_path: Path) -> str:
    """A directory every pod of the test can mount as a hostPath (checkpoints): the test's
    tmp dir locally; on another cluster a path on its node(s)."""
    if cluster.local is not None:
        path = tmp_path / "shared"
        path.mkdir()
        return str(path)
    return f"/tmp/strategyjob-e2e/{ns.name}"
