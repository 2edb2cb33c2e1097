"""State on the parameter servers as seen from the coordinator and the workers.

* ``PSVariable``: a ``strategyjob.Variable`` whose value lives on one ps; every read and
  update is a call to that ps (the update runs there).
* Module parameters created in scope keep a ``ParamRef`` (or ``ShardedParamRef``) in
  ``param._sj_ref``. Shipped to a worker, a dense parameter becomes a worker-local
  ``nn.Parameter`` whose current value is read from its ps in each closure, before first use
  (riding along with the closure's first call to that ps); an ``nn.Embedding`` whose table is
  sharded becomes a ``RemoteEmbedding`` that gathers only the rows it needs; an optimizer over
  such parameters becomes a ``RemoteOptimizer`` whose ``step()`` sends the gradients (dense, or
  the touched rows only) to the ps tasks, where the optimizer's own update rule runs.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.overrides import TorchFunctionMode

from strategyjob import _variables

# Shared by ``strategyjob._variables`` with this package (its ``_INTERNAL`` list): a ps variable
# converts, formats and splits sparse updates as ``strategyjob.Variable`` does.
from strategyjob._variables import _dtype_name, _shape_str, _sparse_parts, _TensorLike, _unwrap
from strategyjob.ps import _torch_modes, _wire
from strategyjob.ps._cluster import run_ps_ops
from strategyjob.ps._transport import Op, ps_device

__all__ = [
    "PSVariable",
    "ParamRef",
    "RemoteEmbedding",
    "RemoteOptimizer",
    "ShardedParamRef",
    "place_on_ps",
    "ps_ref",
    "worker_state",
]


def var_op(op: str, key: str, value: Any = None, indices: Any = None, **kw: Any) -> Op:
    """One operation on variable ``key`` (``optimizer=``, ``read_back=`` as keywords)."""
    return Op(op, key, value, indices, **kw)


# ---------------------------------------------------------------------------------------------
# strategyjob.Variable on a ps


class PSVariable(_variables.Variable):
    """A variable held by parameter server ``task`` under the unique key ``key``."""

    # Set by ``from_ps`` (no value here: the ps holds it).
    _key: str
    _task: int
    _shape: torch.Size
    _dtype: torch.dtype

    @classmethod
    def from_ps(
        cls,
        *,
        key: str,
        task: int,
        shape: torch.Size,
        dtype: torch.dtype,
        name: str,
        trainable: bool = True,
        synchronization: Any = _variables.VariableSynchronization.AUTO,
        aggregation: Any = _variables.VariableAggregation.NONE,
        strategy: Any = None,
    ) -> PSVariable:
        """A handle to the variable the ps task ``task`` holds under ``key`` (its value stays
        there): what ParameterServerStrategy makes in its scope, and what a worker unpickles."""
        variable = object.__new__(cls)
        variable._key = key
        variable._task = task
        variable._shape = torch.Size(shape)
        variable._dtype = dtype
        variable._name = name
        variable._trainable = trainable
        variable._synchronization = synchronization
        variable._aggregation = aggregation
        variable._distribute_strategy = strategy
        variable._container = None
        variable._lock = threading.Lock()
        return variable

    def __reduce__(self) -> Any:
        meta: dict[str, Any] = dict(
            key=self._key,
            task=self._task,
            shape=tuple(self._shape),
            dtype=self._dtype,
            name=self._name,
            trainable=self._trainable,
            synchronization=self._synchronization,
            aggregation=self._aggregation,
        )
        return (functools.partial(PSVariable.from_ps, **meta), ())

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def device(self) -> str:
        return ps_device(self._task)

    @property
    def grad(self) -> None:
        return None

    def _run(self, op: Op) -> list[torch.Tensor]:
        return run_ps_ops(self._task, [op])

    def _value_for_op(self) -> torch.Tensor:
        return self._run(var_op("read", self._key))[0]

    def read_value(self) -> torch.Tensor:
        return self._value_for_op()

    def sparse_read(self, indices: Any, name: Any = None) -> torch.Tensor:
        """Rows ``indices`` (``tf.Variable.sparse_read``): only they travel from the ps."""
        ids = torch.as_tensor(indices).to(torch.long)
        return self._run(var_op("gather", self._key, indices=ids))[0]

    def _convert(self, value: Any, op_name: str) -> torch.Tensor:
        if isinstance(value, torch.Tensor | _TensorLike):
            value = _unwrap(value)
            tensor = value.detach().to(dtype=self._dtype, device="cpu")
        else:
            tensor = torch.as_tensor(value, dtype=self._dtype)
        if tensor.shape != self._shape:
            if op_name == "assign":
                raise ValueError(
                    f"Cannot assign value to variable ' {self._name}': Shape mismatch."
                    f"The variable shape {_shape_str(self._shape)}, and the assigned "
                    f"value shape {_shape_str(tensor.shape)} are incompatible."
                )
            raise ValueError(
                f"Cannot update variable with shape {list(self._shape)} using a Tensor with "
                f"shape {list(tensor.shape)}, shapes must be equal."
            )
        return tensor

    def _apply(self, op_name: str, value: Any, read_value: bool) -> torch.Tensor | None:
        tensor = self._convert(value, op_name)
        result = self._run(var_op(op_name, self._key, tensor, read_back=read_value))
        return result[0] if read_value else None

    def _scatter(self, op_name: str, sparse_delta: Any) -> torch.Tensor:
        indices, updates = _sparse_parts(sparse_delta)
        updates = torch.as_tensor(_unwrap(updates)).detach().to(self._dtype)
        op = var_op(op_name, self._key, updates, torch.as_tensor(indices).to(torch.long))
        op.read_back = True
        return self._run(op)[0]

    def __repr__(self) -> str:
        return (
            f"<strategyjob.Variable '{self._name}' shape={_shape_str(self._shape)} "
            f"dtype={_dtype_name(self._dtype)}, device={self.device}>"
        )

    __str__ = __repr__


# ---------------------------------------------------------------------------------------------
# module parameters


@dataclass(frozen=True)
class ParamRef:
    """Where one (dense) module parameter, or one shard of it, lives."""

    key: str
    task: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool = True

    @property
    def device(self) -> str:
        return ps_device(self.task)


@dataclass(frozen=True)
class ShardedParamRef:
    """A module parameter split by rows into ``shards`` (div partition, in order)."""

    shards: tuple[ParamRef, ...]

    @property
    def offsets(self) -> list[int]:
        out = [0]
        for shard in self.shards:
            out.append(out[-1] + shard.shape[0])
        return out


# The attribute of a torch parameter (or optimizer) under which this module tags it: read and
# written only through ``ps_ref`` / ``place_on_ps`` (``given_optimizer_key`` / ``optimizer_key``).
# An attribute, not a weak table: it travels with the parameter (``copy.deepcopy(model)``).
_REF_ATTRIBUTE = "_sj_ref"
_KEY_ATTRIBUTE = "_sj_key"


def ps_ref(param: Any) -> ParamRef | ShardedParamRef | None:
    """The ps variable(s) behind a module parameter placed on the ps, else None."""
    return getattr(param, _REF_ATTRIBUTE, None)


def place_on_ps(param: torch.Tensor, ref: ParamRef | ShardedParamRef) -> None:
    """Mark ``param`` as the coordinator's copy of the ps variable(s) ``ref``."""
    setattr(param, _REF_ATTRIBUTE, ref)  # an attribute of this instance only


