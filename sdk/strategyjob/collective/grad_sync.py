"""Gradient synchronisation of torch modules built inside ``strategy.scope()``.

Why: the ordinary custom loop ::

    with strategy.scope():
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step_fn(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)  # mean over the replica's own batch
        loss.backward()
        opt.step()
        return loss

    strategy.run(step_fn, args=(x, y))

must update the model exactly as one process training on the global batch. Gradients are
**averaged** over all replicas (DistributedDataParallel's convention).

How:

* A global module parameter-registration hook registers every parameter created while a
  strategy's ``scope()`` is entered on the current thread with that strategy
  (``extended.register_parameter``) and with its :class:`GradientSynchronizer`.
* TensorFlow distributes every variable created in scope, however it was made, so mirrored
  strategies (``extended.adopts_parameters``) also take parameters that reach the scope
  another way: a module deep-copied or unpickled (``torch.load``) there, a module attached
  there, or an optimizer created there over a module built outside (its param groups name
  every parameter it updates); and parameters later attached to a synchronised module or
  added to an optimizer of synchronised parameters. They are registered as if built in scope
  (MultiWorkerMirroredStrategy gives them the chief's values before the next ``run``). An
  optimizer stepped in ``run`` over parameters of no strategy is refused with TF's
  "was not created in the distribution strategy scope" error instead of letting replicas
  drift apart; that check runs when an optimizer's param groups are first seen or change.
  All of this happens when parameters are created, attached or handed to an optimizer:
  never per step.
* One replica per process, several workers (MultiWorkerMirroredStrategy, the hot path): like
  DDP, parameters are packed into buckets (~25 MB, the first ~1 MB, reverse registration
  order); a post-accumulate-grad hook marks each gradient final as backward produces it, and
  a full bucket is copied in (divided by the number of workers) and starts an asynchronous
  all-reduce at once (buckets start in order, so every worker issues the same collectives).
  When backward ends (an autograd final callback), what is left is launched (parameters
  without a gradient count as zeros, so unused parameters never hang), waited for, and the
  averages become the parameters' ``.grad``: views of the bucket's memory, nothing copied
  out. Code between ``backward()`` and ``step()`` (clipping, logging) sees averaged gradients,
  as with DDP; the optimizer-step pre-hook only averages gradients set another way.
* Several replicas in one process (MirroredStrategy/CentralStorageStrategy threads sharing one
  module): the replicas' backward passes accumulate into the shared ``.grad``. ``zero_grad``
  and ``step`` therefore act once per step, through ``ReplicaContext.merge_call``: zero_grad
  is a barrier before any backward, and the step averages the accumulated gradient (dividing by
  the local replica count, all-reducing across workers when there are several), applies the
  optimizer once, and makes the other replicas' step calls no-ops.

Limits: call LR schedulers outside ``strategy.run`` with several local replicas (they would
step once per replica); optimizers that override ``zero_grad`` are not intercepted.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch.nn.modules import module as _module
from torch.nn.parameter import is_lazy
from torch.optim import optimizer as _optimizer
from torch.utils.weak import WeakIdKeyDictionary

from strategyjob import _context
from strategyjob._devices import Topology
from strategyjob._reduce import ReduceOp
from strategyjob.collective import _torch_internals
from strategyjob.collective.backend import CollectiveBackend

__all__ = [
    "NOT_CREATED_IN_SCOPE",
    "GradientSynchronizer",
    "SynchronizedExtended",
    "observe_modules_in_scope",
    "owner_of",
    "scope_entered",
    "scope_exited",
]

#: TensorFlow's error (Keras ``compile``) for a variable not created in the strategy's scope,
#: its example showing where the PyTorch objects go.
NOT_CREATED_IN_SCOPE = (
    "Variable ({variable}) was not created in the distribution strategy scope of ({strategy}). "
    "It is most likely due to not all layers or the model or optimizer being created outside "
    "the distribution strategy scope. Try to make sure your code looks similar to the "
    "following.\nwith strategy.scope():\n  model=_create_model()\n"
    "  optimizer=torch.optim.SGD(model.parameters(), lr=0.1)"
)

#: Default bucket size (DDP's ``bucket_cap_mb=25``) and first-bucket size (DDP's 1 MB).
BUCKET_BYTES = 25 * 1024 * 1024
FIRST_BUCKET_BYTES = 1024 * 1024

_owner: WeakIdKeyDictionary = WeakIdKeyDictionary()  # Parameter -> GradientSynchronizer
_optimizer_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_bypass = threading.local()  # set while merge_fn applies the real optimizer step


def _bypassing() -> bool:
    return getattr(_bypass, "active", False)


class _Bypass:
    def __enter__(self) -> None:
        _bypass.active = True

    def __exit__(self, *exc: Any) -> None:
        _bypass.active = False


# ----------------------------------------------------------------------------- buckets
_storage_uses = _torch_internals.storage_uses

#: Averaged gradients are handed back as views of the bucket's buffer (no copy out) where
#: torch can tell whether a buffer is still seen by some tensor; else they are copied out.
_HAND_OUT_VIEWS = _torch_internals.CAN_COUNT_STORAGE_USES
#: Buffers a bucket keeps: the one being filled and the one the current ``.grad``s may view
#: (``zero_grad(set_to_none=False)`` keeps them alive into the next step).
_BUFFERS_KEPT = 2


class _Buffer:
    """One flat tensor of a bucket: the parameters' values, then one "has a gradient" flag per
    parameter, all-reduced as one collective; and the per-parameter views into it."""

    __slots__ = ("flags", "flat", "own_uses", "views")

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total + len(params), dtype=params[0].dtype, device=params[0].device)
        self.flags = self.flat[total:]
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()
        self.own_uses = _storage_uses(self.flat) if _HAND_OUT_VIEWS else 0

    def is_free(self) -> bool:
        """No tensor outside this object sees the memory (no ``.grad`` handed out is alive)."""
        return not _HAND_OUT_VIEWS or _storage_uses(self.flat) == self.own_uses


class _Bucket:
    """Gradients of a few parameters (same dtype and device), all-reduced as one collective.

    Gradients are copied in already divided by the number of workers (one pass over the
    memory); the averages go back as views of the buffer, so nothing is copied out. A buffer
    is filled again only once no tensor sees it, so gradients a caller kept are never
    overwritten."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        # Parameters with an unusual memory layout (channels_last…) get a copy in their own.
        self.hand_out = [_HAND_OUT_VIEWS and p.is_contiguous() for p in params]
        self.buffers = [_Buffer(params)]  # most recently used first
        self.buffer = self.buffers[0]
        self.ready = [False] * len(params)
        self.num_ready = 0
        self.work: Any = None
        self.stale = False

    def mark_ready(self, i: int) -> bool:
        """Record that parameter ``i``'s gradient is final; True when the bucket just became
        full."""
        if not self.ready[i]:
            self.ready[i] = True
            self.num_ready += 1
            return self.num_ready == len(self.params)
        return False

    def fill_missing(self) -> None:
        """Parameters backward gave no gradient (unused this step) go as zeros."""
        self.ready = [True] * len(self.params)
        self.num_ready = len(self.params)

    def _free_buffer(self) -> _Buffer:
        for i, buffer in enumerate(self.buffers):
            if buffer.is_free():
                del self.buffers[i]
                break
        else:  # every kept buffer is still seen: a new one; the oldest is left to its users
            buffer = _Buffer(self.params)
            del self.buffers[_BUFFERS_KEPT - 1 :]
        self.buffers.insert(0, buffer)
        return buffer

    def seal(self, scale: float) -> torch.Tensor:
        """Copy the current gradients times ``scale`` in; return the flat tensor to reduce."""
        buffer = self.buffer = self._free_buffer()
        has_grad = []
        with torch.no_grad():  # create_graph=True gives gradients that require grad
            for view, p in zip(buffer.views, self.params):
                grad = p.grad
                if grad is None:
                    view.zero_()
                    has_grad.append(0)
                    continue
                torch.mul(grad.to_dense() if grad.is_sparse else grad, scale, out=view)
                has_grad.append(1)
            if all(has_grad):  # the usual step: no flag tensor to build
                buffer.flags.fill_(1)
            else:
                buffer.flags.copy_(torch.tensor(has_grad, dtype=buffer.flags.dtype))
        return buffer.flat

    def hand_back(self) -> None:
        """Make the averages the parameters' gradients; parameters no worker had a gradient
        for keep ``grad is None`` (like single-process training)."""
        buffer = self.buffer
        for p, averaged, used, view_ok in zip(
            self.params, buffer.views, buffer.flags.tolist(), self.hand_out
        ):
            if not used:
                continue
            grad = p.grad
            if grad is not None and (grad.requires_grad or not view_ok) and not grad.is_sparse:
                with torch.no_grad():
                    grad.copy_(averaged)  # keep the caller's gradient tensor and its layout
            elif view_ok:
                p.grad = averaged.view(averaged.shape)  # a new tensor on the bucket's memory
            else:
                p.grad = averaged.clone()

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.num_ready = 0
        self.work = None
        self.stale = False


