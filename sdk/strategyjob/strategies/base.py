"""``Strategy``, ``StrategyExtended``, ``RunOptions`` and the default strategy.

A strategy is a thin public facade over its ``extended`` object. Concrete strategies implement
a handful of hooks on their ``StrategyExtended`` (local devices, worker count and index,
cross-worker collectives); everything else here — reductions with TF's axis and MEAN rules,
gathers, ``reduce_to``/``batch_reduce_to``/``update``, local results — is written once on top
of them. Every cross-replica reduction goes through :meth:`StrategyExtended._all_reduce_flat`:
the local replicas' components are summed in-process, then the per-worker sums go through
``extended.collectives`` (a ``collective.backend.CollectiveBackend``: identities in one
process; ``torch.distributed`` in MultiWorkerMirroredStrategy and TPUStrategy).
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from strategyjob import _context, _nest
from strategyjob._devices import LogicalDevice, Topology, canonicalize, to_device
from strategyjob._reduce import ReduceOp, to_reduce_op
from strategyjob._values import (
    DistributedValues,
    Mirrored,
    PerReplica,
    ValueContext,
    container_of,
    is_distributed_variable,
    regroup,
    select_replica,
)
from strategyjob.collective import grad_sync
from strategyjob.collective.backend import IN_PROCESS, CollectiveBackend
from strategyjob.input import InputContext, distribute_dataset, distribute_datasets_from_function
from strategyjob.input.options import AutoShardPolicy

__all__ = [
    "HoldsOptimizerSlots",
    "InputWorker",
    "RunOptions",
    "Strategy",
    "StrategyExtended",
    "add_scope_entry_check",
    "broadcast_pending_parameters",
]

GATHER_REQUIRES_CROSS_REPLICA = (
    "tf.distribute.Strategy.gather method requires cross-replica context, use "
    "get_replica_context().all_gather() instead"
)


class RunOptions(NamedTuple):
    """Options for ``Strategy.run`` (``tf.distribute.RunOptions``); accepted for compatibility."""

    experimental_enable_dynamic_batch_size: bool = True
    experimental_bucketizing_dynamic_shape: bool = False
    experimental_xla_options: Any = None


class InputWorker(NamedTuple):
    """One input pipeline of this process: its host device and the replicas it feeds."""

    device: torch.device
    compute_devices: tuple[torch.device, ...]


# ---------------------------------------------------------------------------------------------
# tensor helpers


def _to_tensor(value: Any) -> torch.Tensor:
    """A tensor for a component: tensors as is, variables read, Python/numpy values converted."""
    if isinstance(value, torch.Tensor):
        return value
    read = getattr(value, "read_value", None)
    if callable(read):
        return read()
    return torch.as_tensor(value)


def _copy_to(tensor: Any, device: torch.device | None, *, clone: bool) -> Any:
    if not isinstance(tensor, torch.Tensor):
        return tensor
    moved = to_device(tensor, device) if device is not None else tensor
    return moved.clone() if clone and moved is tensor else moved


def _device_of(value: Any) -> torch.device | None:
    device = getattr(value, "device", None)
    if device is None or device == "":
        return None
    return canonicalize(device).torch_device


def _divide(total: torch.Tensor, count: int | torch.Tensor) -> torch.Tensor:
    """MEAN's division, TF's ``truediv``: integers give a float (8/16-bit: float32, wider:
    float64), so the MEAN of ints 1 and 2 is 1.5, never a floored 1."""
    if not (total.is_floating_point() or total.is_complex()):
        total = total.to(torch.float32 if total.element_size() <= 2 else torch.float64)
    if isinstance(count, torch.Tensor):
        count = to_device(count, total.device).to(total.dtype)
    return total / count


def _normalize_axes(axis: Any) -> tuple[int, ...]:
    if isinstance(axis, bool) or not isinstance(axis, (int, tuple, list)):
        raise TypeError(f"Expected `axis` to be an integer, tuple or list not: {axis!r}")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
        raise TypeError(f"Expected `axis` to be an integer, tuple or list not: {axis!r}")
    return axes


def _resolve_axes(axes: tuple[int, ...], tensor: torch.Tensor) -> tuple[int, ...]:
    rank = tensor.dim()
    for a in axes:
        if not -rank <= a < rank:
            raise ValueError(f"`axis` = {a} out of range for `value` with rank {rank}")
    return tuple(a % rank for a in axes)


def _sum_over(value: Any, axes: tuple[int, ...]) -> torch.Tensor:
    tensor = _to_tensor(value)
    resolved = _resolve_axes(axes, tensor)
    return tensor.sum(dim=resolved) if resolved else tensor


def _count_over(value: Any, axes: tuple[int, ...]) -> torch.Tensor:
    tensor = _to_tensor(value)
    resolved = _resolve_axes(axes, tensor)
    return torch.tensor(math.prod(tensor.shape[a] for a in resolved), dtype=torch.int64)


def _check_gatherable(tensor: torch.Tensor, axis: int, what: str) -> int:
    if tensor.is_sparse:
        raise NotImplementedError(f"{what} does not support IndexedSlices")
    if tensor.dim() == 0:
        raise ValueError(
            f"`{what}` needs components of rank >= 1, got a scalar (rank 0). Give each replica's "
            "value a leading dimension first, e.g. `value.unsqueeze(0)` (TF: `expand_dims`)."
        )
    rank = tensor.dim()
    if not -rank <= axis < rank:
        raise ValueError(f"`axis` = {axis} out of range for `value` with rank {rank}")
    return axis % rank


def _map_local(topology: Topology, fn: Callable[[Any], Any], value: Any) -> Any:
    """``run(fn, args=(value,))`` without threads, for elementwise per-replica helpers."""
    if isinstance(value, DistributedValues):
        results = [fn(c) for c in value.values]
    else:
        results = [fn(value) for _ in topology.local_devices]
    return regroup(results)


def _is_mirrored(value: Any) -> bool:
    """``Mirrored`` or a MirroredVariable (whose components are always equal)."""
    if isinstance(value, Mirrored):
        return True
    return type(value).__name__ == "MirroredVariable" and is_distributed_variable(value)


def _is_distributed_nest(value: Any) -> bool:
    """A list/tuple/dict structure with a distributed value among its leaves.

    Such nests reduce and gather leaf by leaf; a nest of plain values (``[1.0, 2.0]``) stays
    one tensor-like value, as TF converts it.
    """
    return _nest.is_nested(value) and any(
        isinstance(leaf, DistributedValues) for leaf in _nest.flatten(value)
    )


def _all_zero(value: Any) -> bool:
    try:
        return bool(np.all(np.asarray(value) == 0))
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# StrategyExtended


#: Checks run when a strategy's scope is entered; one may refuse it with an error.
_scope_entry_checks: list[Callable[[Strategy], None]] = []


def add_scope_entry_check(check: Callable[[Strategy], None]) -> None:
    """Run ``check(strategy)`` whenever a real strategy's scope is entered (not on re-entry),
    before anything is built in it: a layer above refuses a setup it cannot distribute
    (``strategyjob.keras``: Keras loaded with a backend other than torch). It runs at every
    ``run`` too, so it must be quick; adding one twice is a no-op."""
    if check not in _scope_entry_checks:
        _scope_entry_checks.append(check)


@runtime_checkable
class HoldsOptimizerSlots(Protocol):
    """A strategy's ``extended`` that keeps the state of optimizers over its parameters itself
    (ParameterServerStrategy: on the parameter servers, which run the steps): checkpoints
    (``train.Checkpoint``) and Keras's optimizer read and restore that state through it."""

    def optimizer_slots(self, opt: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
        """``opt``'s per-parameter state as ``Optimizer.state_dict()["state"]`` lays it out."""
        ...

    def load_optimizer_slots(
        self, opt: torch.optim.Optimizer, state: dict[int, dict[str, Any]]
    ) -> None:
        """Put ``state`` (laid out as :meth:`optimizer_slots` gives it) where ``opt``'s is."""
        ...


def broadcast_pending_parameters(extended: StrategyExtended) -> None:
    """Give every parameter registered since the last call the chief's value.

    Parameters are registered when modules are built (before their initialisers run), so the
    strategies of several processes call this when the outermost scope exits and before each
    ``run``; every worker builds the same modules in the same order, so the broadcasts line up.
    """
    pending = extended.gradient_synchronizer.take_pending_broadcast()
    if pending:
        with torch.no_grad():
            extended.collectives.broadcast_from_chief_in_place([p.data for p in pending])


class StrategyExtended:
    """Additional APIs for algorithms that need to be distribution-aware (TF's ``extended``).

    Hooks a concrete strategy sets or overrides: ``_logical_devices`` (one ``LogicalDevice``
    per local replica), ``_num_workers``, ``_worker_index``, ``collectives``,
    ``create_variable``, ``register_parameter``, ``_call_for_each_replica``.

    What the modules around a strategy may ask of its ``extended`` is declared here, without
    underscores: ``topology``, ``collectives``, ``gradient_synchronizer``,
    ``adopts_parameters`` / ``register_parameter`` (``collective.grad_sync``'s
    ``SynchronizedExtended``), ``create_variable`` (``strategyjob.Variable`` in scope) and
    ``container_strategy()``; a strategy that keeps optimizer state elsewhere also implements
    :class:`HoldsOptimizerSlots`. What the ``Strategy`` facade asks of it (not TF API: TF's
    Strategy reads underscored hooks) is declared too: ``cluster_resolver``, ``local_results``,
    ``reduce_to_default``, ``default_reduce_destination``, ``gather_to``,
    ``distribute_values_from_function``, ``distribute_dataset`` and
    ``distribute_datasets_from_function``; concrete strategies override these.

    ``collectives`` is the strategy's :class:`~strategyjob.collective.backend.CollectiveBackend`:
    every operation between workers (reductions, gathers, broadcasts of the chief's values,
    agreement on the end of the input, gradient buckets) goes through it. Strategies of one
    process keep the in-process one (identities).
    """

    _num_workers: int = 1
    _worker_index: int = 0

    def __init__(self, container_strategy: Strategy) -> None:
        self._container_strategy_weakref = weakref.ref(container_strategy)
        self._logical_devices: tuple[LogicalDevice, ...] = (LogicalDevice("cpu", 0),)
        self._cluster_resolver: Any = None
        #: The collectives between this strategy's workers (identities within one process).
        self.collectives: CollectiveBackend = IN_PROCESS
        self._gradient_synchronizer: grad_sync.GradientSynchronizer | None = None

    #: Attributes that a deep copy shares with the original (per-process state: process groups,
    #: meshes, the cluster resolver) and those it starts without (None: made again on use).
    _shared_when_copied: frozenset[str] = frozenset()
    _reset_when_copied: frozenset[str] = frozenset()

    def __deepcopy__(self, memo: dict) -> StrategyExtended:
        """A copy of the other attributes; copied along with its strategy (``Strategy.
        __deepcopy__`` puts the strategy's copy in ``memo`` first), it belongs to that copy."""
        cls = type(self)
        result: StrategyExtended = cls.__new__(cls)
        memo[id(self)] = result
        for key, value in self.__dict__.items():
            if key in self._reset_when_copied:
                value = None
            elif key not in self._shared_when_copied:
                value = copy.deepcopy(value, memo)
            result.__dict__[key] = value
        strategy = self._container_strategy_weakref()
        if strategy is not None and id(strategy) in memo:
            result._container_strategy_weakref = weakref.ref(memo[id(strategy)])
        return result

    def container_strategy(self) -> Strategy:
        strategy = self._container_strategy_weakref()
        if strategy is None:
            raise RuntimeError(
                "The strategy of this StrategyExtended was garbage-collected; keep a reference "
                "to the strategy object while using its `extended`."
            )
        return strategy

    @property
    def cluster_resolver(self) -> Any:
        """What ``Strategy.cluster_resolver`` returns (None for single-worker strategies)."""
        return self._cluster_resolver

    # --- topology hooks -------------------------------------------------------------------
    @property
    def _local_devices(self) -> tuple[torch.device, ...]:
        """One torch device per local replica (CPU devices keep their logical index)."""
        return tuple(d.torch_device for d in self._logical_devices)

    @property
    def topology(self) -> Topology:
        """Where this strategy's replicas run, for the modules around it (input, variables,
        gradient synchronisation, replica contexts)."""
        return Topology(
            self._local_devices, self._num_workers, self._worker_index, self.num_replicas_in_sync
        )

    @property
    def gradient_synchronizer(self) -> grad_sync.GradientSynchronizer:
        """The synchroniser of the gradients of this strategy's parameters (made on first use:
        ``collective/grad_sync.py`` registers the parameters built in scope with it)."""
        if self._gradient_synchronizer is None:
            self._gradient_synchronizer = grad_sync.GradientSynchronizer(self)
        return self._gradient_synchronizer

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_workers * len(self._logical_devices)

    def _in_multi_worker_mode(self) -> bool:
        return self._num_workers > 1

    def replica_device_name(self, local_id: int) -> str:
        return self._logical_devices[local_id].name

    def _input_host(self) -> LogicalDevice:
        return self._logical_devices[0].host_cpu

    def _input_workers(self) -> tuple[InputWorker, ...]:
        """This process's input pipelines: one, on the host CPU, feeding every local replica."""
        return (InputWorker(self._input_host().torch_device, self._local_devices),)

    # --- scope hooks ------------------------------------------------------------------------
    def on_scope_entered(self) -> None:
        """Runs when this strategy's scope is entered (not on re-entry)."""
        for check in _scope_entry_checks:
            check(self.container_strategy())
        # The torch hooks that register modules and optimizers built in scope exist only while
        # some strategy's scope is entered; they look the strategy up through `_context`.
        grad_sync.scope_entered()

    def on_scope_exited(self) -> None:
        """Runs when this strategy's outermost scope is exited."""
        grad_sync.scope_exited()

    # --- variables and parameters ---------------------------------------------------------
    def create_variable(
        self,
        initial_value: Any,
        *,
        trainable: bool | None = None,
        name: str | None = None,
        synchronization: Any = None,
        aggregation: Any = None,
    ) -> Any:
        """What ``strategyjob.Variable(...)`` made in this strategy's scope becomes
        (``_variables.VariableCreator``): the strategy's kind of variable (each strategy
        overrides this)."""
        from strategyjob import _variables

        return _variables.create_distributed_variable(
            self.container_strategy(),
            initial_value,
            trainable=trainable,
            name=name,
            **_enum_kwargs(synchronization, aggregation),
        )

    #: Whether parameters that reach this strategy without being built in its scope (a module
    #: deep-copied, loaded or attached in scope, an optimizer created in scope over a module
    #: built outside, a parameter later attached to a synchronised module) are registered as if
    #: built there, and an optimizer stepped in ``run`` over parameters of no strategy is
    #: refused (``collective/grad_sync.py``). Mirrored strategies set it: their replicas must
    #: hold the same values, as TF's do for every variable created in scope.
    adopts_parameters: bool = False

    def register_parameter(
        self, param: torch.nn.Parameter, module: torch.nn.Module | None = None
    ) -> torch.nn.Parameter | None:
        """Called for each ``nn.Parameter`` created (or, with ``adopts_parameters``, adopted) in
        scope, with the module it is put in when known; may return a replacement (adopted ones
        take its value and device in place)."""

    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether ``v`` was created while this strategy's scope was active."""
        return getattr(v, "distribute_strategy", None) is self.container_strategy()

    def value_container(self, value: Any) -> Any:
        """The distributed variable that ``value`` is a component of, else ``value``."""
        container = container_of(value)
        return container if container is not None else value

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Accepted for compatibility: variables are always placed per replica device."""
        yield

    # --- devices and roles ------------------------------------------------------------------
    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The devices used to run replicas on this worker, as TF device names."""
        return tuple(d.name for d in self._logical_devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The devices holding variable components."""
        return tuple(d.name for d in self._logical_devices)

    @property
    def experimental_between_graph(self) -> bool:
        return False

    @property
    def experimental_should_init(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        return True

    @property
    def should_save_summary(self) -> bool:
        return True

    # --- input distribution (strategyjob.input reads the hooks above) ----------------------
    _rebatch = True  # split global batches across replicas

    def distribute_dataset(self, dataset: Any, options: Any, auto_shard_policy: Any) -> Any:
        """What ``Strategy.experimental_distribute_dataset`` returns for ``dataset``."""
        return distribute_dataset(
            dataset,
            extended=self,
            options=options,
            auto_shard_policy=_auto_shard(auto_shard_policy),
            rebatch=self._rebatch,
        )

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any) -> Any:
        """What ``Strategy.distribute_datasets_from_function`` returns for ``dataset_fn``."""
        return distribute_datasets_from_function(dataset_fn, extended=self, options=options)

    # --- running replicas -----------------------------------------------------------------
    def call_for_each_replica(
        self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict | None = None
    ) -> Any:
        """Run ``fn`` once per replica (prefer ``Strategy.run``)."""
        _context.require_cross_replica_or_default_context_extended(self)
        if kwargs is None:
            kwargs = {}
        with self.container_strategy().scope():
            return self._call_for_each_replica(fn, tuple(args), kwargs)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _call_for_each_replica")

    def _make_replica_context(self, local_id: int) -> _context.ReplicaContext:
        return _context.ReplicaContext(
            self.container_strategy(),
            self.topology.global_replica_id(local_id),
            _local_replica_id=local_id,
        )

    # --- local results and values ---------------------------------------------------------
    def local_results(self, value: Any) -> tuple:
        """One entry per local replica. A nest (list, tuple, dict), with or without distributed
        values, gives one copy per replica, as TF 2.21 does (``{"a": 1.0}`` under 2 replicas:
        two dicts); a single plain value gives ``(value,)``."""
        if isinstance(value, DistributedValues):
            return value.values
        if _nest.is_nested(value):
            count = len(self._logical_devices)
            return tuple(
                _nest.map_structure(
                    lambda x, i=i: x.values[i] if isinstance(x, DistributedValues) else x, value
                )
                for i in range(count)
            )
        return (value,)

    def distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Any:
        """``Strategy.experimental_distribute_values_from_function``: one value per replica."""
        topology = self.topology
        results = [
            value_fn(ValueContext(topology.global_replica_id(i), topology.num_replicas_in_sync))
            for i in range(len(topology.local_devices))
        ]
        return regroup(results, always_wrap=True)

    # --- reductions: the single path of every cross-replica reduction ----------------------
    def _all_reduce_flat(
        self, reduce_op: ReduceOp, components: Sequence[Sequence[Any]]
    ) -> list[torch.Tensor]:
        """``components[j]`` holds value j's local components; returns value j reduced globally.

        Local replicas are summed in-process, the sums go through ``collectives.all_reduce``
        (SUM), and MEAN divides by ``num_replicas_in_sync``.
        """
        local_sums = []
        for parts in components:
            tensors = [_to_tensor(p) for p in parts]
            total = tensors[0]
            for t in tensors[1:]:
                total = total + to_device(t, total.device)
            local_sums.append(total)
        summed = self.collectives.all_reduce(local_sums, ReduceOp.SUM)
        if reduce_op == ReduceOp.MEAN:
            count = self.num_replicas_in_sync
            summed = [_divide(t, count) for t in summed]
        return list(summed)

    def default_reduce_destination(self) -> torch.device:
        """Where ``Strategy.reduce`` and ``Strategy.gather`` put their result."""
        return self._input_host().torch_device

    def _place_on(self, destinations: Any, tensor: Any) -> Any:
        """Put ``tensor`` where ``destinations`` (device, tensor, variable, values) says."""
        if destinations is None or not isinstance(tensor, torch.Tensor):
            return tensor
        if isinstance(destinations, (list, tuple)):
            raise ValueError(
                "`destinations` must be a device string, a torch.device, a tensor, a variable "
                "or a DistributedValues, not a list or tuple; call reduce_to once per "
                "destination or use batch_reduce_to."
            )
        if isinstance(destinations, DistributedValues):
            devices = [_device_of(c) for c in destinations.values]
            if len(devices) == 1:
                return _copy_to(tensor, devices[0], clone=False)
            return Mirrored([_copy_to(tensor, d, clone=i > 0) for i, d in enumerate(devices)])
        if isinstance(destinations, (str, torch.device, LogicalDevice)):
            return _copy_to(tensor, canonicalize(destinations).torch_device, clone=False)
        return _copy_to(tensor, _device_of(destinations), clone=False)

    def reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value: Any,
        destinations: Any,
        options: Any = None,
    ) -> Any:
        """Combine ``value`` across replicas and place the result on ``destinations``."""
        _context.require_cross_replica_or_default_context_extended(self)
        reduce_op = self._check_reduce_op(reduce_op)
        self._check_destinations(destinations)
        return self._reduce_to(reduce_op, value, destinations, options)

    def batch_reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: Any = None,
    ) -> list[Any]:
        """``reduce_to`` for many values at once (their collectives are issued together)."""
        _context.require_cross_replica_or_default_context_extended(self)
        reduce_op = self._check_reduce_op(reduce_op)
        pairs = list(value_destination_pairs)
        for _, destinations in pairs:
            self._check_destinations(destinations)
        return self._batch_reduce_to(reduce_op, pairs, options)

    @staticmethod
    def _check_reduce_op(reduce_op: Any) -> ReduceOp:
        if type(reduce_op).__name__ == "VariableAggregation":
            raise ValueError(
                f"reduce_to takes a ReduceOp, got {reduce_op}; convert it with "
                "ReduceOp.from_variable_aggregation()."
            )
        return to_reduce_op(reduce_op)

    @staticmethod
    def _check_destinations(destinations: Any) -> None:
        if isinstance(destinations, (list, tuple)):
            raise ValueError(
                "`destinations` must be a device string, a torch.device, a tensor, a variable "
                f"or a DistributedValues, not a {type(destinations).__name__}."
            )

    def _reduce_to(self, reduce_op: ReduceOp, value: Any, destinations: Any, options: Any) -> Any:
        return self._batch_reduce_to(reduce_op, [(value, destinations)], options)[0]

    def _batch_reduce_to(
        self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Any]], options: Any
    ) -> list[Any]:
        """Nests holding distributed values reduce leaf by leaf (as TF's Mirrored ``_reduce_to``
        maps over the structure); every leaf of every pair goes into one batch."""
        flat_pairs: list[tuple[Any, Any]] = []
        spans: list[tuple[Any, int] | None] = []  # (structure, leaf count) per nested pair
        for value, destinations in pairs:
            if _is_distributed_nest(value):
                leaves = _nest.flatten(value)
                spans.append((value, len(leaves)))
                flat_pairs.extend((leaf, destinations) for leaf in leaves)
            else:
                spans.append(None)
                flat_pairs.append((value, destinations))
        reduced = self._batch_reduce_leaves(reduce_op, flat_pairs, options)
        if not any(spans):
            return reduced
        results, offset = [], 0
        for span in spans:
            if span is None:
                results.append(reduced[offset])
                offset += 1
            else:
                structure, count = span
                results.append(_nest.pack_sequence_as(structure, reduced[offset : offset + count]))
                offset += count
        return results

    def _batch_reduce_leaves(
        self, reduce_op: ReduceOp, pairs: Sequence[tuple[Any, Any]], options: Any
    ) -> list[Any]:
        results: list[Any] = [None] * len(pairs)
        pending: list[int] = []
        for i, (value, destinations) in enumerate(pairs):
            if isinstance(value, DistributedValues):
                if _is_mirrored(value):
                    if reduce_op == ReduceOp.MEAN:
                        results[i] = value
                        continue
                    raise ValueError(
                        f"Cannot reduce a Mirrored value with {reduce_op}: its components are "
                        "copies of one value. Use ReduceOp.MEAN to read it, or pass per-replica "
                        "values (PerReplica)."
                    )
                pending.append(i)
            elif self._num_workers > 1 and len(self._logical_devices) == 1:
                pending.append(i)  # one replica per worker: the host value is that replica's
            else:
                results[i] = self._reduce_non_distributed(reduce_op, value, destinations)
        if pending:
            components = [self._local_results_of(pairs[i][0]) for i in pending]
            reduced = self._all_reduce_flat(reduce_op, components)
            for i, tensor in zip(pending, reduced):
                results[i] = self._place_on(pairs[i][1], tensor)
        return results

    def _local_results_of(self, value: Any) -> tuple:
        return value.values if isinstance(value, DistributedValues) else (value,)

    def _reduce_non_distributed(self, reduce_op: ReduceOp, value: Any, destinations: Any) -> Any:
        """TF's ``reduce_non_distributed_value``: one value standing for every replica."""
        if not isinstance(value, torch.Tensor) and _all_zero(value):
            array = np.asarray(value)
            return np.zeros(array.shape, dtype=array.dtype)
        if reduce_op == ReduceOp.MEAN:
            return value
        if len(self._logical_devices) != 1:
            raise ValueError(
                f"A non-DistributedValues value {value} cannot be reduced with the given reduce "
                f"op {reduce_op}."
            )
        return self._place_on(destinations, value)

    def reduce_to_default(self, reduce_op: ReduceOp, value: Any) -> Any:
        """Reduce to one value on the default destination (what ``Strategy.reduce`` returns)."""
        reduced = self.reduce_to(reduce_op, value, self.default_reduce_destination())
        return self.local_results(reduced)[0]

    def batch_all_reduce(self, reduce_op: ReduceOp, values: list, options: Any) -> list:
        """The merge function of ``ReplicaContext.all_reduce``: each replica gets a copy."""
        pairs = [(v, v if isinstance(v, DistributedValues) else _device_of(v)) for v in values]
        return self.batch_reduce_to(reduce_op, pairs, options)

    # --- gathers ----------------------------------------------------------------------------
    def gather_to(self, value: Any, destinations: Any, axis: int, options: Any = None) -> Any:
        """The replicas' components of ``value`` concatenated along ``axis``, on
        ``destinations`` (``Strategy.gather``; ``value`` itself: ``all_gather``)."""
        what = "all_gather" if destinations is value else "gather"
        if isinstance(value, DistributedValues):
            tensors = [_to_tensor(c) for c in value.values]
        elif self._num_workers > 1 and len(self._logical_devices) == 1:
            tensors = [_to_tensor(value)]
        else:
            return value
        axes = {_check_gatherable(t, axis, what) for t in tensors}
        dim = axes.pop()
        device = tensors[0].device
        local = tensors[0]
        if len(tensors) > 1:
            local = torch.cat([to_device(t, device) for t in tensors], dim=dim)
        gathered = self.collectives.all_gather(local, dim)
        return self._place_on(destinations, gathered)

    def batch_all_gather(self, values: list, axis: int, options: Any) -> list:
        """The merge function of ``ReplicaContext.all_gather``: each replica gets a copy."""
        return [self.gather_to(v, v, axis, options) for v in values]

    # --- updates and broadcasts -------------------------------------------------------------
    def update(
        self,
        var: Any,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict | None = None,
        group: bool = True,
    ) -> Any:
        """Run ``fn(component, *args, **kwargs)`` on every component of ``var``.

        Called in a replica context, this goes through ``merge_call`` (so ``args`` are merged
        first); in cross-replica context it returns a ``Mirrored`` of the per-component results
        (``group=False``: a tuple).
        """
        kwargs = dict(kwargs or {})
        replica_context = _context.get_replica_context()
        if replica_context is None or _context.is_default_strategy(replica_context.strategy):
            with self.container_strategy().scope():
                return self._update(var, fn, tuple(args), kwargs, group)

        def merge_fn(_: Strategy, *merged_args: Any, **merged_kwargs: Any) -> Any:
            return self.update(var, fn, merged_args, merged_kwargs, group=group)

        return replica_context.merge_call(merge_fn, args=args, kwargs=kwargs)

    def _update(self, var: Any, fn: Callable[..., Any], args: tuple, kwargs: dict, group: bool):
        if is_distributed_variable(var):
            updates = []
            for i, component in enumerate(var.values):
                with _context.UpdateContext(i):
                    updates.append(
                        fn(component, *select_replica(i, args), **select_replica(i, kwargs))
                    )
            if not group:
                return tuple(updates)
            return regroup(updates, always_wrap=True, wrap_class=Mirrored)
        with _context.UpdateContext(0):
            target = var.get() if type(var).__name__ == "AggregatingVariable" else var
            result = fn(target, *select_replica(0, args), **select_replica(0, kwargs))
        return result if group else (result,)

    def broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """Copy ``tensor`` to ``destinations`` (a ``Mirrored`` for distributed destinations)."""
        _context.require_cross_replica_or_default_context_extended(self)
        self._check_destinations(destinations)
        return self._broadcast_to(tensor, destinations)

    def _broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        return self._place_on(destinations, tensor)


def _enum_kwargs(synchronization: Any, aggregation: Any) -> dict:
    """Pass only the enums given, so the variable layer's defaults apply otherwise."""
    kwargs = {}
    if synchronization is not None:
        kwargs["synchronization"] = synchronization
    if aggregation is not None:
        kwargs["aggregation"] = aggregation
    return kwargs


# ---------------------------------------------------------------------------------------------
# Strategy


class Strategy:
    """A state & compute distribution policy on a list of devices (``tf.distribute.Strategy``)."""

    _is_default_strategy = False

    def __init__(self, extended: StrategyExtended) -> None:
        self._extended = extended

    # --- properties ---------------------------------------------------------------------------
    @property
    def extended(self) -> StrategyExtended:
        """``StrategyExtended`` with additional methods."""
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas over which gradients are aggregated."""
        return self._extended.num_replicas_in_sync

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver of this strategy (None for single-worker strategies)."""
        return self._extended.cluster_resolver

    # --- scope and run ----------------------------------------------------------------------
    def scope(self) -> Any:
        """Context manager making this strategy current (for variable and model creation)."""
        return _context.CrossReplicaScope(self)

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        """Invoke ``fn`` on each local replica, with the given arguments.

        ``DistributedValues`` arguments (other than distributed variables) are replaced by the
        replica's component; results are regrouped into ``PerReplica`` values (a value that is
        the very same object on every replica is returned as is).
        """
        if not isinstance(args, (list, tuple)):
            raise ValueError(f"positional args must be a list or tuple, got {type(args)}")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"keyword args must be a dict, got {type(kwargs)}")
        if not callable(fn):
            raise TypeError(f"`fn` passed to run() must be callable, got {type(fn)}")
        with self.scope():
            return self._extended.call_for_each_replica(fn, args=tuple(args), kwargs=kwargs)

    def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
        """Deprecated alias of :meth:`run` (TF 2.0-2.1 name)."""
        return self.run(fn, args=args, kwargs=kwargs, options=options)

    # --- reductions -----------------------------------------------------------------------------
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | Sequence[int] | None):
        """Reduce ``value`` across replicas and return the result on the host.

        ``axis=None`` reduces across replicas only. With ``axis``, each replica first reduces
        along ``axis``; MEAN then divides the global sum by the global element count, so partial
        batches are weighted by their true size. A nest holding distributed values (what
        ``run`` returns for a dict of losses) is reduced leaf by leaf, its structure kept.
        """
        reduce_op = to_reduce_op(reduce_op)
        _context.require_cross_replica_or_default_context_extended(self._extended)
        extended = self._extended
        if axis is None:
            return extended.reduce_to_default(reduce_op, value)
        axes = _normalize_axes(axis)
        if _is_distributed_nest(value):
            return _nest.map_structure(lambda leaf: self.reduce(reduce_op, leaf, axes), value)
        topology = extended.topology
        numerator = extended.reduce_to_default(
            ReduceOp.SUM, _map_local(topology, lambda v: _sum_over(v, axes), value)
        )
        if reduce_op == ReduceOp.SUM:
            return numerator
        denominator = extended.reduce_to_default(
            ReduceOp.SUM, _map_local(topology, lambda v: _count_over(v, axes), value)
        )
        return _divide(_to_tensor(numerator), _to_tensor(denominator))

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenate the replicas' components of ``value`` along ``axis``, in replica order.

        A nest holding distributed values (e.g. from ``experimental_distribute_values_from_
        function``) is gathered leaf by leaf, its structure kept: no replica's data is dropped.
        """
        _context.require_cross_replica_or_default_context_extended(
            self._extended, GATHER_REQUIRES_CROSS_REPLICA
        )
        extended = self._extended
        destination = extended.default_reduce_destination()

        def gather_leaf(leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.is_sparse:
                raise NotImplementedError("gather does not support IndexedSlices")
            return extended.local_results(extended.gather_to(leaf, destination, axis))[0]

        if _is_distributed_nest(value):
            return _nest.map_structure(gather_leaf, value)
        return gather_leaf(value)

    def experimental_local_results(self, value: Any) -> tuple:
        """The local per-replica components of ``value`` (``(value,)`` for a plain value)."""
        return self._extended.local_results(value)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Call ``value_fn(ValueContext)`` for each local replica and wrap the results."""
        return self._extended.distribute_values_from_function(value_fn)

    # --- input ------------------------------------------------------------------------------------
    def experimental_distribute_dataset(
        self,
        dataset: Any,
        options: Any = None,
        auto_shard_policy: AutoShardPolicy = AutoShardPolicy.AUTO,
    ) -> Any:
        """Split each global batch of ``dataset`` across the replicas (see strategyjob.input).

        ``auto_shard_policy`` is what TF sets on the dataset's options
        (``experimental_distribute.auto_shard_policy``); a keyword is the PyTorch way.
        """
        return self._extended.distribute_dataset(dataset, options, auto_shard_policy)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[Any], Any], options: Any = None
    ) -> Any:
        """Call ``dataset_fn(InputContext)`` per input pipeline; batches are per replica."""
        return self._extended.distribute_datasets_from_function(dataset_fn, options)

    def experimental_distribute_datasets_from_function(self, dataset_fn, options=None):
        """Deprecated alias of :meth:`distribute_datasets_from_function`."""
        return self.distribute_datasets_from_function(dataset_fn, options)

    def experimental_make_numpy_dataset(self, numpy_input: Any, session: Any = None) -> Any:
        """A dataset of the examples in ``numpy_input`` (a nest of arrays sliced along dim 0).

        The arrays are shared with torch, not copied, where torch can view them (else copied
        once). Batch it (``DataLoader(ds, batch_size=...)`` or ``ds.batch(...)``) before
        ``experimental_distribute_dataset``. ``session`` is TF1's and is ignored.
        """
        from strategyjob.input.datasets import NumpyDataset

        return NumpyDataset(numpy_input)

    # --- copying --------------------------------------------------------------------------
    def __copy__(self) -> Strategy:
        raise RuntimeError("Must only deepcopy DistributionStrategy.")

    def __deepcopy__(self, memo: dict) -> Strategy:
        cls = type(self)
        result = cls.__new__(cls)
        memo[id(self)] = result  # the copy of the extended belongs to `result` (its __deepcopy__)
        for key, value in self.__dict__.items():
            setattr(result, key, copy.deepcopy(value, memo))
        return result


