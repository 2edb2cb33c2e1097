"""Train the digits classifier with TPUStrategy: 2 replicas x 2 logical devices.

Each process is one device (a TF_CONFIG worker task). The first layer is model-parallel: its
input features are split across the two logical devices of a replica
(``experimental_split_to_logical_devices``), each device multiplies its half, and the partial
products are summed (``experimental_replicate_to_logical_devices``). Replicas are data-parallel:
each gets its part of the global batch and gradients are averaged across replicas. Run it with
`strategyjob run job.yaml`; only the imports differ from TensorFlow.
"""

from __future__ import annotations

import os
import time

import strategyjob
import torch
from sklearn.datasets import load_digits
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.tpu.experimental import DeviceAssignment, initialize_tpu_system

LOGICAL_DEVICES = int(os.environ.get("LOGICAL_DEVICES", "2"))
GLOBAL_BATCH_SIZE = 64
EPOCHS = int(os.environ.get("EPOCHS", "6"))

torch.set_num_threads(1)
torch.manual_seed(0)

resolver = TFConfigClusterResolver()
topology = initialize_tpu_system(resolver)
num_replicas = topology.num_tasks // LOGICAL_DEVICES
assignment = DeviceAssignment.build(
    topology, computation_shape=[1, 1, 1, LOGICAL_DEVICES], num_replicas=num_replicas
)
strategy = strategyjob.TPUStrategy(resolver, experimental_device_assignment=assignment)
task = f"{resolver.task_type}-{resolver.task_id}"


def log(message: str) -> None:
    print(f"{task}: {message}", flush=True)


log(
    f"{strategy.num_replicas_in_sync} replicas x {assignment.num_cores_per_replica} logical devices"
)

digits = load_digits()
features = torch.tensor(digits.data / 16.0, dtype=torch.float32)
labels = torch.tensor(digits.target, dtype=torch.long)
order = torch.randperm(len(features), generator=torch.Generator().manual_seed(0))
train_idx, test_idx = order[:1500], order[1500:]


def global_batches(indices: torch.Tensor, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shuffled = indices[torch.randperm(len(indices), generator=torch.Generator().manual_seed(epoch))]
    return [
        (features[shuffled[i : i + GLOBAL_BATCH_SIZE]], labels[shuffled[i : i + GLOBAL_BATCH_SIZE]])
        for i in range(0, len(shuffled), GLOBAL_BATCH_SIZE)
    ]


with strategy.scope():
    hidden = torch.nn.Linear(64, 128)
    head = torch.nn.Linear(128, 10)
    params = [*hidden.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)


def forward(x: torch.Tensor) -> torch.Tensor:
    """The first layer split over the replica's logical devices on its input features."""
    split = [1, LOGICAL_DEVICES]
    x_part = strategy.experimental_split_to_logical_devices(x, split)
    w_part = strategy.experimental_split_to_logical_devices(hidden.weight, split)
    h = strategy.experimental_replicate_to_logical_devices(x_part @ w_part.t())  # a DTensor
    return head(torch.relu(h.full_tensor() + hidden.bias))


def train_step(batch):
    x, y = batch
    optimizer.zero_grad()
    logits = forward(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    correct = (logits.argmax(dim=1) == y).sum().float()
    return loss.detach() * len(y), correct, torch.tensor(float(len(y)))


def eval_step(batch):
    x, y = batch
    with torch.no_grad():
        correct = (forward(x).argmax(dim=1) == y).sum().float()
    return correct, torch.tensor(float(len(y)))


SUM = strategyjob.ReduceOp.SUM
for epoch in range(EPOCHS):
    started = time.perf_counter()
    loss_sum = correct_sum = seen = 0.0
    for batch in strategy.experimental_distribute_dataset(global_batches(train_idx, epoch)):
        loss, correct, count = strategy.run(train_step, args=(batch,))
        loss_sum += float(strategy.reduce(SUM, loss, axis=None))
        correct_sum += float(strategy.reduce(SUM, correct, axis=None))
        seen += float(strategy.reduce(SUM, count, axis=None))
    test_correct = test_seen = 0.0
    for batch in strategy.experimental_distribute_dataset(global_batches(test_idx, 0)):
        correct, count = strategy.run(eval_step, args=(batch,))
        test_correct += float(strategy.reduce(SUM, correct, axis=None))
        test_seen += float(strategy.reduce(SUM, count, axis=None))
    log(
        f"epoch {epoch + 1}/{EPOCHS}: loss {loss_sum / seen:.4f}, "
        f"accuracy {correct_sum / seen:.4f}, test accuracy {test_correct / test_seen:.4f} "
        f"({time.perf_counter() - started:.2f}s)"
    )
    strategyjob.report(
        step=epoch + 1,
        total_steps=EPOCHS,
        loss=round(loss_sum / seen, 4),
        test_accuracy=round(test_correct / test_seen, 4),
    )
