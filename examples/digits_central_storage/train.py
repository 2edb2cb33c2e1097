"""Train a small classifier on scikit-learn's handwritten digits with
CentralStorageStrategy: one process, two compute replicas ("cpu:0", "cpu:1") and the
variables kept once on the parameter device. Run it with `strategyjob run job.yaml`.

This is a tf.distribute custom training loop: only the imports differ from TensorFlow.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import strategyjob
import torch
from sklearn.datasets import load_digits

GLOBAL_BATCH_SIZE = int(os.environ.get("GLOBAL_BATCH_SIZE", "64"))
EPOCHS = int(os.environ.get("EPOCHS", "8"))
LEARNING_RATE = 0.1

torch.set_num_threads(1)
torch.manual_seed(0)

strategy = strategyjob.CentralStorageStrategy(
    compute_devices=["cpu:0", "cpu:1"], parameter_device="cpu:0"
)
print(
    f"{strategy.num_replicas_in_sync} replicas on {strategy.extended.worker_devices}, "
    f"parameters on {strategy.extended.parameter_devices}",
    flush=True,
)

digits = load_digits()
features = torch.tensor(digits.data / 16.0, dtype=torch.float32)
labels = torch.tensor(digits.target, dtype=torch.long)
order = torch.randperm(len(features), generator=torch.Generator().manual_seed(0))
train_idx, test_idx = order[:1500], order[1500:]


def global_batches(indices: torch.Tensor, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The epoch's global batches; the strategy splits each one across the replicas."""
    shuffled = indices[torch.randperm(len(indices), generator=torch.Generator().manual_seed(epoch))]
    return [
        (features[shuffled[i : i + GLOBAL_BATCH_SIZE]], labels[shuffled[i : i + GLOBAL_BATCH_SIZE]])
        for i in range(0, len(shuffled), GLOBAL_BATCH_SIZE)
    ]


with strategy.scope():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)


def train_step(batch):
    x, y = batch
    optimizer.zero_grad()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()  # one update of the central variables from the replicas' gradients
    correct = (logits.argmax(dim=1) == y).sum().float()
    return loss.detach() * len(y), correct, torch.tensor(float(len(y)))


def eval_step(batch):
    x, y = batch
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum().float()
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
    print(
        f"epoch {epoch + 1}/{EPOCHS}: loss {loss_sum / seen:.4f}, "
        f"accuracy {correct_sum / seen:.4f}, test accuracy {test_correct / test_seen:.4f} "
        f"({time.perf_counter() - started:.2f}s)",
        flush=True,
    )
    strategyjob.report(
        step=epoch + 1,
        total_steps=EPOCHS,
        loss=round(loss_sum / seen, 4),
        test_accuracy=round(test_correct / test_seen, 4),
    )

if strategy.extended.should_checkpoint:
    checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / "model.pt"
    torch.save({"model": model.state_dict(), "epochs": EPOCHS}, path)
    print(f"saved checkpoint {path}", flush=True)