def _build_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[_Bucket]:
    """Reverse registration order (≈ the order backward produces gradients), grouped by dtype
    and device; the first bucket is small so communication starts early."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p in reversed(params):
        if p.requires_grad:
            groups.setdefault((p.dtype, p.device), []).append(p)
    buckets: list[_Bucket] = []
    for group in groups.values():
        current: list[torch.nn.Parameter] = []
        size = 0
        limit = min(FIRST_BUCKET_BYTES, bucket_bytes)
        for p in group:
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= limit:
                buckets.append(_Bucket(current))
                current, size, limit = [], 0, bucket_bytes
        if current:
            buckets.append(_Bucket(current))
    return buckets


# ------------------------------------------------------------------------ synchronizer
class GradientSynchronizer:
    """The parameters registered with one strategy, and how their gradients are averaged.

    The strategy's ``extended`` (a :class:`SynchronizedExtended`) provides its ``topology``
    and ``collectives`` (a ``collective.backend.CollectiveBackend``): gradient buckets of
    ``bucket_bytes`` start with ``all_reduce_async`` to overlap communication with backward,
    other gradients go through ``all_reduce``. Strategies that must give new parameters the
    chief's values take them from :meth:`take_pending_broadcast`.

    Every parameter registered with the strategy stays in its buckets for the strategy's
    lifetime (a deterministic layout, identical on every worker); with several models in one
    strategy, every bucket is reduced at each optimizer step.
    """

    def __init__(self, extended: SynchronizedExtended) -> None:
        self._extended_ref = weakref.ref(extended)
        self.params: list[torch.nn.Parameter] = []
        self._pending_broadcast: list[torch.nn.Parameter] = []
        self._hooked: set[int] = set()  # ids of the parameters whose accumulation is watched
        self._buckets: list[_Bucket] | None = None
        self._where: dict[int, tuple[_Bucket, int]] = {}
        self._next_launch = 0
        self._lock = threading.Lock()
        self._end_queued_for: int | None = None  # the backward pass that will call _on_backward_end
        self._averaged = False  # the gradients are the averages of the last backward pass
        self._local: int | None = None
        self._workers: int | None = None
        self._overlap: bool | None = None
        self._start_all_reduce: Callable[[torch.Tensor], Any] | None = None  # set with _overlap

    @property
    def extended(self) -> Any:  # a SynchronizedExtended while its strategy lives
        return self._extended_ref()

    # --- registration -------------------------------------------------------------------
    def add(self, param: torch.nn.Parameter) -> None:
        if param in _owner:
            return
        _owner[param] = self
        self.params.append(param)
        self._pending_broadcast.append(param)
        self._buckets = None  # rebuilt at the next step boundary
        self._watch(param)

    def _watch(self, param: torch.Tensor) -> None:
        """Hook ``param``'s gradient accumulation, on the bucketed path only (elsewhere the hook
        would be a Python call per parameter and backward pass for nothing). A frozen parameter
        cannot take a hook: it gets one when buckets are built after it requires grad."""
        if id(param) in self._hooked or not param.requires_grad or not self._overlapping():
            return
        param.register_post_accumulate_grad_hook(self._on_grad_ready)
        self._hooked.add(id(param))

    def take_pending_broadcast(self) -> list[torch.nn.Parameter]:
        """Parameters whose initial values have not been synchronised yet (and forget them).
        Lazy parameters (``nn.LazyLinear``…) stay pending until their first forward."""
        ready = [p for p in self._pending_broadcast if not is_lazy(p)]
        self._pending_broadcast = [p for p in self._pending_broadcast if is_lazy(p)]
        return ready

    # --- topology (fixed for a strategy; cached because the hooks run every step) ---------
    def local_replicas(self) -> int:
        if self._local is None:
            self._local = len(self.extended.topology.local_devices) or 1
        return self._local

    def _num_workers(self) -> int:
        if self._workers is None:
            self._workers = self.extended.topology.num_workers or 1
        return self._workers

    def _overlapping(self) -> bool:
        """One replica per process and several workers: the bucketed (DDP-like) path."""
        if self._overlap is None:
            self._overlap = self._num_workers() > 1 and self.local_replicas() == 1
            if self._overlap:
                self._start_all_reduce = self.extended.collectives.all_reduce_async
        return self._overlap

    def _ensure_buckets(self) -> list[_Bucket]:
        if self._buckets is None:
            size = self.extended.collectives.bucket_bytes or BUCKET_BYTES
            live = [p for p in self.params if p in _owner]
            self._buckets = _build_buckets(live, size)
            self._where = {id(p): (b, i) for b in self._buckets for i, p in enumerate(b.params)}
            for bucket in self._buckets:
                for p in bucket.params:
                    self._watch(p)
            self._next_launch = 0
        return self._buckets

    # --- hot path: backward hooks -------------------------------------------------------
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._overlapping():
            return
        with self._lock:
            buckets = self._ensure_buckets()
            location = self._where.get(id(param))
            if location is None:
                return
            task = _torch_internals.current_backward_pass()
            if task != self._end_queued_for:
                _torch_internals.run_when_backward_ends(self._on_backward_end)
                self._end_queued_for = task
            bucket, i = location
            if bucket.work is not None:  # launched by a backward pass that did not end
                bucket.stale = True
                return
            if bucket.mark_ready(i):
                self._launch_in_order(buckets)

    def _launch_in_order(self, buckets: list[_Bucket]) -> None:
        while self._next_launch < len(buckets):
            bucket = buckets[self._next_launch]
            if bucket.num_ready < len(bucket.params):
                return
            bucket.work = self._launch(bucket)
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> Any:
        """Start the SUM all-reduce of the bucket's gradients, each divided by the number of
        workers on the way in (so the sum is the average)."""
        return self._start_all_reduce(bucket.seal(1.0 / self._num_workers()))  # type: ignore[misc]

    def _on_backward_end(self) -> None:
        """Finish averaging when ``backward()`` returns, as DDP does: code between backward
        and the optimizer step (gradient clipping, logging) sees the averaged gradients.

        The inner backward of a reentrant checkpoint ends here too: the result is the same, at
        the price of one more round of all-reduces."""
        self._end_queued_for = None
        self._finish_buckets()
        self._averaged = True

    # --- optimizer step ---------------------------------------------------------------------
    def synchronize(self) -> None:
        """Average the gradients of every registered parameter over all replicas, in place.

        Called once per step: by the optimizer-step pre-hook (one local replica) or inside
        ``merge_call`` (several local replicas, after all their backward passes). With one
        replica per worker, the end of each backward pass has already averaged what it
        produced; only gradients set another way (by hand, ``torch.autograd.grad``) are
        averaged here.
        """
        workers, local = self._num_workers(), self.local_replicas()
        if workers == 1 and local == 1:
            return
        if self._overlapping():
            if not self._averaged:
                self._finish_buckets()
            self._averaged = False
            return
        grads = [p.grad for p in self.params if p.grad is not None and p in _owner]
        if not grads:
            return
        if workers > 1:
            reduced = self.extended.collectives.all_reduce(grads, ReduceOp.SUM)
            with torch.no_grad():
                for g, r in zip(grads, reduced):
                    torch.mul(r, 1.0 / (workers * local), out=g)
        else:
            with torch.no_grad():
                for g in grads:
                    g.div_(local)

    def _finish_buckets(self) -> None:
        with self._lock:
            buckets = self._ensure_buckets()
            for bucket in buckets[self._next_launch :]:
                bucket.fill_missing()
            self._launch_in_order(buckets)
            try:
                for bucket in buckets:
                    bucket.work.wait()
                for bucket in buckets:
                    if bucket.stale:  # gradients grew after launch (an aborted backward)
                        self._launch(bucket).wait()
                for bucket in buckets:
                    bucket.hand_back()
            finally:
                for bucket in buckets:
                    bucket.reset()
                self._next_launch = 0


class SynchronizedExtended(Protocol):
    """What the synchroniser and the torch hooks here ask of a strategy's ``extended``
    (``strategies.base.StrategyExtended`` declares it)."""

    collectives: CollectiveBackend
    #: Whether parameters that reach the strategy without being built in its scope are
    #: registered as if built there (mirrored strategies).
    adopts_parameters: bool

    @property
    def topology(self) -> Topology: ...

    @property
    def num_replicas_in_sync(self) -> int: ...

    @property
    def gradient_synchronizer(self) -> GradientSynchronizer:
        """The strategy's synchroniser (one per strategy, made on first use)."""
        ...

    def register_parameter(
        self, param: torch.nn.Parameter, module: torch.nn.Module | None = None
    ) -> torch.nn.Parameter | None:
        """Called for each parameter created or adopted in scope; may return a replacement."""
        ...

    def container_strategy(self) -> Any: ...


