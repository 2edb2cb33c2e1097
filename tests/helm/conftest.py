"""Chart fixtures: helm (offline), the local control plane with an audit log (session), and
the chart installed once with its default values (session).

The control plane is ``tests/support/control_plane.py``; the integration tests' harness
(``integration_harness``) is imported the way their conftest does: pytest puts a conftest's
folder on sys.path, so this one adds tests/integration next to it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from helm_harness import CHART, AuditedControlPlane, Helm, Release, helm_binary

from tests.support.control_plane import find_binaries

_CLUSTER_TESTS = Path(__file__).parent / "test_helm_cluster.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.fspath) == _CLUSTER_TESTS:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    binary, why = helm_binary()
    if binary is None:
        pytest.skip(f"no helm binary: {why}")
    return binary


@pytest.fixture(scope="session")
def helm(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm for offline commands (lint, template)."""
    return Helm(helm_bin, tmp_path_factory.mktemp("helm-offline"))


@pytest.fixture(scope="session")
def cluster() -> Iterator[AuditedControlPlane]:
    bin_dir, why = find_binaries()
    if bin_dir is None:
        pytest.skip(f"no Kubernetes control plane binaries: {why}")
    cp = AuditedControlPlane(bin_dir).start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def cluster_helm(
    helm_bin: Path, cluster: AuditedControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Helm:
    return Helm(helm_bin, tmp_path_factory.mktemp("helm-cluster"), cluster.kubeconfig)


@pytest.fixture(scope="session")
def release(cluster: AuditedControlPlane, cluster_helm: Helm) -> Iterator[Release]:
    """The chart installed with its default values, the first install on this control plane
    (so that the CRDs it brings were not there before)."""
    crds = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    name, namespace = "sjob", "strategyjob-system"
    out = cluster_helm.run(
        "install", name, str(CHART), "--namespace", namespace, "--create-namespace"
    ).stdout
    try:
        yield Release(name, namespace, out, frozenset(crds))
    finally:
        cluster_helm.run("uninstall", name, "--namespace", namespace, check=False)
