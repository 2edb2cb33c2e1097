"""``strategyjob.experimental.coordinator`` (``tf.distribute.experimental.coordinator``)."""

from strategyjob.ps.coordinator import (
    ClusterCoordinator,
    PerWorkerValues,
    RemoteValue,
    get_current_worker_index,
)

__all__ = ["ClusterCoordinator", "PerWorkerValues", "RemoteValue", "get_current_worker_index"]