def owner_of(param: torch.Tensor) -> GradientSynchronizer | None:
    """The synchroniser ``param`` is registered with (its strategy's), else None."""
    return _owner.get(param)


# --------------------------------------------------------------------------- torch hooks
def _scope_strategy() -> Any:
    """The strategy whose ``scope()`` is entered on this thread (cross-replica mode), or None."""
    mode = _context.current_mode()
    if mode.cross_replica_context is None or _context.is_default_strategy(mode.strategy):
        return None
    return mode.strategy


def _adopts(extended: SynchronizedExtended | None) -> bool:
    """Whether ``extended``'s strategy takes parameters that were not built in its scope."""
    return extended is not None and extended.adopts_parameters


def _owning_extended(tensor: torch.Tensor | None) -> Any:
    """The ``extended`` of the adopting strategy that synchronises ``tensor``, else None."""
    sync = _owner.get(tensor) if tensor is not None else None
    extended = sync.extended if sync is not None else None
    return extended if _adopts(extended) else None


def _register(
    extended: SynchronizedExtended, param: torch.nn.Parameter, module: torch.nn.Module
) -> torch.nn.Parameter | None:
    """Register a parameter being put in ``module``; returns the strategy's replacement for it
    (CentralStorageStrategy: a copy on the parameter device), if any."""
    replacement = extended.register_parameter(param, module)
    if not isinstance(replacement, torch.nn.Parameter):
        replacement = None
    extended.gradient_synchronizer.add(param if replacement is None else replacement)
    return replacement


