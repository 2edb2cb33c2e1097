"""How a Keras model bound to a strategy trains: instance attributes over its Trainer methods.

Nothing global changes: :func:`bind` sets attributes on the one model instance (Keras looks
its methods up on the instance: ``fit`` calls ``self.train_step`` through its train function,
``compute_metrics`` calls ``self.get_metrics_result``), and each calls the model's own class
method for the real work.

:func:`bind` picks the binding by strategy: none for ``OneDeviceStrategy`` (plain Keras),
``_ps.PSBinding`` for ``ParameterServerStrategy`` (``compile`` / ``fit`` / ``evaluate`` /
``predict`` / ``save`` / ``save_weights`` / ``load_weights``: the coordinator's fit; see
``_ps``), ``_local.LocalReplicasBinding`` for MirroredStrategy and CentralStorageStrategy
(several replicas in one process), a refusal naming the alternative for what cannot run
exactly (:func:`unsupported_reason`), and for ``MultiWorkerMirroredStrategy`` (one replica per
worker) ``MultiWorkerBinding``, which sets:

* ``fit`` / ``evaluate`` / ``predict`` / ``compile``: run in the strategy's scope (as TF's
  Keras does); ``fit`` also seeds torch's generator with the chief's seed for its duration, so
  that every worker shuffles (arrays, DataLoaders) into the same global batches;
* ``train_step``: in ``strategy.run``, the worker's rows of the global batch (``_split``) go
  through the class's ``train_step`` with the loss that reaches ``backward`` scaled by
  ``rows * workers / global_rows`` (``_common.scaled_loss``: the optimizer's ``scale_loss``,
  on the instance, for the step), so that the gradients ``grad_sync`` averages over the
  workers are those of Keras's loss on the whole global batch, uneven last batch and sample
  weights included; a
  worker with no row takes part with zero gradients and the same optimizer update; float
  non-trainable weights (BatchNormalization's moving statistics) then take the workers' mean;
* ``test_step`` / ``predict_step``: the worker's rows; ``predict_step`` gathers the outputs
  of every worker in worker order, which is row order;
* ``get_metrics_result``: reads the metrics with their variables summed over the workers
  (TF's sync-on-read metric variables), so logs, history, the progress bar and ``evaluate``
  give the global figures, the same on every worker;
* ``save`` / ``save_weights``: the chief writes, the others write to a temporary directory
  that is removed (TF's Keras), then every worker waits for the chief's file;
* in ``fit``, each epoch's shuffle is seeded from the chief's seed and the epoch, and
  ``BackupAndRestore`` is written by the chief and resumed at its saved batch, after a restart
  or a SIGTERM (``_callbacks``); ``train_step`` skips the batches trained before the restart.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import keras
import torch

import strategyjob
from strategyjob._reduce import ReduceOp
from strategyjob.input.distributed import DistributedDataset
from strategyjob.keras import _callbacks
from strategyjob.keras._common import (
    ENTRY_POINTS,
    entry_point,
    moving_statistics,
    refusal,
    scaled_loss,
)
from strategyjob.keras._local import LocalReplicasBinding, local_replicas_refusal
from strategyjob.keras._split import local_rows, rows_of, slice_rows
from strategyjob.keras._sync_on_read import detached_copy, summed, sums_over_workers
from strategyjob.strategies.central_storage import CentralStorageStrategy
from strategyjob.strategies.mirrored import MirroredStrategy
from strategyjob.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy
from strategyjob.strategies.one_device import OneDeviceStrategy
from strategyjob.strategies.parameter_server import ParameterServerStrategy

__all__ = ["MultiWorkerBinding", "bind", "unsupported_reason"]


def unsupported_reason(strategy: Any) -> str | None:
    """Why Keras ``fit`` cannot run under ``strategy`` (None: it can)."""
    name = type(strategy).__name__
    if isinstance(strategy, MultiWorkerMirroredStrategy):
        local = len(strategy.extended.worker_devices)
        if local == 1:
            return None
        return (
            f"{name} with {local} replicas per worker (one per local GPU) is not supported by "
            "Keras fit/evaluate/predict yet; run one worker per GPU (CUDA_VISIBLE_DEVICES), "
            "or use a custom training loop with strategy.run."
        )
    if isinstance(strategy, (MirroredStrategy, CentralStorageStrategy)):
        return local_replicas_refusal(strategy)
    return (
        f"Keras compile/fit/evaluate/predict under {name} is not supported yet (it would not "
        "split the global batch over the replicas); use MultiWorkerMirroredStrategy (one "
        "process per worker, e.g. `strategyjob run`), or a custom training loop with "
        f"strategy.run under {name}."
    )


def bind(model: keras.Model, strategy: Any) -> None:
    """Make ``model``'s training methods use ``strategy`` (called once, when it is captured)."""
    if isinstance(strategy, OneDeviceStrategy):
        return  # one replica: plain Keras computes exactly what the strategy would
    if isinstance(strategy, ParameterServerStrategy):
        from strategyjob.keras._ps import PSBinding  # the coordinator's fit (``_ps``)

        PSBinding(model, strategy).install()
        return
    reason = unsupported_reason(strategy)
    if reason is not None:
        for name in ENTRY_POINTS:
            setattr(model, name, refusal(reason))
        return
    if isinstance(strategy, MultiWorkerMirroredStrategy):
        MultiWorkerBinding(model, strategy).install()
    else:
        LocalReplicasBinding(model, strategy).install()


