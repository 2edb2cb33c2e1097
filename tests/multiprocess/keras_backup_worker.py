"""One MultiWorkerMirroredStrategy task fitting with ``BackupAndRestore`` on a directory both
workers share (KERAS_SAVE_DIR). With INTERRUPT set, both workers fail as epoch 3 begins (after
the backup of epoch 2), as a killed job does; run again without it, the job resumes there.

``python keras_backup_worker.py`` prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os

import keras  # KERAS_BACKEND=torch: set by the test
import numpy as np
import strategyjob as sj
import torch

torch.set_num_threads(1)


class Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if epoch == 2 and os.environ.get("INTERRUPT"):
            raise KeyboardInterrupt("interrupted as epoch 3 begins")


class Epochs(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.begun: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.begun.append(epoch)


def main() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    epochs = Epochs()
    backup = keras.callbacks.BackupAndRestore(os.environ["KERAS_SAVE_DIR"])
    interrupted = False
    try:
        model.fit(
            x, x[:, :2], batch_size=4, epochs=4, verbose=0, callbacks=[backup, Interrupt(), epochs]
        )
    except KeyboardInterrupt:
        interrupted = True
    result = {
        "worker": strategy.cluster_resolver.task_id,
        "interrupted": interrupted,
        "epochs": epochs.begun,
        "weights": [w.tolist() for w in model.get_weights()],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
