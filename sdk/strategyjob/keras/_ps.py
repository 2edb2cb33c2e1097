"""Keras ``fit`` under ``ParameterServerStrategy``, as TensorFlow's Keras (``tf_keras``) does it.

The chief is the coordinator: ``fit`` creates the strategy's ``ClusterCoordinator`` (or uses
the one there is), builds the ``DatasetCreator``'s iterable once on every worker
(``create_per_worker_dataset`` of ``distribute_datasets_from_function``, as TF's
``_ClusterCoordinatorDataHandler``), and schedules ``steps_per_epoch`` train steps per epoch,
each a closure that a worker runs on its next batch. The model's weights are the ps variables
the strategy made of the Keras variables' torch parameters when the model was built in its
scope; a worker rebuilds the model once from its config and compile config (Keras's public
``get_config`` / ``get_compile_config``), reads the weights' current values from the ps in each
step, runs the class's ``train_step`` and, through its optimizer's ``apply`` (set on that
worker's optimizer instance), sends the gradients to the ps, which apply the update once per
step (the step's id; a closure re-run on another worker applies nothing twice). The Keras
optimizer runs on the ps as a torch optimizer with its update rule (``ps_optimizer``,
``_ps_optimizers``); one without such a rule is refused at ``compile``.

Figures: each step returns the values of the worker's metric variables for that step alone;
after each epoch's ``join`` the chief adds them up, in the order the steps were scheduled,
into its own metrics, so ``history`` and the epoch's ``logs`` are the metrics over every batch
of the epoch (what TF reports, its metric variables being on the ps, once no step is in
flight). Batch-level callbacks get empty ``logs`` (a step's figures are on a worker until the
epoch ends). ``evaluate`` / ``predict`` run on the chief, on the weights read from the ps (TF's
default, without ``pss_evaluation_shards``); ``validation_data`` is evaluated so at the end
of each epoch.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import torch

from strategyjob.input import InputContext
from strategyjob.keras._backend import check_keras_version
from strategyjob.keras._dataset_creator import DatasetCreator
from strategyjob.keras._ps_optimizers import KerasAdam, KerasSGD
from strategyjob.ps import _remote
from strategyjob.ps import coordinator as coordinator_lib
from strategyjob.strategies.parameter_server import ParameterServerStrategy
from strategyjob.train._storage import atomic_write_path

__all__ = ["PSBinding", "ps_optimizer"]

STEPS_REQUIRED = (
    "When using a `tf.keras.utils.experimental.DatasetCreator`, `steps_per_epoch`, "
    "`validation_steps` or `steps` argument must be provided in `Model.fit`, "
    "`Model.evaluate`, or `Model.predict`."
)
UNSUPPORTED_INPUT = (
    "Only `tf.keras.utils.experimental.DatasetCreator`, `tf.Tensor`, numpy arrays and pandas "
    "dataframes are supported types at this time. (StrategyJob: `strategyjob.keras."
    "DatasetCreator`, torch tensors and numpy arrays; got {kind}: wrap it in a "
    "DatasetCreator whose dataset_fn returns it, repeated without end.)"
)
_NOT_ON_PS = "Keras fit under ParameterServerStrategy does not support {what} yet; {instead}"


def ps_optimizer(
    optimizer: Any, trainable: list[Any]
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The torch optimizer class and arguments whose update rule, run on the ps, is the Keras
    ``optimizer``'s for the variables ``trainable`` (``_ps_optimizers``). Raises
    ``NotImplementedError`` naming what has no such rule."""
    config = optimizer.get_config()
    name = type(optimizer).__name__
    if isinstance(optimizer, keras.optimizers.SGD):
        cls: type[torch.optim.Optimizer] = KerasSGD
        arguments = {"momentum": float(config["momentum"]), "nesterov": bool(config["nesterov"])}
    elif isinstance(optimizer, keras.optimizers.Adam):  # AdamW too: Adam with weight_decay
        cls = KerasAdam
        arguments = {k: config[k] for k in ("beta_1", "beta_2", "epsilon", "amsgrad")}
    else:
        raise NotImplementedError(
            _NOT_ON_PS.format(
                what=f"the optimizer {name} (the ps run the update rules of SGD, Adam and AdamW)",
                instead="compile with keras.optimizers.SGD, Adam or AdamW, or train under "
                "MultiWorkerMirroredStrategy, or write a custom loop with a torch optimizer "
                "under ParameterServerStrategy.",
            )
        )
    for key in (
        "clipnorm",
        "global_clipnorm",
        "clipvalue",
        "use_ema",
        "loss_scale_factor",
        "gradient_accumulation_steps",
    ):
        if config.get(key):
            raise NotImplementedError(
                _NOT_ON_PS.format(
                    what=f"{name}({key}={config[key]!r})",
                    instead=f"compile with {name} without {key}, or train under "
                    "MultiWorkerMirroredStrategy.",
                )
            )
    rate, schedule = config["learning_rate"], None
    if not isinstance(rate, (int, float)):
        schedule = rate  # Keras's serialized LearningRateSchedule: the ps evaluate it
        if not (isinstance(schedule, dict) and str(schedule.get("module")).startswith("keras.")):
            raise NotImplementedError(
                _NOT_ON_PS.format(
                    what=f"the learning rate {rate!r} (the ps evaluate Keras's own schedules "
                    "only, keras.optimizers.schedules)",
                    instead="use a schedule of keras.optimizers.schedules or a float, or train "
                    "under MultiWorkerMirroredStrategy.",
                )
            )
        rate = float(optimizer.learning_rate)
    decay = config.get("weight_decay")
    # Keras's own test of exclude_from_weight_decay (a method of its optimizers, 3.10-3.15).
    if decay and not all(optimizer._use_weight_decay(v) for v in trainable):  # noqa: SLF001
        raise NotImplementedError(
            _NOT_ON_PS.format(
                what=f"{name}.exclude_from_weight_decay (the ps decay every weight alike)",
                instead="decay every weight, or train under MultiWorkerMirroredStrategy.",
            )
        )
    return cls, {
        "lr": float(rate),
        "weight_decay": decay or None,
        "lr_schedule": schedule,
        **arguments,
    }