DISTRIBUTED_INPUT = (
    "Keras fit/evaluate/predict under MultiWorkerMirroredStrategy read global batches, but "
    "they were given a distributed dataset (strategy.experimental_distribute_dataset), whose "
    "batches on this worker are its own rows only; pass the dataset itself: each worker "
    "computes its own rows of each of its batches."
)


def _not_distributed(data: Any) -> Any:
    """``data`` as Keras reads it; a distributed dataset is refused (:data:`DISTRIBUTED_INPUT`)."""
    if isinstance(data, DistributedDataset):
        raise ValueError(DISTRIBUTED_INPUT)
    return data


class MultiWorkerBinding:
    """A Keras model trained by MultiWorkerMirroredStrategy, one replica per worker."""

    def __init__(self, model: keras.Model, strategy: MultiWorkerMirroredStrategy) -> None:
        self._model = model
        self._strategy = strategy
        self._collectives = strategy.extended.collectives
        self._workers = strategy.num_replicas_in_sync
        self._worker: int | None = None  # this worker's replica id, read in the first step
        self._local_metrics = False  # inside a step: metric reads stay local (no collective)
        self._fit_state: _callbacks.FitState | None = None  # during fit

    def install(self) -> None:
        model = self._model
        for name in ENTRY_POINTS:
            fit = self._seeded_fit if name == "fit" else None
            entry = entry_point(model, self._strategy, name, fit, inputs=_not_distributed)
            setattr(model, name, entry)
        model.train_step = self.train_step
        model.test_step = self.test_step
        model.predict_step = self.predict_step
        model.get_metrics_result = self.get_metrics_result
        model.save = self._chief_writes("save")
        model.save_weights = self._chief_writes("save_weights")

    # --- entry points ---------------------------------------------------------------------
    def _seeded_fit(self, method: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        with self._same_random_order() as seed:
            return self._fit(method, args, kwargs, seed)

    def _fit(self, method: Callable[..., Any], args: tuple, kwargs: dict, seed: int) -> Any:
        """The class's ``fit`` with the callbacks of ``_callbacks``: each epoch's shuffle seeded
        from ``seed``, ``BackupAndRestore`` written by the chief and resumed at its batch."""
        bound = inspect.signature(method).bind(self._model, *args, **kwargs)
        callbacks = bound.arguments.get("callbacks")
        if callbacks is not None and not isinstance(callbacks, (list, tuple)):
            return method(*bound.args, **bound.kwargs)  # a CallbackList: Keras's own
        replay = _callbacks.not_replayed(
            bound.arguments.get("x"), bound.arguments.get("steps_per_epoch")
        )
        state = _callbacks.FitState(seed, replay)
        bound.arguments["callbacks"] = _callbacks.distributed(
            callbacks or (), state, self._strategy
        )
        self._fit_state = state
        try:
            return method(*bound.args, **bound.kwargs)
        finally:
            self._fit_state = None
            state.close()

    def _chief_writes(self, name: str) -> Callable[..., Any]:
        """``save`` / ``save_weights`` (and so ``ModelCheckpoint`` and ``BackupAndRestore``'s
        saves): the chief writes the path; the other workers write to a temporary directory
        that is removed, as TF's Keras does, so that files on storage every worker shares are
        written once. Every worker returns once the chief's file is complete; an error on one
        worker raises on every worker."""
        method = getattr(type(self._model), name)

        def write(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            failed = torch.ones(1)
            try:
                if self._strategy.extended.should_checkpoint:
                    result = method(self._model, filepath, *args, **kwargs)
                else:
                    with tempfile.TemporaryDirectory(prefix="strategyjob-keras-") as scratch:
                        path = os.path.join(scratch, os.path.basename(os.fspath(filepath)))
                        result = method(self._model, path, *args, **kwargs)
                failed.zero_()
            finally:
                (failures,) = self._collectives.all_reduce([failed], ReduceOp.SUM)
            if failures.item() > 0:
                raise RuntimeError(
                    f"model.{name}({os.fspath(filepath)!r}) failed on another worker (its log "
                    "says why); nothing was saved there."
                )
            return result

        write.__doc__ = method.__doc__
        return write

    @contextlib.contextmanager
    def _same_random_order(self) -> Iterator[int]:
        """Seed torch's generator with the chief's seed (drawn from the chief's generator, so
        that ``keras.utils.set_random_seed`` makes ``fit`` repeatable) for the duration of
        ``fit``: every worker then shuffles its copy of the data into the same global batches.
        The caller's generator state is restored afterwards."""
        mine = torch.randint(0, 1 << 62, (1,), dtype=torch.int64)
        if self._workers > 1:
            mine = self._collectives.broadcast_from_chief(mine)
        seed = int(mine[0])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield seed

    # --- steps ------------------------------------------------------------------------------
    def _my_rows(self, data: Any) -> tuple[int, int, int]:
        """``(start, stop, global_rows)`` of this worker's slice of the global batch."""
        if self._worker is None:
            context = strategyjob.get_replica_context()
            self._worker = int(context.replica_id_in_sync_group)
        rows = rows_of(data)
        start, stop = local_rows(rows, self._workers, self._worker)
        return start, stop, rows

    def _run_locally(self, fn: Callable[[Any], Any], data: Any) -> Any:
        """``fn(data)`` in ``strategy.run`` (the replica context, with the chief's values for
        any weights built since the last step), with metric reads kept local."""
        results: list[Any] = []
        self._local_metrics = True
        try:
            self._strategy.run(lambda d: results.append(fn(d)), args=(data,))
        finally:
            self._local_metrics = False
        return results[0]

    def train_step(self, data: Any) -> dict[str, Any]:
        state = self._fit_state
        if state is not None and state.skip_batch():
            return self.get_metrics_result()  # trained before the restart (``_callbacks``)
        self._run_locally(self._train_my_rows, data)
        self._average_moving_statistics()
        return self.get_metrics_result()

    def _average_moving_statistics(self) -> None:
        """Non-trainable float weights a step updates (BatchNormalization's moving mean and
        variance) take the mean of the workers' new values, as TF's MEAN-aggregated mirrored
        variables do, so that every worker keeps the same model. One all-reduce per step,
        only for models that have such weights."""
        weights = moving_statistics(self._model)
        if self._workers == 1 or not weights:
            return
        totals = sums_over_workers(self._collectives, [v.value for v in weights])
        for v, total in zip(weights, totals):
            v.assign((total / self._workers).to(v.value.device, v.value.dtype))

    def _train_my_rows(self, data: Any) -> None:
        model = self._model
        start, stop, rows = self._my_rows(data)
        if start == stop:
            self._zero_update()
            return
        factor = (stop - start) * self._workers / rows
        with scaled_loss(model.optimizer, factor):
            type(model).train_step(model, slice_rows(data, start, stop, rows))

    def _zero_update(self) -> None:
        """A worker with no row in this batch: zero gradients into the all-reduce (every
        worker must take part), then the same optimizer update as the others."""
        model = self._model
        weights = model.trainable_weights
        if not weights:
            return
        model.zero_grad()
        zero = sum(v.value.sum() for v in weights) * 0.0
        zero.backward()
        with torch.no_grad():
            model.optimizer.apply([v.value.grad for v in weights], weights)

    def test_step(self, data: Any) -> dict[str, Any]:
        self._run_locally(self._test_my_rows, data)
        return self.get_metrics_result()

    def _test_my_rows(self, data: Any) -> None:
        model = self._model
        start, stop, rows = self._my_rows(data)
        if start < stop:
            type(model).test_step(model, slice_rows(data, start, stop, rows))

    def predict_step(self, data: Any) -> Any:
        mine = self._run_locally(self._predict_my_rows, data)
        return keras.tree.map_structure(self._gather_rows, mine)

    def _predict_my_rows(self, data: Any) -> Any:
        model = self._model
        start, stop, rows = self._my_rows(data)
        if start < stop:
            return type(model).predict_step(model, slice_rows(data, start, stop, rows))
        # No row here: predict one to learn the outputs' shapes, keep none of it.
        outputs = type(model).predict_step(model, slice_rows(data, 0, 1, rows))
        return keras.tree.map_structure(lambda out: out[:0], outputs)

    def _gather_rows(self, output: Any) -> Any:
        if not isinstance(output, torch.Tensor):
            return output
        return self._collectives.all_gather(output.contiguous(), 0)

    # --- metrics ---------------------------------------------------------------------------
    def get_metrics_result(self) -> dict[str, Any]:
        """The metrics' results over every worker: their variables summed across the workers
        (one all-reduce, ``_sync_on_read``), read, then given back their local values."""
        model = self._model
        read = type(model).get_metrics_result
        if self._local_metrics or self._workers == 1:
            return read(model)
        variables = [v for metric in model.metrics for v in metric.variables]
        with summed(self._collectives, variables):
            return keras.tree.map_structure(detached_copy, read(model))
