"""A TPUStrategy training script for the re-forming tests, run by ``strategyjob run`` or in a
pod: ``python tpu_reform_worker.py OUT STEPS [PACE]``.

Replicas of two logical devices (one process each; as many replicas as the job's processes
allow, so a resize changes their number). Each step's global batch (8 rows, drawn from a
generator seeded with the step) is split over the replicas by ``experimental_distribute_dataset``
and the first layer is split over each replica's logical devices, as ``examples/digits_tpu``.
Training goes through a ``PreemptionCheckpointHandler`` over a ``CheckpointManager`` in
``OUT/ckpt``. Once it has run step 3 every process prints ``RUNNING``; steps are paced by PACE
seconds (default 0.3) to leave a window for a resize. At the end each process prints ``RESULT
{json}`` (replicas, first step of its run, steps run, last loss) and ``STATE <sha256>`` of the
model's whole values (for tests that only see logs).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import strategyjob as sj
import torch
from strategyjob import train
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.tpu.experimental import DeviceAssignment, initialize_tpu_system

torch.set_num_threads(1)

LOGICAL_DEVICES, FEATURES, GLOBAL_BATCH, MARK = 2, 8, 8, 3


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    pace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
    resolver = TFConfigClusterResolver()
    topology = initialize_tpu_system(resolver)
    assignment = DeviceAssignment.build(
        topology,
        computation_shape=[1, 1, 1, LOGICAL_DEVICES],
        num_replicas=topology.num_tasks // LOGICAL_DEVICES,
    )
    strategy = sj.TPUStrategy(resolver, experimental_device_assignment=assignment)
    with strategy.scope():
        torch.manual_seed(0)
        layer = torch.nn.Linear(FEATURES, 16)
        head = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD([*layer.parameters(), *head.parameters()], lr=0.05, momentum=0.9)
    step = torch.zeros((), dtype=torch.int64)
    ckpt = train.Checkpoint(layer=layer, head=head, optimizer=opt, step=step)
    manager = train.CheckpointManager(ckpt, os.path.join(out, "ckpt"), max_to_keep=2)
    handler = sj.experimental.PreemptionCheckpointHandler(strategy.cluster_resolver, manager)
    first = handler.total_run_calls

    def replica_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        x_split = strategy.experimental_split_to_logical_devices(x, [1, LOGICAL_DEVICES])
        w_split = strategy.experimental_split_to_logical_devices(layer.weight, [1, LOGICAL_DEVICES])
        h = strategy.experimental_replicate_to_logical_devices(x_split @ w_split.t())
        loss = ((head(torch.tanh(h + layer.bias)) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def train_step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        losses = strategy.run(replica_step, args=batch)
        return strategy.reduce(sj.ReduceOp.MEAN, losses, axis=None)

    def global_batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + s)
        x = torch.randn(GLOBAL_BATCH, FEATURES, generator=g)
        return x, torch.randn(GLOBAL_BATCH, 1, generator=g)

    ran, loss = [], float("nan")
    while handler.total_run_calls < steps:
        s = handler.total_run_calls
        (batch,) = list(strategy.experimental_distribute_dataset([global_batch(s)]))
        loss = float(handler.run(train_step, batch).detach())
        step += 1
        ran.append(s)
        if s == MARK:
            print("RUNNING", flush=True)
        time.sleep(pace)
    print(
        "RESULT "
        + json.dumps(
            {"replicas": strategy.num_replicas_in_sync, "first": first, "ran": ran, "loss": loss}
        ),
        flush=True,
    )
    digest = hashlib.sha256()
    for t in (layer.weight, layer.bias, head.weight, head.bias):
        whole = t.detach().full_tensor() if hasattr(t, "full_tensor") else t.detach()
        digest.update(whole.contiguous().numpy().tobytes())
    print(f"STATE {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
