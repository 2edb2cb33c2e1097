"""``ShardedVariable``: one logical variable stored as row shards, possibly on several ps.

Reads concatenate the shards; writes slice the value by row offsets; ``embedding_lookup``
asks each shard only for the rows it owns (one request per shard, never the whole table);
``state_dict`` holds the full logical value, so it restores into any number of shards.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from strategyjob._variables import IndexedSlices, _TensorLike, _unwrap

__all__ = ["ShardedVariable", "embedding_lookup"]


def _as_tensor(value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    value = _unwrap(value)
    if isinstance(value, torch.Tensor):
        return value.detach() if dtype is None else value.detach().to(dtype)
    return torch.as_tensor(value, dtype=dtype)


def _gather_rows(shard: Any, local_ids: torch.Tensor) -> torch.Tensor:
    """Rows ``local_ids`` of one shard: read by the shard when it can (a ps variable's
    ``sparse_read`` brings only those rows), else without copying the local shard."""
    sparse_read = getattr(shard, "sparse_read", None)
    if sparse_read is not None:
        return sparse_read(local_ids)
    return _as_tensor(shard).index_select(0, local_ids)


class ShardedVariable(_TensorLike):
    """A variable made of shards split along the first axis (``tf.distribute``'s)."""

    def __init__(self, variables: Sequence[Any], name: str = "ShardedVariable") -> None:
        if (
            not isinstance(variables, (list, tuple))
            or not variables
            or not all(hasattr(v, "assign") and hasattr(v, "shape") for v in variables)
        ):
            raise TypeError(
                "Argument `variables` should be a non-empty list of `variables.Variable`s. "
                f"Received {variables}"
            )
        dtypes = [v.dtype for v in variables]
        if any(d != dtypes[0] for d in dtypes):
            raise ValueError(
                "All elements in argument `variables` must have the same dtype. Received "
                f"dtypes: {dtypes}"
            )
        shapes = [tuple(v.shape) for v in variables]
        if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
            raise ValueError(
                "All elements in argument `variables` must have the same shapes except for the "
                f"first axis. Received shapes: {[list(s) for s in shapes]}"
            )
        self._variables = list(variables)
        self._name = name
        self._row_offsets = [0]
        for shape in shapes:
            self._row_offsets.append(self._row_offsets[-1] + shape[0])
        self._shape = torch.Size([self._row_offsets[-1], *shapes[0][1:]])

    # -- properties ----------------------------------------------------------------------
    @property
    def variables(self) -> list[Any]:
        """The shards, in row order."""
        return list(self._variables)

    @property
    def name(self) -> str:
        return self._name

    @property
    def distribute_strategy(self) -> Any:
        """The strategy its shards were created in (None for shards made outside any), as
        every other kind of variable answers."""
        return getattr(self._variables[0], "distribute_strategy", None)

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._variables[0].dtype

    @property
    def device(self) -> str:
        return self._variables[0].device

    @property
    def trainable(self) -> bool:
        return bool(getattr(self._variables[0], "trainable", True))

    def get_shape(self) -> torch.Size:
        return self._shape

    def __iter__(self) -> Iterator[Any]:
        return iter(self._variables)

    def __len__(self) -> int:
        return int(self._shape[0])

    # -- reads ---------------------------------------------------------------------------
    def _value_for_op(self) -> torch.Tensor:
        return torch.cat([_as_tensor(v.read_value()) for v in self._variables], dim=0)

    def read_value(self) -> torch.Tensor:
        """The full logical value (the concatenation of the shards)."""
        return self._value_for_op()

    def value(self) -> torch.Tensor:
        return self._value_for_op()

    def __getitem__(self, index: Any) -> torch.Tensor:
        if isinstance(index, torch.Tensor) and not index.dtype == torch.bool:
            raise TypeError("ShardedVariable does not support indexing with a Tensor.")
        if isinstance(index, int):
            rows = int(self._shape[0])
            if not -rows <= index < rows:
                raise IndexError(
                    f"ShardedVariable: slice index {index} of dimension 0 out of bounds."
                )
            return self.embedding_lookup(torch.tensor(index % rows))
        return self._value_for_op()[index]

    def _shard_of(self, row: int) -> int:
        return bisect.bisect_right(self._row_offsets, row) - 1

    def embedding_lookup(self, ids: Any) -> torch.Tensor:
        """Rows ``ids`` (any shape) of the logical variable; each shard is asked once."""
        ids = _as_tensor(ids).to(torch.long)
        flat = ids.reshape(-1)
        rows = int(self._shape[0])
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= rows):
            bad = flat[(flat < 0) | (flat >= rows)][0]
            raise IndexError(f"indices[{int(bad)}] is not in [0, {rows})")
        unique, inverse = torch.unique(flat, return_inverse=True)
        offsets = torch.tensor(self._row_offsets, dtype=torch.long)
        owner = torch.bucketize(unique, offsets[1:], right=True)
        gathered = torch.empty((unique.numel(), *self._shape[1:]), dtype=self.dtype)
        for i, shard in enumerate(self._variables):
            mask = owner == i
            if bool(mask.any()):
                gathered[mask] = _gather_rows(shard, unique[mask] - self._row_offsets[i])
        return gathered[inverse].reshape(*ids.shape, *self._shape[1:])

    # -- writes --------------------------------------------------------------------------
    def _split(self, value: Any) -> list[torch.Tensor]:
        tensor = _as_tensor(value, self.dtype)
        if tuple(tensor.shape) != tuple(self._shape):
            raise ValueError(
                f"Cannot update ShardedVariable '{self._name}' of shape {list(self._shape)} "
                f"with a value of shape {list(tensor.shape)}; the shapes must be equal."
            )
        return [
            tensor[self._row_offsets[i] : self._row_offsets[i + 1]]
            for i in range(len(self._variables))
        ]

    def _update(self, op: str, value: Any, read_value: bool) -> Any:
        for shard, part in zip(self._variables, self._split(value)):
            getattr(shard, op)(part, read_value=False)
        return self if read_value else None

    def assign(self, value: Any, use_locking: Any = None, name: Any = None, read_value=True):
        """Assign the rows of ``value`` to the shards that own them; returns self."""
        return self._update("assign", value, read_value)

    def assign_add(self, delta: Any, use_locking: Any = None, name: Any = None, read_value=True):
        return self._update("assign_add", delta, read_value)

    def assign_sub(self, delta: Any, use_locking: Any = None, name: Any = None, read_value=True):
        return self._update("assign_sub", delta, read_value)

    # -- sparse ops (exact "div" sharding only, as in TensorFlow) ------------------------
    def _div_route(self, op_name: str, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self._variables)
        base, extra = divmod(int(self._shape[0]), n)
        sizes = [self._row_offsets[i + 1] - self._row_offsets[i] for i in range(n)]
        if sizes != [base + 1] * extra + [base] * (n - extra):
            raise NotImplementedError(
                f"{op_name} ops are not supported in ShardedVariable that does not conform "
                'to "div" sharding'
            )
        if indices.dim() != 1:
            raise ValueError(f"{op_name}: indices must be 1-D, got shape {list(indices.shape)}")
        big = indices // (base + 1)
        small = (indices - extra) // base if base else big
        shard = torch.maximum(big, small)
        local = torch.where(shard < extra, indices % (base + 1), (indices - extra) % max(base, 1))
        return shard, local

    def _scatter(self, op_name: str, sparse_delta: Any) -> ShardedVariable:
        indices = _as_tensor(sparse_delta.indices).to(torch.long)
        values = _as_tensor(sparse_delta.values, self.dtype)
        shard, local = self._div_route(op_name, indices)
        for i, var in enumerate(self._variables):
            mask = shard == i
            if bool(mask.any()):
                getattr(var, op_name)(IndexedSlices(values[mask], local[mask]))
        return self

    def scatter_update(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_update", sparse_delta)

    def scatter_add(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_sub", sparse_delta)

    def scatter_mul(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_mul", sparse_delta)

    def scatter_div(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_div", sparse_delta)

    def scatter_min(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_min", sparse_delta)

    def scatter_max(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_max", sparse_delta)

    def sparse_read(self, indices: Any, name: Any = None) -> torch.Tensor:
        """Rows ``indices`` (1-D), in index order."""
        indices = _as_tensor(indices).to(torch.long)
        self._div_route("sparse_read", indices)
        return self.embedding_lookup(indices)

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full logical value: restores into a ShardedVariable with any shard count."""
        return {"value": self.read_value()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.assign(state_dict["value"], read_value=False)

    def __repr__(self) -> str:
        return (
            f"<strategyjob.ShardedVariable '{self._name}' shape={list(self._shape)} "
            f"shards={[list(v.shape) for v in self._variables]}>"
        )

    __str__ = __repr__


def embedding_lookup(params: Any, ids: Any) -> torch.Tensor:
    """``tf.nn.embedding_lookup``: rows ``ids`` of ``params`` (ShardedVariable, variable or
    tensor)."""
    if isinstance(params, ShardedVariable):
        return params.embedding_lookup(ids)
    if isinstance(params, (list, tuple)):
        return ShardedVariable(list(params)).embedding_lookup(ids)
    ids = _as_tensor(ids).to(torch.long)
    table = _unwrap(params)  # a variable: the tensor it reads as
    return torch.nn.functional.embedding(ids, table)