def _adopt(extended: SynchronizedExtended, params: Iterable[torch.Tensor | None]) -> None:
    """Register parameters that reached the strategy without being built in its scope, as if
    they had been. Modules and optimizers already hold them, so a placement the strategy asks
    for (its replacement's device) is made in place."""
    for param in params:
        if param is None or param in _owner:
            continue
        replacement = extended.register_parameter(param)  # type: ignore[arg-type]
        if isinstance(replacement, torch.Tensor) and replacement is not param:
            param.data = replacement.data
        extended.gradient_synchronizer.add(param)  # type: ignore[arg-type]


def _on_parameter_registered(
    module: torch.nn.Module, name: str, param: torch.nn.Parameter | None
) -> torch.nn.Parameter | None:
    if param is None:
        return None
    strategy = _scope_strategy()
    if strategy is not None:
        return _register(strategy.extended, param, module)
    if not _owner or param in _owner:
        return None  # plain torch (no strategy has parameters), or already synchronised
    # Put in a module the strategy synchronises (replacing one of its parameters, or next to
    # them): ``model.scale = nn.Parameter(...)``, ``load_state_dict(..., assign=True)``.
    replaced = module._parameters.get(name)  # noqa: SLF001  (torch's hook runs before the put)
    extended = _owning_extended(replaced) or _owning_extended(next(module.parameters(), None))
    return None if extended is None else _register(extended, param, module)


