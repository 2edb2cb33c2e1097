"""Sharding across workers (§4.3), simulated with fake workers that step in lock-step threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from input_fakes import FakeCluster, FakeExtended, range_batches, steps_of
from strategyjob.errors import InvalidArgumentError
from strategyjob.input import SHARD_HINT, AutoShardPolicy, FileDataset, distribute_dataset, shard
from torch.utils.data import DataLoader


def run_workers(num_workers: int, num_local: int, make_input: Any, **kwargs: Any) -> list:
    """Every worker's steps, each worker distributing its own copy of the input."""

    def worker(extended: FakeExtended) -> list:
        distributed = distribute_dataset(make_input(), extended=extended, **kwargs)
        return steps_of(distributed, num_local)

    return FakeCluster(num_workers).run(num_local, worker)


@pytest.mark.parametrize("kind", ["list", "dataloader"])
def test_data_sharding_composition_w2_rw2(kind: str) -> None:
    def make() -> Any:
        if kind == "list":
            return range_batches(16, 8)
        return DataLoader(torch.arange(16), batch_size=8)

    worker0, worker1 = run_workers(2, 2, make, auto_shard_policy=AutoShardPolicy.DATA)
    assert worker0 == [[[0, 1], [4, 5]], [[8, 9], [12, 13]]]
    assert worker1 == [[[2, 3], [6, 7]], [[10, 11], [14, 15]]]
    # AUTO on input without files is DATA.
    assert run_workers(2, 2, make) == [worker0, worker1]


@pytest.mark.parametrize("kind", ["list", "dataloader"])
def test_off_composition_w2_rw2_every_worker_reads_everything(kind: str) -> None:
    def make() -> Any:
        if kind == "list":
            return range_batches(16, 8)
        return DataLoader(torch.arange(16), batch_size=8)

    worker0, worker1 = run_workers(2, 2, make, auto_shard_policy=AutoShardPolicy.OFF)
    expected = [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]], [[12, 13], [14, 15]]]
    assert worker0 == expected
    assert worker1 == expected


@pytest.mark.parametrize("kind", ["list", "generator", "dataloader"])
def test_mwms_two_workers_one_replica_range14_batch8(kind: str) -> None:
    def make() -> Any:
        if kind == "list":
            return range_batches(14, 8)
        if kind == "generator":
            return iter(range_batches(14, 8))
        return DataLoader(torch.arange(14), batch_size=8)

    chief, worker = run_workers(2, 1, make)
    assert chief == [[[0, 1, 2, 3]], [[8, 9, 10]]]
    assert worker == [[[4, 5, 6, 7]], [[11, 12, 13]]]


def test_data_sharding_gives_empty_batches_to_a_worker_short_of_rows() -> None:
    # range(5).batch(4), 2 workers x 1 replica: step 2 is [4] on the chief, [] on the worker.
    chief, worker = run_workers(2, 1, lambda: range_batches(5, 4))
    assert chief == [[[0, 1]], [[4]]]
    assert worker == [[[2, 3]], [[]]]


def test_r_not_divisible_by_workers_is_rejected_on_every_worker() -> None:
    extended = FakeExtended(num_local=2, num_workers=3, num_replicas=4)
    with pytest.raises(ValueError, match=r"\(4\) that cannot be divided by `num_workers` \(3\)"):
        distribute_dataset(range_batches(4, 4), extended=extended)


# --- FILE sharding ---------------------------------------------------------------------------


def write_files(tmp_path: Path, counts: list[int]) -> list[str]:
    """File i holds the examples 100*i, 100*i + 1, … (``counts[i]`` of them), one per line."""
    paths = []
    for i, count in enumerate(counts):
        path = tmp_path / f"part-{i}.txt"
        path.write_text("".join(f"{100 * i + k}\n" for k in range(count)))
        paths.append(str(path))
    return paths


def read_lines(path: str) -> list[torch.Tensor]:
    with open(path) as handle:
        return [torch.tensor(int(line)) for line in handle]


def test_file_dataset_reads_and_batches_across_files(tmp_path: Path) -> None:
    files = write_files(tmp_path, [3, 2])
    batches = [b.tolist() for b in FileDataset(files, read_lines, batch_size=2)]
    assert batches == [[0, 1], [2, 100], [101]]
    dropped = [b.tolist() for b in FileDataset(files, read_lines, 2, drop_remainder=True)]
    assert dropped == [[0, 1], [2, 100]]


def test_file_sharding_gives_each_worker_its_own_files(tmp_path: Path) -> None:
    files = write_files(tmp_path, [2, 2, 2, 2])

    def make() -> FileDataset:
        return FileDataset(files, read_lines, batch_size=2)

    for policy in (AutoShardPolicy.AUTO, AutoShardPolicy.FILE):
        chief, worker = run_workers(2, 1, make, auto_shard_policy=policy)
        # Worker w reads files w, w+2; balanced split of B=2 over 2 slots: one row per step.
        assert chief == [[[0]], [[1]], [[200]], [[201]]]
        assert worker == [[[100]], [[101]], [[300]], [[301]]]


