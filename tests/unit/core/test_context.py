"""Contexts and scopes: semantics doc §1.1, §1.2."""

from __future__ import annotations

import copy
import subprocess
import sys
import threading

import pytest
import strategyjob as sj
import torch
from strategyjob import _context


@pytest.fixture
def mirrored() -> sj.MirroredStrategy:
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


def _state() -> tuple:
    ctx = sj.get_replica_context()
    return (
        sj.has_strategy(),
        sj.in_cross_replica_context(),
        None if ctx is None else (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync),
    )


# --- the state table of §1.1 --------------------------------------------------------------------


def test_top_level_is_default_replica_mode() -> None:
    has, cross, (replica_id, count) = _state()
    assert (has, cross, count) == (False, False, 1)
    assert replica_id == 0 and type(replica_id) is int
    assert sj.get_cross_replica_context() is None
    assert sj.get_strategy() is _context.current_mode().strategy
    assert sj.get_strategy().num_replicas_in_sync == 1


def test_inside_scope_is_cross_replica(mirrored: sj.MirroredStrategy) -> None:
    with mirrored.scope() as entered:
        assert entered is mirrored
        assert _state() == (True, True, None)
        assert sj.get_strategy() is mirrored
        assert sj.get_cross_replica_context() is mirrored
    assert _state()[:2] == (False, False)


def test_inside_run_is_replica_context(mirrored: sj.MirroredStrategy) -> None:
    def fn() -> tuple:
        ctx = sj.get_replica_context()
        return (
            sj.has_strategy(),
            sj.in_cross_replica_context(),
            ctx.num_replicas_in_sync,
            sj.get_strategy() is mirrored,
            ctx.strategy is mirrored,
            sj.get_cross_replica_context(),
        )

    # identical Python objects on both replicas regroup to the object itself
    assert mirrored.run(fn) == (True, False, 2, True, True, None)


def test_replica_ids_are_int32_tensors_in_real_strategies(mirrored: sj.MirroredStrategy) -> None:
    ids = mirrored.experimental_local_results(
        mirrored.run(lambda: sj.get_replica_context().replica_id_in_sync_group)
    )
    assert [int(i) for i in ids] == [0, 1]
    assert all(isinstance(i, torch.Tensor) and i.dtype == torch.int32 for i in ids)


def test_inside_merge_fn_is_cross_replica(mirrored: sj.MirroredStrategy) -> None:
    seen = []

    def merge_fn(strategy: sj.Strategy) -> None:
        seen.append((strategy is mirrored, *_state(), sj.get_strategy() is mirrored))

    mirrored.run(lambda: sj.get_replica_context().merge_call(merge_fn))
    assert seen == [(True, True, True, None, True)]  # once for both replicas


def test_merge_fn_from_default_context() -> None:
    seen = []

    def merge_fn(strategy: sj.Strategy) -> str:
        seen.append(
            (*_state(), sj.get_strategy() is strategy, sj.get_strategy()._is_default_strategy)
        )
        return "merged"

    assert sj.get_replica_context().merge_call(merge_fn) == "merged"
    assert seen == [(False, True, None, True, True)]


def test_modes_are_per_thread(mirrored: sj.MirroredStrategy) -> None:
    other = []
    with mirrored.scope():
        thread = threading.Thread(target=lambda: other.append(_state()[:2]))
        thread.start()
        thread.join(10)
    assert other == [(False, False)]


def test_replica_context_constructor_types(mirrored: sj.MirroredStrategy) -> None:
    assert int(sj.ReplicaContext(mirrored, 1).replica_id_in_sync_group) == 1
    ctx = sj.ReplicaContext(mirrored, torch.tensor(0, dtype=torch.int32))
    assert int(ctx.replica_id_in_sync_group) == 0
    assert sj.ReplicaContext(mirrored, None).replica_id_in_sync_group is None
    with pytest.raises(
        ValueError, match=r"^replica_id_in_sync_group can only be an integer, a Tensor or None\.$"
    ):
        sj.ReplicaContext(mirrored, 1.5)
    with pytest.raises(ValueError, match="can only be an integer"):
        sj.ReplicaContext(mirrored, "0")


def test_replica_context_as_context_manager(mirrored: sj.MirroredStrategy) -> None:
    ctx = sj.ReplicaContext(mirrored, 1)
    with ctx:
        assert sj.get_replica_context() is ctx
        assert sj.has_strategy() and not sj.in_cross_replica_context()
        assert ctx.devices == ("/job:localhost/replica:0/task:0/device:CPU:1",)
    assert not sj.has_strategy()