def coordinator_hook(obj: Any) -> Any:
    """Persistent id of a module parameter placed on the ps (see ``_wire.dumps``)."""
    if isinstance(obj, torch.Tensor):
        ref = ps_ref(obj)
        if ref is not None:
            return ("param", ref)
    return None


class ShardedHandle:
    """Worker-side stand-in of a sharded parameter: row gathers and pending row gradients."""

    def __init__(self, ref: ShardedParamRef) -> None:
        self.ref = ref
        self.starts = ref.offsets  # first row of each shard, then the number of rows
        self.offsets = torch.tensor(self.starts, dtype=torch.long)
        self.anchor = torch.nn.Parameter(torch.zeros(0))  # lets autograd call our backward
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _split(self, ids: torch.Tensor) -> list[tuple[int, int, int]]:
        """``(shard, lo, hi)``: ``ids[lo:hi]`` (ascending ids) are the rows of ``shard``."""
        n = ids.numel()
        if not n:
            return []
        bounds = torch.searchsorted(ids, self.offsets).tolist()
        if bounds[0] != 0 or bounds[-1] != n:  # ids < 0 or >= the number of rows
            raise IndexError("index out of range in self")
        return [(i, lo, hi) for i, (lo, hi) in enumerate(itertools.pairwise(bounds)) if hi > lo]

    def _local(self, ids: torch.Tensor, shard: int, lo: int, hi: int) -> torch.Tensor:
        start = self.starts[shard]
        return ids[lo:hi] - start if start else ids[lo:hi]

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (1-D, unique, ascending): one call per ps, one gather per shard
        touched; the closure's pending dense-parameter reads on that ps travel in the same
        call."""
        by_task: dict[int, list[tuple[int, Op]]] = defaultdict(list)
        for i, lo, hi in self._split(ids):
            shard = self.ref.shards[i]
            by_task[shard.task].append(
                (i, Op("gather", shard.key, indices=self._local(ids, i, lo, hi)))
            )
        parts: list[torch.Tensor | None] = [None] * len(self.ref.shards)
        state = worker_state()
        for task, items in by_task.items():
            reads = state.take_pending(task)
            results = run_ps_ops(task, [Op("read", r.key) for r in reads] + [op for _, op in items])
            state.store(reads, results[: len(reads)])
            for (i, _), part in zip(items, results[len(reads) :]):
                parts[i] = part
        found = [p for p in parts if p is not None]
        if len(found) == 1:
            return found[0]
        if not found:
            first = self.ref.shards[0]
            return torch.empty((0, *first.shape[1:]), dtype=first.dtype)
        return torch.cat(found)

    def sparse_ops(self, opt_json: str) -> dict[int, list[Op]]:
        """The pending row gradients as ``apply_sparse`` ops per ps task; clears them."""
        ops: dict[int, list[Op]] = defaultdict(list)
        if not self.pending:
            return ops
        if len(self.pending) == 1:
            ids, grads = self.pending[0]  # from one lookup: unique ids, ascending
        else:  # several lookups: ids may repeat (the ps adds their rows up)
            ids, order = torch.sort(torch.cat([i for i, _ in self.pending]))
            grads = torch.cat([g for _, g in self.pending]).index_select(0, order)
        self.pending.clear()
        for i, lo, hi in self._split(ids):
            shard = self.ref.shards[i]
            local = self._local(ids, i, lo, hi)
            ops[shard.task].append(
                Op("apply_sparse", shard.key, grads[lo:hi], local, optimizer=opt_json)
            )
        return ops


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, handle: ShardedHandle, ids: torch.Tensor, pad):
        flat = ids.reshape(-1).to(torch.long)
        unique, inverse = torch.unique(flat, return_inverse=True)
        rows = handle.gather(unique)
        ctx.handle, ctx.pad = handle, pad
        ctx.save_for_backward(unique, inverse)
        return rows.index_select(0, inverse).reshape(*ids.shape, *rows.shape[1:])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        unique, inverse = ctx.saved_tensors
        flat = grad.reshape(inverse.numel(), -1)
        summed = torch.zeros((unique.numel(), flat.shape[1]), dtype=grad.dtype)
        summed.index_add_(0, inverse, flat)
        if ctx.pad is not None:
            summed[unique == ctx.pad] = 0
        ctx.handle.pending.append((unique, summed))
        return None, None, None, None


class RemoteEmbedding(torch.nn.Module):
    """A worker's view of an ``nn.Embedding`` whose table is sharded across ps tasks."""

    def __init__(self, ref: ShardedParamRef, padding_idx: int | None) -> None:
        super().__init__()
        self.handle = worker_state().sharded(ref)
        self.padding_idx = padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if worker_state().mode is None:
            return _Lookup.apply(self.handle.anchor, self.handle, ids, self.padding_idx)
        # Parameters are pending (``PullOnUse`` is on the stack): the lookup's own torch calls
        # (on the ids, never on a parameter) skip the mode, which then steps off the stack as
        # soon as the gather took the pending reads along.
        with _torch_modes.disable_torch_function():
            return _Lookup.apply(self.handle.anchor, self.handle, ids, self.padding_idx)


