"""run(), merge_call, all_reduce and all_gather: semantics doc §1.3, §1.4, §2.4, §2.5."""

from __future__ import annotations

import collections
import threading

import pytest
import strategyjob as sj
import torch
from strategyjob.errors import DeadlineExceededError


@pytest.fixture
def mirrored() -> sj.MirroredStrategy:
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


def _replica_id() -> int:
    return int(sj.get_replica_context().replica_id_in_sync_group)


# --- run ----------------------------------------------------------------------------------------


def test_args_must_be_list_or_tuple(mirrored: sj.MirroredStrategy) -> None:
    with pytest.raises(ValueError) as err:
        mirrored.run(lambda x: x, args=1)
    assert str(err.value) == "positional args must be a list or tuple, got <class 'int'>"


def test_run_returns_identical_objects_unwrapped(mirrored: sj.MirroredStrategy) -> None:
    assert mirrored.run(lambda: 1) == 1
    shared = torch.ones(2)
    assert mirrored.run(lambda: shared) is shared


def test_run_wraps_distinct_results_in_per_replica(mirrored: sj.MirroredStrategy) -> None:
    result = mirrored.run(lambda: torch.tensor(float(_replica_id())))
    assert isinstance(result, sj.PerReplica)
    assert [float(v) for v in result.values] == [0.0, 1.0]


def test_run_regroups_structures(mirrored: sj.MirroredStrategy) -> None:
    Point = collections.namedtuple("Point", "x y")

    def fn() -> dict:
        i = _replica_id()
        return {"list": [i, "same"], "point": Point(i * 10, None)}

    result = mirrored.run(fn)
    assert set(result) == {"list", "point"}
    assert isinstance(result["list"], list) and result["list"][1] == "same"
    assert result["list"][0].values == (0, 1)
    assert isinstance(result["point"], Point) and result["point"].y is None
    assert result["point"].x.values == (0, 10)


def test_run_unwraps_per_replica_args_but_not_plain_values(mirrored: sj.MirroredStrategy) -> None:
    per_replica = sj.PerReplica([torch.tensor(1.0), torch.tensor(2.0)])
    mirrored_value = sj.Mirrored([torch.tensor(5.0), torch.tensor(5.0)])
    shared = object()

    def fn(x: torch.Tensor, m: torch.Tensor, *, other: object) -> tuple:
        assert isinstance(x, torch.Tensor) and isinstance(m, torch.Tensor)
        return x * 10, m, other is shared

    xs, ms, flags = mirrored.run(fn, args=(per_replica, mirrored_value), kwargs={"other": shared})
    assert [float(v) for v in xs.values] == [10.0, 20.0]
    assert list(ms.values) == list(mirrored_value.values)
    assert flags is True


def test_one_replica_returns_value_as_is() -> None:
    single = sj.MirroredStrategy(["cpu:0"])
    value = single.run(lambda: torch.tensor([1.0, 2.0]))
    assert isinstance(value, torch.Tensor)
    assert value.tolist() == [1.0, 2.0]


def test_replicas_run_in_their_own_threads(mirrored: sj.MirroredStrategy) -> None:
    names = mirrored.run(lambda: threading.current_thread().name)
    assert set(names.values) == {"replica-0", "replica-1"}


def test_grad_mode_follows_the_caller(mirrored: sj.MirroredStrategy) -> None:
    with torch.no_grad():
        assert mirrored.run(torch.is_grad_enabled) is False
    assert mirrored.run(torch.is_grad_enabled) is True


def test_exception_in_one_replica_propagates_and_releases_the_other(
    mirrored: sj.MirroredStrategy,
) -> None:
    def fn() -> None:
        if _replica_id() == 1:
            raise KeyError("replica 1 failed")
        sj.get_replica_context().merge_call(lambda s: None)  # replica 0 waits here

    with pytest.raises(KeyError, match="replica 1 failed"):
        mirrored.run(fn)
    assert mirrored.run(lambda: 7) == 7  # the strategy is usable afterwards


def test_exception_in_merge_fn_propagates(mirrored: sj.MirroredStrategy) -> None:
    def merge_fn(strategy: sj.Strategy) -> None:
        raise ArithmeticError("merge failed")

    with pytest.raises(ArithmeticError, match="merge failed"):
        mirrored.run(lambda: sj.get_replica_context().merge_call(merge_fn))


# --- merge_call ---------------------------------------------------------------------------------