def _as_tensors(batch: Any) -> Any:
    """A batch as Keras's torch trainer gets it: numpy arrays become torch tensors."""
    return keras.tree.map_structure(
        lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a, batch
    )


def _empty_like(value: Any) -> Any:
    return value[:0].detach() if isinstance(value, torch.Tensor) and value.dim() else value


class _Replica:
    """What a train step ships to a worker: how to rebuild the model, its weights' torch
    parameters (on the worker: the values read from the ps for the step) and the torch
    optimizer over the trainable ones (on the worker: its ``step()`` sends the gradients)."""

    def __init__(self, model: keras.Model, optimizer: torch.optim.Optimizer) -> None:
        self.model_config = keras.saving.serialize_keras_object(model)
        self.compile_config = model.get_compile_config()
        self.params = [v.value for v in model.weights]
        self.trainable = [v.value for v in model.trainable_weights]
        self.optimizer = optimizer
        self._model: keras.Model | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "_model"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state, _model=None)

    def model(self) -> keras.Model:
        """The worker's model, built once (a worker runs one closure at a time)."""
        if self._model is None:
            try:
                self._model = build_copy(self.model_config, self.compile_config)
            except Exception as exc:
                raise NotImplementedError(
                    _NOT_ON_PS.format(
                        what=f"a model the workers cannot rebuild from its Keras config "
                        f"({type(exc).__name__}: {exc})",
                        instead="use a Sequential or Functional model, or give the subclass "
                        "get_config/from_config and register it (keras.saving."
                        "register_keras_serializable) in a module the workers import.",
                    )
                ) from exc
            self._model.optimizer.apply = self._send_gradients  # this instance only
        return self._model

    def _send_gradients(self, gradients: list[Any], variables: list[Any]) -> None:
        for param, grad in zip(self.trainable, gradients):
            param.grad = grad
        self.optimizer.step()

    def train(self, iterator: Any) -> tuple[list[torch.Tensor], Any]:
        """One step on the worker's next batch: the step's metric variables, and the batch's
        targets and predictions with no row (the chief builds its metrics from them)."""
        data = _as_tensors(next(iterator))
        model = self.model()
        with torch.no_grad():
            for variable, param in zip(model.weights, self.params):
                variable.assign(param)  # the value read from the ps for this step
        frozen = [(v, v.value.clone()) for v in model.non_trainable_weights]
        model.reset_metrics()
        type(model).train_step(model, data)
        for variable, before in frozen:
            if not torch.equal(variable.value, before):
                raise NotImplementedError(
                    _NOT_ON_PS.format(
                        what=f"a train step that updates the non-trainable weight "
                        f"{variable.path} (e.g. BatchNormalization's moving statistics)",
                        instead="train under MultiWorkerMirroredStrategy, or freeze the layer.",
                    )
                )
        values = [v.value.detach().clone() for m in model.metrics for v in m.variables]
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        with torch.no_grad():
            y_pred = model(keras.tree.map_structure(_empty_like, x), training=False)
        return values, (keras.tree.map_structure(_empty_like, y), y_pred)


