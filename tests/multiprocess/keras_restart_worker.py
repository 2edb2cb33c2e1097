"""One replica of a 2-worker MultiWorkerMirroredStrategy job under ``strategyjob run``, fitting
with ``BackupAndRestore`` on a directory both workers share. In the job's first run, worker 1
stops in the middle of epoch ``STOP_IN`` (after its batch 1) and writes its pid
(``OUT/blocked-pid``) for the test to signal it (SIGKILL, or SIGTERM as a preemption); the
launcher restarts the whole job, which resumes after the last completed, backed-up epoch. The
result compares the weights with plain Keras fit uninterrupted on one process.

``python keras_restart_worker.py OUT`` prints one ``RESULT {json}`` line when fit ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import keras  # KERAS_BACKEND=torch: set by the test
import numpy as np
import strategyjob as sj
import torch
from keras_backup_worker import Epochs  # this script's folder is on sys.path

torch.set_num_threads(1)

OUT = Path(sys.argv[1])
STOP_IN, EPOCHS = 2, 4  # epochs 0-based: stopped within epoch 2 of 0..3 (4 batches each)


class StoppedOnce(keras.callbacks.Callback):
    """Worker 1, first run: after batch 1 of epoch ``STOP_IN``, wait for the test's signal
    (60 s at most)."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker
        self.epoch = -1

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        marker = OUT / "blocked-pid"
        if self.worker != 1 or (self.epoch, batch) != (STOP_IN, 1) or marker.exists():
            return
        (OUT / "blocked-pid.tmp").write_text(str(os.getpid()))
        os.rename(OUT / "blocked-pid.tmp", marker)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise SystemExit("not signalled within 60 s")


def _layers() -> list:
    return [keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)]


def main() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    worker = strategy.cluster_resolver.task_id
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    keras.utils.set_random_seed(0)  # the same initial weights in every run of the job
    with strategy.scope():
        model = keras.Sequential(_layers())
    initial = model.get_weights()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    epochs = Epochs()
    backup = keras.callbacks.BackupAndRestore(str(OUT / "backup"))
    fit = dict(batch_size=4, epochs=EPOCHS, shuffle=False, verbose=0)
    model.fit(x, y, callbacks=[backup, StoppedOnce(worker), epochs], **fit)

    reference = keras.Sequential(_layers())  # plain Keras, one process, never interrupted
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    reference.fit(x, y, **fit)
    diff = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())
    )
    result = {"worker": worker, "epochs": epochs.begun, "weights_diff": diff}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
