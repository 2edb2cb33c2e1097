"""ParameterServerStrategy against a real local cluster: placement, variables on the ps,
the coordinator's queue semantics, error propagation and clearing."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import strategyjob
import torch
from strategyjob import errors
from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
from strategyjob.ps.coordinator import CANCELLED_MESSAGE, ClusterCoordinator, RemoteValue
from strategyjob.ps.partitioners import FixedShardsPartitioner
from strategyjob.ps.sharded_variable import ShardedVariable
from strategyjob.strategies.parameter_server import ParameterServerStrategy

pytestmark = pytest.mark.timeout(120)


def ps(i):
    return f"/job:ps/replica:0/task:{i}/device:CPU:0"


# --- construction (no processes: the cluster is validated before any connection) ----------


def resolver(cluster, task_type="chief", task_id=0):
    return SimpleClusterResolver(ClusterSpec(cluster), task_type=task_type, task_id=task_id)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({}, "Cluster spec must be non-empty in `tf.distribute.cluster_resolver.ClusterResolver`."),
        ({"chief": ["h:1"], "worker": ["h:2"]}, "There must be at least one ps."),
        ({"chief": ["h:1"], "ps": ["h:2"]}, "There must be at least one worker."),
        (
            {"chief": ["h:1", "h:2"], "worker": ["h:3"], "ps": ["h:4"]},
            "There must be at most one 'chief' job.",
        ),
        ({"chief": ["h:1"], "foo": ["h:2"], "ps": ["h:4"]}, "Disallowed task type found in"),
    ],
)
def test_bad_cluster_specs(cluster, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        ParameterServerStrategy(resolver(cluster, "chief" if "chief" in cluster else None, 0))


def test_unrecognized_task_type():
    cluster = {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}
    with pytest.raises(ValueError, match="Unrecognized task_type: foobar"):
        ParameterServerStrategy(resolver(cluster, "foobar", 0))


def test_coordinator_needs_ps_strategy():
    with pytest.raises(
        ValueError, match=re.escape("Only `tf.distribute.experimental.ParameterServerStrategy`")
    ):
        ClusterCoordinator(strategyjob.OneDeviceStrategy("cpu"))


# --- placement and variables -----------------------------------------------------------------


@pytest.fixture
def strategy(shared_cluster):
    return ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(3))


def test_round_robin_placement_with_shards(strategy):
    with strategy.scope():
        a = strategyjob.Variable(1.0, name="a")
        b = strategyjob.Variable(torch.arange(13.0).reshape(13, 1), name="b")
        c = strategyjob.Variable(torch.zeros(2, 1), name="c")
        with strategy.extended.colocate_vars_with(b):
            d = strategyjob.Variable(torch.zeros(5, 1), name="d")
        e = strategyjob.Variable(0.0, name="e")
    assert a.device == ps(0)
    assert isinstance(b, ShardedVariable) and isinstance(b, ShardedVariable)
    assert [v.device for v in b.variables] == [ps(1), ps(0), ps(1)]
    assert [v.name for v in b.variables] == ["b/part_0:0", "b/part_1:0", "b/part_2:0"]
    assert [list(v.shape) for v in b.variables] == [[5, 1], [4, 1], [4, 1]]
    assert [v.device for v in c.variables] == [ps(0), ps(1)]
    assert not isinstance(d, ShardedVariable) and d.device == ps(1)  # colocated, counter untouched
    assert e.device == ps(0)
    assert isinstance(a, strategyjob.Variable)
    assert strategy.extended.parameter_devices == (ps(0), ps(1))


def test_colocate_with_a_variable_and_not_with_a_local_one(strategy):
    local = strategyjob.Variable(1.0, name="local")  # outside the scope: not on a ps
    with strategy.scope():
        strategyjob.Variable(1.0, name="first")  # ps 0
        second = strategyjob.Variable(1.0, name="second")  # ps 1
        with strategy.extended.colocate_vars_with(second):
            beside = strategyjob.Variable(torch.zeros(9, 1), name="beside")  # never partitioned
        with strategy.extended.colocate_vars_with(local), pytest.raises(ValueError) as err:
            strategyjob.Variable(1.0, name="nowhere")
    assert not isinstance(beside, ShardedVariable) and beside.device == second.device == ps(1)
    assert str(err.value) == (
        "colocate_vars_with needs a variable on a parameter server, got one on "
        "/job:localhost/replica:0/task:0/device:CPU:0; pass a variable created in this "
        "ParameterServerStrategy's scope."
    )


def test_variables_on_ps_read_write_lookup(strategy):
    with strategy.scope():
        b = strategyjob.Variable(torch.arange(13.0).reshape(13, 1), name="b")
        v = strategyjob.Variable(torch.ones(2), name="v")
    assert b.read_value().ravel().tolist() == list(range(13))
    assert b.embedding_lookup(torch.tensor([12, 0, 5, 5])).ravel().tolist() == [12, 0, 5, 5]
    b.assign_add(torch.ones(13, 1))
    assert b.variables[2].read_value().ravel().tolist() == [10, 11, 12, 13]
    assert v.assign_add(torch.ones(2)) is v  # a ShardedVariable (2 rows, 2 shards)
    assert v.read_value().tolist() == [2, 2]
    v.assign([5.0, 6.0])
    assert (v * 2).tolist() == [10, 12]
    with strategy.scope():
        s = strategyjob.Variable(1.0, name="s")
    assert s.assign_add(2.0).item() == 3.0
    assert s.assign_sub(1.0, read_value=False) is None and float(s) == 2.0
    with pytest.raises(ValueError, match="Shape mismatch"):
        s.assign(torch.zeros(3))


def test_sharded_state_dict_restores_with_other_shard_count(shared_cluster):
    four = ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(4))
    two = ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(2))
    with four.scope():
        src = strategyjob.Variable(torch.arange(8.0).reshape(4, 2), name="t")
    with two.scope():
        dst = strategyjob.Variable(torch.zeros(4, 2), name="t")
    dst.load_state_dict(src.state_dict())
    assert [v.read_value().tolist() for v in dst.variables] == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
    ]


# --- the coordinator -------------------------------------------------------------------------


def test_schedule_fetch_keeps_structure(strategy):
    coordinator = ClusterCoordinator(strategy)
    assert ClusterCoordinator(strategy) is coordinator
    with strategy.scope():
        counter = strategyjob.Variable(0.0, name="counter")

    def fn(x):
        counter.assign_add(1.0)
        return (x + 1, (x + 2, x + 3), [x + 4], {"v": x})

    rvs = [coordinator.schedule(fn, args=(torch.tensor(1.0),)) for _ in range(10)]
    assert isinstance(rvs[0], RemoteValue)
    coordinator.join()
    coordinator.join()  # repeated joins are fine
    assert coordinator.done()
    assert float(counter) == 10.0
    assert rvs[0].fetch() == (2, (3, 4), [5], {"v": 1})
    assert isinstance(rvs[0].fetch()[0], np.ndarray)
    assert isinstance(rvs[0].get()[0], torch.Tensor)
    fetched = coordinator.fetch([rvs[1], 3])
    assert fetched[1] == 3 and fetched[0][1] == (3, 4)


def test_remote_value_argument_rejected(strategy):
    coordinator = ClusterCoordinator(strategy)
    rv = coordinator.schedule(lambda: 1)
    with pytest.raises(ValueError, match="RemoteValue` used as an input to scheduled function"):
        coordinator.schedule(lambda x: x, args=(rv,))
    coordinator.join()


def test_per_worker_dataset_and_iterator(strategy):
    coordinator = ClusterCoordinator(strategy)

    def dataset_fn():
        return range(1000)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    with pytest.raises(NotImplementedError, match="Iterating over an `AsyncDistributedIterator`"):
        next(iterator)
    from strategyjob.experimental.coordinator import get_current_worker_index

    rvs = [
        coordinator.schedule(lambda it: (next(it), get_current_worker_index()), args=(iterator,))
        for _ in range(8)
    ]
    coordinator.join()
    results = [rv.fetch() for rv in rvs]
    by_worker: dict[int, list[int]] = {}
    for value, worker in results:
        by_worker.setdefault(int(worker), []).append(int(value))
    # Each worker iterates its own copy of the whole dataset, in order.
    for values in by_worker.values():
        assert values == list(range(len(values)))
    assert sum(len(v) for v in by_worker.values()) == 8


def test_distributed_dataset_only_through_coordinator(strategy):
    dataset = strategy.experimental_distribute_dataset([1, 2, 3])
    with pytest.raises(ValueError, match="create_per_worker_dataset"):
        iter(dataset)
    coordinator = ClusterCoordinator(strategy)
    it = iter(coordinator.create_per_worker_dataset(dataset))
    rv = coordinator.schedule(lambda it: next(it), args=(it,))
    assert rv.fetch() == 1


def test_user_error_surfaces_once_then_scheduling_works(strategy):
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        v = strategyjob.Variable(0.0, name="v")

    def fail():
        raise ValueError("boom from the worker")

    def slow_ok():
        v.assign_add(1.0)
        return 1

    bad = coordinator.schedule(fail)
    with pytest.raises(ValueError, match="boom from the worker"):
        coordinator.join()
    with pytest.raises(ValueError, match="boom from the worker"):
        bad.fetch()
    coordinator.join()  # the error was raised once and cleared
    assert coordinator.done()

    # Closures queued behind a failure are cancelled with TensorFlow's message. The failing
    # closure waits until all of them are queued (else its error may already surface from one
    # of the schedule calls, as it may in TensorFlow).
    with strategy.scope():
        gate = strategyjob.Variable(0.0, name="gate")

    def fail_once_all_queued():
        deadline = time.monotonic() + 60
        while float(gate.read_value()) == 0.0 and time.monotonic() < deadline:
            pass
        raise ValueError("boom from the worker")

    blocker = coordinator.schedule(fail_once_all_queued)
    later = [coordinator.schedule(slow_ok) for _ in range(50)]
    gate.assign(1.0)
    with pytest.raises(ValueError, match="boom"):
        coordinator.join()
    cancelled = 0
    for rv in later:
        try:
            rv.fetch()
        except errors.CancelledError as exc:
            assert str(exc) == CANCELLED_MESSAGE
            cancelled += 1
    assert cancelled >= 1
    with pytest.raises(ValueError, match="boom"):
        blocker.fetch()
    assert coordinator.schedule(slow_ok).fetch() == 1


def test_run_on_worker_through_strategy(strategy):
    coordinator = ClusterCoordinator(strategy)

    def step():
        def replica_fn(x):
            ctx = strategyjob.get_replica_context()
            return x * ctx.num_replicas_in_sync

        return strategy.run(replica_fn, args=(torch.tensor(3.0),))

    assert coordinator.schedule(step).fetch() == 3.0


def test_dataset_fn_error_is_a_closure_input_error(strategy):
    from strategyjob.ps.coordinator import ClosureInputError

    coordinator = ClusterCoordinator(strategy)

    def broken_dataset():
        raise OSError("no such file: train.rec")

    iterator = iter(coordinator.create_per_worker_dataset(broken_dataset))
    rv = coordinator.schedule(lambda it: next(it), args=(iterator,))
    with pytest.raises(ClosureInputError, match="Input has an error, the original exception is"):
        coordinator.join()
    with pytest.raises(ClosureInputError, match=re.escape("no such file: train.rec")):
        rv.fetch()


def test_reduce_inside_scheduled_function(strategy):
    coordinator = ClusterCoordinator(strategy)

    def step():
        per_replica = strategy.run(lambda: torch.tensor([1.0, 2.0]))
        return strategy.reduce(strategyjob.ReduceOp.SUM, per_replica, axis=None)

    assert coordinator.schedule(step).fetch().tolist() == [1.0, 2.0]


def test_runner_wrapper_reads_tf_config(shared_cluster, monkeypatch):
    import json

    from strategyjob.runner import ParameterServerStrategy as runner_strategy

    config = {"cluster": shared_cluster.cluster, "task": {"type": "chief", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    strategy = runner_strategy(min_shard_bytes=16)
    with strategy.scope():
        v = strategyjob.Variable(torch.zeros(10, 2), name="v")  # 80 bytes: 2 shards (one per ps)
    assert [s.device for s in v.variables] == [ps(0), ps(1)]
    with pytest.raises(ValueError, match="Argument `max_shards` must be positive"):
        monkeypatch.setenv(
            "TF_CONFIG", json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:2"], "ps": []}})
        )
        runner_strategy()
