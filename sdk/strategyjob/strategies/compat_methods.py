"""The ``tf.compat.v1`` strategy methods, as a mixin for any ``Strategy``.

TensorFlow keeps ``experimental_run``, ``make_dataset_iterator``, ``make_input_fn_iterator`` and
``update_config_proto`` on ``StrategyBase``, so the v2 classes have them too
(``experimental_make_numpy_dataset`` is on every strategy: ``strategies/base.py``). They are
thin layers over ``run``, ``experimental_distribute_dataset`` and
``distribute_datasets_from_function``; ported TF1 code keeps working unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from strategyjob import errors
from strategyjob.input.datasets import NumpyDataset
from strategyjob.input.options import InputReplicationMode

__all__ = ["CompatV1StrategyMethods", "InputIterator", "NumpyDataset"]


class InputIterator:
    """``tf.distribute.InputIterator``: ``get_next()`` per step, ``initialize()`` (a no-op eagerly).

    Iterating with ``for``/``next()`` ends with ``StopIteration``; ``get_next()`` ends with
    :class:`strategyjob.errors.OutOfRangeError`.
    """

    def __init__(self, make_iterator: Callable[[], Iterator[Any]]) -> None:
        self._make_iterator = make_iterator
        self._iterator: Iterator[Any] | None = None

    def initialize(self) -> list:
        """(Re)start from the first element; returns ``[]`` (no init ops to run eagerly)."""
        self._iterator = iter(self._make_iterator())
        return []

    @property
    def initializer(self) -> list:
        """TF1's initializer op; eagerly it (re)initialises and is ``[]``."""
        return self.initialize()

    def _ensure(self) -> Iterator[Any]:
        if self._iterator is None:
            self.initialize()
        assert self._iterator is not None
        return self._iterator

    def get_next(self) -> Any:
        """The next per-replica element; ``OutOfRangeError`` at the end of the input."""
        iterator = self._ensure()
        get_next = getattr(iterator, "get_next", None)
        if callable(get_next):
            return get_next()
        try:
            return next(iterator)
        except StopIteration:
            raise errors.OutOfRangeError("End of sequence") from None

    def __iter__(self) -> InputIterator:
        return self

    def __next__(self) -> Any:
        return next(self._ensure())


class CompatV1StrategyMethods:
    """Mixin: the deprecated TF1 methods, on top of the v2 API of the class it is mixed into."""

    def make_dataset_iterator(self, dataset: Any) -> InputIterator:
        """An iterator over ``dataset`` (batched by the global batch size), split across replicas
        exactly like ``experimental_distribute_dataset``."""
        distributed = self.experimental_distribute_dataset(dataset)  # type: ignore[attr-defined]
        return InputIterator(lambda: iter(distributed))

    def make_input_fn_iterator(
        self,
        input_fn: Callable[[Any], Any],
        replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER,
    ) -> InputIterator:
        """An iterator over the per-replica-batched dataset ``input_fn(input_context)`` returns;
        ``input_fn`` is called once per worker."""
        if replication_mode != InputReplicationMode.PER_WORKER:
            raise ValueError(f"Input replication mode not supported: {replication_mode!r}")
        distributed = self.distribute_datasets_from_function(input_fn)  # type: ignore[attr-defined]
        return InputIterator(lambda: iter(distributed))

    def experimental_run(self, fn: Callable[..., Any], input_iterator: Any = None) -> Any:
        """``run(fn, args=(input_iterator.get_next(),))``, or ``run(fn)`` without an iterator."""
        args = () if input_iterator is None else (input_iterator.get_next(),)
        return self.run(fn, args=args)  # type: ignore[attr-defined]

    def update_config_proto(self, config_proto: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of the session config (a plain dict here) with what this strategy needs:
        ``isolate_session_state = True`` for a local strategy. The input is left unchanged."""
        if not isinstance(config_proto, Mapping):
            raise TypeError(
                "update_config_proto expects the session config as a mapping (a plain dict of "
                f"settings), got {type(config_proto).__name__}."
            )
        updated = copy.deepcopy(dict(config_proto))
        hook = getattr(getattr(self, "extended", None), "_update_config_proto", None)
        if callable(hook):
            return hook(updated)
        updated["isolate_session_state"] = True
        return updated
