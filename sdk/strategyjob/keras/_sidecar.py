"""``SidecarEvaluator``: evaluate the checkpoints a training job writes, in a task of its own.

Mirrors ``tf.keras.utils.SidecarEvaluator`` (the ``evaluator`` task of a
ParameterServerStrategy job): the chief writes weights checkpoints with
``keras.callbacks.ModelCheckpoint(os.path.join(checkpoint_dir, "ckpt-{epoch}.weights.h5"),
save_weights_only=True)``, each file complete or absent (``_ps``'s chief writes a temporary
file that replaces the path); the evaluator waits for a checkpoint newer than the last it
evaluated, loads it and runs ``model.evaluate``, and stops once it has evaluated the
checkpoint numbered ``max_evaluations`` (the final epoch's) or later, as TF's does.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from strategyjob.input import InputContext
from strategyjob.keras._dataset_creator import DatasetCreator

__all__ = ["SidecarEvaluator"]

log = logging.getLogger(__name__)

_NUMBERED = re.compile(r"^[^.].*-(\d+)\.weights\.h5$")  # ckpt-3.weights.h5; not .temporaries


def latest_numbered(directory: str) -> tuple[int, str] | None:
    """``(number, path)`` of the checkpoint of ``directory`` with the highest number."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    found = [(int(m.group(1)), name) for name in names if (m := _NUMBERED.match(name))]
    if not found:
        return None
    number, name = max(found)
    return number, os.path.join(directory, name)


class SidecarEvaluator:
    """``SidecarEvaluator(model, data, checkpoint_dir, steps=None, max_evaluations=None,
    callbacks=None)``; ``start()`` evaluates until the last checkpoint (TF's arguments;
    ``poll_interval``, seconds between looks at ``checkpoint_dir``, is StrategyJob's)."""

    def __init__(
        self,
        model: Any,
        data: Any,
        checkpoint_dir: str,
        steps: int | None = None,
        max_evaluations: int | None = None,
        callbacks: Any = None,
        poll_interval: float = 1.0,
    ) -> None:
        if isinstance(data, DatasetCreator) and steps is None:
            raise ValueError(
                "When evaluating a `DatasetCreator`, `steps` must be given to "
                "`SidecarEvaluator` (its dataset_fn's iterable may not end)."
            )
        self.model = model
        self.data = data
        self.checkpoint_dir = os.fspath(checkpoint_dir)
        self.steps = steps
        self.max_evaluations = max_evaluations
        self.callbacks = callbacks
        self.poll_interval = poll_interval

    def _data(self) -> dict[str, Any]:
        """``evaluate``'s data arguments: a DatasetCreator's iterable, ``(x, y)`` or
        ``(x, y, sample_weight)`` arrays, or what Keras's ``evaluate`` takes as ``x``."""
        data = self.data
        if isinstance(data, DatasetCreator):
            return {"x": iter(data(InputContext(1, 0, 1)))}
        if isinstance(data, tuple) and len(data) in (2, 3):
            return dict(zip(("x", "y", "sample_weight"), data))
        return {"x": data}

    def start(self) -> None:
        """Evaluate each new checkpoint until the one numbered ``max_evaluations`` (without
        ``max_evaluations``: until the process is stopped, as TF's)."""
        evaluated = None
        while True:
            latest = latest_numbered(self.checkpoint_dir)
            if latest is None or (evaluated is not None and latest[0] <= evaluated):
                time.sleep(self.poll_interval)  # waiting for a file another process writes
                continue
            number, path = latest
            self.model.load_weights(path)
            log.info("Evaluation starts: Model weights loaded from latest checkpoint file %s", path)
            self.model.evaluate(
                **self._data(), steps=self.steps, callbacks=self.callbacks, verbose=2
            )
            evaluated = number
            if self.max_evaluations and self.max_evaluations <= number:
                log.info("Last checkpoint evaluated. SidecarEvaluator stops.")
                return
