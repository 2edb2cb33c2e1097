"""Train a small classifier on scikit-learn's handwritten digits (8x8 MNIST-like images)
with MultiWorkerMirroredStrategy: one process per worker, gradients averaged with
torch.distributed collectives. Run it with `strategyjob run job.yaml`.

This is a tf.distribute custom training loop: only the imports differ from TensorFlow.
Like Keras' BackupAndRestore, the chief backs up the model and optimizer after every
epoch to CHECKPOINT_DIR/backup.pt; a restarted job (every worker restarts when one fails)
resumes from that epoch, so CHECKPOINT_DIR must be storage all workers share. The backup
is deleted once training ends.
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

# The cluster comes from TF_CONFIG, which `strategyjob run` (or the operator) sets.
strategy = strategyjob.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
task = f"{resolver.task_type}-{resolver.task_id}" if resolver.task_type else "local"
is_chief = strategy.extended.should_checkpoint


def log(message: str) -> None:
    print(f"{task}: {message}", flush=True)


log(f"{strategy.num_replicas_in_sync} replicas in sync, chief={is_chief}")

# --- data: every worker loads the same data set; the distributed dataset shards it ----------
digits = load_digits()
features = torch.tensor(digits.data / 16.0, dtype=torch.float32)
labels = torch.tensor(digits.target, dtype=torch.long)
order = torch.randperm(len(features), generator=torch.Generator().manual_seed(0))
train_idx, test_idx = order[:1500], order[1500:]


def global_batches(indices: torch.Tensor, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The epoch's global batches, shuffled identically on every worker."""
    shuffled = indices[torch.randperm(len(indices), generator=torch.Generator().manual_seed(epoch))]
    return [
        (features[shuffled[i : i + GLOBAL_BATCH_SIZE]], labels[shuffled[i : i + GLOBAL_BATCH_SIZE]])
        for i in range(0, len(shuffled), GLOBAL_BATCH_SIZE)
    ]


# --- model and optimizer are created in the strategy's scope ---------------------------------
with strategy.scope():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)


def train_step(batch):
    x, y = batch
    optimizer.zero_grad()
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)  # mean over this replica's batch
    loss.backward()
    optimizer.step()  # gradients are averaged across all replicas first
    correct = (logits.argmax(dim=1) == y).sum().float()
    return loss.detach() * len(y), correct, torch.tensor(float(len(y)))


def eval_step(batch):
    x, y = batch
    with torch.no_grad():
        correct = (model(x).argmax(dim=1) == y).sum().float()
    return correct, torch.tensor(float(len(y)))


checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
backup = checkpoint_dir / "backup.pt"
first_epoch = 0
if backup.exists():  # a restarted job: every worker resumes from the chief's backup
    state = torch.load(backup, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    first_epoch = state["epoch"]
    log(f"restored the backup of epoch {first_epoch}; resuming")

SUM = strategyjob.ReduceOp.SUM
for epoch in range(first_epoch, EPOCHS):
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
    # Reaches the launcher's status line, or the StrategyJob's status.progress in a cluster
    # (only the leader publishes; the other workers' calls do nothing).
    strategyjob.report(
        step=epoch + 1,
        total_steps=EPOCHS,
        loss=round(loss_sum / seen, 4),
        test_accuracy=round(test_correct / test_seen, 4),
    )
    if is_chief:  # written whole, then renamed: a restart never reads half a backup
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "epoch": epoch + 1}, backup.with_suffix(".tmp"))
        backup.with_suffix(".tmp").replace(backup)

# --- only the chief writes the checkpoint (all workers hold identical weights) ---------------
if is_chief:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_dir / "model.pt"
    torch.save({"model": model.state_dict(), "epochs": EPOCHS}, path)
    backup.unlink(missing_ok=True)
    log(f"saved checkpoint {path}")
