"""``ParameterServerStrategy``: variables on ps tasks, steps scheduled onto workers.

Mirrors ``tf.distribute.experimental.ParameterServerStrategy`` (TF2). The chief's program
builds the strategy from a cluster resolver and a ``ClusterCoordinator``; worker and ps tasks
run ``python -m strategyjob.server``. Variables (and module parameters) created in ``scope()``
are placed round robin across the ps tasks, a partitioner splitting big ones into shards
(a ``ShardedVariable``; for modules, the table of an ``nn.Embedding``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from strategyjob import _context, _variables
from strategyjob._devices import LogicalDevice, canonicalize

# What the variables package shares with the strategies (its ``_INTERNAL`` list): a ps variable's
# name, enums and initial value are checked as ``strategyjob.Variable``'s are.
from strategyjob._variables import _base_name, _initial_tensor, _validate_enums
from strategyjob.cluster_resolver.multi_worker_util import validate_cluster_spec
from strategyjob.ps import _cluster, _module_sync, _remote, _transport, _wire, coordinator
from strategyjob.ps.coordinator import ClusterCoordinator
from strategyjob.ps.partitioners import div_partition, num_partitions
from strategyjob.ps.sharded_variable import ShardedVariable
from strategyjob.strategies.base import Strategy, StrategyExtended, _SingleReplicaExtendedMixin

__all__ = ["ParameterServerStrategy", "ParameterServerStrategyExtended"]

log = logging.getLogger(__name__)

NO_COORDINATOR_WARNING = (
    "A `tf.distribute.experimental.ParameterServerStrategy` method is invoked without using "
    "`ClusterCoordinator.schedule`. If you are not tracing a tf.function, this method is "
    "possibly executed on the coordinator, which can be slow. To properly dispatch functions "
    "to run on workers, methods like `run` or `reduce` should be used within a function "
    "passed to `tf.distribute.experimental.coordinator.ClusterCoordinator.schedule`."
)
DATASET_MESSAGE = (
    "To use this dataset, you need to pass this dataset to "
    "ClusterCoordinator.create_per_worker_dataset."
)


def _shards(ref: Any) -> tuple:
    return ref.shards if isinstance(ref, _remote.ShardedParamRef) else (ref,)


def _per_row(value: Any, shards: tuple) -> bool:
    """Whether an optimizer state value is split by rows like its sharded parameter (a
    momentum buffer) rather than one for the whole parameter (Adam's ``step``)."""
    return len(shards) > 1 and isinstance(value, torch.Tensor) and value.dim() > 0


def _ps_task_of(variable: Any) -> int:
    """The ps task holding ``variable`` (a sharded one: its first shard), read from its device
    name as TF colocates by device (``/job:ps/replica:0/task:N/device:CPU:0``)."""
    if isinstance(variable, ShardedVariable):
        variable = variable.variables[0]
    device = canonicalize(variable.device)
    if device.job != "ps":
        raise ValueError(
            f"colocate_vars_with needs a variable on a parameter server, got one on {device.name}; "
            "pass a variable created in this ParameterServerStrategy's scope."
        )
    return device.task


class _PSDataset:
    """What ``experimental_distribute_dataset`` returns: usable only through the coordinator."""

    def __init__(self, creator: Callable[[], Any]) -> None:
        self._creator = creator

    @property
    def creator(self) -> Callable[[], Any]:
        """What builds the dataset on each worker (``coordinator.DeferredDataset``)."""
        return self._creator

    def __iter__(self) -> Any:
        raise ValueError(DATASET_MESSAGE)


class ParameterServerStrategyExtended(_SingleReplicaExtendedMixin, StrategyExtended):
    """Placement, partitioning and the hooks of the parameter-server strategy."""

    def __init__(
        self,
        container_strategy: Strategy,
        cluster_resolver: Any,
        variable_partitioner: Any,
        transport: _cluster.PSTransport | None = None,
    ) -> None:
        super().__init__(container_strategy)
        self._cluster_resolver = cluster_resolver
        self._variable_partitioner = variable_partitioner
        # None: the process's (a worker's view of the strategy, built before any cluster).
        self._ps_transport: _cluster.PSTransport | None = transport
        self._coordinator: ClusterCoordinator | None = None
        self._num_ps = transport.num_ps if transport is not None else 0
        self._counter = 0
        self._lock = threading.Lock()
        self._colocate_with: Any = None
        self._pending: list[tuple[torch.nn.Parameter, Any]] = []
        # Bumped by every ``ClusterCoordinator.schedule``: the chief's copies of module
        # parameters pulled at an older epoch may be stale (``ps._module_sync``).
        self._epoch = 0
        self._uid = uuid.uuid4().hex[:8]
        self._names: defaultdict[str, int] = defaultdict(int)
        self._logical_devices = (LogicalDevice("cpu", 0),)
        if transport is not None:
            _cluster.use(transport)
        elif cluster_resolver is not None:
            self._connect(cluster_resolver)

    def _connect(self, resolver: Any) -> None:
        cluster = resolver.cluster_spec()
        if not cluster.jobs:
            raise ValueError(
                "Cluster spec must be non-empty in "
                "`tf.distribute.cluster_resolver.ClusterResolver`."
            )
        validate_cluster_spec(cluster, resolver.task_type, resolver.task_id)
        if "ps" not in cluster.jobs or cluster.num_tasks("ps") == 0:
            raise ValueError("There must be at least one ps.")
        if "worker" not in cluster.jobs or cluster.num_tasks("worker") == 0:
            raise ValueError("There must be at least one worker.")
        self._num_ps = cluster.num_tasks("ps")
        self._ps_transport = _cluster.GrpcTransport(
            {job: list(cluster.job_tasks(job)) for job in cluster.jobs}
        )
        _cluster.use(self._ps_transport)

    # --- placement ------------------------------------------------------------------------
    def _next_task(self) -> int:
        with self._lock:
            task = self._counter % self._num_ps
            self._counter += 1
            return task

    def _key(self, base: str) -> str:
        with self._lock:
            self._names[base] += 1
            return f"{self._uid}/{base}/{self._names[base]}"

    def _shard_count(self, shape: torch.Size, dtype: torch.dtype) -> int:
        if self._variable_partitioner is None or len(shape) == 0:
            return 1
        return num_partitions(self._variable_partitioner, shape, dtype)

    def create_variable(
        self,
        initial_value: Any,
        *,
        trainable: bool | None = None,
        name: str | None = None,
        synchronization: Any = None,
        aggregation: Any = None,
    ) -> Any:
        base = _base_name(name)
        sync, agg, trainable = _validate_enums(
            synchronization
            if synchronization is not None
            else _variables.VariableSynchronization.AUTO,
            aggregation if aggregation is not None else _variables.VariableAggregation.NONE,
            trainable,
            base,
        )
        if initial_value is None:
            raise ValueError(
                "It looks like you are trying to create a variable without specifying "
                "`initial_value`. Pass it, e.g. `strategyjob.Variable(torch.zeros(3))`."
            )
        tensor = _initial_tensor(initial_value, None)
        common = dict(trainable=trainable, synchronization=sync, aggregation=agg)
        strategy = self.container_strategy()
        colocate = self._colocate_with
        if colocate is not None:
            return self._make(tensor, _ps_task_of(colocate), f"{base}:0", base, strategy, common)
        n = self._shard_count(tensor.shape, tensor.dtype)
        if n <= 1:
            return self._make(tensor, self._next_task(), f"{base}:0", base, strategy, common)
        shards = [
            self._make(
                tensor[offset : offset + size],
                self._next_task(),
                f"{base}/part_{i}:0",
                f"{base}/part_{i}",
                strategy,
                common,
            )
            for i, (offset, size) in enumerate(div_partition(tensor.shape[0], n))
        ]
        return ShardedVariable(shards, name=base)  # its strategy: its shards'

    def _make(self, tensor, task, name, base, strategy, common) -> _remote.PSVariable:
        key = self._key(base)
        self.transport.run_ps_ops(task, [_remote.var_op("create", key, tensor)], wait=True)
        return _remote.PSVariable.from_ps(
            key=key,
            task=task,
            shape=tensor.shape,
            dtype=tensor.dtype,
            name=name,
            strategy=strategy,
            **common,
        )

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Variables created in this context live on the ps of ``colocate_with_variable``
        and are never partitioned."""
        previous, self._colocate_with = self._colocate_with, colocate_with_variable
        try:
            yield
        finally:
            self._colocate_with = previous

    def variable_created_in_scope(self, v: Any) -> bool:
        return getattr(v, "distribute_strategy", None) is self.container_strategy()

    # --- module parameters ---------------------------------------------------------------
    def on_scope_exited(self) -> None:
        super().on_scope_exited()
        self._flush_parameters()

    def register_parameter(
        self, param: torch.nn.Parameter, module: torch.nn.Module | None = None
    ) -> None:
        """Place a module parameter created in scope on the ps (its value is sent when the
        scope exits, after the module's own initialisation); only an embedding table's
        weight is sharded."""
        if _remote.ps_ref(param) is not None:
            return None
        shape, dtype = param.shape, param.dtype
        base = f"{type(module).__name__ if module is not None else 'param'}"
        n = self._shard_count(shape, dtype) if isinstance(module, torch.nn.Embedding) else 1
        refs = []
        for _offset, size in div_partition(shape[0], n) if n > 1 else [(0, None)]:
            part_shape = tuple(shape) if size is None else (size, *shape[1:])
            refs.append(
                _remote.ParamRef(
                    key=self._key(base),
                    task=self._next_task(),
                    shape=part_shape,
                    dtype=dtype,
                    requires_grad=param.requires_grad,
                )
            )
        ref = refs[0] if n <= 1 else _remote.ShardedParamRef(tuple(refs))
        _remote.place_on_ps(param, ref)
        with self._lock:
            self._pending.append((param, ref))
        if module is not None:
            _module_sync.track(module, self)
        return None

    def _flush_parameters(self) -> None:
        """Send the values of module parameters registered since the last flush to the ps."""
        with self._lock:
            pending, self._pending = self._pending, []
        self._write_to_ps("create", pending)

    def _write_to_ps(self, op: str, params: list[tuple[torch.nn.Parameter, Any]]) -> None:
        """``op`` ("create" or "assign") each ``(param, ref)``'s value on its ps, shard by
        shard: one round trip per ps."""
        ops: defaultdict[int, list] = defaultdict(list)
        for param, ref in params:
            value, offset = param.detach(), 0
            shards = _shards(ref)
            for shard in shards:
                part = value[offset : offset + shard.shape[0]] if len(shards) > 1 else value
                offset += shard.shape[0] if shard.shape else 0
                ops[shard.task].append(_remote.var_op(op, shard.key, part))
        for task, task_ops in ops.items():
            self.transport.run_ps_ops(task, task_ops, wait=True)

    def _parameter_device(self, param: torch.nn.Parameter) -> str | list[str]:
        ref = _remote.ps_ref(param)
        if isinstance(ref, _remote.ShardedParamRef):
            return [s.device for s in ref.shards]
        assert ref is not None  # asked for this strategy's parameters only
        return ref.device

    def pull_parameters(self, params: Any) -> None:
        """Copy the ps values of ``params`` (module parameters created in scope) into the
        coordinator's tensors (``ps._module_sync`` calls it before the chief uses a module)."""
        self._flush_parameters()
        wanted = [(p, _shards(ref)) for p in params if (ref := _remote.ps_ref(p))]
        reads: defaultdict[int, list] = defaultdict(list)
        for _, shards in wanted:
            for shard in shards:
                reads[shard.task].append(shard.key)
        values: dict[str, Any] = {}  # one round trip per ps
        for task, keys in reads.items():
            results = self.transport.run_ps_ops(task, [_remote.var_op("read", k) for k in keys])
            values.update(zip(keys, results))
        with torch.no_grad():
            for param, shards in wanted:
                parts = [values[s.key] for s in shards]
                param.copy_(torch.cat(parts) if len(parts) > 1 else parts[0])

    def push_parameters(self, params: Any) -> None:
        """Assign the coordinator's values of ``params`` to their ps variables (after
        ``load_state_dict`` on the chief)."""
        self._flush_parameters()
        self._write_to_ps("assign", [(p, ref) for p in params if (ref := _remote.ps_ref(p))])

    # --- optimizer state on the ps (strategyjob.train.Checkpoint) ------------------------
    def optimizer_slots(self, opt: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
        """The state the ps keep for ``opt`` (momentum and the like), laid out as its
        ``state_dict()["state"]``: by parameter index, each sharded parameter's shards joined."""
        if _remote.given_optimizer_key(opt) is None:  # never shipped: never stepped on the ps
            return {}
        self._flush_parameters()
        wanted = list(self._ps_parameters(opt))
        reads: defaultdict[int, list] = defaultdict(list)
        for _, _, shards, spec in wanted:
            for shard in shards:
                reads[shard.task].append(_remote.var_op("read_slots", shard.key, optimizer=spec))
        values: dict[str, Any] = {}  # one round trip per ps
        for task, ops in reads.items():
            results = self.transport.run_ps_ops(task, ops)
            values.update((op.name, _wire.unpack_state(r)) for op, r in zip(ops, results))
        state = {}
        for index, _, shards, _ in wanted:
            parts = [values[s.key] for s in shards]
            if parts[0]:
                state[index] = {
                    k: torch.cat([p[k] for p in parts]) if _per_row(v, shards) else v
                    for k, v in parts[0].items()
                }
        return state

    def load_optimizer_slots(
        self, opt: torch.optim.Optimizer, state: dict[int, dict[str, Any]]
    ) -> None:
        """Give the ps ``state`` (a restored ``state_dict()["state"]``) for ``opt``, split as
        its parameters are sharded now (the checkpoint may come from another shard count)."""
        self._flush_parameters()
        ops: defaultdict[int, list] = defaultdict(list)
        for index, _, shards, spec in self._ps_parameters(opt):
            slots = state.get(index)
            if not slots:
                continue
            offset = 0
            for shard in shards:
                rows = shard.shape[0] if shard.shape else 0
                part = {
                    k: v[offset : offset + rows] if _per_row(v, shards) else v
                    for k, v in slots.items()
                }
                offset += rows
                packed = _wire.pack_state(part)
                ops[shard.task].append(
                    _remote.var_op("write_slots", shard.key, packed, optimizer=spec)
                )
        for task, task_ops in ops.items():
            self.transport.run_ps_ops(task, task_ops, wait=True)

    def _ps_parameters(self, opt: torch.optim.Optimizer) -> Iterator[tuple[int, Any, tuple, str]]:
        """``(index in state_dict, parameter, its shards, optimizer JSON)`` of each parameter
        of ``opt`` held by the ps."""
        index = 0
        for group in opt.param_groups:
            spec = None
            for param in group["params"]:
                ref = _remote.ps_ref(param)
                if ref is not None:
                    spec = spec or _remote.optimizer_json(opt, group)
                    yield index, param, _shards(ref), spec
                index += 1

    # --- the coordinator's side (``coordinator.CoordinatedExtended``) ---------------------
    @property
    def transport(self) -> _cluster.PSTransport:
        """The cluster's ps tasks and workers (gRPC, or an in-memory one given to the strategy)."""
        return self._ps_transport if self._ps_transport is not None else _cluster.current()

    @property
    def coordinator(self) -> ClusterCoordinator | None:
        return self._coordinator

    def attach_coordinator(self, cluster_coordinator: ClusterCoordinator) -> None:
        self._coordinator = cluster_coordinator

    def before_schedule(self) -> None:
        """Before a function is queued: the ps get the parameters still waiting to be sent,
        and the chief's pulled copies may go stale."""
        self._flush_parameters()
        self._epoch += 1

    def before_create_resources(self) -> None:
        """Before per-worker datasets are built: their functions may read module parameters."""
        self._flush_parameters()

    # --- module parameters on the chief (``ps._module_sync.SyncedExtended``) ---------------
    @property
    def ps_epoch(self) -> int:
        """How many functions were scheduled so far (a pulled copy of an older epoch may be
        stale)."""
        return self._epoch

    def ps_settled(self) -> bool:
        """No scheduled function is queued or running (so the ps values are settled)."""
        return self._coordinator is None or self._coordinator.idle()

    # --- run ------------------------------------------------------------------------------
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self._cluster_resolver is not None and self._coordinator is None:
            log.warning(NO_COORDINATOR_WARNING)
        with _context.ReplicaContext(self.container_strategy(), 0, _local_replica_id=0):
            return fn(*args, **kwargs)

    # --- devices and roles ----------------------------------------------------------------
    @property
    def worker_devices(self) -> tuple[str, ...]:
        return ("/device:CPU:0",)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return tuple(_transport.ps_device(i) for i in range(self._num_ps))

    @property
    def experimental_between_graph(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        return True

    @property
    def should_init(self) -> bool:
        return True

    # --- input ------------------------------------------------------------------------------
    def distribute_dataset(self, dataset: Any, options: Any, *rest: Any) -> Any:
        return _PSDataset(lambda: dataset)

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any) -> Any:
        from strategyjob.input import InputContext

        return _PSDataset(lambda: dataset_fn(InputContext(1, 0, 1)))


class ParameterServerStrategy(Strategy):
    """An asynchronous multi-worker strategy: variables on ps tasks, functions scheduled onto
    workers by a ``ClusterCoordinator``.

    ``ParameterServerStrategy(cluster_resolver, variable_partitioner=None)``: the resolver
    (e.g. ``TFConfigClusterResolver()``) describes a cluster with ``chief``, ``worker`` and
    ``ps`` jobs; ``variable_partitioner`` (see ``strategyjob.experimental.partitioners``)
    splits variables on their first axis.

    Every call to a ps has a deadline, after which it fails with ``UnavailableError`` naming
    the ps (a scheduled function that meets it is retried, each ps applying its updates once).
    As in TensorFlow, this strategy takes no ``CommunicationOptions``: the deadline is
    ``STRATEGYJOB_PS_TIMEOUT`` seconds (default 300) in each process's environment, the
    chief's for its own calls (the coordinator's), each worker's for the calls of the functions
    it runs, so set it for every replica. A ps that stops answering gRPC keepalive pings is
    declared lost within 30 s whatever the deadline.
    """

    extended: ParameterServerStrategyExtended

    def __init__(
        self,
        cluster_resolver: Any = None,
        variable_partitioner: Any = None,
        *,
        transport: _cluster.PSTransport | None = None,
    ) -> None:
        """``transport`` (a strategyjob addition, for tests): the cluster to use instead of the
        resolver's over gRPC, e.g. ``ps._inmemory.InMemoryTransport``."""
        _transport.timeout()  # a bad STRATEGYJOB_PS_TIMEOUT fails here, in one line
        if cluster_resolver is None and transport is None:
            from strategyjob.cluster_resolver import TFConfigClusterResolver

            cluster_resolver = TFConfigClusterResolver()
        super().__init__(
            ParameterServerStrategyExtended(self, cluster_resolver, variable_partitioner, transport)
        )

    @property
    def _cluster_coordinator(self) -> ClusterCoordinator | None:
        """TF's attribute (Keras reads it): the coordinator attached to this strategy."""
        return self.extended.coordinator

    def __reduce__(self) -> Any:
        # Shipped to a worker inside a scheduled function, the strategy becomes the worker's
        # one-replica view (``run`` calls the function once, ``reduce`` is the identity).
        return (_worker_side_strategy, ())

    def __deepcopy__(self, memo: dict) -> ParameterServerStrategy:
        return self


_worker_strategy: ParameterServerStrategy | None = None


def _worker_side_strategy() -> ParameterServerStrategy:
    global _worker_strategy
    if _worker_strategy is None:
        strategy = object.__new__(ParameterServerStrategy)
        Strategy.__init__(strategy, ParameterServerStrategyExtended(strategy, None, None))
        _worker_strategy = strategy
    return _worker_strategy


coordinator.register_coordinated_strategy(ParameterServerStrategy)
