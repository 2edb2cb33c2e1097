"""Keras 3 ``compile`` / ``fit`` / ``evaluate`` / ``predict`` distributed by the strategy.

As in TensorFlow, a Keras model built in ``strategy.scope()`` is bound to that strategy, and
its ``compile``, ``fit``, ``evaluate`` and ``predict`` (called inside or outside the scope) use
it. Keras must run on its torch backend (``KERAS_BACKEND=torch``; set by default when
``import strategyjob`` comes before Keras's import). Supported Keras versions:
``_backend.MIN_KERAS`` to ``_backend.MAX_KERAS`` (exclusive), the ``keras`` extra.

What each strategy does with a bound model:

* the default strategy and ``OneDeviceStrategy``: plain Keras;
* ``MirroredStrategy`` and ``CentralStorageStrategy`` (several replicas in one process, on
  logical CPU devices such as ``MirroredStrategy(["cpu:0", "cpu:1"])``): ``batch_size`` is the
  global batch, each replica computes its own slice of it in ``strategy.run``, the gradient of
  Keras's loss on the global batch is applied once, the metrics (shared by the replicas) are
  the global figures, BatchNormalization keeps the mean of the replicas' moving statistics, and
  ``predict`` returns every row in order (``_local``); saving is plain Keras. Several GPUs in
  one process are refused, naming MultiWorkerMirroredStrategy with one GPU per worker;
* ``MultiWorkerMirroredStrategy`` with one replica per worker: ``batch_size`` is the global
  batch, each worker computes its own slice, gradients are averaged over the global batch
  before the Keras optimizer applies them, metrics are summed over the workers when read, and
  ``predict`` returns every row on every worker (see ``_binding``); ``BackupAndRestore`` is
  written by the chief and resumed at its saved batch, and a SIGTERM during ``fit`` backs up
  after the same batch on every worker and exits 143 (``_callbacks``, ``_preemption``);
* ``ParameterServerStrategy``: the chief runs ``fit`` as the coordinator, as TF's Keras does
  (a ``DatasetCreator``, ``steps_per_epoch`` required, each step scheduled onto a worker, the
  update applied once per step on the ps, ``evaluate`` / ``predict`` on the chief; see ``_ps``),
  or in an evaluator task by ``SidecarEvaluator`` (``_sidecar``);
* ``keras.metrics`` created in a MultiWorkerMirroredStrategy's scope read their global value
  outside ``strategy.run``, and a compiled Keras model built outside every scope is refused
  when called in one (``_watch``); under MirroredStrategy and CentralStorageStrategy the
  replicas update one metric, which reads the global value;
* any other strategy: ``compile`` / ``fit`` / ``evaluate`` / ``predict`` raise one error naming
  what is not supported and the alternative.

This package imports no Keras until a Keras model is built in a strategy's scope; the package
``strategyjob`` imports it when its strategies load, which registers the hooks below.
"""

from __future__ import annotations

from strategyjob.collective import grad_sync
from strategyjob.keras._backend import (
    MAX_KERAS,
    MIN_KERAS,
    check_keras_backend,
)
from strategyjob.keras._capture import on_module_in_scope, strategy_of
from strategyjob.keras._dataset_creator import DatasetCreator
from strategyjob.keras._sidecar import SidecarEvaluator
from strategyjob.keras._watch import watch_name_scopes
from strategyjob.strategies.base import add_scope_entry_check

__all__ = ["MAX_KERAS", "MIN_KERAS", "DatasetCreator", "SidecarEvaluator", "strategy_of"]

add_scope_entry_check(check_keras_backend)
add_scope_entry_check(watch_name_scopes)
grad_sync.observe_modules_in_scope(on_module_in_scope)
