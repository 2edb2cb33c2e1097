"""Deleting a StrategyJob never waits for the operator: jobs carry no finalizer, so
``kubectl delete`` (and ``helm uninstall``'s leftovers) work while the operator is down,
and garbage collection takes the job's pods and Service. Jobs that an earlier version gave
kopf's finalizer lose it on the operator's next pass, and one whose deletion that finalizer
held completes. Each test runs its own operator in a namespace of its own."""

from __future__ import annotations

import asyncio
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


class _Running:
    """kopf's ``stopped`` flag of a daemon that nothing stops."""

    def __bool__(self) -> bool:
        return False


def test_a_jobs_loop_ends_on_its_own_when_its_deleted_event_is_missed(
    control_plane: ControlPlane, own_kube: Kube
) -> None:
    """The job's loop runs in this process with no kopf, so no watch event ever reaches it
    (as when the DELETED event is lost while the watch reconnects): its next pass reads the
    job gone from the real API server, the loop ends, and the reconciler forgets the job."""
    from strategyjob_operator import handlers
    from strategyjob_operator.kube import Credentials, KubeApi
    from strategyjob_operator.metrics import Registry
    from strategyjob_operator.reconcile import OperatorSettings, Reconciler
    from strategyjob_operator.state import OperatorState, installed

    kube = own_kube
    uid = kube.create_job(manifest("lost", "MultiWorkerMirroredStrategy", {"worker": 1}))[
        "metadata"
    ]["uid"]
    cp = control_plane
    state = OperatorState(OperatorSettings(metrics_port=None, resync_seconds=1.0))
    api = KubeApi(Credentials(server=cp.server, token=cp.token, ca_path=str(cp.ca_path)))
    reconciler = state.reconciler = Reconciler(api, state.settings, registry=Registry())
    key = (kube.ns, "lost", uid)

    async def until(what: str, predicate: Any, timeout: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        daemon = asyncio.create_task(
            handlers.run_job(namespace=kube.ns, name="lost", uid=uid, stopped=_Running())
        )
        try:
            await asyncio.to_thread(kube.wait_pods, "lost", 1, 60)
            # its node lost: the reconciler keeps since when the pod has been Unknown
            await asyncio.to_thread(kube.set_phase, "lost-worker-0", "Unknown")
            await until("the Unknown pod noted", lambda: reconciler.remembered() == {key})
            assert not daemon.done()
            await asyncio.to_thread(kube.delete_job, "lost")
            await asyncio.wait_for(daemon, 60)  # the resync pass reads 404
        finally:
            daemon.cancel()
            await api.close()

    with installed(state):  # the handlers' state while the loop runs
        asyncio.run(scenario())
    assert kube.job("lost") is None
    assert state.daemons == {} and state.wakeups == {}
    assert reconciler.remembered() == set()
