"""``strategyjob.compat``: mirrors ``tf.compat``; ``strategyjob.compat.v1`` holds the v1 API."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["v1"]


def __getattr__(name: str) -> ModuleType:
    if name == "v1":
        return importlib.import_module(".v1", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
