"""A failed update is not applied twice: a step retried by the coordinator (here because ps 1
was unavailable for one call) updates each ps shard once. Every attempt of a scheduled function
carries its step id; a ps remembers the update ids it applied (a bounded number) and skips a
retry's. Real ps and worker processes on 127.0.0.1; the id memory and the ps store on their
own."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import strategyjob
import torch
from strategyjob import errors
from strategyjob.ps import _transport
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._transport import Op
from strategyjob.ps.coordinator import ClusterCoordinator
from strategyjob.ps.server import AppliedUpdates, Store
from strategyjob.strategies.parameter_server import ParameterServerStrategy

pytestmark = pytest.mark.timeout(180)

PS1 = "/job:ps/replica:0/task:1"


# ---------------------------------------------------------------------------------------------
# the ps's memory of applied updates


def test_an_applied_update_id_is_skipped_and_a_failed_one_is_not():
    updates = AppliedUpdates(capacity=8)
    assert updates.begin("s/0")
    updates.end("s/0", applied=True)
    assert not updates.begin("s/0")  # applied: skip it
    assert updates.begin("s/1")
    updates.end("s/1", applied=False)  # failed: a retry applies it
    assert "s/1" not in updates
    assert updates.begin("s/1")
    updates.end("s/1", applied=True)
    assert not updates.begin("s/1")


def test_the_memory_of_applied_updates_is_bounded():
    updates = AppliedUpdates(capacity=3)
    for i in range(10):
        assert updates.begin(f"s/{i}")
        updates.end(f"s/{i}", applied=True)
        assert len(updates) <= 3
    assert len(updates) == 3
    assert [f"s/{i}" in updates for i in range(10)] == [False] * 7 + [True] * 3
    assert updates.begin("s/0")  # forgotten: the oldest go first
    updates.end("s/0", applied=True)
    assert "s/7" not in updates and "s/9" in updates
    # A skipped duplicate counts as recent: it is kept over older ones.
    assert not updates.begin("s/8")
    updates.begin("s/10")
    updates.end("s/10", applied=True)
    assert "s/8" in updates and "s/9" not in updates
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        AppliedUpdates(capacity=0)


def test_a_duplicate_waits_for_the_attempt_applying_it():
    updates = AppliedUpdates()
    assert updates.begin("s/0")  # the first attempt is applying it
    answers: list[bool] = []
    retry = threading.Thread(target=lambda: answers.append(updates.begin("s/0")), daemon=True)
    retry.start()
    retry.join(timeout=0.3)
    assert retry.is_alive() and not answers  # waits, neither applies nor skips yet
    updates.end("s/0", applied=True)
    retry.join(timeout=10)
    assert answers == [False]


def _request(store: Store, ops: list[Op], update_id: str = "") -> list[torch.Tensor]:
    return _transport.decode_results(store.run(_transport.encode_ops(ops, update_id)))


def test_the_store_applies_an_update_id_once_and_answers_a_duplicate_as_if_applied():
    store = Store()
    _request(store, [Op("create", "v", torch.zeros(2)), Op("create", "w", torch.zeros(3, 2))])
    sgd = '{"key": "o", "cls": "torch.optim.sgd:SGD", "hparams": {"lr": 0.5}}'
    update = [
        Op("assign_add", "v", torch.ones(2), read_back=True),
        Op("apply_sparse", "w", torch.ones(1, 2), torch.tensor([1]), optimizer=sgd),
        Op("read", "w"),
    ]
    (v, w) = _request(store, update, "step/0")
    assert torch.equal(v, torch.ones(2))
    assert torch.equal(w, torch.tensor([[0.0, 0.0], [-0.5, -0.5], [0.0, 0.0]]))
    # The same id again (a retried step): nothing applied, the reads and read-backs answered.
    (v2, w2) = _request(store, update, "step/0")
    assert torch.equal(v2, v) and torch.equal(w2, w)
    # Another id, or none, is applied.
    (v3, _) = _request(store, update, "step/1")
    assert torch.equal(v3, 2 * torch.ones(2))
    (v4, _) = _request(store, update)
    assert torch.equal(v4, 3 * torch.ones(2))
    # A request that failed (an unknown variable) is not remembered: its retry is applied.
    with pytest.raises(KeyError):
        _request(
            store,
            [Op("assign_add", "v", torch.ones(2)), Op("assign", "x", torch.ones(1))],
            "step/2",
        )
    assert "step/2" not in store.updates


def test_a_step_numbers_its_updates_per_ps_and_leaves_reads_untagged():
    read, add = [Op("read", "v")], [Op("assign_add", "v", torch.ones(1))]
    assert _transport.next_update_id(0, add) == ""  # outside a step
    with _transport.step_scope("s"):
        assert _transport.next_update_id(0, read) == ""
        assert [_transport.next_update_id(0, add) for _ in range(2)] == ["s/0", "s/1"]
        assert _transport.next_update_id(1, add) == "s/0"
        assert _transport.next_update_id(0, read + add) == "s/2"
    with _transport.step_scope("s"):  # a retry numbers from 0 again
        assert _transport.next_update_id(0, add) == "s/0"
    with _transport.step_scope(""):
        assert _transport.next_update_id(0, add) == ""
    header = _transport.encode_ops(add, "s/0")
    assert pb.VarOps.FromString(header).update_id == "s/0"


# ---------------------------------------------------------------------------------------------
# a step retried by the coordinator, on real servers


def _read(ref) -> torch.Tensor:
    return _transport.run_ps_ops(ref.task, [Op("read", ref.key)])[0]


@pytest.fixture
def two_ps(make_cluster, tmp_path, monkeypatch):
    """One worker, two ps; the worker's ps calls fail after 2 s without a reply. Yields the
    cluster, the pid of ps 1, a file counting a step's attempts and ``flaky(attempts, pid)``,
    which a scheduled function calls first: True in the first attempt (which then stops ps 1,
    so that its next call to ps 1 fails at the deadline, as unavailable), False in a later one
    (after letting ps 1 go on). ps 1 is never left stopped."""
    cluster = make_cluster(workers=1, ps=2, env={_transport.TIMEOUT_ENV: "2"})
    pid = cluster.procs[("ps", 1)].pid
    # Retried once when all goes well; a loaded machine may need another (the coordinator
    # counts them).
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "10")

    def flaky(attempts: str, pid: int) -> bool:  # (nested: shipped by value)
        log = Path(attempts)
        first = not log.exists()
        with log.open("a") as f:
            f.write("attempt\n")
        if not first:
            os.kill(pid, signal.SIGCONT)
        return first

    try:
        yield cluster, pid, tmp_path / "attempts", flaky
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_step_retried_for_an_unavailable_ps_updates_each_variable_once(two_ps):
    cluster, ps1_pid, attempts, flaky = two_ps
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        a = strategyjob.Variable(0.0, name="a")  # ps 0
        b = strategyjob.Variable(0.0, name="b")  # ps 1
    assert b.device == f"{PS1}/device:CPU:0"

    def step(attempts: str, pid: int) -> float:
        first = flaky(attempts, pid)
        float(b)  # connected to ps 1 (a new connection to a stopped ps fails at once)
        a.assign_add(1.0)  # reaches ps 0 in every attempt
        if first:
            os.kill(pid, signal.SIGSTOP)  # ps 1 stops: this attempt's update to it fails
        return float(b.assign_add(1.0))

    result = coordinator.schedule(step, args=(str(attempts), ps1_pid))
    coordinator.join()
    assert attempts.read_text().count("attempt") >= 2  # the step was retried
    assert result.fetch() == 1.0
    assert (float(a), float(b)) == (1.0, 1.0)  # each shard updated once
    # Another step is another update, even if it is the same function.
    coordinator.schedule(lambda: a.assign_add(1.0))
    coordinator.schedule(lambda: a.assign_add(1.0))
    coordinator.join()
    assert float(a) == 3.0


def test_a_retried_optimizer_step_applies_each_shards_gradients_once(two_ps):
    cluster, ps1_pid, attempts, flaky = two_ps
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        first = torch.nn.Linear(1, 1, bias=False)  # on ps 0
        second = torch.nn.Linear(1, 1, bias=False)  # on ps 1
        opt = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.5)
    refs = (first.weight._sj_ref, second.weight._sj_ref)
    assert [r.task for r in refs] == [0, 1]
    before = [_read(r) for r in refs]
    x = torch.ones(1, 1)

    def step(attempts: str, pid: int) -> None:
        stop = flaky(attempts, pid)
        opt.zero_grad()
        (first(x).sum() + second(x).sum()).backward()  # both gradients are 1
        if stop:
            os.kill(pid, signal.SIGSTOP)
        opt.step()  # ps 0 applies its gradient; ps 1 does not answer in the first attempt

    coordinator.schedule(step, args=(str(attempts), ps1_pid))
    coordinator.join()
    assert attempts.read_text().count("attempt") >= 2
    for ref, old in zip(refs, before):
        assert torch.allclose(_read(ref), old - 0.5)  # one SGD step each, not two


# ---------------------------------------------------------------------------------------------
# the deadline of the chief's own ps calls: STRATEGYJOB_PS_TIMEOUT (no CommunicationOptions
# argument, as in TensorFlow)


def test_the_chief_takes_its_ps_deadline_from_strategyjob_ps_timeout(make_cluster, monkeypatch):
    cluster = make_cluster(workers=1, ps=1)
    monkeypatch.setenv(_transport.TIMEOUT_ENV, "2")
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = strategyjob.Variable(1.0, name="v")
    assert coordinator.schedule(lambda: v.assign_add(1.0)).fetch() == 2.0
    pid = cluster.procs[("ps", 0)].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(errors.UnavailableError, match="/job:ps/replica:0/task:0") as failure:
            v.read_value()
        assert time.monotonic() - started < 2.0 + 5.0
        assert "STRATEGYJOB_PS_TIMEOUT" in str(failure.value)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert float(v) == 2.0  # served again once it runs


def test_a_bad_strategyjob_ps_timeout_fails_the_strategy_in_one_line(monkeypatch):
    monkeypatch.setenv(_transport.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError) as failure:
        ParameterServerStrategy()
    assert str(failure.value) == (
        "STRATEGYJOB_PS_TIMEOUT must be a positive number of seconds, got 'soon'"
    )


def test_retries_for_an_unavailable_ps_wait_longer_each_time_past_grpcs_reconnection():
    from strategyjob.ps.coordinator import ps_retry_delay

    delays = [ps_retry_delay(n) for n in range(1, 8)]
    assert delays == sorted(delays) and delays[-1] == 8.0  # growing, bounded
    # The default three retries outlast gRPC's reconnection backoff (about a second), during
    # which a restarted ps's calls are refused at once.
    assert sum(delays[:3]) > 2.0