def build_copy(model_config: dict, compile_config: dict | None) -> keras.Model:
    """A model from its serialized config, compiled as the original (not in any scope)."""
    model = keras.saving.deserialize_keras_object(model_config)
    if compile_config:
        model.compile_from_config(compile_config)
    return model


class PSBinding:
    """A Keras model trained by ParameterServerStrategy with the coordinator (the chief)."""

    def __init__(self, model: keras.Model, strategy: ParameterServerStrategy) -> None:
        self._model = model
        self._strategy = strategy
        self._replica: _Replica | None = None  # per compile: the ps keep its optimizer's state

    def install(self) -> None:
        model = self._model
        model.compile = self.compile
        model.fit = self.fit
        model.evaluate = self._on_chief("evaluate")
        model.predict = self._on_chief("predict")
        model.save = self._written("save", with_optimizer=True)
        model.save_weights = self._written("save_weights")
        model.load_weights = self.load_weights

    # --- the chief's copy of the weights ----------------------------------------------------
    def _params(self) -> list[torch.nn.Parameter]:
        return [v.value for v in self._model.weights]

    def pull(self) -> None:
        """The chief's weights take the ps values (after training, before using them)."""
        self._strategy.extended.pull_parameters(self._params())

    def _optimizer_from_ps(self) -> None:
        """The chief's Keras optimizer takes the state the ps keep (slots by Keras's names,
        ``iterations`` from the update count), so that ``model.save`` writes the real one."""
        replica, optimizer = self._replica, self._model.optimizer
        if replica is None:
            return
        # strategyjob.train.Checkpoint reads the ps's optimizer state the same way.
        slots = self._strategy.extended.optimizer_slots(replica.optimizer)
        if not slots:
            return  # not stepped yet
        trainable = self._model.trainable_weights
        if not optimizer.built:
            optimizer.build(trainable)
        by_name = {v.name: v for v in optimizer.variables}
        for index, state in slots.items():
            prefix = trainable[index].path.replace("/", "_")
            for slot, value in state.items():
                if slot == "step":
                    optimizer.iterations.assign(value)
                    continue
                variable = by_name.get(f"{prefix}_{slot}")
                if variable is None:
                    raise RuntimeError(
                        f"strategyjob.keras: the Keras optimizer has no variable "
                        f"{prefix}_{slot} for the ps's {slot!r} of {trainable[index].path}; "
                        "save with save_weights (the optimizer's state is on the ps)."
                    )
                variable.assign(value)

    def _written(self, name: str, with_optimizer: bool = False) -> Callable[..., Any]:
        """``save`` / ``save_weights`` (and so ``ModelCheckpoint``) on the chief: the weights
        read from the ps (for ``save`` the optimizer's state too), written to a temporary file
        that then replaces the path, so that a ``SidecarEvaluator`` never reads half a file."""
        method = getattr(type(self._model), name)

        def write(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            check_keras_version(keras.__version__)
            self.pull()
            if with_optimizer:
                self._optimizer_from_ps()
            if not isinstance(filepath, (str, os.PathLike)):
                return method(self._model, filepath, *args, **kwargs)
            return atomic_write_path(
                os.fspath(filepath), lambda tmp: method(self._model, tmp, *args, **kwargs)
            )

        write.__doc__ = method.__doc__
        return write

    def _on_chief(self, name: str) -> Callable[..., Any]:
        """``evaluate`` / ``predict`` on the chief, on the weights read from the ps (TF's
        coordinator reads its variables from the ps)."""
        method = getattr(type(self._model), name)

        def on_chief(*args: Any, **kwargs: Any) -> Any:
            check_keras_version(keras.__version__)
            self.pull()
            bound = inspect.signature(method).bind(self._model, *args, **kwargs)
            x = bound.arguments.get("x")
            if isinstance(x, DatasetCreator):
                bound.arguments["x"] = _on_the_chief(x, bound.arguments.get("steps"))
            return method(*bound.args, **bound.kwargs)

        on_chief.__doc__ = method.__doc__
        return on_chief

    def load_weights(self, *args: Any, **kwargs: Any) -> Any:
        """Keras's ``load_weights`` on the chief, then the values go to the ps."""
        result = type(self._model).load_weights(self._model, *args, **kwargs)
        self._strategy.extended.push_parameters(self._params())
        return result

    # --- compile ------------------------------------------------------------------------------
    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Keras's ``compile``, then the optimizer's update rule for the ps (refused here, in
        one line, when the ps cannot run it) and the model's config for the workers."""
        check_keras_version(keras.__version__)
        if kwargs.get("jit_compile") is True:
            raise NotImplementedError(
                _NOT_ON_PS.format(
                    what="jit_compile=True", instead="compile with jit_compile=False."
                )
            )
        if kwargs.get("steps_per_execution", 1) != 1:
            raise NotImplementedError(
                _NOT_ON_PS.format(
                    what="steps_per_execution > 1", instead="compile with steps_per_execution=1."
                )
            )
        model = self._model
        if not model.built or not all(_remote.ps_ref(v.value) is not None for v in model.weights):
            raise RuntimeError(
                f"The weights of {model.name} are not all on the ps: build the model in "
                "strategy.scope() (keras.Input(shape) first, or model.build(input_shape) "
                "there), so that every weight is created on the parameter servers."
            )
        type(model).compile(model, *args, **kwargs)
        cls, arguments = ps_optimizer(model.optimizer, model.trainable_weights)
        optimizer = cls([v.value for v in model.trainable_weights], **arguments)
        self._replica = _Replica(model, optimizer)

    # --- fit ----------------------------------------------------------------------------------
    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: Any = "auto",
        callbacks: Any = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        class_weight: Any = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int = 1,
    ) -> Any:
        """TF's ``Model.fit`` with a ``ClusterCoordinator`` (see the module's docstring)."""
        check_keras_version(keras.__version__)
        replica = self._replica
        if replica is None:  # Keras's own text
            raise RuntimeError("You must call `compile()` before using the model.")
        _refuse_fit_arguments(validation_split, class_weight, sample_weight, callbacks)
        creator = _creator(x, y, batch_size, shuffle)
        if steps_per_epoch is None:
            raise ValueError(STEPS_REQUIRED)
        if not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
            raise ValueError(
                f"steps_per_epoch must be a positive integer under ParameterServerStrategy (each "
                f"epoch schedules that many steps), got {steps_per_epoch!r}."
            )
        verbose = 1 if verbose == "auto" else verbose
        cluster = coordinator_lib.ClusterCoordinator(self._strategy)
        dataset = cluster.create_per_worker_dataset(
            self._strategy.distribute_datasets_from_function(creator, options=creator.input_options)
        )
        iterator = iter(dataset)
        model = self._model
        callback_list = keras.callbacks.CallbackList(
            list(callbacks or ()),
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps_per_epoch,
            model=model,
        )
        model.stop_training = False
        train = replica.train
        logs: dict[str, Any] = {}
        callback_list.on_train_begin()
        for epoch in range(initial_epoch, epochs):
            callback_list.on_epoch_begin(epoch)
            results = []
            for step in range(steps_per_epoch):
                callback_list.on_train_batch_begin(step)
                results.append(cluster.schedule(train, args=(iterator,)))
                callback_list.on_train_batch_end(step, {})
                if model.stop_training:
                    break
            cluster.join()
            logs = self._epoch_figures([r.get() for r in results])
            self.pull()
            if validation_data is not None and (epoch + 1) % validation_freq == 0:
                logs.update(
                    self._validate(
                        validation_data, validation_batch_size, batch_size, validation_steps
                    )
                )
            callback_list.on_epoch_end(epoch, logs)
            if model.stop_training:
                break
        callback_list.on_train_end(logs=logs)
        return model.history

    def _epoch_figures(self, steps: list[tuple[list[torch.Tensor], Any]]) -> dict[str, Any]:
        """The chief's metrics over the epoch's steps: each step's metric variables added, in
        the order the steps were scheduled, to the chief's (built from the first step's
        targets and predictions with no row)."""
        model = self._model
        if not steps:
            return {}
        y, y_pred = steps[0][1]
        type(model).compute_metrics(model, None, y, y_pred)  # builds the compiled metrics
        model.reset_metrics()
        variables = [v for m in model.metrics for v in m.variables]
        for values, _ in steps:
            if len(values) != len(variables):
                raise RuntimeError(
                    "strategyjob.keras: a worker's model has other metrics than the chief's "
                    f"({len(values)} metric variables, the chief {len(variables)})."
                )
            for variable, value in zip(variables, values):
                variable.assign(variable.value + value.to(variable.value.dtype))
        return {k: float(v) for k, v in type(model).get_metrics_result(model).items()}

    def _validate(self, data: Any, batch_size: Any, fit_batch: Any, steps: Any) -> dict[str, Any]:
        """``validation_data`` evaluated on the chief, as TF's coordinator does without
        ``pss_evaluation_shards``."""
        if isinstance(data, DatasetCreator):
            x, y, sample_weight = data, None, None
        else:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        results = self._model.evaluate(
            x=x,
            y=y,
            sample_weight=sample_weight,
            batch_size=batch_size or fit_batch,
            steps=steps,
            verbose=0,
            return_dict=True,
        )
        return {f"val_{name}": value for name, value in results.items()}


