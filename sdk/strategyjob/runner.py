"""``strategyjob.runner``: TF-GNN runner's strategy constructors
(``runner.ParameterServerStrategy(min_shard_bytes=None)``)."""

from __future__ import annotations

from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.ps.partitioners import MinSizePartitioner
from strategyjob.strategies.parameter_server import ParameterServerStrategy as _PSStrategy

__all__ = ["ParameterServerStrategy"]


def ParameterServerStrategy(min_shard_bytes: int | None = None) -> _PSStrategy:
    """A ``ParameterServerStrategy`` for the cluster in ``TF_CONFIG``, its variables split by a
    ``MinSizePartitioner`` into at most one shard per ps (shards of at least
    ``min_shard_bytes``, default 256 KiB)."""
    resolver = TFConfigClusterResolver()
    num_ps = resolver.cluster_spec().num_tasks("ps")
    if min_shard_bytes is None:
        partitioner = MinSizePartitioner(max_shards=num_ps)
    else:
        partitioner = MinSizePartitioner(min_shard_bytes, num_ps)
    return _PSStrategy(resolver, partitioner)
