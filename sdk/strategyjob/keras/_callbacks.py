"""Keras callbacks that write files, as the workers other than the chief run them.

``BackupAndRestore`` writes its backup with ``model.save_weights`` (the chief writes it, see
``_binding``) but also writes its metadata file itself and deletes the whole backup directory
when training ends: on storage the workers share, two workers doing that collide (one worker's
``rmtree`` fails on the files the other removed). As TF's Keras does, a worker other than the
chief restores from the shared directory and writes its own backups somewhere temporary.
"""

from __future__ import annotations

import os
from typing import Any

import keras

__all__ = ["MID_EPOCH_BACKUP", "check_backup_frequency", "for_worker"]

MID_EPOCH_BACKUP = (
    "keras.callbacks.BackupAndRestore(save_freq={freq!r}) backs up in the middle of an epoch, "
    "but Keras 3 resumes such a backup at the start of that epoch, so a restarted or preempted "
    'job would train on the epoch\'s first batches twice. Use save_freq="epoch" (the default): '
    "the restarted job resumes after its last completed epoch."
)


class _WorkerBackup(keras.callbacks.Callback):
    """``BackupAndRestore`` on a worker other than the chief: restores the chief's backup from
    the shared directory, saves at the same points as the chief (``save_weights`` takes part
    in the chief's save) into ``scratch``, which it deletes at the end."""

    def __init__(self, shared: keras.callbacks.BackupAndRestore, scratch: str) -> None:
        super().__init__()
        self._restore = shared
        self._save = keras.callbacks.BackupAndRestore(
            scratch,
            save_freq=shared.save_freq,
            double_checkpoint=shared.double_checkpoint,
            delete_checkpoint=True,
        )

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._restore.set_model(model)
        self._save.set_model(model)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._restore.on_train_begin(logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._save.on_epoch_end(epoch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._save.on_train_batch_end(batch, logs)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._save.on_train_end(logs)


def for_worker(callbacks: list[Any] | tuple[Any, ...], scratch: str) -> list[Any]:
    """The callbacks a worker other than the chief runs: each ``BackupAndRestore`` replaced by
    its worker form, writing under ``scratch`` (a directory the caller removes)."""
    result = []
    for i, callback in enumerate(callbacks):
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            callback = _WorkerBackup(callback, os.path.join(scratch, f"backup-{i}"))
        result.append(callback)
    return result


def check_backup_frequency(callbacks: Any) -> None:
    """Refuse a ``BackupAndRestore`` saving every N batches: Keras 3 restores the epoch only,
    not the batch, so resuming its backup would repeat the batches already trained on (TF's
    Keras 2 skips them; Keras 3 has no way to). ``save_freq=False`` (never backs up) passes."""
    for callback in callbacks if isinstance(callbacks, (list, tuple)) else ():
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            freq = callback.save_freq
            if freq not in ("epoch", False):
                raise ValueError(MID_EPOCH_BACKUP.format(freq=freq))
