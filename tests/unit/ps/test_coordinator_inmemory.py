"""``ClusterCoordinator`` with a real ``ParameterServerStrategy`` on the in-memory transport:
TensorFlow's scheduling, retry of a lost worker's closure, error propagation and a worker's
return, table by table, in this process (the ps and workers are the servers' own code, reached
without sockets; ``tests/ps`` runs the same over gRPC on subprocess clusters)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import strategyjob as sj
import torch
from strategyjob import errors
from strategyjob.ps import _cluster
from strategyjob.ps._inmemory import InMemoryTransport
from strategyjob.ps.coordinator import (
    CANCELLED_MESSAGE,
    ClosureInputError,
    ClusterCoordinator,
    RemoteValue,
    RemoteValueStatus,
    get_current_worker_index,
)
from strategyjob.strategies.parameter_server import ParameterServerStrategy

DEADLINE = 60.0  # seconds for anything the test waits for (generous: shared, slow machines)

# Gates the scheduled functions wait on (module-level functions ship by reference, so a
# function running on an in-process worker sees these very events).
_GATES: dict[str, threading.Event] = {}


def _wait_for_gate(name: str) -> int:
    if not _GATES[name].wait(DEADLINE):
        raise TimeoutError(f"gate {name!r} never opened")
    return get_current_worker_index()


def _add_one(v: Any) -> int:
    v.assign_add(torch.ones(()))
    return get_current_worker_index()


def _double(v: Any, x: int) -> tuple[int, int]:
    v.assign_add(torch.ones(()))
    return 2 * x, get_current_worker_index()


def _fail(message: str) -> None:
    raise ValueError(message)


def _next_item(iterator: Any) -> int:
    return next(iterator)


def _poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Cluster:
    def __init__(self, workers: int, ps: int) -> None:
        self.transport = InMemoryTransport(workers, ps)
        self.strategy = ParameterServerStrategy(transport=self.transport)
        with self.strategy.scope():
            self.v = sj.Variable(torch.zeros(()))
        self.coordinator: ClusterCoordinator | None = None

    def start(self) -> ClusterCoordinator:
        self.coordinator = ClusterCoordinator(self.strategy)
        return self.coordinator

    def steps_on(self, worker: int) -> list[str]:
        return [step for w, step in list(self.transport.closures) if w == worker]


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []
    previous = _cluster.current()

    def make(workers: int = 2, ps: int = 1) -> Cluster:
        cluster = Cluster(workers, ps)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for gate in _GATES.values():
            gate.set()  # nothing stays blocked
        _GATES.clear()
        for cluster in made:
            cluster.transport.close()  # (a worker thread waiting for its worker stops waiting)
            if cluster.coordinator is not None:
                cluster.coordinator._pool.shutdown()
        _cluster.use(previous)


def _gate(name: str) -> threading.Event:
    gate = _GATES[name] = threading.Event()
    return gate


# ---------------------------------------------------------------------------------------------
# scheduling


@pytest.mark.parametrize(
    ("workers", "ps", "functions"),
    [(1, 1, 1), (2, 1, 8), (3, 2, 12)],
    ids=["one-worker", "two-workers", "three-workers-two-ps"],
)
def test_scheduled_functions_run_and_return_remote_values(make_cluster, workers, ps, functions):
    cluster = make_cluster(workers, ps)
    coordinator = cluster.start()
    results = [coordinator.schedule(_double, args=(cluster.v, i)) for i in range(functions)]
    assert all(isinstance(r, RemoteValue) for r in results)
    coordinator.join()
    assert coordinator.done()
    for i, result in enumerate(results):
        assert result._result.status is RemoteValueStatus.READY
        value, worker = result.fetch()
        assert value == 2 * i and 0 <= worker < workers
    assert cluster.v.read_value().item() == functions  # every update applied once
    assert len(cluster.transport.closures) == functions  # one run each: no retry


def test_done_is_false_while_a_function_runs_and_join_waits_for_it(make_cluster):
    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    gate = _gate("running")
    result = coordinator.schedule(_wait_for_gate, args=("running",))
    assert not coordinator.done()
    assert not coordinator.idle()
    gate.set()
    coordinator.join()
    assert coordinator.done() and coordinator.idle()
    assert result.fetch() == 0


# ---------------------------------------------------------------------------------------------
# a lost worker's closure runs again on another


@pytest.mark.parametrize(
    ("after_running", "attempts_on_lost"),
    [(False, 0), (True, 1)],
    ids=["lost-before-running", "lost-after-running-updates-applied-once"],
)
def test_a_lost_workers_closure_is_retried_on_another(
    make_cluster, after_running, attempts_on_lost
):
    cluster = make_cluster(2, 1)
    transport = cluster.transport
    transport.set_worker_available(1, False)  # worker 0 takes the closure
    transport.lose_worker_on_next(0, after_running=after_running)
    coordinator = cluster.start()
    result = coordinator.schedule(_add_one, args=(cluster.v,))
    _poll(lambda: not transport.worker_available(0), "worker 0 to be lost")
    transport.set_worker_available(1, True)
    coordinator.join()
    assert result.fetch() == 1  # ran (again) on worker 1
    assert cluster.v.read_value().item() == 1  # the retry's update skipped if applied before
    assert len(cluster.steps_on(0)) == attempts_on_lost
    (step,) = cluster.steps_on(1)
    assert cluster.steps_on(0) in ([], [step])  # the same step id for every attempt


@pytest.mark.parametrize(
    ("comeback", "builds_on_worker_0"),
    [("returns", [0, 1]), ("restarts", [0, 1, 0, 1])],  # the dataset (0), its iterator (1)
    ids=["same-incarnation-keeps-resources", "restarted-worker-gets-resources-rebuilt"],
)
def test_a_lost_worker_takes_closures_again_when_it_comes_back(
    make_cluster, comeback, builds_on_worker_0
):
    cluster = make_cluster(2, 1)
    transport = cluster.transport
    coordinator = cluster.start()
    dataset = coordinator.create_per_worker_dataset(lambda: iter(range(1000)))
    iterator = iter(dataset)
    transport.set_worker_available(1, False)
    assert coordinator.schedule(_next_item, args=(iterator,)).fetch() == 0  # built on worker 0
    transport.lose_worker_on_next(0, after_running=False)
    lost = coordinator.schedule(_add_one, args=(cluster.v,))
    _poll(lambda: not transport.worker_available(0), "worker 0 to be lost")
    assert not coordinator.done()  # no worker to run it: it waits, it does not fail
    if comeback == "returns":
        transport.set_worker_available(0, True)
    else:
        transport.restart_worker(0)
    coordinator.join()
    assert lost.fetch() == 0
    transport.set_worker_available(1, True)
    after = [coordinator.schedule(_next_item, args=(iterator,)) for _ in range(4)]
    coordinator.join()
    assert all(isinstance(r.fetch(), int) for r in after)
    assert [r for w, r in transport.resources if w == 0] == builds_on_worker_0


# ---------------------------------------------------------------------------------------------
# errors: the first one is raised once, at the next schedule / join / done; the rest cancelled


def _surface_at_schedule(coordinator: ClusterCoordinator, cluster: Cluster) -> None:
    _poll(lambda: coordinator.idle(), "the closures to end")
    coordinator.schedule(_add_one, args=(cluster.v,))


def _surface_at_done(coordinator: ClusterCoordinator, cluster: Cluster) -> None:
    _poll(lambda: coordinator.idle(), "the closures to end")
    coordinator.done()


@pytest.mark.parametrize(
    "surface",
    [lambda c, _: c.join(), _surface_at_done, _surface_at_schedule],
    ids=["join", "done", "schedule"],
)
def test_a_functions_error_is_raised_once_and_cancels_the_rest(make_cluster, surface):
    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    gate = _gate("first")
    first = coordinator.schedule(_wait_for_gate, args=("first",))  # the queue fills behind it
    failing = coordinator.schedule(_fail, args=("boom",))
    rest = [coordinator.schedule(_add_one, args=(cluster.v,)) for _ in range(3)]
    gate.set()
    with pytest.raises(ValueError, match="boom"):
        surface(coordinator, cluster)
    assert first.fetch() == 0
    with pytest.raises(ValueError, match="boom"):
        failing.fetch()
    for result in rest:
        with pytest.raises(errors.CancelledError, match=CANCELLED_MESSAGE):
            result.fetch()
    assert cluster.v.read_value().item() == 0  # the cancelled ones never ran
    # Raised once: scheduling works again.
    again = coordinator.schedule(_add_one, args=(cluster.v,))
    coordinator.join()
    assert again.fetch() == 0 and cluster.v.read_value().item() == 1


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("ps-down", errors.UnavailableError, "Parameter server /job:ps/replica:0/task:0 is"),
        ("input", ClosureInputError, "Input has an error"),
    ],
    ids=["ps-down-past-its-retries", "per-worker-dataset-fails"],
)
def test_cluster_failures_surface_as_tensorflows_errors(
    make_cluster, monkeypatch, fault, error, message
):
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "0")
    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    if fault == "ps-down":
        cluster.transport.set_ps_available(0, False)
        result = coordinator.schedule(_add_one, args=(cluster.v,))
    else:
        dataset = coordinator.create_per_worker_dataset(lambda: _fail("no input"))
        result = coordinator.schedule(_next_item, args=(iter(dataset),))
    with pytest.raises(error, match=message):
        coordinator.join()
    with pytest.raises(error, match=message):
        result.fetch()


def test_a_ps_back_within_the_retries_lets_the_function_finish(make_cluster, monkeypatch):
    # Six retries span 23.5 s (0.5, 1, 2, 4, 8, 8): the ps is back long before, even under load.
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "6")
    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    cluster.transport.set_ps_available(0, False)
    result = coordinator.schedule(_add_one, args=(cluster.v,))
    _poll(lambda: cluster.transport.closures, "a first attempt to meet the ps down")
    cluster.transport.set_ps_available(0, True)
    coordinator.join()
    assert result.fetch() == 0
    assert cluster.v.read_value().item() == 1
    assert len(cluster.transport.closures) >= 2  # retried


# ---------------------------------------------------------------------------------------------
# the coordinator and the strategy talk through their protocol


def test_the_strategy_knows_its_coordinator_and_whether_it_is_idle(make_cluster):
    cluster = make_cluster(1, 1)
    extended = cluster.strategy.extended
    assert extended.coordinator is None and extended.ps_settled()
    coordinator = cluster.start()
    assert extended.coordinator is coordinator
    assert ClusterCoordinator(cluster.strategy) is coordinator  # one per strategy
    assert extended.transport is cluster.transport
    epoch = extended.ps_epoch
    gate = _gate("settled")
    coordinator.schedule(_wait_for_gate, args=("settled",))
    assert extended.ps_epoch == epoch + 1
    assert not extended.ps_settled()
    gate.set()
    coordinator.join()
    assert extended.ps_settled()


# ---------------------------------------------------------------------------------------------
# a worker stuck in a closure is taken out; its closure runs on another, its updates once

_STUCK_ON: dict[str, int] = {}  # worker index -> block (once) on gate "stuck" in its next step


def _step(v: Any, seconds: float = 0.0) -> int:
    worker = get_current_worker_index()
    if _STUCK_ON.get("worker") == worker:
        del _STUCK_ON["worker"]
        _wait_for_gate("stuck")
    time.sleep(seconds)
    v.assign_add(torch.ones(()))
    return worker


def _stuck_bound(monkeypatch: pytest.MonkeyPatch, seconds: str, report: str = "60") -> None:
    monkeypatch.setenv("STRATEGYJOB_STUCK_PEER_SECONDS", seconds)
    monkeypatch.setenv("STRATEGYJOB_WAITING_REPORT_SECONDS", report)


def _history(coordinator: ClusterCoordinator, cluster: Cluster, steps: int = 20) -> None:
    """``steps`` completed closures of ``_step``: the history the bound needs."""
    for _ in range(steps):
        coordinator.schedule(_step, args=(cluster.v,))
    coordinator.join()


def test_a_worker_stuck_in_a_closure_is_taken_out_and_every_step_is_applied_once(
    make_cluster, monkeypatch, capfd
):
    _stuck_bound(monkeypatch, "0.5")
    cluster = make_cluster(2, 1)
    coordinator = cluster.start()
    _history(coordinator, cluster)
    gate = _gate("stuck")
    _STUCK_ON["worker"] = 1
    started = time.monotonic()
    results = [coordinator.schedule(_step, args=(cluster.v,)) for _ in range(20)]
    coordinator.join()  # before: waited for the stuck closure for ever
    took = time.monotonic() - started
    assert "worker" not in _STUCK_ON, "worker 1 never took a step"
    assert 0.5 <= took < 10
    assert [r.fetch() for r in results].count(1) == 0  # the stuck one's result is worker 0's
    assert cluster.v.read_value().item() == 40
    err = capfd.readouterr().err
    assert (
        "strategyjob: coordinator takes /job:worker/replica:0/task:1 out: closure _step ran "
    ) in err, err
    assert "longer than this job's stuck-peer bound of 0.5 s (the larger of " in err

    # It wakes: its update reaches the ps, which skips it (the rescheduled run applied it).
    gate.set()
    _poll(lambda: not coordinator._pool.workers[1].taken_out, "worker 1 to finish its closure")
    assert cluster.v.read_value().item() == 40
    assert "/job:worker/replica:0/task:1 finished its stuck closure" in capfd.readouterr().err
    # And takes closures again.
    again: list[RemoteValue] = []
    deadline = time.monotonic() + DEADLINE
    while not any(r.fetch() == 1 for r in again):
        assert time.monotonic() < deadline, "worker 1 got no closure after it came back"
        again += [coordinator.schedule(_step, args=(cluster.v, 0.01)) for _ in range(4)]
        coordinator.join()
    assert cluster.v.read_value().item() == 40 + len(again)


def test_with_no_other_worker_a_stuck_closure_fails_join_naming_it(make_cluster, monkeypatch):
    _stuck_bound(monkeypatch, "0.5")
    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    _history(coordinator, cluster)
    _gate("stuck")
    _STUCK_ON["worker"] = 0
    stuck = coordinator.schedule(_step, args=(cluster.v,))
    queued = coordinator.schedule(_step, args=(cluster.v,))
    with pytest.raises(errors.DeadlineExceededError) as raised:
        coordinator.join()
    message = str(raised.value)
    assert message.startswith(
        "Closure _step on /job:worker/replica:0/task:0 did not complete: it ran 0."
    ), message
    assert "no other worker is left to run it" in message
    assert "STRATEGYJOB_STUCK_PEER_SECONDS (0.5 s)" in message
    assert "raise STRATEGYJOB_STUCK_PEER_SECONDS" in message
    with pytest.raises(errors.DeadlineExceededError):
        stuck.fetch()
    with pytest.raises(errors.CancelledError, match=CANCELLED_MESSAGE):
        queued.fetch()


def test_a_slow_closure_within_the_bound_is_waited_for_and_named(make_cluster, monkeypatch, capfd):
    """A closure slower than any before (1 s after 0 s ones), under the bound (3 s): not taken
    out; the coordinator says whom it waits for every 0.4 s meanwhile."""
    _stuck_bound(monkeypatch, "3", report="0.4")
    cluster = make_cluster(2, 1)
    coordinator = cluster.start()
    _history(coordinator, cluster)
    slow = coordinator.schedule(_step, args=(cluster.v, 1.0))
    coordinator.join()
    assert cluster.v.read_value().item() == 21
    assert len(cluster.transport.closures) == 21  # run once: not rescheduled
    err = capfd.readouterr().err
    assert "coordinator takes" not in err, err
    worker = slow.fetch()
    line = f"s for closure _step on /job:worker/replica:0/task:{worker} (the longest completed "
    lines = [x for x in err.splitlines() if x.startswith("strategyjob: coordinator waiting ")]
    assert len(lines) >= 2 and all(line in x for x in lines), err
    assert "taken out at 3 s)" in err


def test_a_bad_stuck_peer_setting_is_refused_when_the_coordinator_is_made(
    make_cluster, monkeypatch
):
    monkeypatch.setenv("STRATEGYJOB_STUCK_PEER_SECONDS", "soon")
    cluster = make_cluster(1, 1)
    with pytest.raises(ValueError, match="STRATEGYJOB_STUCK_PEER_SECONDS='soon' is not a posit"):
        cluster.start()


def test_a_stuck_verdict_on_a_closure_that_ended_meanwhile_takes_nothing_out(make_cluster):
    """The watch judged a closure stuck, but it ended and the worker's next closure started
    before the take-out: the worker stays in and its new closure is neither lost nor re-run."""
    from strategyjob.ps._closure_watch import Bound
    from strategyjob.ps.coordinator import _Running

    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    gate = _gate("next")
    result = coordinator.schedule(_wait_for_gate, args=("next",))
    worker = coordinator._pool.workers[0]
    _poll(lambda: bool(worker.running()), "the closure running on the worker")
    current = worker.running()[0]
    ended = _Running(current.closure, 0.0, 10.0)  # the verdict's closure: no longer running
    coordinator._pool.take_out(worker, ended, 5.0, Bound(4.0, "a test bound"))
    assert not worker.taken_out
    assert worker.running() == [current]
    gate.set()
    coordinator.join()
    assert result.fetch() == 0
    assert len(cluster.steps_on(0)) == 1  # ran once, not put back


# ---------------------------------------------------------------------------------------------
# resizing: workers join and leave while the coordinator runs


def _counted_step(v: Any, iterator: Any) -> tuple[int, int]:
    position = next(iterator)
    v.assign_add(torch.ones(()))
    return get_current_worker_index(), position


def _add_one_after_gate(v: Any, name: str) -> int:
    _wait_for_gate(name)
    return _add_one(v)


def _resize(cluster: Cluster, size: int) -> None:
    """Workers 0..size-1 in the cluster: the others leave (the process of worker 1 stays up,
    idle, as a terminating pod may; the others' end), new ones join."""
    transport = cluster.transport
    members = set(transport.workers())
    for index in sorted(members - set(range(size))):
        transport.remove_worker(index)
        transport.set_worker_available(index, index == 1)
    for index in sorted(set(range(size)) - members):
        transport.add_worker(index)
    assert cluster.coordinator is not None
    coordinator = cluster.coordinator
    _poll(lambda: coordinator.worker_indices() == tuple(range(size)), f"{size} workers")


def test_workers_join_and_leave_2_4_1_3_and_every_step_is_applied_once(make_cluster):
    cluster = make_cluster(2, 1)
    transport = cluster.transport
    coordinator = cluster.start()
    iterator = iter(coordinator.create_per_worker_dataset(lambda: iter(range(10**6))))
    first_worker_0 = coordinator._pool.workers[0]
    scheduled, counts = 0, []
    for size in (2, 4, 1, 3):
        _resize(cluster, size)
        assert len(iterator.values) == size  # a PerWorkerValues component per worker now
        ran_on: set[int] = set()
        deadline = time.monotonic() + DEADLINE
        while ran_on != set(range(size)):  # until every worker of this size took closures
            assert time.monotonic() < deadline, f"workers {set(range(size)) - ran_on} got none"
            results = [
                coordinator.schedule(_counted_step, args=(cluster.v, iterator))
                for _ in range(3 * size)
            ]
            coordinator.join()
            scheduled += len(results)
            ran_on |= {worker for worker, _ in (r.fetch() for r in results)}
            assert ran_on <= set(range(size))  # a worker that left took no closure
            counts.append(int(cluster.v.read_value().item()))
    assert counts == sorted(set(counts))  # the step counter strictly increases
    assert counts[-1] == scheduled == len(transport.closures)  # each step run and applied once
    # The worker that stayed throughout kept its connection and its dataset and iterator.
    assert coordinator._pool.workers[0] is first_worker_0
    assert [resource for worker, resource in transport.resources if worker == 0] == [0, 1]
    # The workers that joined again got their resources built again (worker 1's process
    # stayed up, yet a worker that joins is not trusted to hold what it had).
    assert [resource for worker, resource in transport.resources if worker == 1] == [0, 1] * 2


def test_a_worker_that_joins_takes_a_waiting_closure_within_a_second(make_cluster):
    cluster = make_cluster(1, 1)
    coordinator = cluster.start()
    iterator = iter(coordinator.create_per_worker_dataset(lambda: iter(range(100))))
    gate = _gate("busy")
    busy = coordinator.schedule(_wait_for_gate, args=("busy",))  # worker 0 is busy
    waiting = coordinator.schedule(_counted_step, args=(cluster.v, iterator))
    _poll(lambda: bool(coordinator._pool.workers[0].running()), "worker 0 to be busy")
    joined = time.monotonic()
    cluster.transport.add_worker(1)
    assert waiting.fetch() == (1, 0)  # on the new worker, from its own new iterator
    took = time.monotonic() - joined
    assert took < 1.5, f"the new worker took the closure {took:.2f} s after joining"
    gate.set()
    coordinator.join()
    assert busy.fetch() == 0


@pytest.mark.parametrize(
    ("goes_away", "ran_on", "attempts_on_leaving"),
    [(False, 0, 1), (True, 1, 1)],
    ids=["finishes-its-closure-result-used", "lost-first-closure-rerun-elsewhere-once"],
)
def test_a_leaving_workers_closure_in_flight_ends_there_or_runs_elsewhere_once(
    make_cluster, goes_away, ran_on, attempts_on_leaving
):
    cluster = make_cluster(1, 1)
    transport = cluster.transport
    coordinator = cluster.start()
    gate = _gate("leaving")
    if goes_away:  # it runs the closure (updates applied), then its process ends, no reply
        transport.lose_worker_on_next(0, after_running=True)
    in_flight = coordinator.schedule(_add_one_after_gate, args=(cluster.v, "leaving"))
    _poll(lambda: bool(coordinator._pool.workers[0].running()), "worker 0 to run the closure")
    transport.add_worker(1)
    transport.remove_worker(0)
    _poll(lambda: coordinator.worker_indices() == (1,), "worker 0 to leave")
    later = [coordinator.schedule(_add_one, args=(cluster.v,)) for _ in range(3)]
    _poll(lambda: len(cluster.steps_on(1)) == 3, "worker 1 to run the later closures")
    gate.set()
    coordinator.join()
    assert in_flight.fetch() == ran_on
    assert [r.fetch() for r in later] == [1, 1, 1]
    assert cluster.v.read_value().item() == 4  # the retried step's update applied once
    assert len(cluster.steps_on(0)) == attempts_on_leaving  # it took nothing after leaving
    _poll(lambda: len(coordinator._pool.all_workers()) == 1, "the leaving worker's threads to end")
