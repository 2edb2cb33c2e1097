"""``TPUStrategy``: replicas that each span several logical devices, on torch DTensor.

Why: TensorFlow's TPUStrategy lets one replica use several devices (model parallelism) by
annotating tensors: split across the replica's logical devices, replicated to all of them, or
assigned to one. Here every device is one process (TF_CONFIG task ``i`` is the device at
``(0, 0, 0, i)`` of mesh ``[1, 1, 1, N]``), a ``DeviceAssignment`` groups the processes into
``R`` replicas of ``L`` logical devices, and the grid of process ranks becomes a torch
``DeviceMesh`` of shape ``(R, L)`` with dimensions ``("replica", "logical")``:

* every process of a replica runs ``fn`` (SPMD) on the replica's input;
* ``experimental_split_to_logical_devices`` returns a ``DTensor`` sharded over the replica's
  logical devices (tile ``i`` on logical core ``i``, row-major, as TF), ``replicate`` a
  replicated ``DTensor``, ``assign`` a ``DTensor`` that lives on one logical core only;
* splits and replicas share one mesh per replica, whose dimensions are the prime factors of
  ``L`` (``L = 4``: ``(2, 2)``; ``[1, 4]`` is ``[Shard(1), Shard(1)]`` there), so DTensor
  combines any two of them; inside ``run`` an operation that meets an assigned tensor (or a
  split this mesh cannot express) together with another mesh's DTensor gets it replicated
  (:class:`_OneMeshPerOperation`), as XLA moves tensors between cores in TF;
* the annotations are identities for autograd: the gradient reaching the unannotated tensor is
  the whole logical gradient on every logical device (the shards are all-gathered back);
* ``DTensor`` outputs of ``run`` are returned as their logical (full) values, and reductions,
  gathers and gradient averaging go across the replica dimension only, so
  ``num_replicas_in_sync`` is ``R``, not ``N``.

CPU processes use gloo; GPU processes NCCL (the process group is MultiWorkerMirroredStrategy's,
``collective/process_group.py``).

Limits: all processes run the same program, so every logical device must make the same
annotation calls in the same order (a split that the replica's mesh cannot express, such as
``[3, 2]`` for ``L = 6`` on a ``(2, 3)`` mesh, builds its own mesh, collectively, on first use);
a device assignment must use every process of the cluster; TF's ``experimental_logical_device``
placement scope is not provided.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.experimental import implicit_replication
from torch.overrides import TorchFunctionMode

from strategyjob import _names, _nest
from strategyjob._devices import LogicalDevice
from strategyjob._values import regroup, select_replica
from strategyjob.cluster_resolver import ClusterResolver, TFConfigClusterResolver, multi_worker_util
from strategyjob.collective import process_group
from strategyjob.collective.backend import ProcessGroupCollectives
from strategyjob.collective.options import CommunicationOptions
from strategyjob.collective.watchdog import BlockingWaitWatchdog
from strategyjob.strategies.base import Strategy, StrategyExtended, broadcast_pending_parameters
from strategyjob.strategies.compat_methods import CompatV1StrategyMethods
from strategyjob.tpu.device_assignment import DeviceAssignment
from strategyjob.tpu.topology import line_topology

__all__ = ["TPUExtended", "TPUStrategy", "TPUStrategyV1"]

SPMD_ASSIGN_ERROR = (
    "Cannot assign a tensor to a logical device in SPMD mode. To disable SPMD, Please construct "
    "the TPUStrategy with `experimental_spmd_xla_partitioning=False`"
)
#: Per-process state that copies of a strategy share rather than duplicate.
_SHARED_STATE = frozenset(
    {
        "_cluster",
        "_cluster_resolver",
        "_group",
        "_mesh",
        "_replica_logical_mesh",
        "_logical_group",
        "_replica_group",
        "collectives",
        "_split_meshes",
        "_core_meshes",
        "_device_assignment",
        "_gradient_synchronizer",
    }
)
_IMPLICIT_REPLICATION_WARNING = ".*implicitly creating a replicated DTensor.*"
_NO_SHARDING_RULE = "does not have a sharding strategy registered"
_IN_PLACE_OPERATORS = frozenset(
    {
        "__setitem__",
        *(
            f"__i{op}__"
            for op in "add sub mul matmul truediv floordiv mod pow and or xor lshift rshift".split()
        ),
    }
)
#: Overridable functions that take tensors but compute nothing on them: their arguments must
#: stay the very tensors of the autograd graph.
_NOT_OPERATIONS = (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward)
#: How DTensor waits for its collectives: one blocking call, watched (``collective.watchdog``).
#: torch gives that op of its functional collectives no public name.
_WAIT_TENSOR = (
    torch.ops._c10d_functional.wait_tensor,  # noqa: SLF001  (torch's; see above)
    torch.ops._c10d_functional.wait_tensor.default,  # noqa: SLF001  (its overload)
)


# ------------------------------------------------------------------------------ cluster


class _Cluster:
    """This process's place in the cluster: rank, world size and the collective group."""

    def __init__(self, resolver: ClusterResolver) -> None:
        cluster_spec = resolver.cluster_spec()
        self.task_type, self.task_id = resolver.task_type, resolver.task_id
        self.group: process_group.CollectiveGroup | None = None
        self._membership: process_group.ClusterMembership | None = None
        if not cluster_spec.as_dict():
            self.rank, self.world_size = 0, 1
            return
        if self.task_type is None or self.task_id is None:
            raise ValueError(
                "When `cluster_spec` is given, you must also specify `task_type` and `task_id`."
            )
        multi_worker_util.validate_cluster_spec(cluster_spec, self.task_type, self.task_id)
        # Adapter: the rendezvous is MultiWorkerMirroredStrategy's (rank = id_in_cluster).
        membership = process_group.membership_from_cluster(
            cluster_spec.as_dict(), self.task_type, self.task_id
        )
        self.rank, self.world_size = membership.rank, membership.world_size
        self._membership = membership

    def connect(self) -> None:
        """Join the cluster's process group (MultiWorkerMirroredStrategy's, with its bounded
        waits); a one-process cluster still gets a process group for ``DeviceMesh``."""
        if self._membership is not None and self.world_size > 1:
            self.group = process_group.get_group(self._membership, CommunicationOptions())
        elif not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def device(self) -> LogicalDevice:
        job, task = self.task_type or "localhost", self.task_id or 0
        if torch.cuda.is_available():
            index = (
                int(os.environ.get(_names.ENV_LOCAL_RANK, self.rank)) % torch.cuda.device_count()
            )
            return LogicalDevice("cuda", index, job=job, task=task)
        return LogicalDevice("cpu", 0, job=job, task=task)


