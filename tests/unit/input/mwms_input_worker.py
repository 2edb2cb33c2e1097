"""One worker of the two-process input test: prints its steps as one JSON line.

Run as ``python mwms_input_worker.py CASE [DIR]`` with TF_CONFIG set by the test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import strategyjob as sj
import torch
from strategyjob.experimental import AutoShardPolicy, CommunicationOptions
from strategyjob.input import FileDataset
from torch.utils.data import DataLoader, Dataset, Sampler


class CountingDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        self.loaded.append(index)
        return torch.tensor(index)


def read_lines(path: str) -> list[torch.Tensor]:
    return [torch.tensor(int(line)) for line in Path(path).read_text().split()]


def main() -> None:
    case = sys.argv[1]
    strategy = sj.MultiWorkerMirroredStrategy(
        communication_options=CommunicationOptions(timeout_seconds=60)
    )
    result: dict = {"worker": strategy.extended.topology.worker_index, "agreements": []}
    extended = strategy.extended
    start_agreement = extended.collectives.start_any_has_data

    def recorded_agreement(flag: bool):  # counts the per-step end-of-input agreements
        result["agreements"].append(flag)
        return start_agreement(flag)

    extended.collectives.start_any_has_data = recorded_agreement
    if case == "range":
        batches = [torch.arange(i, min(i + 8, 14)) for i in range(0, 14, 8)]
        distributed = strategy.experimental_distribute_dataset(batches)
    elif case == "files":
        files = sorted(str(p) for p in Path(sys.argv[2]).glob("part-*.txt"))
        dataset = FileDataset(files, read_lines, batch_size=2)
        distributed = strategy.experimental_distribute_dataset(
            dataset, auto_shard_policy=AutoShardPolicy.FILE
        )
    elif case == "abandon":
        # Leave a pass after two steps (its last agreement still unconfirmed), then make a
        # whole new pass: the collectives must still line up, and the process exit cleanly.
        batches = [torch.arange(i, i + 4) for i in range(0, 32, 4)]
        distributed = strategy.experimental_distribute_dataset(batches)
        for step, batch in enumerate(distributed):
            strategy.run(lambda x: x.sum(), args=(batch,))
            if step == 1:
                break
    elif case == "uneven_loaders":
        # Exact step counts 3 and 1: exchanged once, then an agreement per step beyond 1.
        def dataset_fn(ctx: sj.InputContext) -> DataLoader:
            start, size = [(0, 5), (10, 2)][ctx.input_pipeline_id]
            return DataLoader(torch.arange(start, start + size), batch_size=2)

        distributed = strategy.distribute_datasets_from_function(dataset_fn)
    elif case == "lying_len":
        # Worker 1's sampler promises 3 indices and yields 1.
        class Lying(Sampler[int]):
            def __iter__(self):
                return iter([0])

            def __len__(self) -> int:
                return 3

        def dataset_fn(ctx: sj.InputContext) -> DataLoader:
            data = torch.arange(3)
            if ctx.input_pipeline_id == 0:
                return DataLoader(data, batch_size=1)
            return DataLoader(data, batch_size=1, sampler=Lying())

        distributed = strategy.distribute_datasets_from_function(dataset_fn)
    else:
        counting = CountingDataset(10)
        distributed = strategy.experimental_distribute_dataset(DataLoader(counting, batch_size=4))
    steps = []
    for batch in distributed:
        steps.append(batch.tolist())
        # Every step is a collective step on every worker, empty batches included.
        total = strategy.reduce(
            "SUM", strategy.run(lambda x: x.sum().reshape(1), args=(batch,)), axis=None
        )
        result.setdefault("totals", []).append(total.item())
    result["steps"] = steps
    if case == "loader":
        result["loaded"] = sorted(counting.loaded)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
