"""Capture: a Keras model built in a strategy's scope is bound to that strategy.

Keras 3's torch layers are ``torch.nn.Module``s: building one in scope registers submodules
(its layers, its ``_torch_params``), which ``collective.grad_sync`` reports to the observer
below with the strategy whose scope is entered. Nothing here imports Keras: a module can only
be a Keras model if Keras is already imported.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

__all__ = ["on_module_in_scope", "strategy_of"]

_bound: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()


def on_module_in_scope(strategy: Any, module: torch.nn.Module) -> None:
    """Bind ``module`` to ``strategy`` if it is a Keras model not bound yet (the strategy it
    was first built in keeps it, as TF's model keeps the strategy of its creation)."""
    keras = sys.modules.get("keras")
    model_class = getattr(keras, "Model", None)
    if model_class is None or not isinstance(module, model_class) or module in _bound:
        return
    _bound[module] = strategy
    from strategyjob.keras import _binding

    _binding.bind(module, strategy)


def strategy_of(model: Any) -> Any:
    """The strategy ``model`` was built in (None: plain Keras, not captured by any strategy)."""
    try:
        return _bound.get(model)
    except TypeError:  # not weak-referenceable: no torch module, so never bound
        return None