def _on_the_chief(creator: DatasetCreator, steps: int | None) -> Any:
    """A ``DatasetCreator``'s batches for ``evaluate`` / ``predict`` on the chief: ``steps``
    of them (required, as TF requires it)."""
    if steps is None:
        raise ValueError(STEPS_REQUIRED)
    return iter(creator(InputContext(1, 0, 1)))


def _refuse_fit_arguments(
    validation_split: float, class_weight: Any, sample_weight: Any, callbacks: Any
) -> None:
    """One error for a ``fit`` argument the coordinator's fit has no way to honour."""
    weights = (
        "put the weights in the batches the DatasetCreator's dataset_fn returns "
        "((x, y, sample_weight))."
    )
    for what, given, instead in (
        ("`validation_split`", bool(validation_split), "pass validation_data."),
        ("`class_weight`", class_weight is not None, weights),
        ("`sample_weight`", sample_weight is not None, weights),
    ):
        if given:
            raise NotImplementedError(_NOT_ON_PS.format(what=what, instead=instead))
    for callback in callbacks or ():
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise NotImplementedError(
                _NOT_ON_PS.format(
                    what="keras.callbacks.BackupAndRestore",
                    instead="save with keras.callbacks.ModelCheckpoint (written by the chief) "
                    "and load_weights when the chief restarts.",
                )
            )


