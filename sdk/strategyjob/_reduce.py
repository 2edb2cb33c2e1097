"""``ReduceOp``: how the values of several replicas combine (``tf.distribute.ReduceOp``)."""

from __future__ import annotations

import enum
from typing import Any


class ReduceOp(enum.Enum):
    """Indicates how a set of values should be reduced.

    ``SUM`` adds the values of all replicas; ``MEAN`` divides that sum by the number of
    replicas (or, for ``Strategy.reduce`` with an ``axis``, by the global element count).
    """

    SUM = "SUM"
    MEAN = "MEAN"

    @staticmethod
    def from_variable_aggregation(aggregation: Any) -> ReduceOp:
        """``VariableAggregation.SUM``/``MEAN`` to the same ``ReduceOp``; anything else fails."""
        name = getattr(aggregation, "name", None)
        if name == "SUM":
            return ReduceOp.SUM
        if name == "MEAN":
            return ReduceOp.MEAN
        shown = f"{type(aggregation).__name__}.{name}" if name is not None else f"{aggregation}"
        raise ValueError(
            f"Could not convert from `tf.VariableAggregation` {shown} to"
            "`tf.distribute.ReduceOp` type"
        )


def to_reduce_op(reduce_op: ReduceOp | str) -> ReduceOp:
    """Accepts a ``ReduceOp`` or a case-insensitive string (``"sum"``, ``"Mean"``), as TF's APIs do.

    ``ReduceOp("sum")`` itself stays strict (``ValueError: 'sum' is not a valid ReduceOp``),
    like TensorFlow's enum; only the reduction APIs upper-case strings first.
    """
    if isinstance(reduce_op, ReduceOp):
        return reduce_op
    if isinstance(reduce_op, str):
        return ReduceOp(reduce_op.upper())
    return ReduceOp(reduce_op)
