"""Train a small classifier on scikit-learn's handwritten digits with Keras ``fit`` under
MultiWorkerMirroredStrategy: one process per worker. Run it with `strategyjob run job.yaml`.

This is TensorFlow's Keras multi-worker tutorial on Keras 3's torch backend: the model is
built in the strategy's scope, so ``compile`` / ``fit`` / ``evaluate`` / ``save`` use the
strategy. ``batch_size`` is the global batch (each worker trains on its own rows of it), the
history and the callbacks' logs are the global figures (the same on every worker), and only
the chief writes the saved model.
"""

from __future__ import annotations

import os
from pathlib import Path

import keras  # KERAS_BACKEND=torch, set in job.yaml
import numpy as np
import strategyjob
import torch
from sklearn.datasets import load_digits

GLOBAL_BATCH_SIZE = int(os.environ.get("GLOBAL_BATCH_SIZE", "64"))
EPOCHS = int(os.environ.get("EPOCHS", "8"))

torch.set_num_threads(1)

# The cluster comes from TF_CONFIG, which `strategyjob run` (or the operator) sets.
strategy = strategyjob.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
task = f"{resolver.task_type}-{resolver.task_id}" if resolver.task_type else "local"


def log(message: str) -> None:
    print(f"{task}: {message}", flush=True)


log(f"{strategy.num_replicas_in_sync} replicas in sync, Keras {keras.__version__}")

# --- data: every worker loads the same data; fit gives each worker its rows of each batch ----
digits = load_digits()
features = (digits.data / 16.0).astype("float32")
labels = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(features))
train, test = order[:1500], order[1500:]

# --- the model is built in the strategy's scope: it is bound to the strategy -----------------
with strategy.scope():
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)]
    )
model.compile(
    optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)


class Report(keras.callbacks.Callback):
    """Logs each epoch's global figures and reports progress (only the leader publishes)."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        loss, accuracy, test_accuracy = logs["loss"], logs["accuracy"], logs["val_accuracy"]
        log(
            f"epoch {epoch + 1}/{EPOCHS}: loss {loss:.4f}, accuracy {accuracy:.4f}, "
            f"test accuracy {test_accuracy:.4f}"
        )
        strategyjob.report(
            step=epoch + 1,
            total_steps=EPOCHS,
            loss=round(loss, 4),
            test_accuracy=round(test_accuracy, 4),
        )


model.fit(
    features[train],
    labels[train],
    batch_size=GLOBAL_BATCH_SIZE,
    epochs=EPOCHS,
    validation_data=(features[test], labels[test]),
    verbose=0,
    callbacks=[Report()],
)

# --- every worker calls save; the chief writes it (shared storage), the others a temporary copy --
checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
checkpoint_dir.mkdir(parents=True, exist_ok=True)
model.save(checkpoint_dir / "model.keras")
log(f"saved {checkpoint_dir / 'model.keras'}")
