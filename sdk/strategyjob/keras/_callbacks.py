"""The callbacks a bound model's ``fit`` runs under MultiWorkerMirroredStrategy.

``BackupAndRestore`` is run by :class:`DistributedBackup` on every worker, so that a restarted
job resumes exactly where the backup was taken, mid-epoch included (TF's Keras 2 resumes at
the saved batch; Keras 3 would redo the saved epoch from its start):

* the chief writes the backup in Keras's files (``latest.weights.h5`` through the binding's
  ``save_weights``, ``training_metadata.json`` with Keras's ``epoch`` / ``batch`` keys), adding
  under ``"strategyjob"`` how many batches of the epoch are done, the fit's shuffling seed and
  the epoch's metric variables summed over the workers; the other workers write nothing;
* every worker restores from that shared directory (Keras's own restore, then the position):
  the binding's ``train_step`` skips the batches already done (their data is still drawn, so
  the rest of the epoch gets the same rows as it would have), and the epoch's metrics are given
  back (the chief holds the sums, the others zeros: the summed read is the global figure);
* ``save_freq=<N>`` backs up every N trained batches, ``"epoch"`` at each epoch's end, and a
  SIGTERM saves after the batch every worker agrees on, then exits 143 (``_preemption``).

Resuming mid-epoch needs each epoch to draw its rows in the same order when it is run again:
:class:`EpochOrder` seeds torch's generator at each epoch's start from the fit's seed and the
epoch (arrays, and DataLoaders shuffled by torch's generator, then shuffle the same way). With
other data (a generator, a ``PyDataset``, a DataLoader with its own generator) or with
``steps_per_epoch`` (an epoch does not restart its data), a batch-frequency backup is refused
(:func:`not_replayed`), and SIGTERM stops the process as it would without the backup (the job
resumes at its last epoch's end).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

import keras
import torch

from strategyjob import _nest
from strategyjob.keras._preemption import PreemptionWatch
from strategyjob.keras._sync_on_read import sums_over_workers
from strategyjob.train._storage import atomic_write

__all__ = ["DistributedBackup", "EpochOrder", "FitState", "distributed"]

_log = logging.getLogger(__name__)

#: Keras's file names in a BackupAndRestore directory (its restore reads them).
WEIGHTS = "latest.weights.h5"
METADATA = "training_metadata.json"

NOT_REPLAYED = (
    "keras.callbacks.BackupAndRestore(save_freq={freq!r}) backs up in the middle of an epoch, "
    "but {why}, so a restarted job could not resume at the saved batch with the same rows. "
    'Use save_freq="epoch", or {fix}.'
)


def not_replayed(x: Any, steps_per_epoch: Any) -> tuple[str, str] | None:
    """Why a rerun epoch of ``fit(x, steps_per_epoch=...)`` may not draw the same rows in the same
    order with torch's generator seeded the same (and what to do); None: it does. Arrays (and
    nests of them) and DataLoaders drawing from torch's generator do."""
    if steps_per_epoch is not None:
        return "with steps_per_epoch an epoch does not restart its data", "leave it unset"
    if isinstance(x, torch.utils.data.DataLoader):
        own = [getattr(o, "generator", None) for o in (x, x.sampler, x.batch_sampler)]
        if all(g is None for g in own):
            return None
        why = "the DataLoader shuffles with its own torch.Generator"
        return why, "let it shuffle with torch's default generator (generator=None)"
    leaves = [] if x is None else _nest.flatten(x)
    if leaves and all(getattr(leaf, "shape", None) is not None for leaf in leaves):
        return None
    why = f"the order of the batches of a {type(x).__name__} is its own"
    return why, "pass arrays or a torch DataLoader"


