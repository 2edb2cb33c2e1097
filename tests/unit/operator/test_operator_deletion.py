"""StrategyJobs carry no finalizer, so deleting one never waits for the operator: kopf's
daemon is registered as needing none, and each job's daemon ends itself when its job is
deleted or replaced by a namesake (kopf stops daemons only for objects it finalizes), also
when the watch missed the DELETED event; the reconciler then forgets the job."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from strategyjob_operator import constants as c
from strategyjob_operator import handlers, job_loop, state, stopping
from strategyjob_operator.kube import ApiError
from strategyjob_operator.metrics import Registry
from strategyjob_operator.reconcile import JobGone, OperatorSettings, Reconciler
from strategyjob_operator.state import OperatorState

from tests.support.fake_api import FakeApi


def test_no_handler_of_the_operator_puts_a_finalizer_on_jobs() -> None:
    registry = kopf.get_default_registry()
    spawning = registry._spawning.get_all_handlers()
    assert any(h.fn is handlers.run_job for h in spawning)  # the daemon is there
    everything = [*spawning, *registry._changing.get_all_handlers()]
    assert not [h for h in everything if h.requires_finalizer], everything


def test_no_finalizer_for_daemons_unsets_what_kopf_sets_on_every_daemon() -> None:
    registry = kopf.OperatorRegistry()

    @kopf.daemon(c.GROUP, c.VERSION, c.PLURAL, registry=registry)
    async def daemon(**_: Any) -> None:
        pass

    assert registry._spawning.get_all_handlers()[0].requires_finalizer  # kopf's default
    handlers.no_finalizer_for_daemons(registry)
    assert not registry._spawning.get_all_handlers()[0].requires_finalizer


class _Reconciler:
    """Counts passes; the real one is exercised by the integration tests."""

    def __init__(self) -> None:
        self.passes: list[str] = []
        self.forgotten: list[tuple[str, str, str]] = []
        self.gone = False
        self.metrics = self

    def inc(self, *_: Any) -> None:
        pass

    async def reconcile(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.passes.append(f"{namespace}/{name}")
        if self.gone:
            raise JobGone(name)

    def forget(self, namespace: str, name: str, uid: str) -> None:
        self.forgotten.append((namespace, name, uid))


class _Never:
    def __bool__(self) -> bool:
        return False


def _install(
    state: OperatorState, reconciler: Any, settings: OperatorSettings | None = None
) -> OperatorState:
    """The test's operator state (the ``operator_state`` fixture), with ``reconciler`` (and
    ``settings``)."""
    if settings is not None:
        state.settings = settings
    state.reconciler = reconciler
    return state


async def _until(what: str, predicate: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_jobs_daemon_ends_when_the_job_is_deleted_or_replaced_by_a_namesake(
    operator_state: OperatorState,
) -> None:
    reconciler = _Reconciler()
    state = _install(operator_state, reconciler)

    async def scenario() -> None:
        first = asyncio.create_task(
            handlers.run_job(namespace="ns", name="j", uid="u1", stopped=_Never())
        )
        await _until("the first pass", lambda: len(reconciler.passes) >= 1)
        # deleted and created again under the same name: the new job's daemon takes over
        second = asyncio.create_task(
            handlers.run_job(namespace="ns", name="j", uid="u2", stopped=_Never())
        )
        await asyncio.wait_for(first, 10)
        assert not second.done() and state.daemons == {("strategyjobs", "ns", "j"): "u2"}
        assert reconciler.forgotten == [("ns", "j", "u1")]  # the first job's state only
        assert ("strategyjobs", "ns", "j") in state.wakeups
        # the first job's DELETED event, late: the second daemon stays
        await handlers.job_changed(namespace="ns", name="j", uid="u1", type="DELETED")
        await asyncio.sleep(0.2)
        assert not second.done()
        passes = len(reconciler.passes)
        await handlers.job_changed(namespace="ns", name="j", uid="u2", type="MODIFIED")
        await _until("a pass on the event", lambda: len(reconciler.passes) > passes)
        await handlers.job_changed(namespace="ns", name="j", uid="u2", type="DELETED")
        await asyncio.wait_for(second, 10)
        assert state.daemons == {} and state.wakeups == {}
        assert reconciler.forgotten == [("ns", "j", "u1"), ("ns", "j", "u2")]

    asyncio.run(scenario())


def test_forget_frees_the_state_of_one_job_and_no_other() -> None:
    reconciler = Reconciler(FakeApi(None), registry=Registry())
    for uid in ("u1", "u2"):
        reconciler._unknown_seen[("ns", "j", uid)] = {"pod-uid": "2026-01-01T00:00:00Z"}
    reconciler._create_backoff[("ns", "j", "u1")] = object()  # type: ignore[assignment]
    reconciler._create_backoff[("ns", "k", "u3")] = object()  # type: ignore[assignment]
    reconciler.forget("ns", "j", "u1")
    assert reconciler.remembered() == {("ns", "j", "u2"), ("ns", "k", "u3")}
    reconciler.forget("ns", "j", "u2")
    reconciler.forget("ns", "k", "u3")
    reconciler.forget("ns", "k", "u3")  # twice: nothing left, no error
    assert reconciler.remembered() == set()


def _job(uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "template": {"spec": {"containers": [{"name": "strategyjob", "image": "x"}]}},
                }
            },
        },
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_pass_that_reads_the_job_gone_ends_its_daemon_without_a_deleted_event(
    operator_state: OperatorState, how: str
) -> None:
    """The watch missed the job's DELETED event: the next pass (a pod's event, a timer)
    reads it gone (404, or a namesake's uid) and the daemon ends, its state freed."""
    api = FakeApi(_job("u1"))
    api.refuse = ApiError(403, "POST", "/api/v1/namespaces/ns/services", '{"message": "no"}')
    settings = OperatorSettings(metrics_port=None)
    reconciler = Reconciler(api, settings, registry=Registry())
    state = _install(operator_state, reconciler, settings)

    async def scenario() -> None:
        daemon = asyncio.create_task(
            handlers.run_job(namespace="ns", name="j", uid="u1", stopped=_Never())
        )
        # the first pass is refused: the job has a create backoff
        await _until("a backoff", lambda: reconciler.remembered() == {("ns", "j", "u1")})
        assert not daemon.done()
        api.job = None if how == "deleted" else _job("u2")
        job_loop.wake("ns", "j")  # e.g. a pod's event; no DELETED event comes
        await asyncio.wait_for(daemon, 10)
        assert state.daemons == {} and state.wakeups == {}
        assert reconciler.remembered() == set()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_daemon_with_nothing_due_still_reads_its_job_now_and_then(
    operator_state: OperatorState,
) -> None:
    """A finished job's daemon has no timer and may get no event: it passes anyway every
    ``idle_check_seconds``, so a deletion whose event was lost ends it."""
    reconciler = _Reconciler()
    state = _install(
        operator_state, reconciler, OperatorSettings(metrics_port=None, idle_check_seconds=0.2)
    )

    async def scenario() -> None:
        daemon = asyncio.create_task(
            handlers.run_job(namespace="ns", name="j", uid="u1", stopped=_Never())
        )
        await _until("a pass with nothing woken", lambda: len(reconciler.passes) >= 2)
        reconciler.gone = True
        await asyncio.wait_for(daemon, 10)
        assert state.daemons == {} and reconciler.forgotten == [("ns", "j", "u1")]

    asyncio.run(scenario())


def test_an_installed_state_is_the_handlers_until_its_block_ends() -> None:
    before = state.current()
    with state.installed() as fresh:
        assert state.current() is fresh and fresh is not before
        stopping.give_up("the test stops its own operator state")
        assert fresh.fatal == "the test stops its own operator state" and fresh.stop_flag.done()
    assert state.current() is before and not before.stop_flag.done()