def test_merge_call_doc_example(mirrored: sj.MirroredStrategy) -> None:
    def merge_fn(distribution: sj.Strategy, value: sj.PerReplica) -> int:
        return sum(distribution.experimental_local_results(value))

    def fn(x: int) -> int:
        v = x + _replica_id()
        s = sj.get_replica_context().merge_call(merge_fn, args=(v,))
        return s + v

    results = mirrored.experimental_local_results(mirrored.run(fn, args=(3,)))
    assert results == (10, 11)


def test_merge_call_regroups_args_and_selects_results(mirrored: sj.MirroredStrategy) -> None:
    seen = []

    def merge_fn(strategy: sj.Strategy, value: object, *, shared: object) -> sj.Mirrored:
        seen.append((type(value).__name__, shared))
        return sj.Mirrored(["first", "second"])

    def fn() -> object:
        return sj.get_replica_context().merge_call(
            merge_fn, args=(_replica_id(),), kwargs={"shared": "same"}
        )

    assert mirrored.run(fn).values == ("first", "second")
    assert seen == [("PerReplica", "same")]


def test_merge_call_in_one_replica_context() -> None:
    one = sj.OneDeviceStrategy("cpu:0")

    def fn() -> tuple:
        return sj.get_replica_context().merge_call(
            lambda s, x: (s is one, sj.in_cross_replica_context(), x), args=(5,)
        )

    assert one.run(fn) == (True, True, 5)


def test_different_number_of_merge_calls(mirrored: sj.MirroredStrategy) -> None:
    def fn() -> None:
        if _replica_id() == 0:
            sj.get_replica_context().merge_call(lambda s: None)

    with pytest.raises(RuntimeError) as err:
        mirrored.run(fn)
    assert str(err.value) == (
        "Some replicas made a different number of replica_context().merge_call() calls."
    )


def test_several_merge_calls_in_sequence(mirrored: sj.MirroredStrategy) -> None:
    def fn() -> int:
        ctx = sj.get_replica_context()
        total = 0
        for step in range(3):
            value = step * 10 + _replica_id()
            total += ctx.merge_call(lambda s, v: sum(s.experimental_local_results(v)), (value,))
        return total

    assert mirrored.run(fn) == (0 + 1) + (10 + 11) + (20 + 21)


def test_merge_timeout_raises_deadline_exceeded() -> None:
    from strategyjob.collective import local

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    release = threading.Event()
    contexts = [strategy.extended._make_replica_context(i) for i in range(2)]

    def fn(i: int) -> None:
        if i == 0:
            sj.get_replica_context().merge_call(lambda s: None)
        else:
            release.wait(30)  # late replica

    with strategy.scope(), pytest.raises(DeadlineExceededError, match=r"\[1\] did not reach"):
        local.run_replicas(
            strategy, fn, contexts, [(0,), (1,)], [{}, {}], timeout=0.2, sequential=False
        )
    release.set()


# --- all_reduce / all_gather --------------------------------------------------------------------


def test_all_reduce_sum_and_mean(mirrored: sj.MirroredStrategy) -> None:
    def fn(op: str) -> torch.Tensor:
        return sj.get_replica_context().all_reduce(op, torch.tensor(_replica_id() + 1.0))

    assert [float(v) for v in mirrored.run(fn, args=("sum",)).values] == [3.0, 3.0]
    assert [float(v) for v in mirrored.run(fn, args=(sj.ReduceOp.MEAN,)).values] == [1.5, 1.5]


def test_all_reduce_nest_gives_each_replica_its_own_copy(mirrored: sj.MirroredStrategy) -> None:
    def fn() -> dict:
        i = _replica_id()
        value = {"a": torch.tensor([i, i]), "b": [torch.tensor(2.0 * i)]}
        out = sj.get_replica_context().all_reduce(sj.ReduceOp.SUM, value)
        out["a"].add_(100 * (i + 1))  # in-place on one replica must not leak to the other
        return out

    result = mirrored.run(fn)
    assert [v.tolist() for v in result["a"].values] == [[101, 101], [201, 201]]
    assert [float(v) for v in result["b"][0].values] == [2.0, 2.0]


def test_all_reduce_of_identical_python_value(mirrored: sj.MirroredStrategy) -> None:
    # Each replica converts a Python number to a tensor of its own, as TF does: reduced.
    means = mirrored.run(lambda: sj.get_replica_context().all_reduce("mean", 4.0))
    assert [t.item() for t in mirrored.experimental_local_results(means)] == [4.0, 4.0]
    sums = mirrored.run(lambda: sj.get_replica_context().all_reduce("sum", 1.0))
    assert [t.item() for t in mirrored.experimental_local_results(sums)] == [2.0, 2.0]


def test_all_reduce_in_default_context_returns_value() -> None:
    value = torch.tensor([1.0, 2.0])
    assert sj.get_replica_context().all_reduce("sum", value) is value


