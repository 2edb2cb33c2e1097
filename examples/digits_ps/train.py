"""Train the digits classifier with ParameterServerStrategy. This program is the chief (the
coordinator); the worker and ps replicas only run `python -m strategyjob.server`. Run it with
`strategyjob run job.yaml`.

The model's parameters live on the ps task; the chief schedules training steps with a
ClusterCoordinator and any free worker runs each one: it reads the parameters from the ps,
computes gradients on a batch of its own dataset and has the ps apply the optimizer. A worker
that dies is replaced transparently: its steps run again elsewhere and it gets work again
when it comes back. Only the imports differ from TensorFlow. The loss curve goes to
TensorBoard event files in LOGDIR (`strategyjob tensorboard` serves them).
"""

from __future__ import annotations

import os
import time

import strategyjob
import torch
from strategyjob import summary
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.experimental.coordinator import ClusterCoordinator

STEPS = int(os.environ.get("STEPS", "300"))
LOG_EVERY = int(os.environ.get("LOG_EVERY", "30"))
LOGDIR = os.environ.get("LOGDIR", "logs")
BATCH_SIZE = 64

torch.set_num_threads(1)
torch.manual_seed(0)

resolver = TFConfigClusterResolver()
strategy = strategyjob.experimental.ParameterServerStrategy(resolver)
coordinator = ClusterCoordinator(strategy)


def log(message: str) -> None:
    print(f"{resolver.task_type}-{resolver.task_id}: {message}", flush=True)


workers = resolver.cluster_spec().num_tasks("worker")
log(f"coordinating {workers} workers and {resolver.cluster_spec().num_tasks('ps')} ps")

with strategy.scope():  # created on the ps
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def load(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits data set (inside scikit-learn, nothing to download): 1,500 train images,
    the rest for test, split the same way in every process."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    features = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(features), generator=torch.Generator().manual_seed(0))
    idx = order[:1500] if split == "train" else order[1500:]
    return features[idx], labels[idx]


def dataset_fn():
    """Runs on each worker: random training batches, forever."""
    features, labels = load("train")
    generator = torch.Generator().manual_seed(int(time.time_ns()) % 2**31)
    while True:
        idx = torch.randint(0, len(features), (BATCH_SIZE,), generator=generator)
        yield features[idx], labels[idx]


per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


def train_step(iterator):
    def step_fn(batch):
        x, y = batch
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()  # applied on the ps
        return loss.detach()

    return strategy.run(step_fn, args=(next(iterator),))


def test_accuracy():
    features, labels = load("test")
    with torch.no_grad():
        return (model(features).argmax(dim=1) == labels).float().mean()


# tf.summary's writer (the chief is the job's one writer); flushed at least every 10 s, so that
# TensorBoard's curve trails training by no more than that
writer = summary.create_file_writer(LOGDIR, flush_millis=10_000)
started = time.perf_counter()
for done in range(LOG_EVERY, STEPS + 1, LOG_EVERY):
    losses = [
        coordinator.schedule(train_step, args=(per_worker_iterator,)) for _ in range(LOG_EVERY)
    ]
    coordinator.join()
    mean = sum(float(loss.fetch()) for loss in losses) / len(losses)
    log(f"step {done}/{STEPS}: loss {mean:.4f} ({time.perf_counter() - started:.1f}s)")
    with writer.as_default(step=done):
        summary.scalar("loss", mean)
    strategyjob.report(step=done, total_steps=STEPS, loss=round(mean, 4))

accuracy = float(coordinator.schedule(test_accuracy).fetch())
log(f"test accuracy {accuracy:.4f}")