def _rank_grid(assignment: DeviceAssignment, world_size: int) -> np.ndarray:
    """``grid[r, k]`` = the process rank running logical core ``k`` of replica ``r``."""
    topology = assignment.topology
    if topology.num_tpus_per_task != 1 or topology.num_tasks != world_size:
        raise ValueError(
            f"The device assignment's topology has {topology.num_tasks} task(s) with "
            f"{topology.num_tpus_per_task} device(s) each, but the cluster runs {world_size} "
            "process(es) with one device each. Build the assignment from "
            "strategyjob.tpu.experimental.initialize_tpu_system(resolver)."
        )
    grid = np.array(
        [
            [assignment.task(r, k) for k in range(assignment.num_cores_per_replica)]
            for r in range(assignment.num_replicas)
        ],
        dtype=np.int64,
    )
    if grid.size != world_size or len(set(grid.flat)) != grid.size:
        raise ValueError(
            f"The device assignment uses {len(set(grid.flat))} of the cluster's {world_size} "
            f"devices ({assignment.num_replicas} replica(s) x "
            f"{assignment.num_cores_per_replica} logical device(s)). Every process must run one "
            "logical device: start num_replicas * num_cores_per_replica processes."
        )
    return grid


def _prime_factors(n: int) -> tuple[int, ...]:
    """``n``'s prime factors, ascending: the dimensions of a replica's logical-device mesh."""
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return tuple(factors)


