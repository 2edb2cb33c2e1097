"""``strategyjob.runner``: TF-GNN runner's strategy constructors
(``runner.ParameterServerStrategy(min_shard_bytes=None)``)."""

from strategyjob.ps.runner import ParameterServerStrategy

__all__ = ["ParameterServerStrategy"]
