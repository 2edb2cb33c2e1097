"""End-to-end fixtures: the cluster (the session's kind cluster with the project's images
loaded, or the one of ``STRATEGYJOB_E2E_KUBECONFIG``), the operator installed with its Helm
chart, and a fresh namespace per test. See ``e2e_support`` for the helpers."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.e2e_support import (
    CHART,
    ENV_HELM_ARGS,
    ENV_KUBECONFIG,
    ENV_RELEASE,
    ENV_SHARED_DIR,
    Cluster,
    Namespace,
    tool,
)
from tests.support.control_plane import find_binaries
from tests.support.kind import KIND_SHARED_PATH, project_images, report

_HERE = Path(__file__).parent

RELEASE_NAMESPACE, RELEASE = "strategyjob-system", "strategyjob-operator"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
            # A test's timeout bounds the test, not the package's setup that its first test
            # waits for (loading the 7.8 GB worker image takes minutes): each setup step is
            # bounded by its own timeout (the load, helm's --wait).
            marker = item.get_closest_marker("timeout")
            seconds = marker.args[0] if marker and marker.args else item.config.getini("timeout")
            item.add_marker(pytest.mark.timeout(float(seconds), func_only=True), append=False)


@pytest.fixture(scope="package")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """The cluster under test: ``STRATEGYJOB_E2E_KUBECONFIG``'s, else the session's kind
    cluster (two nodes, kube-router enforcing NetworkPolicy) with this tree's operator and
    worker images loaded into both nodes."""
    if kubeconfig := os.environ.get(ENV_KUBECONFIG):
        return Cluster(Path(kubeconfig), tool("kubectl", None), tool("helm", None))
    kind = request.getfixturevalue("kind_cluster")
    bin_dir, _ = find_binaries()
    bin_dir = Path(bin_dir) if bin_dir else None
    images = project_images()
    report(f"e2e: images {', '.join(images)} loaded into both nodes in {kind.load(*images):.0f} s")
    return Cluster(
        kind.kubeconfig, tool("kubectl", bin_dir), tool("helm", bin_dir), kind, images[0]
    )


@pytest.fixture(scope="package")
def operator(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """The operator, installed with ``helm install`` of the chart (two replicas with kopf
    peering, its own ServiceAccount and RBAC) unless ``STRATEGYJOB_E2E_RELEASE`` names an
    installed one; yields ``(namespace, release)``.

    Installed once for the session with ``tfjob.enabled=true``, as a platform team serving
    both kinds would: every StrategyJob test then also shows that serving TFJobs changes
    nothing for StrategyJobs, and the TFJob test needs no second install (a second release
    would be a second controller of StrategyJobs; reinstalling costs a helm ``--wait``).
    ``STRATEGYJOB_E2E_HELM_ARGS="--set tfjob.enabled=false"`` turns it off on a cluster
    whose TFJobs Kubeflow's training-operator serves."""
    if release := os.environ.get(ENV_RELEASE):
        namespace, name = release.split("/", 1)
        yield namespace, name
        return
    if not (CHART / "Chart.yaml").is_file():
        pytest.fail(f"the operator's Helm chart is missing: {CHART}")
    extra = ["--set", "tfjob.enabled=true", *shlex.split(os.environ.get(ENV_HELM_ARGS, ""))]
    if cluster.operator_image:  # loaded into the nodes, never pulled
        repository, tag = cluster.operator_image.rsplit(":", 1)
        extra = ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                 "--set", "image.pullPolicy=Never", *extra]  # fmt: skip
    cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace",
        "--wait", "--timeout", "5m", *extra,
    )  # fmt: skip
    try:
        yield RELEASE_NAMESPACE, RELEASE
    finally:
        # The namespace stays: the kind integration modules install their operator there next.
        cluster.helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")


@pytest.fixture
def ns(cluster: Cluster, operator: tuple[str, str]) -> Iterator[Namespace]:
    """A fresh namespace; deleted afterwards (which stops whatever still runs in it)."""
    namespace = Namespace(cluster, operator)
    try:
        yield namespace
    finally:
        namespace.delete()


@pytest.fixture
def shared_dir(cluster: Cluster, ns: Namespace) -> Iterator[str]:
    """A directory every pod of the test can mount as a hostPath (checkpoints), the same
    storage on every node: on kind a directory under the one every node mounts (tools/kind/
    cluster.sh), removed afterwards; on another cluster under ``STRATEGYJOB_E2E_SHARED_DIR``,
    which must be shared."""
    yield f"{os.environ.get(ENV_SHARED_DIR, KIND_SHARED_PATH)}/{ns.name}"
    if cluster.kind is not None:
        shutil.rmtree(cluster.kind.shared_dir / ns.name, ignore_errors=True)