def test_file_sharding_with_uneven_files_pads_the_short_worker(tmp_path: Path) -> None:
    files = write_files(tmp_path, [4, 1])

    def make() -> FileDataset:
        return FileDataset(files, read_lines, batch_size=2)

    chief, worker = run_workers(2, 1, make, auto_shard_policy=AutoShardPolicy.FILE)
    # The worker runs out after one step but keeps stepping with empty batches until the chief
    # is done too; then both end at the same step.
    assert chief == [[[0]], [[1]], [[2]], [[3]]]
    assert worker == [[[100]], [[]], [[]], [[]]]


def test_file_sharding_with_fewer_files_than_workers_fails(tmp_path: Path) -> None:
    files = write_files(tmp_path, [4])
    extended = FakeExtended(num_local=1, num_workers=2, worker_index=0)
    distributed = distribute_dataset(
        FileDataset(files, read_lines, batch_size=2),
        extended=extended,
        auto_shard_policy=AutoShardPolicy.FILE,
    )
    with pytest.raises(InvalidArgumentError) as err:
        iter(distributed)
    assert "only has 1 file(s), which is not enough for the required 2 shards/workers" in str(
        err.value
    )


def test_auto_with_fewer_files_than_workers_falls_back_to_data(tmp_path: Path) -> None:
    files = write_files(tmp_path, [4])
    chief, worker = run_workers(2, 1, lambda: FileDataset(files, read_lines, batch_size=4))
    assert chief == [[[0, 1]]]
    assert worker == [[[2, 3]]]


def test_file_policy_on_input_without_files_fails_with_several_workers() -> None:
    extended = FakeExtended(num_local=1, num_workers=2)
    distributed = distribute_dataset(
        range_batches(4, 2), extended=extended, auto_shard_policy=AutoShardPolicy.FILE
    )
    with pytest.raises(InvalidArgumentError, match="does not declare its files"):
        iter(distributed)


def test_file_policy_with_one_worker_keeps_all_files(tmp_path: Path) -> None:
    files = write_files(tmp_path, [2, 1])
    distributed = distribute_dataset(
        FileDataset(files, read_lines, batch_size=3), extended=FakeExtended(2)
    )
    # AUTO -> FILE (no sharding with one worker), balanced split of B=3: [2, 1].
    assert steps_of(distributed, 2) == [[[0, 1], [100]]]


# --- HINT ------------------------------------------------------------------------------------


def test_hint_replaces_shard_placeholders(tmp_path: Path) -> None:
    files = write_files(tmp_path, [2, 2, 2, 2])

    def make() -> FileDataset:
        return FileDataset(files, read_lines, batch_size=2).shard(SHARD_HINT, SHARD_HINT)

    chief, worker = run_workers(2, 1, make, auto_shard_policy=AutoShardPolicy.HINT)
    assert chief == [[[0]], [[1]], [[200]], [[201]]]
    assert worker == [[[100]], [[101]], [[300]], [[301]]]


def test_hint_on_generic_input_shards_global_batches() -> None:
    def make() -> Any:
        return shard(range_batches(8, 2), SHARD_HINT, SHARD_HINT)

    chief, worker = run_workers(2, 1, make, auto_shard_policy=AutoShardPolicy.HINT)
    # Balanced split of B=2 over 2 slots (1 each); worker w keeps global batches w, w+2.
    assert chief == [[[0]], [[1]], [[4]], [[5]]]
    assert worker == [[[2]], [[3]], [[6]], [[7]]]


def test_hint_placeholders_are_no_ops_under_other_policies() -> None:
    def make() -> Any:
        return shard(range_batches(4, 2), SHARD_HINT, SHARD_HINT)

    chief, worker = run_workers(2, 1, make, auto_shard_policy=AutoShardPolicy.OFF)
    assert chief == worker == [[[0]], [[1]], [[2]], [[3]]]


def test_without_placeholders_hint_does_not_shard() -> None:
    chief, worker = run_workers(
        2, 1, lambda: range_batches(4, 2), auto_shard_policy=AutoShardPolicy.HINT
    )
    assert chief == worker == [[[0]], [[1]], [[2]], [[3]]]


def test_shard_argument_checks() -> None:
    with pytest.raises(ValueError, match="SHARD_HINT for both"):
        shard([], SHARD_HINT, 0)
    with pytest.raises(ValueError, match="0 <= index < num_shards"):
        shard([], 2, 2)
    assert [b.tolist() for b in shard(range_batches(6, 2), 2, 1)] == [[2, 3]]