def _split_placements(mesh_shape: Sequence[int], dims: Sequence[int]) -> list[Placement] | None:
    """Placements that split a tensor into ``dims`` pieces on a mesh of ``mesh_shape``, tile
    ``i`` (row-major) on the core with row-major index ``i``; ``None`` if the mesh cannot.

    Consecutive mesh dimensions split one tensor dimension, the outer one first (DTensor nests
    shards in mesh order): on a ``(2, 2)`` mesh ``[4, 1]`` is ``[Shard(0), Shard(0)]``, ``[2, 2]``
    is ``[Shard(0), Shard(1)]``. ``[3, 2]`` does not fit a ``(2, 3)`` mesh.
    """
    placements: list[Placement] = []
    position = 0
    for tensor_dim, pieces in enumerate(dims):
        while pieces > 1:
            if position == len(mesh_shape) or pieces % mesh_shape[position]:
                return None
            placements.append(Shard(tensor_dim))
            pieces //= mesh_shape[position]
            position += 1
    if position != len(mesh_shape) and placements:
        return None
    return placements or [Replicate()] * len(mesh_shape)


# ---------------------------------------------------------------------- autograd helpers


class _BroadcastFromCore(torch.autograd.Function):
    """The value of a DTensor that lives on one logical core (a one-device mesh), as a plain
    tensor on every core of the replica (differentiable).

    Backward hands the DTensor its gradient (every core computed the same one; only the owner
    holds data), so the value is counted once. It takes the DTensor itself, not its local
    tensor: DTensor cannot take back the gradient of a local tensor of a core outside its mesh
    (an empty 1-D tensor) for a value of two or more dimensions."""

    @staticmethod
    def forward(ctx: Any, value: DTensor, device: torch.device, src: int, group: Any) -> Any:
        ctx.mesh = value.device_mesh
        if dist.get_rank() == src:
            buffer = value.to_local().detach().clone()
        else:
            buffer = torch.empty(value.shape, dtype=value.dtype)
        buffer = buffer.to(device).contiguous()
        dist.broadcast(buffer, src=src, group=group)
        return buffer

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        value_grad = DTensor.from_local(grad, ctx.mesh, [Replicate()], run_check=False)
        return value_grad, None, None, None


