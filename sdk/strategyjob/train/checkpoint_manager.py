"""``strategyjob.train.CheckpointManager``: numbered checkpoints in one directory, the newest
``max_to_keep`` kept (``tf.train.CheckpointManager``).

The directory's state file lists the kept checkpoints; it is rewritten atomically after each
checkpoint file is in place, so a process killed while saving leaves the previous list, whose
checkpoints are all complete. Under a strategy with several workers every worker calls ``save``
and keeps the same bookkeeping, but only the chief writes, records and deletes files; the
directory must be one all workers can read (a shared volume) for them to restore.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from strategyjob.train import _storage
from strategyjob.train.checkpoint import Checkpoint, role, write_to

__all__ = ["CheckpointManager"]

_log = logging.getLogger(__name__)


def _evaluate(value: Any) -> int:
    """An int from an int, a tensor or a variable (a step counter or checkpoint number)."""
    return int(value)


class CheckpointManager:
    """Manages the checkpoints of one ``Checkpoint`` in ``directory``.

    Args:
      checkpoint: the ``strategyjob.train.Checkpoint`` to save and restore.
      directory: where checkpoints and the state file (``checkpoint``) live.
      max_to_keep: how many recent checkpoints to keep; ``None`` keeps all.
      keep_checkpoint_every_n_hours: additionally keep one checkpoint per this many hours.
      checkpoint_name: the checkpoints' file prefix (``ckpt-1``, ``ckpt-2``, ...).
      step_counter: the training step (int-convertible), read when ``checkpoint_interval``
        is set.
      checkpoint_interval: save only when ``step_counter`` advanced by at least this much
        since the last save.
      init_fn: called by ``restore_or_initialize`` when there is no checkpoint.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        directory: str | os.PathLike,
        max_to_keep: int | None,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                "CheckpointManager expects a strategyjob.train.Checkpoint, got "
                f"{type(checkpoint).__name__}. Wrap the objects: Checkpoint(model=model, ...)."
            )
        if max_to_keep is not None and max_to_keep <= 0:
            raise ValueError(
                f"Expected a positive integer or `None` for `max_to_keep`, got {max_to_keep}."
            )
        if checkpoint_interval is not None and step_counter is None:
            raise ValueError(
                "`step_counter` should be passed if `checkpoint_interval` is not None."
            )
        if not checkpoint_name or os.sep in checkpoint_name:
            raise ValueError(
                f"`checkpoint_name` must be a file name prefix without {os.sep!r}, got "
                f"{checkpoint_name!r}."
            )
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._max_to_keep = max_to_keep
        self._keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self._checkpoint_name = checkpoint_name
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._init_fn = init_fn
        self._last_checkpoint_step: int | None = None
        self._swept_temporaries = False
        self._maybe_delete: collections.OrderedDict[str, float] = collections.OrderedDict()

        now = time.time()
        state = _storage.get_checkpoint_state(self._directory)
        self._latest_checkpoint: str | None = None
        if state is None:
            # a little in the past: a manager re-created at once still preserves by the clock
            self._last_preserved_timestamp = now - 1.0
            return
        self._last_preserved_timestamp = min(state.last_preserved_timestamp, now)
        paths = state.all_model_checkpoint_paths
        stamps = state.all_model_checkpoint_timestamps or [self._last_preserved_timestamp] * len(
            paths
        )
        for path, stamp in zip(paths, stamps):
            stamp = min(stamp, now)
            if stamp > self._last_preserved_timestamp and os.path.isfile(path):
                self._maybe_delete[path] = stamp
        if os.path.isfile(state.model_checkpoint_path):
            self._latest_checkpoint = state.model_checkpoint_path
        else:  # listed but gone: fall back to the newest listed one that exists
            existing = [p for p in paths if os.path.isfile(p)]
            self._latest_checkpoint = existing[-1] if existing else None

    # -- properties ----------------------------------------------------------------------------
    @property
    def directory(self) -> str:
        return self._directory

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def checkpoint_interval(self) -> int | None:
        return self._checkpoint_interval

    @property
    def latest_checkpoint(self) -> str | None:
        """The path of the newest checkpoint, or None."""
        return self._latest_checkpoint

    @property
    def checkpoints(self) -> list[str]:
        """The checkpoints this manager may still delete, oldest first (those kept by
        ``keep_checkpoint_every_n_hours`` are no longer listed)."""
        return list(self._maybe_delete)

    # -- saving --------------------------------------------------------------------------------
    def _record_state(self) -> None:
        if self._latest_checkpoint is None:
            return
        _storage.update_checkpoint_state(
            self._directory,
            model_checkpoint_path=self._latest_checkpoint,
            all_model_checkpoint_paths=list(self._maybe_delete),
            all_model_checkpoint_timestamps=list(self._maybe_delete.values()),
            last_preserved_timestamp=self._last_preserved_timestamp,
        )

    def _sweep(self) -> list[str]:
        """Forget checkpoints beyond ``max_to_keep``; returns the files to delete."""
        doomed: list[str] = []
        if not self._max_to_keep:
            return doomed
        while len(self._maybe_delete) > self._max_to_keep:
            path, stamp = self._maybe_delete.popitem(last=False)
            hours = self._keep_checkpoint_every_n_hours
            if hours and stamp - hours * 3600.0 >= self._last_preserved_timestamp:
                self._last_preserved_timestamp = stamp
                continue
            doomed.append(path)
        return doomed

    @staticmethod
    def _delete(paths: list[str]) -> None:
        for path in paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                _log.warning("Could not delete old checkpoint %s: %s", path, e)

    def save(
        self, checkpoint_number: Any = None, check_interval: bool = True, options: Any = None
    ) -> str | None:
        """Save a checkpoint numbered ``checkpoint_number`` (default: the checkpoint's
        incremented ``save_counter``); returns its path, or None when ``checkpoint_interval``
        says it is not time yet. Call it on every worker."""
        if self._checkpoint_interval is not None:
            step = _evaluate(self._step_counter)
            if self._last_checkpoint_step is not None:
                if step == self._last_checkpoint_step:
                    return None
                if check_interval and step < self._last_checkpoint_step + self._checkpoint_interval:
                    return None
            self._last_checkpoint_step = step

        save_counter = self._checkpoint.save_counter
        save_counter.add_(1)  # in place: the checkpoint's own counter, saved with it
        if checkpoint_number is None:
            checkpoint_number = save_counter
        path = f"{self._prefix}-{_evaluate(checkpoint_number)}"

        # the same bookkeeping on every worker; only the chief's is written down
        previous = (
            collections.OrderedDict(self._maybe_delete),
            self._latest_checkpoint,
            self._last_preserved_timestamp,
        )
        self._maybe_delete.pop(path, None)  # re-saved: moves to the end
        self._maybe_delete[path] = time.time()
        self._latest_checkpoint = path

        def record_and_sweep() -> None:  # the chief, once the file is in place
            if not self._swept_temporaries:
                self._swept_temporaries = True
                _storage.remove_stale_temporaries(
                    self._directory, [f"{self._checkpoint_name}-", _storage.STATE_FILENAME]
                )
            # the list drops old files before they go: every listed checkpoint exists
            doomed = self._sweep()
            self._record_state()
            self._delete(doomed)

        try:
            write_to(self._checkpoint, path, after=record_and_sweep)
        except BaseException:
            self._maybe_delete, self._latest_checkpoint, self._last_preserved_timestamp = previous
            raise
        if not role(self._checkpoint).is_chief:
            self._sweep()
        return path

    # -- restoring -----------------------------------------------------------------------------
    def restore_or_initialize(self) -> str | None:
        """Restore the latest checkpoint and return its path; with none, call ``init_fn`` and
        return None. Under several workers, all of them must see the same latest checkpoint
        (a shared directory), else this raises instead of letting them diverge."""
        found = self._latest_checkpoint is not None
        who = role(self._checkpoint)
        some = who.agree(found)
        every = not who.agree(not found)
        if some and not every:
            raise RuntimeError(
                f"Only some workers see a checkpoint in {self._directory} (this one: "
                f"{self._latest_checkpoint or 'none'}). Put the checkpoint directory on storage "
                "that every worker reads, e.g. a shared volume."
            )
        if found:
            self._checkpoint.restore(self._latest_checkpoint)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = _evaluate(self._step_counter)
            return self._latest_checkpoint
        if self._init_fn is not None:
            self._init_fn()
            _log.info("No checkpoint in %s; initialized with init_fn.", self._directory)
        return None