def test_current_local_replica_id_per_mode(mirrored: sj.MirroredStrategy) -> None:
    assert _context.current_local_replica_id() == 0  # the default replica
    seen = mirrored.run(lambda: _context.current_local_replica_id())
    assert mirrored.experimental_local_results(seen) == (0, 1)
    with mirrored.scope():
        assert _context.current_local_replica_id() is None  # cross-replica
    with sj.ReplicaContext(mirrored, 1):
        assert _context.current_local_replica_id() == 1


def test_merge_routes_end_with_the_run(mirrored: sj.MirroredStrategy) -> None:
    contexts = []

    def fn() -> torch.Tensor:
        contexts.append(sj.get_replica_context())
        return sj.get_replica_context().all_reduce("SUM", torch.ones(1))

    summed = mirrored.run(fn)
    assert [t.item() for t in mirrored.experimental_local_results(summed)] == [2.0, 2.0]
    assert len(contexts) == 2 and not any(c in _context._merge_routes for c in contexts)


# --- scope nesting, §1.2 ------------------------------------------------------------------------


def test_same_scope_nesting(mirrored: sj.MirroredStrategy) -> None:
    scope = mirrored.scope()
    with scope, scope, mirrored.scope():
        assert sj.get_strategy() is mirrored
    assert not sj.has_strategy()
    assert _context._state.stack == []


def test_mixing_strategies_in_scopes(mirrored: sj.MirroredStrategy) -> None:
    other = sj.OneDeviceStrategy("cpu:0")
    with mirrored.scope():
        with pytest.raises(RuntimeError) as err:
            other.scope().__enter__()
    assert (
        str(err.value)
        == f"Mixing different tf.distribute.Strategy objects: {mirrored} is not {other}"
    )
    assert not sj.has_strategy()


def test_scope_inside_run_requires_cross_replica(mirrored: sj.MirroredStrategy) -> None:
    def fn() -> None:
        with mirrored.scope():
            pass

    with pytest.raises(RuntimeError) as err:
        mirrored.run(fn)
    assert str(err.value) == (
        "Method requires being in cross-replica context, use get_replica_context().merge_call()"
    )


def test_default_scope_inside_real_scope(mirrored: sj.MirroredStrategy) -> None:
    default = sj.get_strategy()
    with (
        mirrored.scope(),
        pytest.raises(RuntimeError, match=r"^Must not nest tf\.distribute\.Strategy scopes\.$"),
    ):
        with default.scope():
            pass


def test_default_scope_outside_then_variable_fails(mirrored: sj.MirroredStrategy) -> None:
    default = sj.get_strategy()
    with default.scope() as entered:
        assert entered is default
        with mirrored.scope():
            assert sj.get_strategy() is mirrored
            with pytest.raises(RuntimeError) as err:
                _context.check_variable_creation_scope()
    assert (
        str(err.value)
        == f"Mixing different tf.distribute.Strategy objects: {mirrored} is not {default}"
    )


def test_require_replica_context_messages(mirrored: sj.MirroredStrategy) -> None:
    ctx = sj.ReplicaContext(mirrored, 0)
    with (
        mirrored.scope(),
        pytest.raises(RuntimeError, match=r"^Need to be inside `call_for_each_replica\(\)`$"),
    ):
        ctx.merge_call(lambda s: None)
    with (
        sj.ReplicaContext(mirrored, 1),
        pytest.raises(RuntimeError, match=r"^Mismatching ReplicaContext\.$"),
    ):
        ctx.merge_call(lambda s: None)
    other = sj.OneDeviceStrategy("cpu:0")
    with sj.ReplicaContext(other, 0), pytest.raises(RuntimeError) as err:
        ctx.merge_call(lambda s: None)
    assert (
        str(err.value) == f"Mismatching tf.distribute.Strategy objects: {other} is not {mirrored}."
    )


def test_wrong_strategy_scope_messages(mirrored: sj.MirroredStrategy) -> None:
    with pytest.raises(RuntimeError) as err:
        _context.wrong_strategy_scope(mirrored)
    assert str(err.value) == f'Need to be inside "with strategy.scope()" for {mirrored}'


