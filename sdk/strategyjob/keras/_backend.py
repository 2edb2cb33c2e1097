"""Which Keras StrategyJob drives: Keras 3 on its torch backend, in a tested version range."""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "MAX_KERAS",
    "MIN_KERAS",
    "check_keras_backend",
    "check_keras_version",
]

#: The Keras versions the tests run (lowest and newest); pyproject.toml's ``keras`` extra.
MIN_KERAS = (3, 10, 0)
MAX_KERAS = (3, 16, 0)  # exclusive

WRONG_BACKEND = (
    "Keras is running on its {backend!r} backend, but StrategyJob distributes Keras models on "
    "the 'torch' backend only (their layers are torch modules, their fit a torch loop). Set "
    "KERAS_BACKEND=torch before Keras is first imported, or import strategyjob first (it sets "
    "KERAS_BACKEND=torch when it is unset)."
)


def _loaded_backend() -> str | None:
    """The backend of the Keras already imported in this process, else None."""
    config = sys.modules.get("keras.src.backend.config")
    backend = getattr(config, "backend", None)
    return backend() if callable(backend) else None


def check_keras_backend(strategy: Any) -> None:
    """Refuse a strategy's scope while Keras runs on another backend: a model built there
    would not be a torch module, so it would train undistributed and repeat the work."""
    backend = _loaded_backend()
    if backend is not None and backend != "torch":
        raise RuntimeError(WRONG_BACKEND.format(backend=backend))


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


def check_keras_version(version: str) -> None:
    """Refuse a Keras outside the tested range: the binding relies on its trainer's methods."""
    if not MIN_KERAS <= _version_tuple(version) < MAX_KERAS:
        low, high = (".".join(map(str, v)) for v in (MIN_KERAS, MAX_KERAS))
        raise RuntimeError(
            f"Keras {version} is not supported by strategyjob.keras: install a version in "
            f'[{low}, {high}) (pip install "strategyjob[keras]").'
        )