#: Called as ``observer(strategy, module)`` when ``module`` gets a submodule in a strategy's scope.
_module_observers: list[Callable[[Any, torch.nn.Module], None]] = []


def observe_modules_in_scope(observer: Callable[[Any, torch.nn.Module], None]) -> None:
    """Have ``observer(strategy, module)`` called whenever ``module`` gets a submodule while
    ``strategy``'s scope is entered on this thread: how a layer above learns which objects
    were built in scope (``strategyjob.keras`` binds the Keras models built there). Runs in
    torch's module-registration hook, so it must be quick; registering twice is a no-op."""
    if observer not in _module_observers:
        _module_observers.append(observer)


def _on_module_registered(
    module: torch.nn.Module, name: str, submodule: torch.nn.Module | None
) -> None:
    """A module attached in a mirrored strategy's scope, or later to a module the strategy
    synchronises (``model.head = nn.Linear(...)``), has its parameters adopted."""
    if submodule is None:
        return None
    strategy = _scope_strategy()
    if strategy is not None:
        for observer in _module_observers:
            observer(strategy, module)
        extended = strategy.extended if _adopts(strategy.extended) else None
    elif _owner:
        extended = _owning_extended(next(module.parameters(), None))
    else:
        return None
    if extended is not None:
        _adopt(extended, submodule.parameters())
    return None


