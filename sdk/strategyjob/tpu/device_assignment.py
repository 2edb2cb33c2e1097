"""``DeviceAssignment``: which mesh device runs each logical core of each replica.

``DeviceAssignment.build`` follows TensorFlow's placement arithmetic and its validation
messages unchanged (``tensorflow/python/tpu/device_assignment.py``), so an assignment built
for a topology gives the same ``core_assignment`` here as there. ``TPUStrategy`` turns it
into a ``(replica, logical core)`` grid of process ranks for a torch ``DeviceMesh``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from strategyjob.tpu.topology import Topology

__all__ = ["DeviceAssignment", "DeviceOrderMode"]


class DeviceOrderMode(enum.IntEnum):
    """How ``build`` orders devices: AUTO forms rings where it can."""

    AUTO = 0
    RING = 1
    MESH = 2


class DeviceAssignment:
    """Mapping from the logical cores of each replica to devices of a ``Topology``.

    Args:
      topology: the ``Topology`` the coordinates refer to.
      core_assignment: int array ``[num_replicas, num_cores_per_replica, 4]`` of mesh
        coordinates. Prefer :meth:`build`.
    """

    def __init__(self, topology: Topology, core_assignment: Any) -> None:
        if not isinstance(topology, Topology):
            raise ValueError(f"topology must be a Topology object, got {type(topology)}")
        core_assignment = np.asarray(core_assignment, dtype=np.int32)
        if core_assignment.ndim != 3:
            raise ValueError(
                f"core_assignment must be a rank 3 numpy array, got shape {core_assignment.shape}"
            )
        if core_assignment.shape[-1] != topology.mesh_rank:
            raise ValueError(
                "core_assignment.shape[-1] must have size equal to topology rank "
                f"({topology.mesh_rank}), got core_assignment.shape={core_assignment.shape}"
            )
        self._topology = topology
        self._core_assignment = core_assignment
        self._num_replicas = int(core_assignment.shape[0])
        self._num_cores_per_replica = int(core_assignment.shape[1])
        self._task_and_cores_to_replicas: dict[int, dict[int, list[int]]] = {}
        for replica in range(self._num_replicas):
            for core in range(self._num_cores_per_replica):
                task = topology.task_ordinal_at_coordinates(core_assignment[replica, core])
                replicas = self._task_and_cores_to_replicas.setdefault(task, {})
                replicas.setdefault(core, []).append(replica)

    @property
    def topology(self) -> Topology:
        return self._topology

    @property
    def num_cores_per_replica(self) -> int:
        """The number of logical cores (devices) of each replica."""
        return self._num_cores_per_replica

    @property
    def num_replicas(self) -> int:
        return self._num_replicas

    @property
    def core_assignment(self) -> np.ndarray:
        """int32 array ``[num_replicas, num_cores_per_replica, topology_rank]``."""
        return self._core_assignment

    def coordinates(self, replica: int, logical_core: int) -> tuple:
        """The mesh coordinates of ``logical_core`` of ``replica``."""
        return tuple(int(c) for c in self._core_assignment[replica, logical_core, :])

    def lookup_replicas(self, task_id: int, logical_core: int) -> list[int]:
        """The sorted replicas whose ``logical_core`` runs on task ``task_id``."""
        try:
            return sorted(self._task_and_cores_to_replicas[task_id][logical_core])
        except KeyError:
            raise ValueError(
                f"Can not find any replica in task: {task_id} contains logical_core: "
                f"{logical_core} "
            ) from None

    def tpu_ordinal(self, replica: int = 0, logical_core: int = 0) -> int:
        """The device number, within its task, of ``logical_core`` of ``replica``."""
        return self._topology.tpu_device_ordinal_at_coordinates(
            self.coordinates(replica, logical_core)
        )

    def task(self, replica: int = 0, logical_core: int = 0) -> int:
        """The task (process) that runs ``logical_core`` of ``replica``."""
        return self._topology.task_ordinal_at_coordinates(self.coordinates(replica, logical_core))

    def host_device(self, replica: int = 0, logical_core: int = 0, job: str | None = None) -> str:
        return self._topology.cpu_device_name_at_coordinates(
            self.coordinates(replica, logical_core), job=job
        )

    def tpu_device(self, replica: int = 0, logical_core: int = 0, job: str | None = None) -> str:
        return self._topology.tpu_device_name_at_coordinates(
            self.coordinates(replica, logical_core), job=job
        )

    @staticmethod
    def build(
        topology: Topology,
        computation_shape: Sequence[int] | None = None,
        computation_stride: Sequence[int] | None = None,
        num_replicas: int = 1,
    ) -> DeviceAssignment:
        """Place ``num_replicas`` blocks of ``computation_shape`` devices on ``topology``."""
        return device_assignment(topology, computation_shape, computation_stride, num_replicas)

    def __repr__(self) -> str:
        return (
            f"DeviceAssignment(num_replicas={self._num_replicas}, "
            f"num_cores_per_replica={self._num_cores_per_replica})"
        )


# ---------------------------------------------------------------------------------- rings


def _open_ring_2d(x_size: int, y_size: int, z: int) -> list[tuple[int, int, int]]:
    """Ring order of an ``x_size x y_size`` plane at height ``z``, without chip (0, 0)."""
    ring = []
    for i in range(y_size // 2):
        ring.extend((j, 2 * i, z) for j in range(1, x_size))
        ring.extend((j, 2 * i + 1, z) for j in range(x_size - 1, 0, -1))
    ring.extend((0, i, z) for i in range(y_size - 1, 0, -1))
    return ring


def _ring_3d(x_size: int, y_size: int, z_size: int) -> list[tuple[int, int, int]]:
    """Ring order of an ``x by y by z`` block: 2-D rings stacked in z, joined at one corner."""
    if x_size == 1 and y_size == 1:
        return [(0, 0, i) for i in range(z_size)]
    if x_size == 1 and z_size == 1:
        return [(0, i, 0) for i in range(y_size)]
    if y_size == 1 and z_size == 1:
        return [(i, 0, 0) for i in range(x_size)]
    if any(s > 1 and s % 2 for s in (x_size, y_size, z_size)):  # odd: plain row order
        return [(x, y, z) for z in range(z_size) for y in range(y_size) for x in range(x_size)]
    ring = [(0, 0, 0)]
    if z_size == 1:
        return ring + _open_ring_2d(x_size, y_size, 0)
    if y_size == 1:
        return ring + [(x, y, z) for (x, z, y) in _open_ring_2d(x_size, z_size, 0)]
    if x_size == 1:
        return ring + [(x, y, z) for (y, z, x) in _open_ring_2d(y_size, z_size, 0)]
    for i in range(z_size):
        plane = _open_ring_2d(x_size, y_size, i)
        ring.extend(plane if i % 2 == 0 else reversed(plane))
    ring.extend((0, 0, i) for i in range(z_size - 1, 0, -1))
    return ring


# ------------------------------------------------------------------------------- build


def _as_vector(value: Sequence[int] | None, rank: int) -> np.ndarray:
    if value is None:
        return np.ones(rank, dtype=np.int32)
    return np.asarray(value, dtype=np.int32)


def _replica_shape(replica_counts: np.ndarray, num_replicas: int) -> list[int]:
    """Replicas per mesh dimension, as close to a cube as fits (TF's choice).

    Dimensions are visited by increasing capacity; on ties the core dimension first, then x,
    y, z, so that replicas prefer the cores of one chip and then neighbouring chips.
    """
    rank = len(replica_counts)
    shape = [0] * rank
    if num_replicas <= 0:
        return shape
    remaining, dims_left = num_replicas, rank
    order = sorted((int(count), (i + 1) % rank) for i, count in enumerate(replica_counts))
    for count, key in order:
        i = (key + rank - 1) % rank
        target = math.ceil(remaining ** (1.0 / dims_left))
        shape[i] = min(target, count)
        remaining = -(-remaining // shape[i])
        dims_left -= 1
    return shape


def device_assignment(
    topology: Topology,
    computation_shape: Sequence[int] | None = None,
    computation_stride: Sequence[int] | None = None,
    num_replicas: int = 1,
) -> DeviceAssignment:
    """``DeviceAssignment.build``: validate the request, then tile the mesh with replicas."""
    if not isinstance(topology, Topology):
        raise ValueError(f"`topology` is not a Topology object; got {type(topology)}")
    rank = topology.mesh_rank
    mesh_shape = topology.mesh_shape
    shape = _as_vector(computation_shape, rank)
    stride = _as_vector(computation_stride, rank)
    if shape.shape != (rank,):
        raise ValueError(f"computation_shape must have shape [{rank}]; got {shape.shape}")
    if stride.shape != (rank,):
        raise ValueError(f"computation_stride must have shape [{rank}]; got {stride.shape}")
    if any(shape < 1):
        raise ValueError(f"computation_shape must be positive; got computation_shape={shape}")
    if any(stride < 1):
        raise ValueError(f"computation_stride must be positive; got computation_stride={stride}")
    footprint = shape * stride
    if any(footprint > mesh_shape):
        raise ValueError(
            f"computation footprint {footprint} does not fit in TPU topology shape {mesh_shape}"
        )
    replica_counts = (mesh_shape // footprint) * stride
    max_replicas = int(np.prod(replica_counts))
    if num_replicas > max_replicas:
        raise ValueError(
            f"requested {num_replicas} replicas but only {max_replicas} replicas with shape "
            f"{shape} and computation_stride {stride} fit in a TPU mesh of shape {mesh_shape}"
        )
    if topology.missing_devices.size:
        return DeviceAssignment(topology, _task_order(topology, shape, num_replicas))
    replica_shape = _replica_shape(replica_counts, num_replicas)
    ring = (
        rank == 4
        and shape[-1] == mesh_shape[-1]
        and int(np.prod(stride)) == 1
        and num_replicas == max_replicas
    )
    if ring:
        assignment = _ring_tiling(shape, replica_shape, int(mesh_shape[-1]), num_replicas)
    else:
        assignment = _grid_tiling(shape, stride, replica_shape, num_replicas)
    return DeviceAssignment(topology, assignment)


def _ring_tiling(shape, replica_shape, cores_per_chip: int, num_replicas: int) -> list:
    inner = _ring_3d(int(shape[0]), int(shape[1]), int(shape[2]))
    outer = _ring_3d(replica_shape[0], replica_shape[1], replica_shape[2])
    assignment = []
    for replica in range(num_replicas):
        ox, oy, oz = outer[replica]
        cores = []
        for index in range(int(np.prod(shape))):
            ix, iy, iz = inner[index // cores_per_chip]
            cores.append(
                [
                    ox * shape[0] + ix,
                    oy * shape[1] + iy,
                    oz * shape[2] + iz,
                    index % cores_per_chip,
                ]
            )
        assignment.append(cores)
    return assignment


def _grid_tiling(shape, stride, replica_shape, num_replicas: int) -> np.ndarray:
    """Replica ``r`` in mixed radix (core digit fastest); cores of a block in row-major order."""
    rank = len(shape)
    offsets = np.zeros([num_replicas, rank], dtype=np.int32)
    radix = [replica_shape[-1], *replica_shape[:-1]]
    for replica in range(num_replicas):
        t, digits = replica, []
        for base in radix:
            digits.append(t % base)
            t //= base
        position = np.array([*digits[1:], digits[0]], dtype=np.int32)
        offsets[replica] = (position // stride) * (shape * stride) + position % stride
    axes = [np.arange(0, shape[i] * stride[i], stride[i]) for i in range(rank)]
    block = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, rank)
    return block[np.newaxis, :, :] + offsets[:, np.newaxis, :]


def _task_order(topology: Topology, shape: np.ndarray, num_replicas: int) -> list:
    """With missing devices: replicas take the devices in task order (stride ignored)."""
    per_replica = int(np.prod(shape))
    per_task = topology.num_tpus_per_task
    available = topology.num_tasks * per_task
    if num_replicas * per_replica > available:
        raise ValueError(
            f"requested {num_replicas} replicas of {per_replica} cores but the topology has only "
            f"{available} devices"
        )
    coords = topology.device_coordinates
    return [
        [
            coords[(r * per_replica + k) // per_task, (r * per_replica + k) % per_task].tolist()
            for k in range(per_replica)
        ]
        for r in range(num_replicas)
    ]