def _auto_shard(policy: Any) -> Any:
    return policy if policy is not None else AutoShardPolicy.AUTO


# ---------------------------------------------------------------------------------------------
# The default strategy


class _SingleReplicaExtendedMixin:
    """Shared by the default strategy and OneDeviceStrategy: one replica, no communication."""

    def _reduce_to(self, reduce_op: ReduceOp, value: Any, destinations: Any, options: Any):
        return value

    def _batch_reduce_to(self, reduce_op: ReduceOp, pairs: Sequence, options: Any) -> list:
        return [value for value, _ in pairs]

    def gather_to(self, value: Any, destinations: Any, axis: int, options: Any = None) -> Any:
        return value

    def local_results(self, value: Any) -> tuple:
        return (value,)

    def distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> Any:
        return value_fn(ValueContext())

    def _broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        return tensor


class _DefaultDistributionExtended(_SingleReplicaExtendedMixin, StrategyExtended):
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        with _context.ReplicaContext(self.container_strategy(), 0, _local_replica_id=0):
            return fn(*args, **kwargs)

    def create_variable(self, initial_value: Any, **kwargs: Any) -> Any:
        from strategyjob import _variables

        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return _variables.create_plain_variable(None, initial_value, device=None, **kwargs)

    def variable_created_in_scope(self, v: Any) -> bool:
        return getattr(v, "distribute_strategy", None) is None

    def _update(self, var: Any, fn: Callable[..., Any], args: tuple, kwargs: dict, group: bool):
        result = fn(var, *args, **kwargs)
        return result if group else (result,)

    @property
    def worker_devices(self) -> tuple[str, ...]:
        raise RuntimeError("worker_devices() method unsupported by default tf.distribute.Strategy.")

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        raise RuntimeError(
            "parameter_devices() method unsupported by default tf.distribute.Strategy."
        )

    def distribute_dataset(self, dataset: Any, options: Any, auto_shard_policy: Any) -> Any:
        return dataset

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any) -> Any:
        return dataset_fn(InputContext())


