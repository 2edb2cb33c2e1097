"""RBAC taken away after the startup check: a job's passes that the API server keeps
refusing (HTTP 403), or a watch of kopf's that it forbids, stop the operator with one line
(``__main__`` exits 1 with it) instead of leaving it up and serving nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from strategyjob_operator import handlers, job_loop, stopping
from strategyjob_operator.kube import ApiError
from strategyjob_operator.reconcile import OperatorSettings
from strategyjob_operator.state import OperatorState, installed

FORBIDDEN = ApiError(
    403,
    "GET",
    "/apis/strategyjob.dev/v1alpha1/namespaces/ns/strategyjobs/j",
    '{"message": "strategyjobs.strategyjob.dev \\"j\\" is forbidden: User \\"op\\" cannot get '
    'resource \\"strategyjobs\\" in API group \\"strategyjob.dev\\" in the namespace \\"ns\\""}',
)


class _Refused:
    """After ``ok`` passes that succeed, every pass fails with the next of ``errors`` (in
    turn)."""

    def __init__(self, *errors: Exception, ok: int = 0) -> None:
        self.errors, self.ok, self.passes = errors, ok, 0
        self.metrics = self

    def inc(self, *_: Any) -> None:
        pass

    def forget(self, *_: Any) -> None:
        pass

    async def reconcile(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.passes += 1
        if self.passes > self.ok:
            raise self.errors[(self.passes - self.ok - 1) % len(self.errors)]


class _Never:
    def __bool__(self) -> bool:
        return False


def _state(state: OperatorState, reconciler: Any) -> OperatorState:
    """The test's operator state, with ``reconciler``."""
    state.reconciler = reconciler
    state.settings = OperatorSettings(metrics_port=None, max_error_backoff=0.05)  # fast passes
    return state


@pytest.mark.timeout(60)
def test_passes_refused_with_403_stop_the_operator_with_one_line(
    operator_state: OperatorState,
) -> None:
    reconciler = _Refused(FORBIDDEN, ok=1)
    state = _state(operator_state, reconciler)
    asyncio.run(_run_until_woken(state))
    assert reconciler.passes == 1 + job_loop.FORBIDDEN_PASSES
    assert state.stop_flag.done() and state.fatal is not None
    assert "\n" not in state.fatal
    assert state.fatal.startswith("The API server forbids a request the operator needs (HTTP 403: ")
    assert 'cannot get resource "strategyjobs"' in state.fatal and "RBAC" in state.fatal


async def _run_until_woken(state: OperatorState) -> None:
    """Run the job's daemon, waking it after each pass (as its pods' events would)."""
    daemon = asyncio.create_task(
        handlers.run_job(namespace="ns", name="j", uid="u", stopped=_Never())
    )
    deadline = asyncio.get_running_loop().time() + 30
    while not daemon.done():
        assert asyncio.get_running_loop().time() < deadline, "the daemon never ended"
        job_loop.wake("ns", "j")
        await asyncio.sleep(0.01)
    await daemon


@pytest.mark.timeout(60)
def test_other_errors_and_403s_between_them_keep_the_loop_going() -> None:
    server_error = ApiError(500, "GET", "/x", "boom")
    # an admission webhook's 403 is about one object, not the operator's rights
    webhook = ApiError(403, "PATCH", "/x", '{"message": "admission webhook \\"v\\" denied it"}')
    for errors in (
        (server_error,),
        (webhook,),
        (FORBIDDEN, server_error),
        (FORBIDDEN, ValueError("x")),
    ):
        reconciler = _Refused(*errors)

        async def some_passes(state: OperatorState, r: _Refused = reconciler) -> None:
            daemon = asyncio.create_task(
                handlers.run_job(namespace="ns", name="j", uid="u", stopped=_Never())
            )
            deadline = asyncio.get_running_loop().time() + 30
            while r.passes < job_loop.FORBIDDEN_PASSES + 2:
                assert asyncio.get_running_loop().time() < deadline, "too few passes"
                job_loop.wake("ns", "j")
                await asyncio.sleep(0.01)
            assert not daemon.done()
            state.daemons.clear()  # as on the job's DELETED event
            job_loop.wake("ns", "j")
            await asyncio.wait_for(daemon, 10)

        with installed(OperatorState()) as state:  # a fresh one for each case
            _state(state, reconciler)
            asyncio.run(some_passes(state))
        assert state.fatal is None and not state.stop_flag.done(), errors


class _KopfForbidden(Exception):
    """What kopf raises for a 403 (its APIForbiddenError has a ``status``)."""

    status = 403


def test_a_watch_kopf_gives_up_on_with_403_stops_the_operator(
    operator_state: OperatorState,
) -> None:
    state = _state(operator_state, None)
    stopping.give_up_on_kopfs_forbidden_requests()
    stopping.give_up_on_kopfs_forbidden_requests()  # once only
    kopf_logger = logging.getLogger("kopf._core.reactor.orchestration")
    ours = [
        h for h in logging.getLogger("kopf").handlers if isinstance(h, stopping.GiveUpOnForbidden)
    ]
    assert len(ours) == 1
    try:
        try:
            raise RuntimeError("a 500")
        except RuntimeError:
            kopf_logger.exception("Watcher for pods@ns has failed: a 500")
        try:
            raise _KopfForbidden('admission webhook "v" denied the request')
        except _KopfForbidden:
            kopf_logger.exception("Patching failed")
        assert state.fatal is None
        try:
            raise _KopfForbidden(
                'strategyjobs.strategyjob.dev is forbidden: User "op" cannot watch resource x'
            )
        except _KopfForbidden:
            kopf_logger.exception("Watcher for strategyjobs@ns has failed")
        assert state.stop_flag.done()
        assert state.fatal == (
            "The API server forbids a request the operator needs (HTTP 403: "
            'strategyjobs.strategyjob.dev is forbidden: User "op" cannot watch resource x): '
            "its account lost RBAC since it started; give it the Helm chart's ClusterRole and "
            "Roles back, then restart the operator."
        )
    finally:
        for handler in ours:
            logging.getLogger("kopf").removeHandler(handler)


def test_the_error_backoff_doubles_up_to_its_cap_however_long_the_passes_fail() -> None:
    errors = job_loop.ErrorBackoff(60.0)
    waits = [errors.backoff(ValueError("x")) for _ in range(2000)]  # a day and more
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0] and waits[-1] == 60.0
    refused = job_loop.ErrorBackoff(60.0)
    waits = [refused.backoff(FORBIDDEN) for _ in range(job_loop.FORBIDDEN_PASSES)]
    assert waits[-1] is None and None not in waits[:-1]  # RBAC gone: the operator gives up