def _adopting_setstate(original: Callable[[Any, dict], None]) -> Callable[[Any, dict], None]:
    """Wrap ``Module.__setstate__``, which deep copies and unpickling (``torch.load`` of a whole
    module) call, so that a module copied or loaded in a mirrored strategy's scope is
    synchronised like one built there (TF: every variable created in scope is distributed).
    A copy made outside scope (an EMA model, say) stays plain."""

    @functools.wraps(original)
    def __setstate__(self: torch.nn.Module, state: dict) -> None:
        original(self, state)
        strategy = _scope_strategy()
        if strategy is not None and _adopts(strategy.extended) and "_modules" in self.__dict__:
            _adopt(strategy.extended, self.parameters())

    return __setstate__


def _adopting_add_param_group(original: Callable[[Any, dict], None]) -> Callable[[Any, dict], None]:
    """Wrap ``Optimizer.add_param_group`` (which ``__init__`` calls per group): an optimizer
    created in a mirrored strategy's scope, or one that already updates parameters the strategy
    synchronises, adopts the parameters of the group (the parameters it will update)."""

    @functools.wraps(original)
    def add_param_group(self: torch.optim.Optimizer, param_group: dict) -> None:
        original(self, param_group)
        group = self.param_groups[-1]["params"]
        strategy = _scope_strategy()
        if strategy is None and not _owner:
            return  # plain torch
        (first,) = _first_optimizer_param(self) or (None,)
        if strategy is not None:
            extended = strategy.extended if _adopts(strategy.extended) else None
        else:
            extended = _owning_extended(first) or next(
                (e for e in map(_owning_extended, group) if e is not None), None
            )
        if extended is None:
            return
        if first is not None and first not in _owner:  # earlier groups join too (once)
            group = [p for g in self.param_groups for p in g["params"]]
        _adopt(extended, group)

    return add_param_group


