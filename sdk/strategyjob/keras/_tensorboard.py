"""Keras's ``TensorBoard`` callback for a model bound to a strategy: it writes through
``tf.summary`` (its ``summary`` property imports TensorFlow when first read), which a torch
install lacks. Each such callback instance is given :mod:`strategyjob.summary` instead,
through the instance attribute Keras reads first (``_summary_module``, Keras 3.10 to 3.15),
so that the epoch and batch curves and the weight histograms are written by the job's writer
alone (the chief, else worker 0), with the global figures the logs hold. Nothing global is
patched; a ``TensorBoard`` of a model outside every strategy stays Keras's own.

What Keras writes with TensorFlow's own ops has no torch path: the model graph
(``write_graph``, on by default) is left out with one warning; ``write_images`` and
``embeddings_freq`` are refused at ``fit``, naming what to do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import keras

from strategyjob import summary

logger = logging.getLogger("strategyjob.keras")

NEEDS_TENSORFLOW = (
    "keras.callbacks.TensorBoard({field}={value!r}) needs TensorFlow's own summary ops, "
    "which a model distributed by {strategy} on the torch backend cannot use: leave {field} "
    "unset. Scalars (update_freq) and weight histograms (histogram_freq) are written through "
    "strategyjob.summary."
)
GRAPH_LEFT_OUT = (
    "keras.callbacks.TensorBoard: the model graph (write_graph=True) is not written: Keras "
    "writes it with TensorFlow's ops. Scalars and histograms are written through "
    "strategyjob.summary, by the job's chief (else worker 0) alone."
)


def through_strategyjob_summary(callbacks: Iterable[Any], strategy: Any) -> None:
    """Give each ``keras.callbacks.TensorBoard`` in ``callbacks`` :mod:`strategyjob.summary`
    (once: a callback passed to several ``fit`` calls keeps it)."""
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.TensorBoard):
            continue
        for field, unset in (("write_images", False), ("embeddings_freq", 0)):
            value = getattr(callback, field, unset)
            if value != unset:
                name = type(strategy).__name__
                raise ValueError(NEEDS_TENSORFLOW.format(field=field, value=value, strategy=name))
        if callback.write_graph:
            callback.write_graph = False
            logger.warning(GRAPH_LEFT_OUT)
        callback._summary_module = summary  # noqa: SLF001  (Keras's hook for its summary ops)
