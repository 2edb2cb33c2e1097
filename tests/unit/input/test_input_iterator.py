"""End of data, partial and empty batches, Optional, and device placement of the iterator."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from input_fakes import FakeExtended, range_batches
from strategyjob._values import PerReplica
from strategyjob.errors import InvalidArgumentError, OutOfRangeError, UnavailableError
from strategyjob.input import (
    DistributedIterator,
    InputOptions,
    Optional,
    distribute_dataset,
)


def iterator(n: int, b: int, num_local: int = 2, **kwargs) -> DistributedIterator:
    extended = FakeExtended(num_local)
    return iter(distribute_dataset(range_batches(n, b), extended=extended, **kwargs))


def test_next_ends_with_stop_iteration_and_stays_ended() -> None:
    it = iterator(4, 4)
    first = next(it)
    assert isinstance(first, PerReplica)
    assert [v.tolist() for v in first.values] == [[0, 1], [2, 3]]
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_get_next_ends_with_out_of_range_error() -> None:
    it = iterator(4, 4)
    it.get_next()
    with pytest.raises(OutOfRangeError, match="End of sequence"):
        it.get_next()
    with pytest.raises(OutOfRangeError):
        it.get_next()


def test_get_next_as_optional_is_empty_at_the_end() -> None:
    it = iterator(4, 4)
    value = it.get_next_as_optional()
    assert value.has_value()
    assert [v.tolist() for v in value.get_value().values] == [[0, 1], [2, 3]]
    end = it.get_next_as_optional()
    assert not end.has_value()
    with pytest.raises(InvalidArgumentError, match="has no value"):
        end.get_value()
    assert not it.get_next_as_optional().has_value()


def test_optional_constructors() -> None:
    assert Optional.from_value(3).get_value() == 3
    assert not Optional.empty().has_value()
    assert repr(Optional.empty()) == "Optional(<empty>)"


def test_the_three_methods_share_one_position() -> None:
    it = iterator(12, 4)
    a = next(it)
    b = it.get_next()
    c = it.get_next_as_optional().get_value()
    assert [x.values[0].tolist() for x in (a, b, c)] == [[0, 1], [4, 5], [8, 9]]


def test_empty_batches_have_zero_rows_and_the_input_dtype_and_trailing_dims() -> None:
    x = torch.arange(15, dtype=torch.float64).reshape(5, 3)
    it = iter(distribute_dataset([x[:4], x[4:]], extended=FakeExtended(4)))
    next(it)
    last = next(it)
    shapes = [tuple(v.shape) for v in last.values]
    assert shapes == [(1, 3), (0, 3), (0, 3), (0, 3)]
    assert all(v.dtype == torch.float64 for v in last.values)


def test_replicas_without_data_get_empty_batches_from_an_earlier_step() -> None:
    # rebatch=False: 3 elements over 2 replicas; the last step has data for replica 0 only.
    it = iterator(6, 2, rebatch=False)
    next(it)
    last = next(it)
    assert [v.tolist() for v in last.values] == [[4, 5], []]


def test_every_step_asks_whether_any_worker_has_data() -> None:
    extended = FakeExtended(2)
    assert len(list(distribute_dataset(range_batches(8, 4), extended=extended))) == 2
    assert extended.any_worker_calls == [True, True, False]


def test_a_worker_with_data_does_not_wait_for_the_agreement_of_its_step() -> None:
    # The answer a worker with data would wait for is one it knows: its round trip overlaps
    # with the step and is collected when the next step starts.
    extended = FakeExtended(2)
    iterator = iter(distribute_dataset(range_batches(8, 4), extended=extended))
    next(iterator)
    assert extended.answers_collected == []
    next(iterator)
    assert extended.answers_collected == [0]
    with pytest.raises(StopIteration):
        next(iterator)
    assert extended.answers_collected == [0, 1, 2]  # no data: it waits for the answer


def test_a_failed_agreement_surfaces_at_the_next_step() -> None:
    class Broken(FakeExtended):
        def start_any_has_data(self, flag: bool):
            def wait() -> bool:
                raise UnavailableError("cluster check alive failed, worker 1 is down")

            return wait

    iterator = iter(distribute_dataset(range_batches(8, 4), extended=Broken(2)))
    next(iterator)
    with pytest.raises(UnavailableError, match="worker 1 is down"):
        next(iterator)


def test_each_iter_is_a_new_pass_over_re_iterable_input() -> None:
    distributed = distribute_dataset(range_batches(4, 2), extended=FakeExtended(2))
    first = [[v.tolist() for v in x.values] for x in distributed]
    second = [[v.tolist() for v in x.values] for x in distributed]
    assert first == second == [[[0], [1]], [[2], [3]]]


def test_fetch_to_device_false_keeps_host_tensors_untouched() -> None:
    batch = torch.arange(4)
    it = iter(
        distribute_dataset(
            [batch],
            extended=FakeExtended(1),
            options=InputOptions(experimental_fetch_to_device=False),
        )
    )
    assert next(it) is batch


def test_fetch_to_device_moves_to_the_replica_device() -> None:
    class OnMeta(FakeExtended):
        pass

    extended = OnMeta(2)
    extended.topology = replace(
        extended.topology, local_devices=(torch.device("cpu"), torch.device("meta"))
    )
    value = next(iter(distribute_dataset(range_batches(4, 4), extended=extended)))
    assert [v.device.type for v in value.values] == ["cpu", "meta"]
    host = InputOptions(experimental_fetch_to_device=False)
    value = next(iter(distribute_dataset(range_batches(4, 4), extended=extended, options=host)))
    assert [v.device.type for v in value.values] == ["cpu", "cpu"]


def test_worker_without_any_data_gets_a_clear_error() -> None:
    class OtherWorkerHasData(FakeExtended):
        def any_has_data(self, flag: bool) -> bool:
            return True

    extended = OtherWorkerHasData(2)
    it = iter(distribute_dataset([], extended=extended))
    with pytest.raises(InvalidArgumentError, match="has no input at all"):
        next(it)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fetch_to_device_moves_pinned_batches_to_cuda() -> None:
    extended = FakeExtended(2)
    extended.topology = replace(
        extended.topology, local_devices=(torch.device("cuda", 0), torch.device("cpu"))
    )
    batch = torch.arange(4).pin_memory()
    value = next(iter(distribute_dataset([batch], extended=extended)))
    assert [v.device.type for v in value.values] == ["cuda", "cpu"]
    assert [v.tolist() for v in value.values] == [[0, 1], [2, 3]]
