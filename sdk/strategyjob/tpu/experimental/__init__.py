"""``strategyjob.tpu.experimental``: mirrors ``tf.tpu.experimental``.

``Topology`` describes the devices of a cluster as a ``(x, y, z, core)`` mesh,
``DeviceAssignment.build`` maps replicas and their logical cores onto it, and
``initialize_tpu_system`` returns the topology of the cluster in TF_CONFIG (one process per
device: task ``i`` is the device at ``(0, 0, 0, i)`` of mesh ``[1, 1, 1, N]``).
"""

from strategyjob.tpu.device_assignment import DeviceAssignment, DeviceOrderMode
from strategyjob.tpu.topology import Topology, initialize_tpu_system

__all__ = ["DeviceAssignment", "DeviceOrderMode", "Topology", "initialize_tpu_system"]
