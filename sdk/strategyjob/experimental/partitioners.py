"""``strategyjob.experimental.partitioners`` (``tf.distribute.experimental.partitioners``)."""

from strategyjob.ps.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
)

__all__ = ["FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "Partitioner"]