class FitState:
    """What one ``fit`` call's callbacks and the binding's ``train_step`` share."""

    def __init__(self, seed: int, not_replayed: tuple[str, str] | None) -> None:
        self.seed = seed  # the chief's: each epoch's shuffling seed derives from it
        #: why a rerun epoch may draw other rows (then no mid-epoch backup), or None
        self.not_replayed = not_replayed
        self.skip = 0  # batches of the resumed epoch trained before the restart
        self.watch: PreemptionWatch | None = None  # one per fit, whatever the backups

    def skip_batch(self) -> bool:
        """Whether the batch now given to ``train_step`` was trained before the restart."""
        if self.skip <= 0:
            return False
        self.skip -= 1
        return True

    def close(self) -> None:
        """At the end of ``fit`` (returned or raised): SIGTERM's handler back."""
        if self.watch is not None:
            self.watch.close()
            self.watch = None


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of torch's generator at ``epoch``'s start (the same in every run of the job)."""
    return (seed * 1_000_003 + epoch) % (1 << 63)


class EpochOrder(keras.callbacks.Callback):
    """Seeds torch's generator at each epoch's start, so that an epoch shuffles the same way in
    the run that trains it first and in a restarted run that resumes it (Keras's epoch iterator
    makes each epoch's data iterator, which draws the shuffle, after ``on_epoch_begin``)."""

    def __init__(self, state: FitState) -> None:
        super().__init__()
        self._state = state

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        torch.manual_seed(epoch_seed(self._state.seed, epoch))


class DistributedBackup(keras.callbacks.Callback):
    """A user's ``BackupAndRestore`` run on every worker (see the module docstring)."""

    def __init__(self, backup: keras.callbacks.BackupAndRestore, state: FitState, strategy: Any):
        super().__init__()
        self._backup = backup  # Keras's: restores; its settings say when to save
        self._state = state
        self._strategy = strategy
        self._chief = bool(strategy.extended.should_checkpoint)
        self._epoch = 0
        self._since_save = 0  # trained batches since the last periodic backup
        self._resumed: tuple[int, int] | None = None  # (epoch, batches done) restored
        self._metrics: list[float] | None = None  # the resumed epoch's summed metric variables
        self._watch: PreemptionWatch | None = None
        self._position = (0, 0)  # (epoch, batches done) after the last trained batch

    @property
    def _frequency(self) -> int | None:
        freq = self._backup.save_freq
        return freq if isinstance(freq, int) and not isinstance(freq, bool) else None

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._backup.set_model(model)

    # --- restoring --------------------------------------------------------------------------
    def on_train_begin(self, logs: dict | None = None) -> None:
        self._backup.on_train_begin(logs)  # the weights, and the epoch to start at
        position = _read_position(self._backup.backup_dir)
        if position is not None:
            epoch, done = int(position["epoch"]), int(position["batches_done"])
            self._state.seed = int(position["seed"])
            self._since_save = int(position["since_save"])
            if done:
                self._resumed = (epoch, done)
                self._metrics = list(position["metrics"])
                self._state.skip = done
                _log.warning(
                    "BackupAndRestore: resuming epoch %d after its batch %d (of the backup in %s)",
                    epoch + 1,
                    done,
                    self._backup.backup_dir,
                )
        state = self._state
        if state.not_replayed is None and state.watch is None and PreemptionWatch.possible():
            self._watch = state.watch = PreemptionWatch(self._strategy, self._save_preempted)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch
        if self._resumed is not None and self._resumed[0] == epoch and self._metrics is not None:
            self._give_back_metrics(self._metrics)
            self._metrics = None

    def _give_back_metrics(self, sums: Sequence[float]) -> None:
        """The resumed epoch's metric variables: the chief holds the global sums, the others
        zeros, so that the metrics' summed read is the figure of the batches done so far."""
        variables = _metric_variables(self.model)
        if sum(int(v.value.numel()) for v in variables) != len(sums):
            raise ValueError(
                f"The backup in {self._backup.backup_dir} holds {len(sums)} metric values, the "
                "model's metrics have another number: the model or its compile() changed since "
                "the backup. Remove the backup directory to start the training again."
            )
        flat = torch.tensor(list(sums), dtype=torch.float64)
        if not self._chief:
            flat.zero_()
        start = 0
        for v in variables:
            n = int(v.value.numel())
            v.assign(flat[start : start + n].reshape(v.value.shape).to(v.value.dtype))
            start += n

    # --- saving -----------------------------------------------------------------------------
    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        done = batch + 1
        if self._resumed is not None and (self._epoch, done) <= self._resumed:
            return  # a batch skipped: trained before the restart, its backup already taken
        self._position = (self._epoch, done)
        self._since_save += 1
        freq = self._frequency
        if freq is not None and self._since_save >= freq:
            self._since_save = 0
            self._save(self._epoch, done)
        if self._watch is not None:
            self._watch.after_batch()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._backup.save_freq == "epoch":
            self._save(epoch + 1, 0)

    def _save_preempted(self) -> None:
        epoch, done = self._position
        self._save(epoch, done)
        _log.warning(
            "BackupAndRestore: preempted; backed up epoch %d after its batch %d in %s",
            epoch + 1,
            done,
            self._backup.backup_dir,
        )

    def _save(self, epoch: int, done: int) -> None:
        """Back up the training state after ``done`` batches of ``epoch`` (0: its start), on
        every worker (the chief writes)."""
        backup = self._backup
        metrics: list[float] = []
        if done:  # mid-epoch: the epoch's metrics so far, summed over the workers
            variables = [v.value for v in _metric_variables(self.model)]
            if variables:
                collectives = self._strategy.extended.collectives
                metrics = [
                    x
                    for t in sums_over_workers(collectives, variables)
                    for x in t.reshape(-1).tolist()
                ]
        weights = os.path.join(backup.backup_dir, WEIGHTS)
        metadata = os.path.join(backup.backup_dir, METADATA)
        if self._chief:
            os.makedirs(backup.backup_dir, exist_ok=True)
            if backup.double_checkpoint:
                for path in (weights, metadata):
                    if os.path.exists(path):
                        shutil.copyfile(path, f"{path}.bkp")
        self.model.save_weights(weights, overwrite=True)  # the binding's: the chief writes
        if self._chief:
            position = {
                "epoch": epoch,
                "batches_done": done,
                "seed": self._state.seed,
                "since_save": self._since_save,
                "metrics": metrics,
            }
            record = {"epoch": epoch, "batch": max(done - 1, 0), "strategyjob": position}
            text = json.dumps(record).encode()
            atomic_write(metadata, lambda f: f.write(text))

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._chief and self._backup.delete_checkpoint:
            shutil.rmtree(self._backup.backup_dir, ignore_errors=True)


def _metric_variables(model: keras.Model) -> list[Any]:
    return [v for metric in model.metrics for v in metric.variables]


def _read_position(backup_dir: str) -> dict[str, Any] | None:
    """The position a backup was taken at (None: no backup, or one written by plain Keras,
    which Keras's restore resumes at its epoch's start)."""
    path = os.path.join(backup_dir, METADATA)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        position = json.load(f).get("strategyjob")
    return position if isinstance(position, dict) else None


def distributed(callbacks: Sequence[Any], state: FitState, strategy: Any) -> list[Any]:
    """The callbacks ``fit`` runs: :class:`EpochOrder` first, each ``BackupAndRestore`` as a
    :class:`DistributedBackup`. Refuses a batch-frequency backup when a rerun epoch may draw
    other rows (``state.not_replayed``)."""
    result: list[Any] = [EpochOrder(state)]
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            freq = callback.save_freq
            if freq not in ("epoch", False) and state.not_replayed is not None:
                why, fix = state.not_replayed
                raise ValueError(NOT_REPLAYED.format(freq=freq, why=why, fix=fix))
            callback = DistributedBackup(callback, state, strategy)
        result.append(callback)
    return result
