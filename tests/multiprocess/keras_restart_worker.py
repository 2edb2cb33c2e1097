"""One replica of a 2-worker MultiWorkerMirroredStrategy job under ``strategyjob run``, fitting
with ``BackupAndRestore`` on a directory both workers share. In the job's first run, worker 1
stops in the middle of epoch ``STOP_IN`` (after its batch 1) and writes its pid
(``OUT/blocked-pid``) for the test to signal it; the launcher restarts the whole job.

* ``epoch`` (SIGKILL): backups at each epoch's end; the job resumes after the last completed
  epoch. The result compares the weights with plain Keras fit uninterrupted on one process.
* ``batches`` (SIGKILL): a shuffled fit backed up every 2 batches, so after batch 1 of epoch
  ``STOP_IN``; the job resumes after that batch.
* ``preempted`` (SIGTERM): a shuffled fit backed up at epochs' ends; worker 1 goes on once the
  test has signalled it (``OUT/signalled``), and every worker backs up after the next batch
  and exits 143 (the preemption path); the job resumes after that batch.

In the shuffled modes the result compares the weights and the history with the same 2-worker
fit run uninterrupted afterwards in the same job (same initial weights, same seed).

``python keras_restart_worker.py OUT MODE`` prints one ``RESULT {json}`` line when fit ends.
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
MODE = sys.argv[2] if len(sys.argv) > 2 else "epoch"
STOP_IN, EPOCHS = 2, 4  # epochs 0-based: stopped within epoch 2 of 0..3 (4 batches each)


class StoppedOnce(keras.callbacks.Callback):
    """Worker 1, first run: after batch 1 of epoch ``STOP_IN``, wait for the test's signal
    (60 s at most); once signalled with SIGTERM (``OUT/signalled``), train on."""

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
            if (OUT / "signalled").exists():
                return
            time.sleep(0.05)
        raise SystemExit("not signalled within 60 s")


def _layers() -> list:
    return [keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)]


def _compiled(strategy: sj.MultiWorkerMirroredStrategy, initial: list | None) -> keras.Model:
    with strategy.scope():
        model = keras.Sequential(_layers())
    if initial is not None:
        model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model


def main() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    worker = strategy.cluster_resolver.task_id
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    keras.utils.set_random_seed(0)  # the same initial weights in every run of the job
    model = _compiled(strategy, None)
    initial = model.get_weights()
    epochs = Epochs()
    stop = StoppedOnce(worker)
    fit = dict(batch_size=4, epochs=EPOCHS, shuffle=MODE != "epoch", verbose=0)
    if MODE == "epoch":
        backup = keras.callbacks.BackupAndRestore(str(OUT / "backup"))
        callbacks = [backup, stop, epochs]
    elif MODE == "batches":  # backed up after batch 1, then stopped
        backup = keras.callbacks.BackupAndRestore(str(OUT / "backup"), save_freq=2)
        callbacks = [backup, stop, epochs]
    else:  # preempted: the notice is voted on at this batch's end, after the stop
        backup = keras.callbacks.BackupAndRestore(str(OUT / "backup"))
        callbacks = [stop, backup, epochs]
    keras.utils.set_random_seed(1)  # fit's shuffling seed, the same in the reference below
    history = model.fit(x, y, callbacks=callbacks, **fit)

    if MODE == "epoch":
        reference = keras.Sequential(_layers())  # plain Keras, one process, never interrupted
        reference.set_weights(initial)
        reference.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
        reference.fit(x, y, **fit)
        expected: dict = {}
    else:  # the same 2-worker fit, never interrupted
        reference = _compiled(strategy, initial)
        keras.utils.set_random_seed(1)
        expected = reference.fit(x, y, **fit).history
    diff = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())
    )
    result = {
        "worker": worker,
        "epochs": epochs.begun,
        "weights_diff": diff,
        "steps": int(model.optimizer.iterations),
        "history": history.history,
        "expected": {k: v[-len(epochs.begun) :] for k, v in expected.items()},
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