def _synchronizers_of(params: Iterable[torch.Tensor]) -> list[GradientSynchronizer]:
    found: list[GradientSynchronizer] = []
    for p in params:
        sync = _owner.get(p)
        if sync is not None and sync not in found:
            found.append(sync)
    return found


def _describe(tensor: torch.Tensor) -> str:
    return f"<{type(tensor).__name__} shape={tuple(tensor.shape)} dtype={tensor.dtype}>"


def _check_synchronised(params: list[torch.Tensor], syncs: list[GradientSynchronizer]) -> None:
    """Refuse an optimizer whose step would leave some of its parameters unsynchronised while
    several replicas train: inside ``run`` of a mirrored strategy, or next to parameters one
    synchronises. Replicas would otherwise drift apart without a word (one process: each
    replica thread would apply the update again)."""
    mode = _context.current_mode()
    candidates = [sync.extended for sync in syncs]
    if mode.replica_context is not None and not _context.is_default_strategy(mode.strategy):
        candidates.insert(0, mode.strategy.extended)
    for extended in candidates:
        if _adopts(extended) and extended.num_replicas_in_sync > 1:
            break
    else:
        return
    sync = extended.gradient_synchronizer
    for p in params:
        if _owner.get(p) is not sync:
            raise ValueError(
                NOT_CREATED_IN_SCOPE.format(
                    variable=_describe(p), strategy=extended.container_strategy()
                )
            )


def _optimizer_synchronizers(opt: torch.optim.Optimizer) -> list[GradientSynchronizer]:
    signature = tuple(len(group["params"]) for group in opt.param_groups)
    cached = _optimizer_cache.get(opt)
    if cached is None or cached[0] != signature:
        # Once per optimizer and param-group layout: never on the per-step path.
        params = [p for group in opt.param_groups for p in group["params"]]
        syncs = _synchronizers_of(params)
        _check_synchronised(params, syncs)
        cached = (signature, syncs)
        _optimizer_cache[opt] = cached
    return cached[1]


def _multi_replica_context(syncs: list[GradientSynchronizer]) -> Any:
    """The replica context when this call comes from one of several local replica threads."""
    if not syncs or syncs[0].local_replicas() == 1:
        return None
    return _context.get_replica_context()


def _stash_grads(opt: torch.optim.Optimizer) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    stash = []
    for group in opt.param_groups:
        for p in group["params"]:
            stash.append((p, p.grad))
            p.grad = None
    return stash


#: The gradients a merged step set aside, per optimizer, until the replicas' steps are done.
_stashed_grads: weakref.WeakKeyDictionary[
    torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor | None]]
] = weakref.WeakKeyDictionary()


def _merged_step(strategy: Any, opt: torch.optim.Optimizer) -> None:
    for sync in _optimizer_synchronizers(opt):
        sync.synchronize()
    with _Bypass():
        opt.step()
    # The other replicas' own step() calls must not apply the update again.
    _stashed_grads[opt] = _stash_grads(opt)


def _merged_restore(strategy: Any, opt: torch.optim.Optimizer) -> None:
    for p, grad in _stashed_grads.pop(opt, ()):
        p.grad = grad


