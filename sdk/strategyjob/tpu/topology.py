"""``Topology``: the devices of a cluster as a 4-D ``(x, y, z, core)`` mesh.

Why a mesh at all on GPUs and CPU processes: ``DeviceAssignment.build`` places replicas and
their logical cores by mesh coordinates, and ported code builds its assignment from the
topology exactly as on TPUs. A StrategyJob cluster runs one process per device, so its
topology is the line ``[1, 1, 1, N]`` with task ``i`` at ``(0, 0, 0, i)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Topology", "initialize_tpu_system"]


def _device_name(job: str | None, task: int, kind: str, device: int) -> str:
    prefix = f"/job:{job}" if job is not None else ""
    return f"{prefix}/task:{task}/device:{kind}:{device}"


class Topology:
    """Describes a set of devices: the mesh shape and each (task, device)'s coordinates.

    Args:
      serialized: not supported (TensorFlow's serialized ``TopologyProto``); pass
        ``mesh_shape`` and ``device_coordinates`` instead.
      mesh_shape: 4 positive integers ``(x, y, z, core)``.
      device_coordinates: an int array ``[num_tasks, devices_per_task, 4]`` giving the mesh
        coordinates of every device of every task.
    """

    def __init__(
        self,
        serialized: bytes | None = None,
        mesh_shape: Sequence[int] | None = None,
        device_coordinates: Any = None,
    ) -> None:
        if serialized:
            raise ValueError(
                "A serialized TopologyProto is not supported: build the Topology from "
                "`mesh_shape` and `device_coordinates`, or get the cluster's topology from "
                "strategyjob.tpu.experimental.initialize_tpu_system()."
            )
        self._mesh_shape = np.asarray(mesh_shape if mesh_shape is not None else [], np.int32)
        if self._mesh_shape.ndim != 1 or len(self._mesh_shape) != 4 or any(self._mesh_shape < 1):
            raise ValueError(
                "`mesh_shape` must be a sequence of 4 positive entries; got "
                f"`mesh_shape={self._mesh_shape}`"
            )
        coords = np.asarray(device_coordinates if device_coordinates is not None else [], np.int32)
        if coords.ndim != 3 or coords.shape[2] != len(self._mesh_shape):
            raise ValueError(
                "`device_coordinates` must be a rank 3 int32 array with minor dimension equal to "
                f"the mesh shape rank; got shape {coords.shape} for mesh_shape={self._mesh_shape}"
            )
        if coords.size and (np.any(coords < 0) or np.any(coords >= self._mesh_shape)):
            raise ValueError(
                f"`device_coordinates` must lie inside mesh_shape={self._mesh_shape}; got "
                f"{coords.tolist()}"
            )
        self._device_coordinates = coords
        self._tasks = np.full(tuple(self._mesh_shape), -1, dtype=np.int32)
        self._devices = np.full(tuple(self._mesh_shape), -1, dtype=np.int32)
        for task in range(coords.shape[0]):
            for device in range(coords.shape[1]):
                at = tuple(coords[task, device])
                self._tasks[at] = task
                self._devices[at] = device
        self._missing_devices = np.argwhere(self._tasks < 0)

    @property
    def mesh_shape(self) -> np.ndarray:
        """A rank 1 int32 array: the shape of the mesh ``(x, y, z, core)``."""
        return self._mesh_shape

    @property
    def mesh_rank(self) -> int:
        return len(self._mesh_shape)

    @property
    def device_coordinates(self) -> np.ndarray:
        """A rank 3 int32 array ``[tasks, devices, axis]`` of mesh coordinates."""
        return self._device_coordinates

    @property
    def missing_devices(self) -> np.ndarray:
        """Indices of the mesh positions that no device occupies."""
        return self._missing_devices

    @property
    def num_tasks(self) -> int:
        return int(self._device_coordinates.shape[0])

    @property
    def num_tpus_per_task(self) -> int:
        return int(self._device_coordinates.shape[1])

    def task_ordinal_at_coordinates(self, device_coordinates: Sequence[int]) -> int:
        """The task (process) that holds the device at ``device_coordinates``."""
        return int(self._tasks[tuple(device_coordinates)])

    def tpu_device_ordinal_at_coordinates(self, device_coordinates: Sequence[int]) -> int:
        """The device number, within its task, of the device at ``device_coordinates``."""
        return int(self._devices[tuple(device_coordinates)])

    def cpu_device_name_at_coordinates(self, device_coordinates: Sequence[int], job=None) -> str:
        return _device_name(job, self.task_ordinal_at_coordinates(device_coordinates), "CPU", 0)

    def tpu_device_name_at_coordinates(self, device_coordinates: Sequence[int], job=None) -> str:
        task = self.task_ordinal_at_coordinates(device_coordinates)
        device = self.tpu_device_ordinal_at_coordinates(device_coordinates)
        return _device_name(job, task, "TPU", device)

    def __repr__(self) -> str:
        return (
            f"Topology(mesh_shape={self._mesh_shape.tolist()}, "
            f"num_tasks={self.num_tasks}, num_tpus_per_task={self.num_tpus_per_task})"
        )


def line_topology(num_devices: int) -> Topology:
    """The topology of ``num_devices`` processes: task ``i`` at ``(0, 0, 0, i)``."""
    coords = [[[0, 0, 0, i]] for i in range(num_devices)]
    return Topology(mesh_shape=[1, 1, 1, num_devices], device_coordinates=coords)


def initialize_tpu_system(cluster_resolver: Any = None) -> Topology:
    """The topology of the cluster (TF's ``tf.tpu.experimental.initialize_tpu_system``).

    The cluster comes from ``cluster_resolver`` (default: ``TFConfigClusterResolver()``): its
    chief and worker tasks, one device each. Without a cluster (no TF_CONFIG) the topology is
    this one process's device. Nothing is started: the rendezvous happens when the strategy
    is created.
    """
    from strategyjob.cluster_resolver import TFConfigClusterResolver

    resolver = cluster_resolver if cluster_resolver is not None else TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    count = sum(len(cluster.get(job) or []) for job in ("chief", "worker"))
    return line_topology(max(count, 1))
