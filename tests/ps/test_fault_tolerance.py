"""Fault tolerance as TensorFlow specifies it: a worker killed mid-training is replaced
transparently (its closures re-run, its datasets rebuilt when it returns); a dead ps gives an
unavailable error that names it."""

from __future__ import annotations

import time

import pytest
import strategyjob
import torch
from strategyjob import errors
from strategyjob.ps.coordinator import ClusterCoordinator
from strategyjob.strategies.parameter_server import ParameterServerStrategy

pytestmark = pytest.mark.timeout(180)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_worker_killed_mid_training_job_still_finishes(make_cluster):
    cluster = make_cluster(workers=2, ps=1)
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        steps = strategyjob.Variable(0, name="steps")
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def dataset_fn():
        return iter(range(1_000_000))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def train_step(it):
        position = next(it)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        time.sleep(0.01)  # simulated compute: keeps closures in flight while the worker dies
        steps.assign_add(1)
        from strategyjob.experimental.coordinator import get_current_worker_index

        return get_current_worker_index(), position

    first = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(60)]
    wait_until(lambda: int(steps) >= 10, 60, "training to start")
    cluster.kill("worker", 1)
    cluster.start("worker", 1)  # same command, TF_CONFIG and port
    cluster.wait_ready("worker", 1)
    coordinator.join()
    # Every closure finished without the user seeing an error (at least once each).
    assert all(rv.fetch() is not None for rv in first)
    assert int(steps) >= 60

    # The coordinator reconnects to the restarted worker without anything from the user.
    second: list = []
    deadline = time.monotonic() + 60
    while not any(int(rv.fetch()[0]) == 1 for rv in second):
        assert time.monotonic() < deadline, "the restarted worker got no work"
        second += [coordinator.schedule(train_step, args=(iterator,)) for _ in range(10)]
        coordinator.join()
    assert int(steps) >= 60 + len(second)
    results = [tuple(int(v) for v in rv.fetch()) for rv in first + second]
    # Its dataset was rebuilt: the restarted worker's positions start again from 0.
    after = [pos for worker, pos in results[60:] if worker == 1]
    before = [pos for worker, pos in results[:60] if worker == 1]
    assert after[0] == 0 or (before and after[0] < max(before))


def test_dead_ps_gives_unavailable_error_naming_it(make_cluster):
    cluster = make_cluster(workers=1, ps=2)
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        a = strategyjob.Variable(0.0, name="a")  # ps0
        b = strategyjob.Variable(0.0, name="b")  # ps1
    assert b.device == "/job:ps/replica:0/task:1/device:CPU:0"

    def step():
        a.assign_add(1.0)
        b.assign_add(1.0)

    coordinator.schedule(step)
    coordinator.join()
    cluster.kill("ps", 1)
    for _ in range(5):
        coordinator.schedule(step)
    with pytest.raises(errors.UnavailableError, match="/job:ps/replica:0/task:1"):
        coordinator.join()
    with pytest.raises(errors.UnavailableError, match="/job:ps/replica:0/task:1"):
        b.read_value()
    assert float(a) >= 1.0  # ps0 still serves