def test_cross_replica_methods_refused_in_replica_context(mirrored: sj.MirroredStrategy) -> None:
    message = (
        "Method requires being in cross-replica context, use get_replica_context().merge_call()"
    )
    value = torch.tensor([1.0])
    calls = {
        "reduce": lambda: mirrored.reduce("SUM", value, axis=None),
        "reduce_to": lambda: mirrored.extended.reduce_to("SUM", value, "cpu:0"),
        "batch_reduce_to": lambda: mirrored.extended.batch_reduce_to("SUM", [(value, "cpu:0")]),
        "call_for_each_replica": lambda: mirrored.extended.call_for_each_replica(lambda: 1),
        "run": lambda: mirrored.run(lambda: 1),
    }
    for name, call in calls.items():

        def fn(call=call) -> None:
            call()

        with pytest.raises(RuntimeError) as err:
            mirrored.run(fn)
        assert str(err.value) == message, name
    with pytest.raises(RuntimeError) as err:
        mirrored.run(lambda: mirrored.gather(value, 0))
    assert str(err.value) == (
        "tf.distribute.Strategy.gather method requires cross-replica context, use "
        "get_replica_context().all_gather() instead"
    )


def test_cross_replica_methods_of_other_strategy_in_scope(mirrored: sj.MirroredStrategy) -> None:
    other = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with mirrored.scope(), pytest.raises(RuntimeError) as err:
        other.reduce("MEAN", torch.tensor(1.0), axis=None)
    assert (
        str(err.value)
        == f"Mixing different tf.distribute.Strategy objects: {mirrored} is not {other}"
    )


# --- experimental_set_strategy ------------------------------------------------------------------


def test_experimental_set_strategy(mirrored: sj.MirroredStrategy) -> None:
    sj.experimental_set_strategy(mirrored)
    assert sj.get_strategy() is mirrored and sj.in_cross_replica_context()
    other = sj.OneDeviceStrategy("cpu:0")
    sj.experimental_set_strategy(other)  # replaces the previously set one
    assert sj.get_strategy() is other
    sj.experimental_set_strategy(None)
    assert not sj.has_strategy()


@pytest.mark.parametrize("target", ["none", "same", "other"])
def test_experimental_set_strategy_inside_scope(mirrored: sj.MirroredStrategy, target: str) -> None:
    strategy = {"none": None, "same": mirrored, "other": sj.OneDeviceStrategy("cpu:0")}[target]
    with mirrored.scope(), pytest.raises(RuntimeError) as err:
        sj.experimental_set_strategy(strategy)
    assert str(err.value) == "Must not be called inside a `tf.distribute.Strategy` scope."


# --- copying ------------------------------------------------------------------------------------


def test_copy_rules(mirrored: sj.MirroredStrategy) -> None:
    with pytest.raises(RuntimeError, match=r"^Must only deepcopy DistributionStrategy\.$"):
        copy.copy(mirrored)
    clone = copy.deepcopy(mirrored)
    assert clone is not mirrored and clone.extended is not mirrored.extended
    assert clone.extended.container_strategy() is clone
    assert clone.num_replicas_in_sync == 2
    only_one = r"^Should only create a single instance of _DefaultDistributionStrategy$"
    with pytest.raises(RuntimeError, match=only_one):
        copy.deepcopy(sj.get_strategy())
    with pytest.raises(RuntimeError, match="single instance"):
        type(sj.get_strategy())()


def test_deepcopy_shares_per_process_state_and_belongs_to_the_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)  # local mode: one worker, no rendezvous
    strategy = sj.MultiWorkerMirroredStrategy()
    synchronizer = strategy.extended.gradient_synchronizer
    clone = copy.deepcopy(strategy)
    assert clone.extended.container_strategy() is clone
    # shared: one cluster resolver and one set of collectives per process
    assert clone.cluster_resolver is strategy.cluster_resolver
    assert clone.extended.collectives is strategy.extended.collectives
    # made again for the copy, on first use
    assert clone.extended.gradient_synchronizer is not synchronizer
    assert strategy.extended.gradient_synchronizer is synchronizer
    assert clone.reduce("SUM", torch.tensor(2.0), axis=None).item() == 2.0
    # the extended copied alone still belongs to the original strategy
    assert copy.deepcopy(strategy.extended).container_strategy() is strategy


@pytest.mark.parametrize(
    "program",
    [
        # each public door gives the contexts their default strategy, though the context layer
        # never imports the strategies (the SDK layers contract)
        "import strategyjob.nn as nn, torch; assert nn.compute_average_loss(torch.ones(4)) == 1",
        "import strategyjob.train as t; t.Checkpoint(step=__import__('torch').zeros(()))",
        "import strategyjob as sj; assert sj.get_replica_context().num_replicas_in_sync == 1",
        "import strategyjob as sj; sj.PerReplica([1, 2]).values; sj.get_strategy().run(int)",
    ],
)
def test_every_public_door_loads_the_default_strategy(program: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_context_layer_without_strategies_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setattr(_context, "_default_strategy_maker", None)
    with pytest.raises(RuntimeError, match="Reach the SDK through `import strategyjob`"):
        _context._default_strategy()
