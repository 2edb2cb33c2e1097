"""StrategyJob: the tf.distribute programming model on PyTorch.

Code written against ``tf.distribute`` ports by replacing ``tf.distribute`` with
``strategyjob``. The public names below are loaded lazily so that the torch-free
parts of the package (``strategyjob.jobspec``, ``strategyjob.cluster_resolver``,
``strategyjob.launcher``, ``strategyjob.client``) can be imported by the operator without
pulling in torch.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__version__ = "0.1.0"

# Keras reads its backend once, when first imported; StrategyJob distributes Keras models on
# the torch backend only (strategyjob.keras refuses a strategy scope under another one).
if "keras" not in sys.modules:
    os.environ.setdefault("KERAS_BACKEND", "torch")

# public name -> module that defines it (relative to this package)
_PUBLIC: dict[str, str] = {
    # contexts
    "ReplicaContext": "._context",
    "get_strategy": "._context",
    "has_strategy": "._context",
    "in_cross_replica_context": "._context",
    "get_replica_context": "._context",
    "get_cross_replica_context": "._context",
    "experimental_set_strategy": "._context",
    # values and variables
    "DistributedValues": "._values",
    "PerReplica": "._values",
    "Mirrored": "._values",
    "ValueContext": "._values",
    "ReduceOp": "._reduce",
    "VariableSynchronization": "._variables",
    "VariableAggregation": "._variables",
    "Variable": "._variables",
    # input distribution
    "InputContext": ".input",
    "InputOptions": ".input",
    "InputReplicationMode": ".input",
    # strategies
    "Strategy": ".strategies.base",
    "StrategyExtended": ".strategies.base",
    "RunOptions": ".strategies.base",
    "OneDeviceStrategy": ".strategies.one_device",
    "MirroredStrategy": ".strategies.mirrored",
    "CentralStorageStrategy": ".strategies.central_storage",
    "MultiWorkerMirroredStrategy": ".strategies.multi_worker_mirrored",
    "ParameterServerStrategy": ".strategies.parameter_server",
    "TPUStrategy": ".strategies.tpu",
    # parameter servers
    "ShardedVariable": ".ps.sharded_variable",
    "Server": ".ps.server",
    # training progress (torch-free)
    "report": "._progress",
}

_SUBMODULES = {
    "client",
    "cluster_resolver",
    "compat",
    "errors",
    "experimental",
    "input",
    "jobspec",
    "keras",
    "launcher",
    "nn",
    "runner",
    "server",
    "tpu",
    "train",
}

__all__ = sorted(_PUBLIC) + sorted(_SUBMODULES)


# Names that need no torch; every other public name loads the strategies first, which give the
# contexts below them their default strategy (``_context.set_default_strategy_maker``).
_TORCH_FREE = {"report", "client", "cluster_resolver", "errors", "jobspec", "launcher"}


def __getattr__(name: str) -> Any:
    if name in _PUBLIC or name in _SUBMODULES:
        if name not in _TORCH_FREE:
            importlib.import_module(".strategies.base", __name__)
            # Keras models built in a strategy's scope are bound to it (imports no Keras).
            importlib.import_module(".keras", __name__)
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
        globals()[name] = value  # cache: later lookups skip __getattr__
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
