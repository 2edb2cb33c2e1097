"""Integration fixtures: a real control plane (session), the operator as a subprocess
(session), and a fresh namespace per test. Helpers live in ``integration_harness``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration_harness import VOLCANO_GROUP, VOLCANO_VERSION, Kube, OperatorProcess, wait_for

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
        cp.wait_established(
            "strategyjobs.strategyjob.dev", "clusterkopfpeerings.kopf.dev", "tfjobs.kubeflow.org"
        )
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


@pytest.fixture(scope="module")
def volcano_pod_group_crd(control_plane: ControlPlane) -> Iterator[None]:
    """Volcano's PodGroup API (its schema reduced to "any object"), what the operator writes
    to, for one module; scheduler-plugins' PodGroup API stays uninstalled on purpose. A module
    before may have just deleted it: that one must be gone before it is created again."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    name = f"podgroups.{VOLCANO_GROUP}"
    api_client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    ext = client.ApiextensionsV1Api(api_client)

    def crd() -> Any:
        try:
            return ext.read_custom_resource_definition(name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    try:
        wait_for("an earlier PodGroup CRD to go", lambda: crd() is None, timeout=60)
        version = {
            "name": VOLCANO_VERSION,
            "served": True,
            "storage": True,
            "schema": {
                "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            },
        }
        names = {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"}
        body = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": VOLCANO_GROUP,
                "scope": "Namespaced",
                "names": names,
                "versions": [version],
            },
        }
        ext.create_custom_resource_definition(body)

        def established() -> bool:
            found = crd()
            conds = (found.status.conditions or []) if found else []
            return any(c.type == "Established" and c.status == "True" for c in conds)

        wait_for("PodGroup CRD established", established, timeout=30)
        yield
        ext.delete_custom_resource_definition(name)
    finally:
        api_client.close()
