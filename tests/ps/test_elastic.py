"""A ParameterServerStrategy job resized while it trains, over gRPC: the chief's coordinator
follows its transport's workers (2 -> 4 -> 1 -> 3; or the STRATEGYJOB_CLUSTER_FILE a resizer
writes), every scheduled step is applied once, the step counter only grows, and the worker that
stays keeps its process, connection and iterator."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import strategyjob
import torch
from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
from strategyjob.ps.coordinator import ClusterCoordinator, get_current_worker_index
from strategyjob.strategies.parameter_server import ParameterServerStrategy

pytestmark = pytest.mark.timeout(240)

DEADLINE = 60.0


def _poll(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_workers_join_and_leave_2_4_1_3_while_training(make_cluster):
    cluster = make_cluster(workers=4, ps=1)  # four worker processes; the job starts with two
    addresses = cluster.cluster["worker"]
    spec = {**cluster.cluster, "worker": addresses[:2]}
    strategy = ParameterServerStrategy(
        SimpleClusterResolver(ClusterSpec(spec), task_type="chief", task_id=0)
    )
    coordinator = ClusterCoordinator(strategy)
    transport = strategy.extended.transport
    with strategy.scope():
        steps = strategyjob.Variable(0, name="steps")
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    iterator = iter(coordinator.create_per_worker_dataset(lambda: iter(range(10**6))))
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    def train_step(it):
        position = next(it)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps.assign_add(1)
        return get_current_worker_index(), position

    stays = cluster.procs[("worker", 0)]
    first_worker_0 = coordinator._pool.workers[0]
    scheduled, counts, positions_on_0 = 0, [], []
    for size in (2, 4, 1, 3):
        if size == 3:  # worker 1's process stayed up after leaving; worker 2's is a new one
            cluster.start("worker", 2)
            cluster.wait_ready("worker", 2)
        transport.set_workers({i: addresses[i] for i in range(size)})
        members = tuple(range(size))
        _poll(lambda: coordinator.worker_indices() == members, f"{size} workers")  # noqa: B023
        if size == 1:  # workers 2 and 3 left: their processes end
            cluster.kill("worker", 2)
            cluster.kill("worker", 3)
        ran_on: set[int] = set()
        deadline = time.monotonic() + DEADLINE
        while ran_on != set(range(size)):
            assert time.monotonic() < deadline, f"workers {set(range(size)) - ran_on} got none"
            results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(4 * size)]
            coordinator.join()
            scheduled += len(results)
            for worker, position in (tuple(int(v) for v in r.fetch()) for r in results):
                assert worker in range(size)  # a worker that left took no closure
                ran_on.add(worker)
                if worker == 0:
                    positions_on_0.append(position)
            counts.append(int(steps))
    assert counts == sorted(set(counts))  # the chief's step counter strictly increases
    assert counts[-1] == scheduled  # every scheduled step applied once
    # The worker that stayed: same process, same connection, its iterator never rebuilt.
    assert stays.poll() is None and cluster.procs[("worker", 0)] is stays
    assert coordinator._pool.workers[0] is first_worker_0
    assert sorted(positions_on_0) == list(range(len(positions_on_0)))


def test_the_chief_follows_the_cluster_file_while_a_two_worker_job_trains(
    make_cluster, tmp_path, monkeypatch, caplog
):
    cluster = make_cluster(workers=3, ps=1)  # the job starts with two; the third joins
    addresses = cluster.cluster["worker"]
    spec = {**cluster.cluster, "worker": addresses[:2]}
    path = tmp_path / "cluster.json"

    def write(content: object) -> None:  # as a resizer does: whole, renamed over the file
        (tmp_path / "cluster.tmp").write_text(
            content if isinstance(content, str) else json.dumps(content)
        )
        os.replace(tmp_path / "cluster.tmp", path)

    write(spec)
    monkeypatch.setenv("STRATEGYJOB_CLUSTER_FILE", str(path))
    strategy = ParameterServerStrategy(
        SimpleClusterResolver(ClusterSpec(spec), task_type="chief", task_id=0)
    )
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        steps = strategyjob.Variable(0, name="steps")

    def train_step():
        time.sleep(0.01)  # simulated compute: closures stay in flight across the resizes
        steps.assign_add(1)
        return get_current_worker_index()

    results: list = []
    stop = threading.Event()

    def train() -> None:  # the chief's loop, running throughout
        while not stop.is_set():
            results.extend(coordinator.schedule(train_step) for _ in range(10))
            coordinator.join()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        _poll(lambda: int(steps) >= 20, "training to start")
        write({**spec, "worker": addresses})  # 2 -> 3
        _poll(lambda: coordinator.worker_indices() == (0, 1, 2), "worker 2 to join")
        _poll(lambda: 2 in {r.fetch() for r in list(results)[-30:]}, "worker 2 to take closures")
        with caplog.at_level("WARNING", logger="strategyjob.ps._cluster_file"):
            write('{"worker": [')  # a bad write: said, and the job keeps its three workers
            _poll(lambda: bool(caplog.records), "the warning")
        assert "cannot be used" in caplog.records[0].getMessage()  # (once: test_cluster_file)
        assert coordinator.worker_indices() == (0, 1, 2)
        write({**spec, "worker": {"0": addresses[0]}})  # 3 -> 1
        _poll(lambda: coordinator.worker_indices() == (0,), "workers 1 and 2 to leave")
        resized = len(results)
        _poll(lambda: len(results) >= resized + 40, "training on one worker")
    finally:
        stop.set()
        trainer.join(timeout=DEADLINE)
    assert not trainer.is_alive()
    coordinator.join()
    assert int(steps) == len(results)  # every scheduled step applied once
    # Closures scheduled once the resize was seen ran on worker 0 only (those scheduled before
    # may have been in flight on the leaving workers: they finished there).
    assert {r.fetch() for r in results[resized + 10 :]} == {0}
