"""``DatasetCreator``: the input of Keras ``fit`` under ``ParameterServerStrategy``.

Mirrors ``tf.keras.utils.experimental.DatasetCreator``: the coordinator never holds the
training data; each worker calls ``dataset_fn(input_context)`` once and draws its batches
from what it returns, for as many steps as the coordinator schedules there. The iterable
should repeat without end (TF's tutorial: ``dataset.repeat()``), since ``fit`` continues
each worker's iterator from epoch to epoch. No torch, no Keras here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DatasetCreator"]


class DatasetCreator:
    """``DatasetCreator(dataset_fn, input_options=None)``: ``dataset_fn`` takes a
    ``strategyjob.InputContext`` and returns an iterable of batches, each
    ``(x, y)`` or ``(x, y, sample_weight)`` as Keras's ``fit`` takes them."""

    def __init__(
        self, dataset_fn: Callable[[Any], Iterable[Any]], input_options: Any = None
    ) -> None:
        if not callable(dataset_fn):
            raise TypeError("`dataset_fn` for `DatasetCreator` must be a `callable`.")
        self.dataset_fn = dataset_fn
        self.input_options = input_options

    def __call__(self, *args: Any, **kwargs: Any) -> Iterable[Any]:
        dataset = self.dataset_fn(*args, **kwargs)
        if not hasattr(dataset, "__iter__"):
            raise TypeError(
                "The `dataset_fn` of a `DatasetCreator` must return an iterable of batches "
                f"(a DataLoader, a generator, ...), got {type(dataset).__name__}."
            )
        return dataset