class _SplitToLogicalDevices(torch.autograd.Function):
    """A whole tensor (equal on every logical device) as a sharded DTensor; identity for
    autograd: the gradient comes back whole on every device (all-gathered)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, mesh: DeviceMesh, placements: tuple) -> Any:
        coordinate = mesh.get_coordinate()
        assert coordinate is not None  # every process of the job is on the mesh
        local = tensor.detach()
        for mesh_dim, placement in enumerate(placements):
            if isinstance(placement, Shard):
                size = local.shape[placement.dim] // mesh.size(mesh_dim)
                local = local.narrow(placement.dim, coordinate[mesh_dim] * size, size)
        return DTensor.from_local(
            local.contiguous(),
            mesh,
            placements,
            run_check=False,
            shape=tensor.shape,
            stride=tensor.stride(),
        )

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple:
        whole = grad.full_tensor() if isinstance(grad, DTensor) else grad
        return whole, None, None


class _AssignToCore(torch.autograd.Function):
    """``tensor`` as a DTensor that exists on logical core ``k`` only; identity for autograd.

    Backward broadcasts the owner's gradient so every core's ``tensor`` gets it whole, a
    blocking wait that ``watchdog`` (when there is one) watches."""

    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        mesh: DeviceMesh,
        src: int,
        group,
        watchdog: BlockingWaitWatchdog | None,
    ) -> Any:
        ctx.src, ctx.group, ctx.watchdog = src, group, watchdog
        return DTensor.from_local(tensor.detach(), mesh, [Replicate()], run_check=False)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple:
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        shape = grad.shape
        result = local.contiguous() if dist.get_rank() == ctx.src else None
        if result is None or result.shape != shape:
            result = torch.zeros(shape, dtype=grad.dtype, device=local.device)
        if ctx.group is not None:
            with ctx.watchdog.watching() if ctx.watchdog is not None else nullcontext():
                dist.broadcast(result, src=ctx.src, group=ctx.group)
        return result, None, None, None, None


# ---------------------------------------------------------------------------- extended


def _is_in_place(func: Callable) -> bool:
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in _IN_PLACE_OPERATORS


def _shallow_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among an operation's arguments and in its list arguments (``cat``)."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _map_tensors(
    fn: Callable[[torch.Tensor], torch.Tensor], args: tuple, kwargs: dict, keep_first: bool
) -> tuple[tuple, dict]:
    """``fn`` applied to the tensors that :func:`_shallow_tensors` finds (not to ``args[0]``
    when ``keep_first``: an in-place operation must write to its own tensor)."""

    def one(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return fn(value)
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return type(value)(fn(v) if isinstance(v, torch.Tensor) else v for v in value)
        return value

    mapped = tuple(a if keep_first and i == 0 else one(a) for i, a in enumerate(args))
    return mapped, {k: one(v) for k, v in kwargs.items()}


class _OneMeshPerOperation(TorchFunctionMode):
    """Inside ``run`` of a replica with several logical devices: an operation sees its
    annotated operands on one mesh.

    Why: DTensor refuses operations across meshes, while TF places the transfers itself. A
    tensor assigned to one core (a one-device mesh) or split in a way the replica's mesh cannot
    express (its own mesh) is replicated onto the replica's mesh when it meets a DTensor of
    another mesh. A plain tensor that requires grad and meets a DTensor is made a replicated
    DTensor explicitly, so that its gradient comes back a plain tensor: autograd cannot add up
    gradients of one tensor that arrive on different meshes. An operation that DTensor has no
    sharding rule for (``aten.mv``, which ``matrix @ vector`` is) runs on the whole values and
    gives a replicated DTensor, as XLA partitions any operation.
    """

    def __init__(
        self,
        watchdog: BlockingWaitWatchdog | None,
        on_one_mesh: Callable[[Callable, tuple, dict], tuple[tuple, dict]],
        on_whole_values: Callable[[Callable, tuple, dict], Any],
    ) -> None:
        super().__init__()
        self._watchdog = watchdog
        self._on_one_mesh = on_one_mesh
        self._on_whole_values = on_whole_values

    def __torch_function__(
        self, func: Callable, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _NOT_OPERATIONS:
            return func(*args, **kwargs)
        if func in _WAIT_TENSOR and self._watchdog is not None:
            with self._watchdog.watching():  # a lost peer ends the process
                return func(*args, **kwargs)
        # ``types`` never names DTensor (its __torch_function__ is disabled): look at the args
        args, kwargs = self._on_one_mesh(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except NotImplementedError as e:
            # raised by sharding propagation, before any collective: the same on every core
            if _NO_SHARDING_RULE not in str(e) or _is_in_place(func):
                raise
            return self._on_whole_values(func, args, kwargs)


class TPUExtended(StrategyExtended):
    """Implementation of TPUStrategy: one process per logical device of each replica."""

    # Copies share the process's cluster membership, meshes and groups.
    _shared_when_copied = _SHARED_STATE

    def __init__(
        self,
        container_strategy: Strategy,
        tpu_cluster_resolver: ClusterResolver | None = None,
        device_assignment: DeviceAssignment | None = None,
        use_spmd_for_xla_partitioning: bool = False,
    ) -> None:
        super().__init__(container_strategy)
        resolver = tpu_cluster_resolver
        if resolver is None:
            resolver = TFConfigClusterResolver()
        if not isinstance(resolver, ClusterResolver):
            raise ValueError(
                "tpu_cluster_resolver must be an instance of "
                f"strategyjob.cluster_resolver.ClusterResolver, got {type(resolver).__name__}; "
                "pass e.g. TFConfigClusterResolver() or None (TF_CONFIG)."
            )
        if device_assignment is not None and not isinstance(device_assignment, DeviceAssignment):
            raise ValueError(
                "device_assignment must be a strategyjob.tpu.experimental.DeviceAssignment, got "
                f"{type(device_assignment).__name__}; build one with DeviceAssignment.build()."
            )
        cluster = _Cluster(resolver)
        if device_assignment is None:  # every device is its own replica
            device_assignment = DeviceAssignment.build(
                line_topology(cluster.world_size), num_replicas=cluster.world_size
            )
        grid = _rank_grid(device_assignment, cluster.world_size)  # validated before joining
        device = cluster.device()
        if device.device_type == "cuda":
            torch.cuda.set_device(device.torch_device)  # NCCL: one device per process
        cluster.connect()

        self._cluster_resolver = resolver
        self._device_assignment = device_assignment
        self._use_spmd_for_xla_partitioning = bool(use_spmd_for_xla_partitioning)
        self._cluster = cluster
        self._group = cluster.group
        # DTensor's collectives are waited for in one blocking call each, watched instead.
        self._watchdog = (
            None
            if cluster.group is None
            else BlockingWaitWatchdog(cluster.group, "a logical-device collective")
        )
        self._grid = grid
        (replica,), (core,) = np.nonzero(grid == cluster.rank)
        self._replica_id, self._logical_core = int(replica), int(core)
        self._num_workers = int(grid.shape[0])  # input pipelines and gradients: per replica
        self._worker_index = self._replica_id
        self._logical_devices = (device,)
        self._device_type = device.device_type
        self._torch_device = device.torch_device
        self._mesh = DeviceMesh(
            self._device_type, torch.as_tensor(grid), mesh_dim_names=("replica", "logical")
        )
        self._logical_group = self._mesh.get_group("logical")
        self._replica_group = self._mesh.get_group("replica")
        if self._group is not None:
            # gradients and reductions go across replicas; the chief (replica 0's first
            # logical device) broadcasts to every process
            self.collectives = ProcessGroupCollectives(
                self._group,
                self._replica_group,
                chief=int(grid[0, 0]),
                workers=[int(r) for r in grid[:, self._logical_core]],
            )
        # Every annotation of a replica lives on one mesh of its logical devices, so DTensor
        # can combine them: its dimensions are the prime factors of L (L = 4: (2, 2)), which
        # express every split of a power-of-two L (slicing is slow: do it once).
        factors = _prime_factors(self.num_cores_per_replica)
        if len(factors) <= 1:
            self._replica_logical_mesh = self._mesh["logical"]
        else:
            names = ("replica", *(f"logical_{i}" for i in range(len(factors))))
            self._replica_logical_mesh = DeviceMesh(
                self._device_type,
                torch.as_tensor(grid).reshape(grid.shape[0], *factors),
                mesh_dim_names=names,
            )[names[1:]]
        # splits that the replica's mesh cannot express (L = 6 split [3, 2]) get their own
        self._split_meshes: dict[tuple[int, ...], DeviceMesh] = {}
        self._core_meshes: dict[int, DeviceMesh] = {}

    # --- topology -------------------------------------------------------------------------
    @property
    def num_replicas_in_sync(self) -> int:
        return int(self._grid.shape[0])

    @property
    def num_cores_per_replica(self) -> int:
        return int(self._grid.shape[1])

    @property
    def experimental_device_assignment(self) -> DeviceAssignment:
        return self._device_assignment

    @property
    def device_mesh(self) -> DeviceMesh:
        """The ``(replica, logical)`` torch ``DeviceMesh`` of the cluster's processes."""
        return self._mesh

    @property
    def logical_device_id(self) -> int:
        """The logical core of its replica that this process runs."""
        return self._logical_core

    @property
    def experimental_between_graph(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        return self._cluster.rank == int(self._grid[0, 0])

    @property
    def should_save_summary(self) -> bool:
        return self.should_checkpoint

    # --- module parameters -------------------------------------------------------------------
    def register_parameter(
        self, param: torch.nn.Parameter, module: torch.nn.Module | None = None
    ) -> None:
        """Keep gradients plain tensors: a parameter used with DTensors (implicit replication)
        receives a DTensor gradient, which becomes its logical value as soon as it is ready."""
        if param.requires_grad:  # a frozen parameter cannot take the hook (nor needs it)
            param.register_post_accumulate_grad_hook(self._make_grad_plain)

    def _make_grad_plain(self, param: torch.Tensor) -> None:
        grad = param.grad
        if isinstance(grad, DTensor):
            param.grad = self._logical_value(grad)

    def _broadcast_pending_parameters(self) -> None:
        if self._group is not None:
            broadcast_pending_parameters(self)

    def on_scope_exited(self) -> None:
        super().on_scope_exited()
        self._broadcast_pending_parameters()

    # --- running the replica ---------------------------------------------------------------
    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        self._broadcast_pending_parameters()
        context = self._make_replica_context(0)
        one_mesh = (
            _OneMeshPerOperation(self._watchdog, self._on_one_mesh, self._on_whole_values)
            if self.num_cores_per_replica > 1
            else nullcontext()
        )
        with (
            context,
            implicit_replication(),
            one_mesh,
            warnings.catch_warnings(),
        ):
            # Plain tensors meeting DTensors are the replica's replicated values: that is the
            # point of implicit replication, so DTensor's warning about it is noise here.
            warnings.filterwarnings("ignore", message=_IMPLICIT_REPLICATION_WARNING)
            if self._device_type == "cuda":
                with torch.cuda.device(self._torch_device):
                    result = fn(*select_replica(0, args), **select_replica(0, kwargs))
            else:
                result = fn(*select_replica(0, args), **select_replica(0, kwargs))
        return regroup([_nest.map_structure(self._logical_value, result)])

    def _logical_value(self, value: Any) -> Any:
        """A DTensor output as the plain tensor it stands for, on every logical core."""
        if not isinstance(value, DTensor):
            return value
        mesh = value.device_mesh
        if mesh.get_coordinate() is not None and mesh.size() > 1:
            return value.full_tensor()
        if mesh.size() == 1 and self.num_cores_per_replica > 1:  # assigned to one core
            src = int(mesh.mesh.flatten()[0])
            return _BroadcastFromCore.apply(value, self._torch_device, src, self._logical_group)
        return value.to_local()

    # --- annotations ------------------------------------------------------------------------
    def _split_layout(self, dims: Sequence[int]) -> tuple[DeviceMesh, list[Placement]]:
        """Where a split into ``dims`` pieces lives: the replica's mesh when it can express
        the split, else a mesh of the split's own shape (row-major cores)."""
        mesh = self._replica_logical_mesh
        placements = _split_placements(tuple(mesh.shape), dims)
        if placements is not None:
            return mesh, placements
        split_dims = [i for i, d in enumerate(dims) if d > 1]
        split_shape = tuple(dims[i] for i in split_dims)
        cached = self._split_meshes.get(split_shape)
        if cached is None:
            names = ("replica", *(f"split_{i}" for i in range(len(split_shape))))
            full = DeviceMesh(
                self._device_type,
                torch.as_tensor(self._grid).reshape(self._grid.shape[0], *split_shape),
                mesh_dim_names=names,
            )
            cached = full[names[1:]]
            self._split_meshes[split_shape] = cached
        return cached, [Shard(i) for i in split_dims]

    def _core_mesh(self, logical_core: int) -> DeviceMesh:
        """A one-device mesh holding this replica's ``logical_core`` (no collective needed)."""
        if self.num_cores_per_replica == 1:
            return self._replica_logical_mesh
        mesh = self._core_meshes.get(logical_core)
        if mesh is None:
            rank = int(self._grid[self._replica_id, logical_core])
            mesh = DeviceMesh(self._device_type, [rank], _init_backend=False)
            self._core_meshes[logical_core] = mesh
        return mesh

    def _as_plain(self, tensor: Any) -> torch.Tensor:
        """The logical value of an annotated tensor (differentiable), else ``tensor``."""
        if isinstance(tensor, DTensor):
            return self._logical_value(tensor)
        return torch.as_tensor(tensor) if not isinstance(tensor, torch.Tensor) else tensor

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        device = self._torch_device
        if tensor.device.type == device.type and (device.type == "cpu" or tensor.device == device):
            return tensor  # "cpu" vs "cpu:0" would copy
        return tensor.to(device)

    def split_to_logical_devices(self, tensor: Any, partition_dimensions: Sequence[int]) -> DTensor:
        """``TPUStrategy.experimental_split_to_logical_devices`` once its arguments are checked."""
        mesh, placements = self._split_layout([int(d) for d in partition_dimensions])
        if isinstance(tensor, DTensor) and tensor.device_mesh == mesh:
            return tensor.redistribute(mesh, placements)
        plain = self._to_device(self._as_plain(tensor))
        if all(isinstance(p, Replicate) for p in placements):
            return DTensor.from_local(plain, mesh, placements, run_check=False)
        return _SplitToLogicalDevices.apply(plain, mesh, tuple(placements))

    def replicate_to_logical_devices(self, tensor: Any) -> DTensor:
        """``TPUStrategy.experimental_replicate_to_logical_devices``."""
        mesh = self._replica_logical_mesh
        if isinstance(tensor, DTensor) and tensor.device_mesh == mesh:
            return tensor.redistribute(mesh, [Replicate()] * mesh.ndim)
        return self._replicated_on(self._to_device(self._as_plain(tensor)), mesh)

    def _replicated_on(self, tensor: torch.Tensor, mesh: DeviceMesh) -> DTensor:
        """A plain tensor (equal on every logical core) as a replicated DTensor on ``mesh``, one
        of the replica's meshes; differentiable, its gradient a plain tensor on every core."""
        if mesh.size() == 1 and self.num_cores_per_replica > 1:  # assigned to one core
            src = int(mesh.mesh.flatten()[0])
            return _AssignToCore.apply(tensor, mesh, src, self._logical_group, self._watchdog)
        return DTensor.from_local(tensor, mesh, [Replicate()] * mesh.ndim, run_check=False)

    def _is_own_mesh(self, mesh: DeviceMesh) -> bool:
        """Whether ``mesh`` is one that this replica's annotations use."""
        return (
            mesh == self._replica_logical_mesh
            or any(mesh == m for m in self._core_meshes.values())
            or any(mesh == m for m in self._split_meshes.values())
        )

    def _on_one_mesh(self, func: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``func``'s arguments, with the replica's DTensors on one mesh (see
        :class:`_OneMeshPerOperation`)."""
        tensors = _shallow_tensors(args, kwargs)
        if len(tensors) < 2:
            return args, kwargs
        meshes: list[DeviceMesh] = []
        for t in tensors:
            if isinstance(t, DTensor) and not any(t.device_mesh == m for m in meshes):
                meshes.append(t.device_mesh)
        if not meshes or not all(self._is_own_mesh(m) for m in meshes):
            return args, kwargs  # no DTensor, or not ours: DTensor decides
        target = meshes[0] if len(meshes) == 1 else self._replica_logical_mesh
        needs_grad = any(
            t.requires_grad and not isinstance(t, DTensor) and torch.is_grad_enabled()
            for t in tensors
        )
        if len(meshes) == 1 and not needs_grad:
            return args, kwargs

        def convert(t: torch.Tensor) -> torch.Tensor:
            if isinstance(t, DTensor):
                if t.device_mesh == target:
                    return t
                return self._replicated_on(self._logical_value(t), target)
            if t.requires_grad and torch.is_grad_enabled():
                return self._replicated_on(t, target)
            return t  # implicit replication

        return _map_tensors(convert, args, kwargs, keep_first=_is_in_place(func))

    def _on_whole_values(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """``func`` on the logical values of its DTensor arguments (all on one mesh), its
        tensor results replicated on that mesh."""
        mesh = next(t for t in _shallow_tensors(args, kwargs) if isinstance(t, DTensor)).device_mesh
        plain_args, plain_kwargs = _map_tensors(self._logical_value, args, kwargs, keep_first=False)
        result = func(*plain_args, **plain_kwargs)
        return _nest.map_structure(
            lambda r: self._replicated_on(r, mesh) if isinstance(r, torch.Tensor) else r, result
        )

    def assign_to_logical_device(self, tensor: Any, logical_device_id: int) -> DTensor:
        """``TPUStrategy.experimental_assign_to_logical_device``: refused in SPMD mode or for an
        id outside the replica's logical devices, with TF's messages."""
        if self._use_spmd_for_xla_partitioning:
            raise ValueError(SPMD_ASSIGN_ERROR)
        count = self.num_cores_per_replica
        if logical_device_id < 0 or logical_device_id >= count:
            raise ValueError(
                "`logical_core_id` to assign must be lower then total number of logical devices "
                f"per replica. Received logical device id {logical_device_id} but there are only "
                f"total of {count} logical devices in replica."
            )
        plain = self._to_device(self._as_plain(tensor))
        src = int(self._grid[self._replica_id, logical_device_id])
        group = self._logical_group if self.num_cores_per_replica > 1 else None
        mesh = self._core_mesh(logical_device_id)
        return _AssignToCore.apply(plain, mesh, src, group, self._watchdog)


# ---------------------------------------------------------------------------- strategies


class _TPUStrategyBase(Strategy):
    extended: TPUExtended

    def experimental_assign_to_logical_device(self, tensor: Any, logical_device_id: int) -> Any:
        """Place the computation of ``tensor`` on logical device ``logical_device_id`` only.

        Returns a ``DTensor`` that exists on that logical device of the replica (its
        ``full_tensor()`` there is ``tensor``); ``run`` returns it as a plain tensor on every
        device. Raises ``ValueError`` in SPMD mode or for an id outside the replica's logical
        devices.
        """
        return self.extended.assign_to_logical_device(tensor, logical_device_id)

    def experimental_split_to_logical_devices(
        self, tensor: Any, partition_dimensions: Sequence[int]
    ) -> Any:
        """Split ``tensor`` across the replica's logical devices (a sharded ``DTensor``).

        ``partition_dimensions[i]`` is the number of pieces along dimension ``i``; the tile
        with row-major index ``j`` lives on logical device ``j``. The gradient flows back to
        ``tensor`` whole.
        """
        extended = self.extended
        count = extended.num_cores_per_replica
        if not hasattr(tensor, "shape"):
            tensor = torch.as_tensor(tensor)
        dims = list(partition_dimensions)
        product = math.prod(dims)
        shape = tuple(tensor.shape)
        if len(shape) != len(dims):
            raise ValueError(
                "Length of `partition_dimensions` must equal to the rank of `tensor.shape` "
                f"({len(shape)}). Received len(partition_dimensions)={len(dims)}."
            )
        for index, size in enumerate(shape):
            if size is None:
                continue
            if size % dims[index] != 0:
                raise ValueError(
                    f"Tensor shape at `partition_dimensions[{index}]` must be divisible by "
                    f"corresponding value specified by `partition_dimensions` ({dims[index]}). "
                    f"Received: {size}."
                )
        if product != count:
            raise ValueError(
                "The product of `partition_dimensions` should be the same as the number of "
                f"logical devices (={count}). Received `partition_dimensions`="
                f"{partition_dimensions},and their product is {product}."
            )
        return extended.split_to_logical_devices(tensor, dims)

    def experimental_replicate_to_logical_devices(self, tensor: Any) -> Any:
        """Copy ``tensor`` to every logical device of the replica (a replicated ``DTensor``)."""
        return self.extended.replicate_to_logical_devices(tensor)


class TPUStrategy(_TPUStrategyBase):
    """Synchronous training where each replica may span several devices (model parallelism).

    Args:
      tpu_cluster_resolver: a ``strategyjob.cluster_resolver.ClusterResolver`` (default
        ``TFConfigClusterResolver()``): one process per device; without TF_CONFIG, this
        process's device alone.
      experimental_device_assignment: a ``strategyjob.tpu.experimental.DeviceAssignment``
        grouping the devices into replicas of ``num_cores_per_replica`` logical devices
        (default: every device is its own replica).
      experimental_spmd_xla_partitioning: TF's SPMD flag; assigning a tensor to one logical
        device is then an error.
    """

    def __init__(
        self,
        tpu_cluster_resolver: ClusterResolver | None = None,
        experimental_device_assignment: DeviceAssignment | None = None,
        experimental_spmd_xla_partitioning: bool = False,
    ) -> None:
        super().__init__(
            TPUExtended(
                self,
                tpu_cluster_resolver,
                device_assignment=experimental_device_assignment,
                use_spmd_for_xla_partitioning=experimental_spmd_xla_partitioning,
            )
        )


class TPUStrategyV1(CompatV1StrategyMethods, _TPUStrategyBase):
    """``strategyjob.experimental.TPUStrategy(tpu_cluster_resolver=None, device_assignment=None)``
    (TF's ``tf.distribute.experimental.TPUStrategy``); see :class:`TPUStrategy`."""

    def __init__(
        self,
        tpu_cluster_resolver: ClusterResolver | None = None,
        device_assignment: DeviceAssignment | None = None,
    ) -> None:
        super().__init__(
            TPUExtended(self, tpu_cluster_resolver, device_assignment=device_assignment)
        )
