"""Deleting a StrategyJob never waits for the operator: jobs carry no finalizer, so
``kubectl delete`` (and ``helm uninstall``'s leftovers) work while the operator is down,
and garbage collection takes the job's pods and Service. Jobs that an earlier version gave
kopf's finalizer lose it on the operator's next pass, and one whose deletion that finalizer
held completes. Each test runs its own operator in a namespace of its own."""

from __future__ import annotations

from typing import Any

import pytest
from integration_harness import Kube, OperatorProcess, manifest, wait_for

from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.timeout(180)

#: The finalizer the operator's earlier versions put on every StrategyJob.
OLD_FINALIZER = "strategyjob.dev/operator"


def _finalizers(kube: Kube, name: str) -> list[str] | None:
    job = kube.job(name)
    return None if job is None else list(job["metadata"].get("finalizers") or [])


def test_a_job_is_deleted_at_once_while_the_operator_is_down(
    control_plane: ControlPlane, own_kube: Kube
) -> None:
    kube = own_kube
    op = OperatorProcess(control_plane, "--standalone", "-n", kube.ns).start()
    try:
        kube.create_job(manifest("gone", "MultiWorkerMirroredStrategy", {"worker": 2}))
        kube.wait_pods("gone", 2, timeout=60)
        wait_for("the job's Created condition", lambda: kube.condition("gone", "Created"), 60)
        assert _finalizers(kube, "gone") == [], kube.job("gone")
    finally:
        op.stop()
    assert op.proc is not None and op.proc.poll() is not None
    kube.cp.kubectl("delete", "strategyjob", "gone", "-n", kube.ns, "--timeout=20s")
    assert kube.job("gone") is None  # kubectl returned once it was gone: no finalizer held it
    # kube-controller-manager's garbage collector takes the children (owner references)
    wait_for("the job's pods garbage-collected", lambda: not kube.pods("gone"), timeout=90)


def _job_with_old_finalizer(name: str) -> dict[str, Any]:
    body = manifest(name, "MultiWorkerMirroredStrategy", {"worker": 1})
    body["metadata"]["finalizers"] = [OLD_FINALIZER]
    return body


def test_the_finalizer_of_earlier_versions_is_taken_off_on_upgrade(
    control_plane: ControlPlane, own_kube: Kube
) -> None:
    """Jobs left by an earlier operator carry its finalizer, and one deleted while no
    operator ran waits on it: the new operator releases both, and runs the live one."""
    kube = own_kube
    kube.create_job(_job_with_old_finalizer("kept"))
    kube.create_job(_job_with_old_finalizer("doomed"))
    kube.delete_job("doomed")
    doomed = kube.job("doomed")
    assert doomed is not None and doomed["metadata"].get("deletionTimestamp")
    op = OperatorProcess(control_plane, "--standalone", "-n", kube.ns).start()
    try:
        wait_for("the deleted job gone", lambda: kube.job("doomed") is None, timeout=60)
        wait_for("the old finalizer off", lambda: _finalizers(kube, "kept") == [], timeout=60)
        kube.wait_pods("kept", 1, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator:\n{op.output()[-3000:]}") from e
    finally:
        op.stop()
