"""Keras ``fit`` / ``evaluate`` / ``predict`` with several replicas in one process:
``MirroredStrategy`` and ``CentralStorageStrategy`` on logical CPU devices.

How these strategies run replicas decides the design: ``strategy.run`` runs each local replica
in its own thread, one at a time in replica order between merge calls, and the replicas share
the one model (Keras 3's torch layers are torch modules; MirroredStrategy shares a module
between its replica threads, CentralStorageStrategy keeps it on its parameter device), so the
backward passes of the replicas accumulate into the same ``.grad`` and their metric updates
add to the same metric variables. ``LocalReplicasBinding`` sets on the model instance:

* ``train_step``: the global batch is split over the replicas (``_split.local_rows``, the
  distributed iterator's balanced split); in ``strategy.run`` each replica runs the class's
  ``train_step`` on its rows, its loss scaled by ``rows / global_rows`` (the optimizer's
  ``scale_loss``; a ``train_step`` that applies gradients without it is refused, naming the
  fix) and with the model's ``zero_grad`` and the optimizer's ``apply`` held back for the
  step, so that the accumulated ``.grad`` is exactly the gradient of Keras's loss on the
  global batch (uneven last batch and sample weights included); the optimizer then applies it
  once, in cross-replica context. The compiled metrics and the loss tracker hold the sums over
  the replicas when read (TF's sync-on-read SUM), so the logs, history and ``evaluate`` are
  the global figures, and so is any ``keras.metrics`` object created in scope and updated in
  ``strategy.run``. Float non-trainable weights (BatchNormalization's moving statistics): each
  replica updates its own copy from the step's values and its rows; the model keeps their mean
  (TF's ON_READ / MEAN variables, as read in cross-replica context);
* ``test_step``: each replica evaluates its rows; ``predict_step``: each replica predicts its
  rows, concatenated in replica order, which is row order.
* ``fit`` / ``evaluate`` / ``predict``: a distributed dataset
  (``strategy.experimental_distribute_dataset(loader)``) given as ``x`` or ``validation_data``
  is read as its global batches (each step's per-replica batches joined in replica order), which
  the steps split again with the balanced split.

A replica with no row in a short last batch computes nothing (in one process nobody waits for
it). Saving (``save``, ``save_weights``, ``ModelCheckpoint``, ``BackupAndRestore``) is plain
Keras: one process writes. The replicas' tensors must be on the model's device, so several
GPUs in one process are refused, and so are CPU replicas while Keras computes elsewhere (its
default device on a GPU machine): :func:`local_replicas_refusal`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import keras
import torch

import strategyjob
from strategyjob import _nest
from strategyjob._values import select_replica
from strategyjob.input.distributed import DistributedDataset
from strategyjob.keras._common import (
    ENTRY_POINTS,
    entry_point,
    instance_attribute,
    moving_statistics,
    scaled_loss,
)
from strategyjob.keras._split import local_rows, rows_of, slice_rows

__all__ = ["NOT_SCALED", "LocalReplicasBinding", "local_replicas_refusal"]

SEVERAL_GPUS = (
    "Keras fit/evaluate/predict under {name} with {count} replicas on {devices} is not "
    "supported: the replicas of one process share the model on one device. Use "
    "MultiWorkerMirroredStrategy with one GPU per worker (`strategyjob run`, "
    "CUDA_VISIBLE_DEVICES), or {name} on logical CPU devices, e.g. {name}(['cpu:0', 'cpu:1'])."
)

NOT_SCALED = (
    "The train_step of {model} applies the gradients of a loss it did not pass through "
    "self.optimizer.scale_loss(loss), so the gradients of {strategy}'s replicas cannot be "
    "combined into the global batch's; call loss = self.optimizer.scale_loss(loss) before "
    "loss.backward() in train_step, as Keras's own train_step does."
)

KERAS_ELSEWHERE = (
    "Keras puts its variables and computation on {keras_device!r} (torch's default, or "
    "KERAS_TORCH_DEVICE), not on the CPU devices of {name}'s replicas ({devices}); set "
    "KERAS_TORCH_DEVICE=cpu before Keras is imported, or use MultiWorkerMirroredStrategy "
    "with one GPU per worker."
)


def local_replicas_refusal(strategy: Any, keras_device: str | None = None) -> str | None:
    """Why Keras cannot train under this one-process strategy (None: it can). Its replicas
    must all be on the CPU (logical CPU devices), or be one; replicas on the CPU need Keras on
    the CPU too (``keras_device``: Keras's default device, read from Keras if not given)."""
    devices = tuple(strategy.extended.worker_devices)
    name = type(strategy).__name__
    on_cpu = all("/DEVICE:CPU:" in d.upper() for d in devices)
    if not on_cpu and len(devices) > 1:
        return SEVERAL_GPUS.format(name=name, count=len(devices), devices=", ".join(devices))
    keras_device = keras_device or _keras_device()
    if on_cpu and torch.device(keras_device).type != "cpu":
        return KERAS_ELSEWHERE.format(
            keras_device=keras_device, name=name, devices=", ".join(devices)
        )
    return None


def _keras_device() -> str:
    """The device Keras's torch backend creates its tensors on (no public API says it)."""
    from keras.src.backend.torch import core

    return str(core.get_device())


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


class _GlobalBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The global batches of a distributed dataset: each step's per-replica batches joined in
    replica order (each pass a new pass over the distributed dataset)."""

    def __init__(self, dataset: DistributedDataset, replicas: int) -> None:
        self._dataset = dataset
        self._replicas = replicas

    def __iter__(self) -> Iterator[Any]:
        for step in self._dataset:
            parts = [select_replica(i, step) for i in range(self._replicas)]
            yield _nest.map_structure(lambda *rows: torch.cat(rows), *parts)


def global_input(data: Any, replicas: int) -> Any:
    """``data`` as Keras reads it: a distributed dataset (``experimental_distribute_dataset``)
    becomes a DataLoader of its global batches, which ``fit`` splits over the replicas again;
    anything else is Keras's."""
    if isinstance(data, DistributedDataset):
        return torch.utils.data.DataLoader(_GlobalBatches(data, replicas), batch_size=None)
    return data


class LocalReplicasBinding:
    """A Keras model trained by a one-process strategy with several local replicas."""

    def __init__(self, model: keras.Model, strategy: Any) -> None:
        self._model = model
        self._strategy = strategy
        self._replicas = int(strategy.num_replicas_in_sync)
        self._name = type(strategy).__name__

    def install(self) -> None:
        model = self._model
        for name in ENTRY_POINTS:
            setattr(model, name, entry_point(model, self._strategy, name, inputs=self._global))
        model.train_step = self.train_step
        model.test_step = self.test_step
        model.predict_step = self.predict_step

    def _global(self, data: Any) -> Any:
        return global_input(data, self._replicas)

    def _each_replica(self, fn: Callable[[Any], Any], data: Any) -> list[Any]:
        """``fn(rows)`` in ``strategy.run`` for each replica with rows of the batch (its own):
        the results in replica order, None for a replica without rows."""
        rows = rows_of(data)
        results: list[Any] = [None] * self._replicas

        def replica_fn() -> None:
            replica = int(strategyjob.get_replica_context().replica_id_in_sync_group)
            start, stop = local_rows(rows, self._replicas, replica)
            if start < stop:
                results[replica] = fn(slice_rows(data, start, stop, rows))

        self._strategy.run(replica_fn)
        return results

    # --- steps ------------------------------------------------------------------------------
    def train_step(self, data: Any) -> dict[str, Any]:
        model = self._model
        optimizer = model.optimizer
        global_rows = rows_of(data)
        statistics = moving_statistics(model)
        before = [v.value.detach().clone() for v in statistics]

        def train_rows(rows: Any) -> list[torch.Tensor]:
            for v, value in zip(statistics, before):
                v.assign(value)  # each replica's copy starts from the step's values
            calls: set[str] = set()
            with (
                scaled_loss(optimizer, rows_of(rows) / global_rows, calls),
                instance_attribute(optimizer, "apply", lambda *args, **kw: calls.add("apply")),
            ):
                type(model).train_step(model, rows)
            if calls == {"apply"}:
                raise RuntimeError(
                    NOT_SCALED.format(model=type(model).__name__, strategy=self._name)
                )
            return [v.value.detach().clone() for v in statistics]

        torch.nn.Module.zero_grad(model)
        with instance_attribute(model, "zero_grad", _no_op):
            after = self._each_replica(train_rows, data)
        weights = model.trainable_weights
        if weights:
            with torch.no_grad():
                optimizer.apply([v.value.grad for v in weights], weights)
        self._keep_mean(statistics, [before if values is None else values for values in after])
        return model.get_metrics_result()

    @staticmethod
    def _keep_mean(statistics: list[Any], per_replica: list[list[torch.Tensor]]) -> None:
        """Each weight takes the mean of the replicas' copies (one without rows kept the step's
        values), as TF's MEAN-aggregated ON_READ variables read in cross-replica context."""
        for i, v in enumerate(statistics):
            copies = torch.stack([values[i] for values in per_replica])
            v.assign(copies.mean(dim=0).to(v.value.dtype))

    def test_step(self, data: Any) -> dict[str, Any]:
        model = self._model
        self._each_replica(lambda rows: type(model).test_step(model, rows), data)
        return model.get_metrics_result()

    def predict_step(self, data: Any) -> Any:
        model = self._model
        outputs = self._each_replica(lambda rows: type(model).predict_step(model, rows), data)
        present = [out for out in outputs if out is not None]
        return keras.tree.map_structure(lambda *parts: torch.cat(parts), *present)
