"""``strategyjob.train.Checkpoint``: save and restore training state (``tf.train.Checkpoint``).

A checkpoint is one file (a ``torch.save`` archive, read back with ``weights_only=True``) with the
state of every object the ``Checkpoint`` tracks, under the attribute names it was given, plus
``save_counter``. Under a strategy with several workers every worker calls ``save``/``write``
(values that need a collective, such as sync-on-read variables, are read on all of them), only
the worker whose ``strategy.extended.should_checkpoint`` is true writes the file, and every
worker returns once the file is in place (or raises if the chief could not write it).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from strategyjob import _context, _variables, errors
from strategyjob.strategies.base import HoldsOptimizerSlots
from strategyjob.train import _storage

__all__ = ["Checkpoint", "CheckpointLoadStatus", "InitializationOnlyStatus"]

_log = logging.getLogger(__name__)

_FORMAT = "strategyjob.train.Checkpoint"
_VERSION = 1
_RESERVED = frozenset({"save_counter", "save", "write", "restore", "read"})  # its own API
_PYTHON_TYPES = (bool, int, float, str, type(None))


# ---------------------------------------------------------------------------------------------
# Who writes: the strategy's chief, the others wait for it


@dataclass(frozen=True)
class Role:
    """This process's part in a save: whether it writes, and how workers agree afterwards
    (``agree(flag)`` is true when ``flag`` is true on any worker; it waits for all of them)."""

    is_chief: bool
    agree: Callable[[bool], bool]


def _single(flag: bool) -> bool:
    return flag


# ---------------------------------------------------------------------------------------------
# A Checkpoint's own state, apart from its attributes


class _State:
    """What a :class:`Checkpoint` keeps for itself. Its attribute names are the objects it tracks
    (any name but its API's), so its state is not asked for by attribute: the checkpoint holds
    it privately and :func:`_state_of` finds it for this module's functions."""

    def __init__(self, strategy: Any) -> None:
        self.objects: dict[str, Any] = {}
        self.save_counter = torch.zeros((), dtype=torch.int64)
        self.strategy = strategy  # made in a strategy's scope: saves follow that strategy's chief

    def capture(self, extended: Any = None) -> dict[str, Any]:
        """Every tracked object's saved form (the file's ``objects``)."""
        return {name: _capture(obj, extended) for name, obj in self.objects.items()}

    def restore(self, saved: dict[str, Any], restore: _Restore, name: str) -> None:
        """Restore ``saved`` into the tracked objects; Python values are replaced."""
        self.objects.update(restore.objects(name, self.objects, saved))


# id(checkpoint) -> its state. Weak values: the checkpoint alone holds its state, so neither
# outlives it through this table (its state holds the tracked objects, which may hold it).
_states: weakref.WeakValueDictionary[int, _State] = weakref.WeakValueDictionary()


def _state_of(checkpoint: Checkpoint) -> _State:
    return _states[id(checkpoint)]


def _strategy_of(obj: Any) -> Any:
    """The non-default strategy that ``obj``'s state belongs to, else None."""
    strategy = getattr(obj, "distribute_strategy", None)  # variables
    if strategy is not None and not _context.is_default_strategy(strategy):
        return strategy
    param = None
    if isinstance(obj, torch.nn.Module):
        param = next(obj.parameters(), None)
    elif isinstance(obj, torch.optim.Optimizer):
        param = next((p for g in obj.param_groups for p in g["params"]), None)
    elif isinstance(getattr(obj, "optimizer", None), torch.optim.Optimizer):  # LR schedulers
        return _strategy_of(obj.optimizer)
    if param is None:
        return None
    from strategyjob.collective import grad_sync  # torch.distributed: on first use

    sync = grad_sync.owner_of(param)
    extended = sync.extended if sync is not None else None
    return extended.container_strategy() if extended is not None else None


def strategy_for(checkpoint: Checkpoint) -> Any:
    """The strategy in scope, else the one the checkpoint was made in, else the one its objects
    belong to; None when there is none."""
    strategy = _context.get_strategy() if _context.has_strategy() else None
    if strategy is None:
        strategy = _state_of(checkpoint).strategy
    if strategy is None:
        strategy = next((s for s in map(_strategy_of, _leaves(checkpoint)) if s is not None), None)
    return strategy


def role(checkpoint: Checkpoint) -> Role:
    """Who writes and how workers agree: :func:`strategy_for`'s strategy; with none, the
    process's multi-worker collective group (rank 0 writes)."""
    strategy = strategy_for(checkpoint)
    if strategy is not None:
        extended = strategy.extended
        return Role(bool(extended.should_checkpoint), extended.collectives.any_has_data)
    from strategyjob.collective import process_group

    group = process_group.current_group()
    if group is not None and group.world_size > 1:
        return Role(group.rank == 0, group.any)
    return Role(True, _single)


def write_to(checkpoint: Checkpoint, path: str, after: Callable[[], None] | None = None) -> str:
    """Write ``checkpoint`` to exactly ``path`` (on every worker; the chief writes), running
    ``after`` on the chief once the file is in place and before the workers agree on whether it
    succeeded: how a ``CheckpointManager`` records and sweeps its directory with each save."""
    return _write(checkpoint, path, after)


def _extended(checkpoint: Checkpoint) -> Any:
    strategy = strategy_for(checkpoint)
    return strategy.extended if strategy is not None else None


def _write(checkpoint: Checkpoint, path: str, after: Callable[[], None] | None = None) -> str:
    """Write ``path`` (the chief only), run ``after`` there once it is in place, then wait
    until every worker knows whether that succeeded."""
    if _context.has_strategy() and not _context.in_cross_replica_context():
        raise RuntimeError(
            f"Checkpoint cannot be written from a replica context (inside `strategy.run`): "
            f"every replica would write {path}. Save after `strategy.run` returns."
        )
    who = role(checkpoint)
    state = _state_of(checkpoint)
    payload = {  # read on every worker: some reads are collectives
        "format": _FORMAT,
        "version": _VERSION,
        "save_counter": int(state.save_counter),
        "objects": state.capture(_extended(checkpoint)),
    }
    failure: BaseException | None = None
    if who.is_chief:
        try:
            _storage.atomic_write(path, lambda f: torch.save(payload, f))
            if after is not None:
                after()
        except Exception as e:  # told to the other workers before it is raised
            failure = e
    try:
        failed_somewhere = who.agree(failure is not None)
    except errors.DeadlineExceededError as e:
        raise errors.DeadlineExceededError(
            f"{e.message} Saving {path} waits for every worker: call save/write on all "
            "of them (only the chief writes files)."
        ) from (failure or e)
    if failure is not None:
        raise failure
    if failed_somewhere:
        raise RuntimeError(
            f"The chief could not write checkpoint {path}; its log says why. Check that "
            "the checkpoint directory is writable by the chief."
        )
    return path


def _leaves(checkpoint: Checkpoint) -> Iterator[Any]:
    stack = list(_state_of(checkpoint).objects.values())
    while stack:
        obj = stack.pop()
        if isinstance(obj, Checkpoint):
            stack.extend(_state_of(obj).objects.values())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
        else:
            yield obj


# ---------------------------------------------------------------------------------------------
# What each kind of object saves


def _is_variable(obj: Any) -> bool:
    return hasattr(obj, "assign") and (
        _variables.checkpoint_reader(obj) is not None or hasattr(obj, "read_value")
    )


def _kind(obj: Any) -> str | None:
    if isinstance(obj, Checkpoint):
        return "checkpoint"
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return "state_dict"  # modules, optimizers, LR schedulers, ShardedVariable, GradScaler
    if _is_variable(obj):
        return "variable"
    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, torch.Generator):
        return "generator"
    if isinstance(obj, _PYTHON_TYPES):
        return "python"
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        return "dict"
    if isinstance(obj, list):
        return "list"
    return None


