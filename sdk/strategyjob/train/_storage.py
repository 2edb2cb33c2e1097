"""Files of a checkpoint directory: atomic writes and the state file listing the checkpoints.

Every file is written to a hidden temporary file in its final directory, flushed, fsynced and
renamed over the final name (then the directory is fsynced), so a reader sees either the
complete old file or the complete new one, even if the writer is killed mid-write. A killed
writer leaves only its temporary file (``.NAME.tmp-PID-RANDOM``), which no reader looks at.

The state file (``checkpoint``, as TensorFlow names it) is JSON with the fields of TensorFlow's
``CheckpointState``; paths inside the directory are stored relative to it, so a directory can be
moved or mounted elsewhere.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = [
    "STATE_FILENAME",
    "CheckpointState",
    "atomic_write",
    "atomic_write_path",
    "get_checkpoint_state",
    "latest_checkpoint",
    "remove_stale_temporaries",
    "update_checkpoint_state",
]

STATE_FILENAME = "checkpoint"
_TMP_MARK = ".tmp-"


def _temporary_name(path: str) -> str:
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def _fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace_with(path: str, tmp: str, write: Callable[[], Any]) -> Any:
    """``write()`` (which writes ``tmp``, flushed to disk), then ``tmp`` replaces ``path``; on
    any failure ``tmp`` is removed and ``path`` left as it was."""
    try:
        result = write()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(os.path.dirname(os.path.abspath(path)))
    return result


def atomic_write(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` through ``write(file)`` so that it is either complete or absent.

    The temporary file lives in the same directory (a rename is atomic only within one file
    system) and is created with the process's umask, like any file the user writes.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = _temporary_name(path)

    def write_tmp() -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())

    _replace_with(path, tmp, write_tmp)


def atomic_write_path(path: str, write: Callable[[str], Any]) -> Any:
    """``atomic_write`` for writers that take a path (Keras's ``save_weights``): ``write`` gets
    a temporary path in the same directory that ends as ``path`` does (Keras checks the
    ending), which then replaces ``path``; returns what ``write`` returns."""
    directory, base = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.getpid()}-{secrets.token_hex(4)}{_TMP_MARK}-{base}")

    def write_tmp() -> Any:
        result = write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return result

    return _replace_with(path, tmp, write_tmp)


def remove_stale_temporaries(directory: str, names: Sequence[str]) -> list[str]:
    """Delete the temporary files that killed writers left for files named ``names*``."""
    removed = []
    for name in names:
        pattern = os.path.join(glob.escape(directory), f".{glob.escape(name)}*{_TMP_MARK}*")
        for tmp in glob.glob(pattern):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
                removed.append(tmp)
    return removed


@dataclass
class CheckpointState:
    """The state file's contents (TensorFlow's ``CheckpointState``), paths made absolute."""

    model_checkpoint_path: str
    all_model_checkpoint_paths: list[str] = field(default_factory=list)
    all_model_checkpoint_timestamps: list[float] = field(default_factory=list)
    last_preserved_timestamp: float = 0.0


def _state_path(directory: str, latest_filename: str | None) -> str:
    return os.path.join(directory, latest_filename or STATE_FILENAME)


def _stored(directory: str, path: str) -> str:
    """``path`` relative to ``directory`` when it lies inside it, else absolute."""
    absolute = os.path.abspath(path)
    root = os.path.abspath(directory)
    if os.path.dirname(absolute) == root:
        return os.path.basename(absolute)
    return absolute


def _loaded(directory: str, stored: str) -> str:
    return stored if os.path.isabs(stored) else os.path.join(directory, stored)


def get_checkpoint_state(
    checkpoint_dir: str | os.PathLike, latest_filename: str | None = None
) -> CheckpointState | None:
    """The state file of ``checkpoint_dir``, or None when there is none."""
    directory = os.fspath(checkpoint_dir)
    path = _state_path(directory, latest_filename)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        state = CheckpointState(
            model_checkpoint_path=_loaded(directory, str(data["model_checkpoint_path"])),
            all_model_checkpoint_paths=[
                _loaded(directory, str(p)) for p in data.get("all_model_checkpoint_paths", [])
            ],
            all_model_checkpoint_timestamps=[
                float(t) for t in data.get("all_model_checkpoint_timestamps", [])
            ],
            last_preserved_timestamp=float(data.get("last_preserved_timestamp", 0.0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path} is not a strategyjob checkpoint state file (JSON with "
            f"'model_checkpoint_path'): {e}. Use a directory of strategyjob checkpoints, or "
            "delete that file."
        ) from None
    return state


def update_checkpoint_state(
    save_dir: str,
    model_checkpoint_path: str,
    all_model_checkpoint_paths: Sequence[str],
    all_model_checkpoint_timestamps: Sequence[float] | None = None,
    last_preserved_timestamp: float | None = None,
    latest_filename: str | None = None,
) -> None:
    """Write the state file of ``save_dir`` atomically."""
    data: dict[str, Any] = {
        "model_checkpoint_path": _stored(save_dir, model_checkpoint_path),
        "all_model_checkpoint_paths": [_stored(save_dir, p) for p in all_model_checkpoint_paths],
    }
    if all_model_checkpoint_timestamps is not None:
        data["all_model_checkpoint_timestamps"] = list(all_model_checkpoint_timestamps)
    if last_preserved_timestamp is not None:
        data["last_preserved_timestamp"] = last_preserved_timestamp
    text = json.dumps(data, indent=1) + "\n"
    atomic_write(_state_path(save_dir, latest_filename), lambda f: f.write(text.encode("utf-8")))


def latest_checkpoint(
    checkpoint_dir: str | os.PathLike, latest_filename: str | None = None
) -> str | None:
    """The path of the latest checkpoint the state file of ``checkpoint_dir`` lists, or None
    when there is none (``tf.train.latest_checkpoint``)."""
    state = get_checkpoint_state(checkpoint_dir, latest_filename)
    if state is None or not os.path.isfile(state.model_checkpoint_path):
        return None
    return state.model_checkpoint_path