def _reduce_embedding(module: torch.nn.Embedding) -> Any:
    ref = ps_ref(module.weight)
    if not isinstance(ref, ShardedParamRef):
        return NotImplemented
    return (RemoteEmbedding, (ref, module.padding_idx))


# ---------------------------------------------------------------------------------------------
# optimizers

_opt_counter = iter(range(1 << 62))


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def holds_ps_parameters(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` updates parameters held by parameter servers (its steps run there)."""
    return any(ps_ref(p) is not None for group in opt.param_groups for p in group["params"])


def given_optimizer_key(opt: torch.optim.Optimizer) -> str | None:
    """The name under which the ps keep ``opt``'s state, or None if it has none yet (it was
    never shipped: never stepped on the ps)."""
    return getattr(opt, _KEY_ATTRIBUTE, None)


def optimizer_key(opt: torch.optim.Optimizer) -> str:
    """The name under which the ps keep ``opt``'s state (given on first use)."""
    key = given_optimizer_key(opt)
    if key is None:
        key = f"opt{next(_opt_counter)}"
        setattr(opt, _KEY_ATTRIBUTE, key)
    return key


def _class_path(opt: torch.optim.Optimizer) -> str:
    cls = type(opt)
    return f"{cls.__module__}:{cls.__qualname__}"


def optimizer_json(opt: torch.optim.Optimizer, group: dict) -> str:
    """What the ps need to run ``opt`` for ``group``'s parameters (RemoteOptimizer's JSON)."""
    hparams = {k: _plain(v) for k, v in group.items() if k != "params"}
    return json.dumps({"key": optimizer_key(opt), "cls": _class_path(opt), "hparams": hparams})


def _reduce_optimizer(opt: torch.optim.Optimizer) -> Any:
    if not holds_ps_parameters(opt):
        return NotImplemented
    groups = [
        ({k: _plain(v) for k, v in group.items() if k != "params"}, list(group["params"]))
        for group in opt.param_groups
    ]
    return (RemoteOptimizer, (optimizer_key(opt), _class_path(opt), groups))


class RemoteOptimizer:
    """A worker's view of an optimizer over ps-held parameters: ``step()`` ships gradients."""

    def __init__(self, key: str, cls_path: str, groups: list[tuple[dict, list]]) -> None:
        self._key = key
        self._cls_path = cls_path
        self.param_groups = [dict(hparams, params=params) for hparams, params in groups]
        self._json: dict[int, tuple[dict, str]] = {}  # by group: its hparams and their JSON

    def _opt_json(self, group: dict) -> str:
        """The JSON of the optimizer with ``group``'s hyperparameters (encoded again only when
        they changed, e.g. by a learning-rate schedule in the closure)."""
        hparams = {k: _plain(v) for k, v in group.items() if k != "params"}
        cached = self._json.get(id(group))
        if cached is None or cached[0] != hparams:
            text = json.dumps({"key": self._key, "cls": self._cls_path, "hparams": hparams})
            cached = self._json[id(group)] = (hparams, text)
        return cached[1]

    def zero_grad(self, set_to_none: bool = True) -> None:
        with _torch_modes.disable_torch_function():  # our own bookkeeping: skip ``PullOnUse``
            self._zero_grad()

    def _zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if isinstance(p, ShardedHandle):
                    p.pending.clear()
                else:
                    p.grad = None

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        with _torch_modes.disable_torch_function():  # our own bookkeeping: skip ``PullOnUse``
            self._send_gradients()
        return loss

    def _send_gradients(self) -> None:
        ops: dict[int, list[Op]] = defaultdict(list)
        for group in self.param_groups:
            opt_json = self._opt_json(group)
            for p in group["params"]:
                if isinstance(p, ShardedHandle):
                    for task, task_ops in p.sparse_ops(opt_json).items():
                        ops[task].extend(task_ops)
                elif p.grad is not None:
                    ref = cast(ParamRef, ps_ref(p))  # a worker's dense parameter
                    ops[ref.task].append(Op("apply_dense", ref.key, p.grad, optimizer=opt_json))
        for task, task_ops in ops.items():
            run_ps_ops(task, task_ops)


_wire.register_reducer(torch.nn.Embedding, _reduce_embedding)
_wire.register_reducer(torch.optim.Optimizer, _reduce_optimizer)


# ---------------------------------------------------------------------------------------------
# the worker's side


class WorkerState:
    """Per-process cache of the parameters a worker has seen, and its resources."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.params: dict[str, torch.nn.Parameter] = {}
        self.handles: dict[ShardedParamRef, ShardedHandle] = {}
        self.resources: dict[int, Any] = {}
        self.pending: dict[int, list[ParamRef]] = {}
        self.pending_ids: set[int] = set()
        self.mode: PullOnUse | None = None  # while a closure runs with parameters pending

    def param(self, ref: ParamRef) -> torch.nn.Parameter:
        with self.lock:
            param = self.params.get(ref.key)
            if param is None:
                param = torch.nn.Parameter(
                    torch.zeros(ref.shape, dtype=ref.dtype), requires_grad=ref.requires_grad
                )
                place_on_ps(param, ref)
                self.params[ref.key] = param
            return param

    def sharded(self, ref: ShardedParamRef) -> ShardedHandle:
        with self.lock:
            handle = self.handles.get(ref)
            if handle is None:
                handle = self.handles[ref] = ShardedHandle(ref)
            return handle

    def loader(self, touched: list[ParamRef]) -> Any:
        """A persistent-id loader that records the dense parameters it resolves."""

        def load(pid: Any) -> Any:
            kind = pid[0]
            if kind == "param":
                ref = pid[1]
                if isinstance(ref, ShardedParamRef):
                    return self.sharded(ref)
                touched.append(ref)
                return self.param(ref)
            if kind == "resource":
                try:
                    return self.resources[pid[1]]
                except KeyError:
                    raise MissingResource(pid[1]) from None
            if kind == "value":
                return pid[1]
            raise ValueError(f"unknown persistent id {pid!r}")

        return load

    # -- fresh values for each closure ------------------------------------------------------
    # A closure reads the current value of every dense parameter it uses. The reads are
    # deferred: they ride along with the closure's first call to the parameter's ps (an
    # embedding gather), or happen, one call per ps, when a torch operation first touches a
    # parameter still pending (``PullOnUse``).

    def begin(self, refs: list[ParamRef]) -> None:
        pending: dict[int, list[ParamRef]] = defaultdict(list)
        for ref in dict.fromkeys(refs):
            pending[ref.task].append(ref)
        self.pending = dict(pending)
        self.pending_ids = {id(self.params[r.key]) for r in dict.fromkeys(refs)}

    def take_pending(self, task: int) -> list[ParamRef]:
        refs = self.pending.pop(task, [])
        for ref in refs:
            self.pending_ids.discard(id(self.params[ref.key]))
        if not self.pending and self.mode is not None:
            self.mode.retire()
        return refs

    def store(self, refs: list[ParamRef], values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for ref, value in zip(refs, values):
                self.params[ref.key].copy_(value)

    def flush(self) -> None:
        for task in list(self.pending):
            refs = self.take_pending(task)
            self.store(refs, run_ps_ops(task, [var_op("read", r.key) for r in refs]))

    def end(self) -> None:
        self.pending, self.pending_ids = {}, set()


def _touches(values: Any, ids: set[int]) -> bool:
    for value in values:
        if id(value) in ids:
            return True
        if isinstance(value, (list, tuple)) and any(id(v) in ids for v in value):
            return True
    return False


def _metadata_functions() -> set[Any]:
    """Torch functions that use a tensor's metadata (or ``.grad``), never its value."""
    out: set[Any] = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel}
    for name in ("grad", "requires_grad", "shape", "dtype", "device", "is_leaf", "ndim"):
        descriptor = getattr(torch.Tensor, name)
        for accessor in ("__get__", "__set__"):
            if hasattr(descriptor, accessor):
                out.add(getattr(descriptor, accessor))
    return out


_METADATA_FUNCTIONS = _metadata_functions()


class PullOnUse(TorchFunctionMode):
    """Reads the pending parameters before the first torch operation that uses one.

    The mode is on torch's mode stack only while some parameter is pending: it steps off as
    soon as none is (``retire``, e.g. once the first embedding gather brought the dense
    parameters along), so that the rest of the closure runs at full speed.
    """

    def __init__(self, state: WorkerState) -> None:
        super().__init__()
        self._state = state
        self._on_stack = False

    def __enter__(self) -> PullOnUse:
        if self._state.pending:
            super().__enter__()
            self._on_stack = True
            self._state.mode = self
        return self

    def __exit__(self, *exc: Any) -> None:
        self._state.mode = None
        if self._on_stack:
            self._on_stack = False
            super().__exit__(*exc)

    def retire(self) -> None:
        """Nothing is pending any more: leave the mode stack now if this mode is on top of it
        (inside one of its own calls it is not; it then stays, idle, until the closure ends)."""
        if self._on_stack and _torch_modes.pop_mode_if_on_top(self):
            self._on_stack = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        ids = self._state.pending_ids
        if (
            ids
            and func not in _METADATA_FUNCTIONS
            and (_touches(args, ids) or _touches(kwargs.values(), ids))
        ):
            self._state.flush()
        return func(*args, **kwargs)


class MissingResource(Exception):
    """A closure's argument refers to a per-worker resource this worker has not built (it
    restarted): the worker's closure runner answers so, and the coordinator rebuilds it."""

    def __init__(self, resource_id: int) -> None:
        super().__init__(f"resource {resource_id} is not on this worker")
        self.resource_id = resource_id


_state: WorkerState | None = None
_state_lock = threading.Lock()
# The state of an in-process worker (``ps._inmemory``), on the thread that runs its closures.
_local = threading.local()


@contextlib.contextmanager
def worker_state_scope(state: WorkerState) -> Iterator[None]:
    """On this thread, ``worker_state()`` is ``state``: each in-process worker keeps its own
    parameters and resources, as a worker process does."""
    previous = getattr(_local, "state", None)
    _local.state = state
    try:
        yield
    finally:
        _local.state = previous


def worker_state() -> WorkerState:
    """This worker's state (the process's, or the in-process worker's on its thread)."""
    local = getattr(_local, "state", None)
    if local is not None:
        return local
    global _state
    with _state_lock:
        if _state is None:
            _state = WorkerState()
        return _state