def test_all_gather(mirrored: sj.MirroredStrategy) -> None:
    result = mirrored.run(
        lambda: sj.get_replica_context().all_gather(torch.tensor([1, 2, 3]), axis=0)
    )
    assert [v.tolist() for v in result.values] == [[1, 2, 3, 1, 2, 3]] * 2


def test_all_gather_nest_with_uneven_shapes(mirrored: sj.MirroredStrategy) -> None:
    def fn() -> dict:
        if _replica_id() == 0:
            value = {"a": torch.tensor([0]), "b": torch.tensor([[0, 1]])}
        else:
            value = {"a": torch.tensor([1]), "b": torch.tensor([[2, 3], [4, 5]])}
        return sj.get_replica_context().all_gather(value, 0)

    result = mirrored.run(fn)
    for i in range(2):
        assert result["a"].values[i].tolist() == [0, 1]
        assert result["b"].values[i].tolist() == [[0, 1], [2, 3], [4, 5]]


def test_all_gather_rejects_scalars_and_sparse(mirrored: sj.MirroredStrategy) -> None:
    with pytest.raises(ValueError, match="rank >= 1"):
        mirrored.run(lambda: sj.get_replica_context().all_gather(torch.tensor(1.0), 0))
    sparse = torch.tensor([[0.0, 1.0]]).to_sparse()
    with pytest.raises(NotImplementedError) as raised:
        mirrored.run(lambda: sj.get_replica_context().all_gather(sparse, 0))
    assert str(raised.value) == "all_gather does not support IndexedSlices"


def test_replica_devices(mirrored: sj.MirroredStrategy) -> None:
    devices = mirrored.run(lambda: sj.get_replica_context().devices)
    assert len(devices) == 1  # a 1-tuple per replica regroups to a 1-tuple of PerReplica
    assert devices[0].values == (
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:1",
    )
    with pytest.raises(RuntimeError, match="Need to be inside"), mirrored.scope():
        sj.ReplicaContext(mirrored, 0).devices  # noqa: B018


def test_three_replicas_gather_in_replica_order() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])

    def fn() -> torch.Tensor:
        i = _replica_id()
        return sj.get_replica_context().all_gather(torch.full((i + 1,), i), axis=0)

    result = strategy.run(fn)
    assert [v.tolist() for v in result.values] == [[0, 1, 1, 2, 2, 2]] * 3
    assert strategy.reduce("SUM", strategy.run(lambda: torch.tensor(_replica_id())), None) == 3


def test_replicas_take_turns_in_replica_order(mirrored: sj.MirroredStrategy) -> None:
    log = []

    def fn() -> None:
        i = _replica_id()
        log.append(f"{i} starts")
        sj.get_replica_context().merge_call(lambda s: log.append("merge"))
        log.append(f"{i} resumes")

    for _ in range(3):  # deterministic, not a lucky interleaving
        log.clear()
        mirrored.run(fn)
        assert log == ["0 starts", "1 starts", "merge", "0 resumes", "1 resumes"]


def test_random_draws_follow_replica_order(mirrored: sj.MirroredStrategy) -> None:
    torch.manual_seed(0)
    draws = mirrored.run(lambda: torch.rand(()))
    torch.manual_seed(0)
    assert [float(d) for d in draws.values] == [float(torch.rand(())), float(torch.rand(()))]


def test_failure_releases_a_concurrently_running_replica() -> None:
    from strategyjob.collective import local

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    started = threading.Event()
    finished = []
    contexts = [strategy.extended._make_replica_context(i) for i in range(2)]

    def fn(i: int) -> None:
        if i == 0:
            assert started.wait(10)
            raise OSError("replica 0 failed")
        started.set()
        finished.append(True)
        sj.get_replica_context().merge_call(lambda s: None)  # released, not hung

    with strategy.scope(), pytest.raises(OSError, match="replica 0 failed"):
        local.run_replicas(strategy, fn, contexts, [(0,), (1,)], [{}, {}], sequential=False)
    assert finished == [True]


def test_failure_in_first_replica_skips_the_rest(mirrored: sj.MirroredStrategy) -> None:
    ran = []

    def fn() -> None:
        ran.append(_replica_id())
        if _replica_id() == 0:
            raise OSError("replica 0 failed")

    with pytest.raises(OSError, match="replica 0 failed"):
        mirrored.run(fn)
    assert ran == [0]


def test_experimental_run_v2_alias(mirrored: sj.MirroredStrategy) -> None:
    result = mirrored.experimental_run_v2(lambda x: x * 2, args=(sj.PerReplica([1, 2]),))
    assert result.values == (2, 4)
