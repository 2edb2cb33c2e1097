"""StrategyJobs carry no finalizer, so deleting one never waits for the operator: kopf's
daemon is registered as needing none, and each job's daemon ends itself when its job is
deleted or replaced by a namesake (kopf stops daemons only for objects it finalizes)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from strategyjob_operator import constants as c
from strategyjob_operator import handlers


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
        self.metrics = self

    def inc(self, *_: Any) -> None:
        pass

    async def reconcile(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.passes.append(f"{namespace}/{name}")


class _Never:
    def __bool__(self) -> bool:
        return False


async def _until(what: str, predicate: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_jobs_daemon_ends_when_the_job_is_deleted_or_replaced_by_a_namesake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = handlers._State()
    reconciler = _Reconciler()
    state.reconciler = reconciler  # type: ignore[assignment]
    monkeypatch.setattr(handlers, "STATE", state)

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
        assert not second.done() and state.daemons == {("ns", "j"): "u2"}
        assert ("ns", "j") in state.wakeups
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

    asyncio.run(scenario())