def _creator(x: Any, y: Any, batch_size: int | None, shuffle: bool) -> DatasetCreator:
    """``x`` as a ``DatasetCreator``: as is, or arrays (with ``y``) made one, as TF's
    ``_ClusterCoordinatorDataHandler`` does (every worker draws batches of the whole arrays,
    shuffled by its own generator)."""
    if isinstance(x, DatasetCreator):
        if y is not None:
            raise ValueError(
                "`y` argument is not supported when using "
                "`tf.keras.utils.experimental.DatasetCreator`: the dataset_fn's batches hold "
                "the targets."
            )
        return x
    arrays = (np.ndarray, torch.Tensor)
    if isinstance(x, arrays) and isinstance(y, arrays):
        return DatasetCreator(_ArrayBatches(x, y, batch_size or 32, shuffle))
    raise NotImplementedError(UNSUPPORTED_INPUT.format(kind=type(x).__name__))


class _ArrayBatches:
    """``dataset_fn`` of arrays: batches of ``batch_size`` rows, epoch after epoch without
    end, in a new random order each pass when ``shuffle`` (the last batch of a pass short)."""

    def __init__(self, x: Any, y: Any, batch_size: int, shuffle: bool) -> None:
        self.x, self.y = torch.as_tensor(x), torch.as_tensor(y)
        self.batch_size, self.shuffle = batch_size, shuffle

    def __call__(self, input_context: Any) -> Any:
        # Called on each worker: a seed of its own, so that the workers' orders differ.
        return self._batches(uuid.uuid4().int & ((1 << 62) - 1))

    def _batches(self, seed: int) -> Any:
        rows = self.x.shape[0]
        generator = torch.Generator().manual_seed(seed)
        while True:
            order = torch.randperm(rows, generator=generator) if self.shuffle else None
            for start in range(0, rows, self.batch_size):
                index = slice(start, start + self.batch_size)
                if order is None:
                    yield self.x[index], self.y[index]
                else:
                    picked = order[index]
                    yield self.x[picked], self.y[picked]
