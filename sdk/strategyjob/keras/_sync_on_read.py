"""Keras metric variables read as TF's sync-on-read variables: summed over the workers.

One place does the summing, for the metrics of a bound model (``_binding``'s
``get_metrics_result``) and for standalone metrics created in a strategy's scope
(``_watch``). While a read is summed, nested reads (a metric's ``result()`` called by the
model's ``get_metrics_result``, a metric holding metrics) read the values already summed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from strategyjob._reduce import ReduceOp

__all__ = ["detached_copy", "reading_summed", "summed", "sums_over_workers"]

_state = threading.local()


def _cpu_float64(value: Any) -> torch.Tensor:
    """``value`` flattened into a float64 CPU tensor (what one all-reduce of many carries)."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return tensor.detach().reshape(-1).to("cpu", torch.float64)


def sums_over_workers(collectives: Any, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each of ``tensors`` summed over the workers, in its own shape, as float64 on the CPU:
    one all-reduce carries them all."""
    flat = torch.cat([_cpu_float64(t) for t in tensors])
    (total,) = collectives.all_reduce([flat], ReduceOp.SUM)
    parts = torch.split(total, [t.numel() for t in tensors])
    return [part.reshape(t.shape) for part, t in zip(parts, tensors)]


def detached_copy(value: Any) -> Any:
    """A result that cannot alias a metric variable (restored to its local value next)."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def reading_summed() -> bool:
    """Whether this thread is inside :func:`summed` (the variables hold their sums)."""
    return bool(getattr(_state, "depth", 0))


@contextlib.contextmanager
def summed(collectives: Any, variables: Sequence[Any]) -> Iterator[None]:
    """While entered, the Keras ``variables`` hold their sum over the workers (one
    all-reduce); their local values are given back on exit. Re-entered: no second sum."""
    if reading_summed() or not variables:
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            yield
        finally:
            _state.depth -= 1
        return
    local = [v.value.detach().clone() for v in variables]
    totals = sums_over_workers(collectives, local)
    _state.depth = 1
    try:
        for v, value, total in zip(variables, local, totals):
            v.assign(total.to(value.device, value.dtype))
        yield
    finally:
        _state.depth = 0
        for v, value in zip(variables, local):
            v.assign(value)
