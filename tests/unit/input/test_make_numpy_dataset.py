"""``Strategy.experimental_make_numpy_dataset`` on every strategy: examples of in-memory arrays,
shared with torch rather than copied, that a ``DataLoader`` batches and
``experimental_distribute_dataset`` splits (TF: ``from_tensor_slices`` of the arrays)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import strategyjob as sj
import torch
from strategyjob.compat import v1
from torch.utils.data import DataLoader


def _strategy(name: str) -> sj.Strategy:
    if name == "default":
        return sj.get_strategy()
    if name == "one_device":
        return sj.OneDeviceStrategy("cpu:0")
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


def _data() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5, dtype=np.int64)


def _steps(strategy: sj.Strategy, distributed) -> list[list[tuple[list, list]]]:
    return [
        [(x.tolist(), y.tolist()) for x, y in strategy.experimental_local_results(step)]
        for step in distributed
    ]


@pytest.mark.parametrize("name", ["default", "one_device", "mirrored"])
def test_examples_share_the_arrays(name: str) -> None:
    x, y = _data()
    dataset = _strategy(name).experimental_make_numpy_dataset((x, y))
    assert isinstance(dataset, torch.utils.data.Dataset) and len(dataset) == 5
    first_x, first_y = dataset[0]
    assert first_x.tolist() == [0.0, 1.0] and first_y.item() == 0
    assert first_x.dtype == torch.float32 and first_y.dtype == torch.int64
    x[0, 0] = 100.0  # no copy was made: the dataset sees the change
    assert dataset[0][0].tolist() == [100.0, 1.0]
    assert [example[1].item() for example in dataset] == [0, 1, 2, 3, 4]  # iterable, in order


def test_mirrored_dataloader_then_distribute() -> None:
    strategy = _strategy("mirrored")
    dataset = strategy.experimental_make_numpy_dataset(_data())
    loader = DataLoader(dataset, batch_size=2)  # global batches of 2: one example per replica
    assert _steps(strategy, strategy.experimental_distribute_dataset(loader)) == [
        [([[0.0, 1.0]], [0]), ([[2.0, 3.0]], [1])],
        [([[4.0, 5.0]], [2]), ([[6.0, 7.0]], [3])],
        [([[8.0, 9.0]], [4]), ([], [])],  # the partial last batch leaves replica 1 empty
    ]


def test_mirrored_tf_style_batch_then_distribute() -> None:
    strategy = _strategy("mirrored")
    x, y = _data()
    batched = strategy.experimental_make_numpy_dataset({"x": x, "y": y}).batch(4)
    assert batched.batch_size == 4 and len(batched) == 2
    steps = list(strategy.experimental_distribute_dataset(batched))
    first = strategy.experimental_local_results(steps[0])
    assert [r["y"].tolist() for r in first] == [[0, 1], [2, 3]]
    last = strategy.experimental_local_results(steps[1])
    assert [r["y"].tolist() for r in last] == [[4], []]
    batch = next(iter(batched))
    assert batch["x"].data_ptr() == torch.from_numpy(x).data_ptr()  # a view, not a copy
    assert len(strategy.experimental_make_numpy_dataset(x).batch(4, drop_remainder=True)) == 1


@pytest.mark.parametrize("name", ["default", "one_device"])
def test_one_replica_dataloader_then_distribute(name: str) -> None:
    strategy = _strategy(name)
    loader = DataLoader(strategy.experimental_make_numpy_dataset(_data()), batch_size=2)
    steps = list(strategy.experimental_distribute_dataset(loader))
    assert [y.tolist() for _, y in steps] == [[0, 1], [2, 3], [4]]  # not rebatched


def test_distributing_unbatched_examples_asks_for_batch() -> None:
    strategy = _strategy("mirrored")
    dataset = strategy.experimental_make_numpy_dataset(np.ones([10], dtype=np.float32))
    with pytest.raises(ValueError, match=r"^Call the `batch` method on the input Dataset"):
        list(strategy.experimental_distribute_dataset(dataset))


def test_arrays_torch_cannot_view_are_copied_once() -> None:
    read_only = np.arange(4.0)
    read_only.flags.writeable = False
    big_endian = np.arange(4, dtype=">i4")
    reversed_view = np.arange(4.0)[::-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it views a read-only array
        dataset = sj.get_strategy().experimental_make_numpy_dataset(
            (read_only, big_endian, reversed_view)
        )
    assert [t.tolist() for t in dataset[1]] == [1.0, 1, 2.0]
    assert dataset[3][1].dtype == torch.int32


def test_lists_are_stacked_and_bad_input_is_refused() -> None:
    strategy = _strategy("default")
    stacked = strategy.experimental_make_numpy_dataset([np.zeros(2), np.ones(2)])
    assert len(stacked) == 2 and stacked[1].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="must have the same length along dimension 0"):
        strategy.experimental_make_numpy_dataset((np.zeros(3), np.zeros(4)))
    with pytest.raises(ValueError, match=r"need rank >= 1"):
        strategy.experimental_make_numpy_dataset(np.float32(1.0))


def test_compat_v1_strategy_has_the_same_method() -> None:
    strategy = v1.CentralStorageStrategy(["cpu:0", "cpu:1"])
    dataset = strategy.experimental_make_numpy_dataset(np.arange(4.0))
    loader = DataLoader(dataset, batch_size=4)
    (step,) = list(strategy.experimental_distribute_dataset(loader))
    assert [t.tolist() for t in strategy.experimental_local_results(step)] == [
        [0.0, 1.0],
        [2.0, 3.0],
    ]
