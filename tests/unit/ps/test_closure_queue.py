"""The coordinator's closure queue on plain data: TensorFlow's scheduling semantics (first in,
first out; the first error wins, cancels what is queued and is raised once, after the closures
in flight end) without a cluster. Threads stand in for the coordinator's worker threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from strategyjob import errors
from strategyjob.ps import coordinator
from strategyjob.ps.coordinator import CANCELLED_MESSAGE, _Closure, _ClosureQueue

DEADLINE = 30.0  # seconds for a thread to get where the test waits for it


def _closures(count: int) -> list[_Closure]:
    return [_Closure(None, (i,), {}) for i in range(count)]  # type: ignore[arg-type]


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # reported to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _cancelled(closure: _Closure) -> bool:
    with pytest.raises(errors.CancelledError, match=CANCELLED_MESSAGE):
        closure.output.get()
    return True


def test_closures_come_out_in_order_and_the_queue_knows_when_it_is_idle() -> None:
    queue = _ClosureQueue()
    first, second = _closures(2)
    assert queue.idle()
    queue.put(first)
    queue.put(second)
    assert not queue.idle()
    assert queue.get(timeout=0) is first
    assert queue.get(timeout=0) is second
    assert not queue.idle()  # both in flight
    queue.mark_finished()
    queue.mark_finished()
    assert queue.idle() and queue.done()
    assert queue.get(timeout=0.01) is None  # nothing to take: the timeout ends the wait


def test_a_closure_put_back_goes_first_and_runs_again() -> None:
    queue = _ClosureQueue()
    first, second = _closures(2)
    queue.put(first)
    queue.put(second)
    assert queue.get(timeout=0) is first
    queue.put_back(first)  # its worker failed: another takes it, before the later ones
    assert queue.get(timeout=0) is first
    assert queue.get(timeout=0) is second


def test_the_first_error_wins_cancels_the_queued_and_is_raised_once() -> None:
    queue = _ClosureQueue()
    running, other, queued = _closures(3)
    for closure in (running, other, queued):
        queue.put(closure)
    assert queue.get(timeout=0) is running
    assert queue.get(timeout=0) is other
    first, second = ValueError("first"), ValueError("second")
    queue.mark_failed(first)
    assert _cancelled(queued)
    queue.mark_failed(second)
    with pytest.raises(ValueError, match="first"):
        queue.wait()
    queue.wait()  # raised once: the queue is usable again
    assert queue.idle()


def _two_running_one_failed(error: BaseException) -> tuple[_ClosureQueue, _Closure]:
    """A queue whose two closures were taken by workers, the first of which failed."""
    queue = _ClosureQueue()
    first, second = _closures(2)
    queue.put(first)
    queue.put(second)
    assert [queue.get(timeout=0), queue.get(timeout=0)] == [first, second]
    queue.mark_failed(error)
    return queue, second


def test_a_closure_put_back_after_an_error_is_cancelled_not_run() -> None:
    queue, retried = _two_running_one_failed(RuntimeError("boom"))
    queue.put_back(retried)  # its worker lost the ps meanwhile
    assert _cancelled(retried)
    assert queue.get(timeout=0.01) is None
    with pytest.raises(RuntimeError, match="boom"):
        queue.done()


def test_the_error_is_raised_only_after_the_closures_in_flight_end() -> None:
    queue, _still_running = _two_running_one_failed(KeyError("lost"))
    waiter, outcome = _in_thread(queue.wait)
    waiter.join(timeout=0.2)
    assert waiter.is_alive(), "raised while a closure was still running"
    queue.mark_finished()
    waiter.join(timeout=DEADLINE)
    assert not waiter.is_alive() and isinstance(outcome.get("error"), KeyError)


def test_an_error_outside_any_closure_cancels_the_queue() -> None:
    queue = _ClosureQueue()
    (queued,) = _closures(1)
    queue.put(queued)
    queue.record_error(errors.PermissionDeniedError("refused our token"))
    assert _cancelled(queued)
    with pytest.raises(errors.PermissionDeniedError, match="token"):
        queue.wait()


def test_a_full_queue_holds_the_scheduler_until_a_worker_takes_one(monkeypatch) -> None:
    monkeypatch.setattr(coordinator, "QUEUE_LIMIT", 2)
    queue = _ClosureQueue()
    a, b, c = _closures(3)
    queue.put(a)
    queue.put(b)
    putter, outcome = _in_thread(lambda: queue.put(c))
    putter.join(timeout=0.2)
    assert putter.is_alive(), "a third closure went into a queue of two"
    assert queue.get(timeout=0) is a
    putter.join(timeout=DEADLINE)
    assert not putter.is_alive() and "error" not in outcome
    assert [queue.get(timeout=0), queue.get(timeout=0)] == [b, c]


def test_stopping_frees_the_workers_and_a_blocked_scheduler(monkeypatch) -> None:
    monkeypatch.setattr(coordinator, "QUEUE_LIMIT", 1)
    queue, empty = _ClosureQueue(), _ClosureQueue()
    a, b = _closures(2)
    queue.put(a)
    putter, _ = _in_thread(lambda: queue.put(b))  # blocked: the queue is full
    getter, got = _in_thread(lambda: empty.get(timeout=None))  # blocked: nothing to take
    queue.stop()
    empty.stop()
    for thread in (putter, getter):
        thread.join(timeout=DEADLINE)
        assert not thread.is_alive()
    assert got["value"] is None
    assert queue.get(timeout=None) is None
