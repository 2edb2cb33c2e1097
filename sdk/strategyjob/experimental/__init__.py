"""``strategyjob.experimental``: mirrors ``tf.distribute.experimental``."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC: dict[str, str] = {
    "MultiWorkerMirroredStrategy": "strategyjob.strategies.multi_worker_mirrored",
    "CentralStorageStrategy": "strategyjob.strategies.central_storage",
    "CommunicationOptions": "strategyjob.collective.options",
    "CommunicationImplementation": "strategyjob.collective.options",
    "AutoShardPolicy": "strategyjob.input",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