def _check_trackable(name: str, obj: Any) -> None:
    if _kind(obj) is None:
        raise ValueError(
            f"`Checkpoint` was expecting a trackable object for {name!r} (a torch module, "
            "optimizer, LR scheduler, tensor, strategyjob.Variable, ShardedVariable, "
            f"torch.Generator, Python number or string, or a dict/list of those), got {obj!r}. "
            "Give the object `state_dict()` and `load_state_dict()` to track it."
        )
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_trackable(f"{name}.{k}", v)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_trackable(f"{name}[{i}]", v)


def _whole(value: Any) -> Any:
    """``value`` with every DTensor (TPUStrategy's split state) replaced by its whole value:
    a file written by the chief alone must not hold only the chief's shards."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_whole(v) for v in value)
    return value


def _laid_out_like(saved: Any, current: Any) -> Any:
    """``saved`` (whole values) laid out as ``current`` is: a tensor whose counterpart is a
    DTensor becomes a DTensor with the same mesh and placements, each process keeping its own
    shard of the value it read (no communication)."""
    if isinstance(current, DTensor) and isinstance(saved, torch.Tensor):
        return distribute_tensor(
            saved.to(current.dtype), current.device_mesh, current.placements, src_data_rank=None
        )
    if isinstance(current, dict) and isinstance(saved, dict):
        return {k: _laid_out_like(v, current.get(k)) for k, v in saved.items()}
    if isinstance(current, list | tuple) and isinstance(saved, list | tuple):
        laid = [_laid_out_like(v, c) for v, c in zip(saved, current, strict=False)]
        return type(saved)([*laid, *saved[len(laid) :]])
    return saved


def _ps_slots_owner(obj: Any, extended: Any) -> HoldsOptimizerSlots | None:
    """``extended`` when ``obj`` is an optimizer whose state lives on its parameter servers
    (ParameterServerStrategy runs the optimizer's steps there), else None."""
    if not isinstance(extended, HoldsOptimizerSlots):
        return None
    if not isinstance(obj, torch.optim.Optimizer):
        return None
    from strategyjob.ps import _remote  # only reached under ParameterServerStrategy

    return extended if _remote.holds_ps_parameters(obj) else None


def _capture(obj: Any, extended: Any = None) -> tuple[str, Any]:
    kind = _kind(obj)
    if kind == "checkpoint":
        return kind, _state_of(obj).capture(extended)
    if kind == "state_dict":
        state = obj.state_dict()
        if (owner := _ps_slots_owner(obj, extended)) is not None:
            state["state"] = owner.optimizer_slots(obj)
        return kind, _whole(state)
    if kind == "variable":
        read = _variables.checkpoint_reader(obj) or obj.read_value
        return kind, torch.as_tensor(read()).detach()
    if kind == "tensor":
        return kind, _whole(obj.detach())
    if kind == "generator":
        return kind, obj.get_state()
    if kind == "dict":
        return kind, {k: _capture(v, extended) for k, v in obj.items()}
    if kind == "list":
        return kind, [_capture(v, extended) for v in obj]
    return "python", obj


def _check_shape(name: str, obj: Any, value: torch.Tensor) -> None:
    if tuple(obj.shape) != tuple(value.shape):
        raise ValueError(
            f"Received incompatible tensor with shape {list(value.shape)} when attempting to "
            f"restore variable with shape {list(obj.shape)} and name {name}."
        )


class _Restore:
    """One restore's bookkeeping: what matched, what did not."""

    def __init__(self, extended: Any = None) -> None:
        self.extended = extended  # the strategy's, for state that lives on its servers
        self.matched: list[str] = []
        self.unused_values: list[str] = []  # in the file, no object for them
        self.unbound_objects: list[str] = []  # objects the file has no value for

    def objects(self, name: str, objects: dict[str, Any], saved: dict[str, Any]) -> dict:
        """Restore ``saved`` into ``objects`` (a mapping); returns the new Python values."""
        replaced = {}
        for key, obj in objects.items():
            if key not in saved:
                self.unbound_objects.append(f"{name}.{key}")
                continue
            kind, value = saved[key]
            new = self.one(f"{name}.{key}", obj, kind, value)
            if new is not obj:
                replaced[key] = new
        self.unused_values += [f"{name}.{k}" for k in saved if k not in objects]
        return replaced

    def one(self, name: str, obj: Any, kind: str, value: Any) -> Any:
        """Restore one object; returns it, or its new value when it is a Python value."""
        own = _kind(obj)
        if own != kind and not {own, kind} <= {"tensor", "variable"}:
            raise ValueError(
                f"The checkpoint holds a {kind} for {name}, but the object to restore into is "
                f"a {own} ({type(obj).__name__}). Restore into the same kind of object that "
                "was saved."
            )
        self.matched.append(name)
        if kind == "python":
            return value
        if own == "checkpoint":
            _state_of(obj).restore(value, self, name)
        elif own == "state_dict":
            obj.load_state_dict(_laid_out_like(value, obj.state_dict()))
            if (owner := _ps_slots_owner(obj, self.extended)) is not None:
                owner.load_optimizer_slots(obj, value.get("state", {}))
                obj.state.clear()  # the ps step with it; the chief's copy would go stale
        elif own == "variable":
            _check_shape(name, obj, value)
            obj.assign(value.to(obj.dtype))
        elif own == "tensor":
            _check_shape(name, obj, value)
            with torch.no_grad():
                if isinstance(obj, DTensor):
                    obj.to_local().copy_(_laid_out_like(value, obj).to_local())
                else:
                    obj.copy_(value)
        elif own == "generator":
            obj.set_state(value)
        elif own == "dict":
            obj.update(self.objects(name, obj, value))
        elif own == "list":
            for i, item in enumerate(obj[: len(value)]):
                new = self.one(f"{name}[{i}]", item, *value[i])
                if new is not item:
                    obj[i] = new
            self.unbound_objects += [f"{name}[{i}]" for i in range(len(value), len(obj))]
            self.unused_values += [f"{name}[{i}]" for i in range(len(obj), len(value))]
        return obj


# ---------------------------------------------------------------------------------------------
# Load statuses (TensorFlow's names)


class CheckpointLoadStatus:
    """What ``restore``/``read`` matched; the assertions raise ``AssertionError`` on mismatch."""

    def __init__(self, save_path: str, restore: _Restore) -> None:
        self._save_path = save_path
        self._restore = restore
        self._silenced = False

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Every value in the checkpoint was restored into an object, and every object got one."""
        self.assert_existing_objects_matched()
        if self._restore.unused_values:
            raise AssertionError(
                f"Unresolved object in checkpoint {self._save_path}: "
                f"{', '.join(self._restore.unused_values)}. Track those objects in the "
                "Checkpoint, or call `expect_partial()` instead."
            )
        self._silenced = True
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Every object the Checkpoint tracks got a value from the checkpoint."""
        if self._restore.unbound_objects:
            raise AssertionError(
                "Some Python objects were not bound to checkpointed values, likely due to "
                f"changes in the Python program: {self._restore.unbound_objects}"
            )
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """At least one object was restored."""
        if not self._restore.matched:
            raise AssertionError(
                f"The checkpoint {self._save_path} matched none of the Checkpoint's objects."
            )
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Silence the warning about checkpoint values that no object took."""
        self._silenced = True
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        """Nothing to run: values are restored when ``restore`` returns (eager, as in TF 2)."""

    def initialize_or_restore(self, session: Any = None) -> None:
        """Nothing to run: values are restored when ``restore`` returns (eager, as in TF 2)."""

    def __del__(self) -> None:
        try:
            if not self._silenced and self._restore.unused_values:
                _log.warning(
                    "Values in checkpoint %s were not restored into any object: %s. Call "
                    "`expect_partial()` on the load status to silence this warning.",
                    self._save_path,
                    ", ".join(self._restore.unused_values),
                )
        except Exception:  # interpreter shutdown
            pass


class InitializationOnlyStatus:
    """The status of ``restore(None)``: nothing was restored, objects keep their values."""

    def assert_consumed(self) -> InitializationOnlyStatus:
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def assert_existing_objects_matched(self) -> InitializationOnlyStatus:
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def assert_nontrivial_match(self) -> InitializationOnlyStatus:
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    def expect_partial(self) -> InitializationOnlyStatus:
        return self

    def run_restore_ops(self, session: Any = None) -> None:
        pass

    def initialize_or_restore(self, session: Any = None) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Checkpoint


class Checkpoint:
    """Groups trackable objects, saving and restoring them (``tf.train.Checkpoint``).

    ``Checkpoint(model=model, optimizer=opt, scheduler=sched, step=torch.tensor(0))`` tracks
    each keyword argument under its name; objects assigned as attributes later are tracked too.
    Modules, optimizers, LR schedulers and anything else with ``state_dict``/``load_state_dict``
    restore in place, as do tensors, ``strategyjob.Variable``\\ s (distributed ones included) and
    ``torch.Generator``\\ s; Python numbers and strings, being immutable, are restored as the
    checkpoint's attribute (``ckpt.epoch``).
    """

    def __init__(self, root: Any = None, **kwargs: Any) -> None:
        self._hold(_State(_context.get_strategy() if _context.has_strategy() else None))
        if root is not None:
            kwargs = {"root": root, **kwargs}
        for name, value in kwargs.items():
            if name.startswith("_"):
                raise ValueError(
                    f"`Checkpoint` cannot track an object named {name!r}: names starting with "
                    "'_' are Checkpoint's own. Choose another name."
                )
            setattr(self, name, value)

    def _hold(self, state: _State) -> None:
        object.__setattr__(self, "_state", state)
        _states[id(self)] = state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy (``copy.deepcopy``) holds its own copy of the state."""
        held = state.pop("_state")
        self.__dict__.update(state)
        self._hold(held)

    # -- tracking -----------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name in _RESERVED:
            raise ValueError(
                f"`Checkpoint` cannot track an object named {name!r}: the name belongs to "
                "Checkpoint's own API. Choose another name."
            )
        _check_trackable(name, value)
        self._state.objects[name] = value

    def __getattr__(self, name: str) -> Any:
        state = self.__dict__.get("_state")
        if state is not None and name in state.objects:
            return state.objects[name]
        raise AttributeError(f"'Checkpoint' object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        if name in self._state.objects:
            del self._state.objects[name]
        else:
            object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._state.objects))

    def __repr__(self) -> str:
        return f"<strategyjob.train.Checkpoint objects={list(self._state.objects)}>"

    @property
    def save_counter(self) -> torch.Tensor:
        """How many times ``save`` ran (an int64 scalar tensor, saved with the checkpoint)."""
        return self._state.save_counter

    # -- saving ------------------------------------------------------------------------------
    def write(self, file_prefix: str | os.PathLike, options: Any = None) -> str:
        """Write a checkpoint to exactly ``file_prefix``, not counted in ``save_counter``;
        returns the path. Call it on every worker."""
        return _write(self, os.fspath(file_prefix))

    def save(self, file_prefix: str | os.PathLike, options: Any = None) -> str:
        """Write ``{file_prefix}-{save_counter}`` after incrementing ``save_counter``, and
        record it in the directory's state file (so ``latest_checkpoint`` finds it); returns
        the path. Call it on every worker."""
        self._state.save_counter += 1
        path = f"{os.fspath(file_prefix)}-{int(self._state.save_counter)}"
        directory = os.path.dirname(os.path.abspath(path))
        return _write(
            self, path, after=lambda: _storage.update_checkpoint_state(directory, path, [path])
        )

    # -- restoring ---------------------------------------------------------------------------
    def read(self, save_path: str | os.PathLike) -> CheckpointLoadStatus:
        """Restore every tracked object (and ``save_counter``) from ``save_path``."""
        path = os.fspath(save_path)
        if os.path.isdir(path):
            raise ValueError(
                f"{path} is a directory, not a checkpoint. Pass a checkpoint's path, e.g. "
                "strategyjob.train.latest_checkpoint(directory)."
            )
        if not os.path.exists(path):
            raise errors.NotFoundError(
                f"Failed to restore from checkpoint at {path}: no such file. Pass a path that "
                "`save`/`write` returned, or strategyjob.train.latest_checkpoint(directory)."
            )
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds for a bad file
            raise errors.DataLossError(
                f"Failed to read checkpoint {path}: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}. It is not a complete "
                "strategyjob checkpoint."
            ) from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise errors.DataLossError(
                f"{path} is not a strategyjob.train.Checkpoint file. Pass a path that "
                "`save`/`write` returned."
            )
        restore = _Restore(_extended(self))
        self._state.restore(data["objects"], restore, "(root)")
        self._state.save_counter.fill_(int(data.get("save_counter", 0)))
        return CheckpointLoadStatus(path, restore)

    def restore(
        self, save_path: str | os.PathLike | None, options: Any = None
    ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restore from ``save_path``; ``None`` (no checkpoint yet, e.g. ``latest_checkpoint``
        of an empty directory) restores nothing and keeps the objects' values."""
        if save_path is None:
            return InitializationOnlyStatus()
        return self.read(save_path)