def _step_pre_hook(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    if _bypassing():
        return
    syncs = _optimizer_synchronizers(opt)
    if not syncs:
        return
    ctx = _multi_replica_context(syncs)
    if ctx is not None:
        if len(args) > 1 or kwargs:  # args[0] is the optimizer itself
            raise ValueError(
                "optimizer.step(closure) is not supported with several replicas in one process: "
                "call backward() in the replica function and then optimizer.step()."
            )
        ctx.merge_call(_merged_step, args=(opt,))
        return
    for sync in syncs:
        sync.synchronize()


def _step_post_hook(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    if _bypassing():
        return
    syncs = _optimizer_synchronizers(opt)
    ctx = _multi_replica_context(syncs)
    if ctx is not None:
        ctx.merge_call(_merged_restore, args=(opt,))


def _once_per_step(original: Callable[..., Any], owner_params: Callable[[Any], list]) -> Callable:
    """Wrap a ``zero_grad`` so that several local replicas run it once, as a barrier."""

    def zero_grad(self: Any, set_to_none: bool = True) -> None:
        syncs = _synchronizers_of(owner_params(self))
        ctx = _multi_replica_context(syncs)
        if ctx is None:
            original(self, set_to_none)
            return
        ctx.merge_call(lambda _strategy: original(self, set_to_none))

    zero_grad.__doc__ = original.__doc__
    zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
    return zero_grad


def _first_optimizer_param(opt: torch.optim.Optimizer) -> list:
    for group in opt.param_groups:
        if group["params"]:
            return group["params"][:1]
    return []


def _first_module_param(module: torch.nn.Module) -> list:
    first = next(module.parameters(), None)
    return [] if first is None else [first]


class _TorchHooks:
    """The process-wide torch hooks and method wrappers above, present only while a strategy's
    ``scope()`` is entered on some thread (``run`` enters it): outside, torch is exactly as
    torch made it, so another library in the same process never meets them.

    What happens to a strategy's objects between scopes needs nothing global: gradients are
    averaged by per-parameter hooks, and an optimizer stepped in ``run`` is checked when its
    parameters change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._handles: list[Any] = []
        self._wrapped: list[tuple[type, str, Callable[..., Any], Callable[..., Any] | None]] = []

    def enter(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._install()

    def exit(self) -> None:
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._remove()

    def _install(self) -> None:
        self._handles = [
            # torch's stub says the hook returns None; its code takes a replacement parameter
            _module.register_module_parameter_registration_hook(_on_parameter_registered),  # type: ignore[arg-type]
            _module.register_module_module_registration_hook(_on_module_registered),
            _optimizer.register_optimizer_step_pre_hook(_step_pre_hook),
            _optimizer.register_optimizer_step_post_hook(_step_post_hook),
        ]
        if not self._wrapped:  # made once: ``run`` enters and leaves a scope every step
            self._wrapped = [(cls, name, cls.__dict__[name], None) for cls, name, _ in _WRAPPERS]
        for i, (cls, name, original, replacement) in enumerate(self._wrapped):
            current = cls.__dict__[name]
            if replacement is None or current is not original:  # first, or changed since
                replacement = _WRAPPERS[i][2](current)
                self._wrapped[i] = (cls, name, current, replacement)
            setattr(cls, name, replacement)

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for cls, name, original, replacement in reversed(self._wrapped):
            # Put torch's method back unless someone wrapped ours meanwhile (theirs would go).
            if cls.__dict__.get(name) is replacement:
                setattr(cls, name, original)


#: The torch methods wrapped while a scope is entered: (class, name, wrapper maker).
_WRAPPERS: list[tuple[type, str, Callable[[Any], Callable[..., Any]]]] = [
    (torch.nn.Module, "__setstate__", _adopting_setstate),
    (torch.optim.Optimizer, "add_param_group", _adopting_add_param_group),
    (torch.optim.Optimizer, "zero_grad", lambda f: _once_per_step(f, _first_optimizer_param)),
    (torch.nn.Module, "zero_grad", lambda f: _once_per_step(f, _first_module_param)),
]


_hooks = _TorchHooks()


def scope_entered() -> None:
    """A strategy's scope was entered (outermost, on this thread): install the torch hooks if
    no other scope holds them."""
    _hooks.enter()


def scope_exited() -> None:
    """The scope :func:`scope_entered` counted was left: remove the hooks with the last one."""
    _hooks.exit()
