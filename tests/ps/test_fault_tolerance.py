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


def test_a_worker_stuck_in_a_closure_is_taken_out_and_every_step_applied_once(
    make_cluster, tmp_path, monkeypatch, capfd
):
    """Worker 1 blocks inside its 26th-or-later closure (alive: its server answers) until the
    test releases it: with STRATEGYJOB_STUCK_PEER_SECONDS=3 the coordinator takes it out once
    the closure has run the bound, runs the step on worker 0, and join returns (before: it
    waited for ever). Released, the stuck closure sends its update, which the ps skips: every
    step is applied once."""
    monkeypatch.setenv("STRATEGYJOB_STUCK_PEER_SECONDS", "3")
    cluster = make_cluster(workers=2, ps=1)
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        steps = strategyjob.Variable(0, name="steps")
    stuck, release, woke = (str(tmp_path / name) for name in ("stuck", "release", "woke"))

    def train_step():
        import os
        import time

        from strategyjob.experimental.coordinator import get_current_worker_index

        worker = get_current_worker_index()
        if worker == 1 and os.path.exists(stuck):
            os.remove(stuck)  # block once
            deadline = time.monotonic() + 90
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.05)
            steps.assign_add(1)
            open(woke, "w").close()
            return worker
        time.sleep(0.01)
        steps.assign_add(1)
        return worker

    for _ in range(25):  # the history the bound needs (20 closures)
        coordinator.schedule(train_step)
    coordinator.join()
    open(stuck, "w").close()
    started = time.monotonic()
    results = [coordinator.schedule(train_step) for _ in range(30)]
    coordinator.join()
    took = time.monotonic() - started
    assert not (tmp_path / "stuck").exists(), "worker 1 never took a step"
    assert int(steps) == 55
    assert all(rv.fetch() in (0, 1) for rv in results)
    err = capfd.readouterr().err
    taken = "strategyjob: coordinator takes /job:worker/replica:0/task:1 out: closure "
    assert taken in err, err
    assert (
        "test_a_worker_stuck_in_a_closure_is_taken_out_and_every_step_applied_once.<locals>"
        ".train_step ran 3." in err
    )
    print(f"stuck closure: join returned {took:.1f} s after the steps were scheduled")
    assert 3 <= took < 20

    # Released, it sends its update: the ps skips it (the step ran on worker 0).
    (tmp_path / "release").touch()
    wait_until(lambda: (tmp_path / "woke").exists(), 30, "the stuck closure to wake")
    assert int(steps) == 55
    wait_until(lambda: not coordinator._pool.workers[1].taken_out, 30, "worker 1 to be back")
