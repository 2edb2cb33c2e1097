"""Integration fixtures: a real control plane (session), the operator as a subprocess
(session), and a fresh namespace per test. Helpers live in ``integration_harness``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_harness import Kube, OperatorProcess

from tests.support.control_plane import REPO_ROOT, ControlPlane, find_binaries

_HERE = Path(__file__).parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test item (``item.rep_call``): fixtures that gather
    evidence when a test failed read it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    bin_dir, why = find_binaries()
    if bin_dir is None:
        pytest.skip(f"no Kubernetes control plane binaries: {why}")
    cp = ControlPlane(bin_dir).start()
    try:
        cp.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
        cp.wait_established("strategyjobs.strategyjob.dev", "clusterkopfpeerings.kopf.dev")
        yield cp
    finally:
        cp.stop()


#: The shared operator watches only the namespaces of the ``kube`` fixture; tests that run
#: their own operators (``own_kube``) get namespaces it never touches.
SHARED_PREFIX = "t-"
OWN_PREFIX = "own-"


@pytest.fixture(scope="session")
def operator(control_plane: ControlPlane) -> Iterator[OperatorProcess]:
    op = OperatorProcess(control_plane, "--standalone", "-n", f"{SHARED_PREFIX}*").start()
    try:
        yield op
    finally:
        op.stop()


def _namespace(control_plane: ControlPlane, prefix: str) -> Iterator[Kube]:
    from kubernetes import client

    ns = f"{prefix}{uuid.uuid4().hex[:8]}"
    k = Kube(control_plane, ns)
    k.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        yield k
    finally:
        k.core.delete_namespace(ns)
        k.api_client.close()


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    """A fresh namespace that the shared ``operator`` watches."""
    yield from _namespace(control_plane, SHARED_PREFIX)


@pytest.fixture
def own_kube(control_plane: ControlPlane) -> Iterator[Kube]:
    """A fresh namespace no shared operator watches, for tests that run their own."""
    yield from _namespace(control_plane, OWN_PREFIX)