class _DefaultDistributionStrategy(Strategy):
    """The strategy in effect when no other is: one replica, no distribution."""

    _is_default_strategy = True

    def __init__(self) -> None:
        if not _creating_default:
            raise RuntimeError(
                "Should only create a single instance of _DefaultDistributionStrategy"
            )
        super().__init__(_DefaultDistributionExtended(self))

    def scope(self) -> Any:
        """The default strategy's scope pushes nothing (``_context.DefaultScope``)."""
        return _context.DefaultScope(self)

    def __deepcopy__(self, memo: dict) -> Strategy:
        raise RuntimeError("Should only create a single instance of _DefaultDistributionStrategy")


_creating_default = False
_default_strategy: _DefaultDistributionStrategy | None = None
_default_lock = threading.Lock()


def _get_default_strategy() -> Strategy:
    global _creating_default, _default_strategy
    if _default_strategy is None:
        with _default_lock:
            if _default_strategy is None:
                _creating_default = True
                try:
                    _default_strategy = _DefaultDistributionStrategy()
                finally:
                    _creating_default = False
    return _default_strategy


_context.set_default_strategy_maker(_get_default_strategy)

# Re-exported for subclasses and tests.
__all__ += ["GATHER_REQUIRES_CROSS_REPLICA", "PerReplica"]
