"""One TPUStrategy process of a 2-process cluster whose device assignment puts replica 0 on
task 1 and replica 1 on task 0 (torch numbers the replica group by rank, the other way round):
prints ``RESULT {json}`` with what the replica-order-sensitive collectives gave."""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.distributed as dist
from strategyjob import get_replica_context
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.strategies.tpu import TPUStrategy
from strategyjob.tpu.experimental import DeviceAssignment, initialize_tpu_system


def main() -> dict:
    resolver = TFConfigClusterResolver()
    topology = initialize_tpu_system(resolver)
    reversed_replicas = DeviceAssignment(topology, np.array([[[0, 0, 0, 1]], [[0, 0, 0, 0]]]))
    strategy = TPUStrategy(resolver, experimental_device_assignment=reversed_replicas)
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    initial = torch.nn.Linear(3, 1).weight.detach().clone()  # this process's own draw
    torch.manual_seed(100 + rank)
    with strategy.scope():
        layer = torch.nn.Linear(3, 1)  # the same draw, then the chief's (task 1) values
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)

    def step() -> tuple:
        ctx = get_replica_context()
        replica = int(ctx.replica_id_in_sync_group)
        # uneven sizes: replica 0 gives [0], replica 1 gives [1, 1]
        mine = torch.full((replica + 1,), float(replica))
        gathered = ctx.all_gather(mine, axis=0)
        total = ctx.all_reduce("sum", torch.tensor(float(replica)))
        loss = layer(torch.full((1, 3), float(replica + 1))).sum()
        loss.backward()
        optimizer.step()
        return gathered, total, layer.weight.grad.detach().clone()

    gathered, total, grad = strategy.run(step)
    local = strategy.experimental_local_results
    return {
        "rank": rank,
        "replica": strategy.extended.topology.worker_index,
        "should_checkpoint": bool(strategy.extended.should_checkpoint),
        "initial": initial.tolist(),
        "weight": layer.weight.detach().tolist(),
        "gathered": local(gathered)[0].tolist(),
        "total": float(local(total)[0]),
        "grad": local(grad)[0].tolist(),
        "gather": strategy.gather(
            strategy.experimental_distribute_values_from_function(
                lambda ctx: torch.tensor([float(ctx.replica_id_in_sync_group)])
            ),
            axis=0,
        ).tolist(),
    }


if __name__ == "__main__":
    result = main()
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()
