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
    like TensorFlow's enum; only the reduction APIs upper-case strings first. An op that is
    neither gets TensorFlow's message followed by the valid ops (TF's stops at the first
    sentence, which leaves a user guessing between ``"AVG"``, ``"MEAN"`` and ``"mean"``).
    """
    if isinstance(reduce_op, ReduceOp):
        return reduce_op
    try:
        return ReduceOp(reduce_op.upper() if isinstance(reduce_op, str) else reduce_op)
    except ValueError as e:
        raise ValueError(f"{e}. {VALID_OPS}") from None


#: What :func:`to_reduce_op` appends to TensorFlow's message for an op it does not know.
VALID_OPS = (
    "Use one of: tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN, "
    "or the strings 'sum' and 'mean' (in any case)."
)
