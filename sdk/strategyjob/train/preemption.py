"""``strategyjob.experimental.PreemptionCheckpointHandler`` and ``TerminationConfig``
(``tf.distribute.experimental``'s names and semantics).

Why: a preempted or drained pod gets ``SIGTERM`` and a grace period before ``SIGKILL``. The
handler turns that notice into one checkpoint taken at the same step on every worker, then
exits with a code that restart policies retry, so the restarted job resumes where it stopped::

    ckpt = strategyjob.train.Checkpoint(model=model, optimizer=opt)
    handler = strategyjob.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, ckpt, "/ckpt")         # restores the latest checkpoint
    while handler.total_run_calls < STEPS:                 # continues from the saved step
        handler.run(distributed_train_step, batch_for(handler.total_run_calls))

How workers agree, cheaply: the ``SIGTERM`` handler only sets a flag. Each ``run`` call starts
one 4-byte all-reduce of that flag (through the strategy's collectives, the same agreement the
distributed iterator uses) and collects the previous call's answer, which has been in flight
during a whole step; so every worker reads the same answer at the same call, costing no round
trip per step. When any worker was signalled, all of them save (through the
``CheckpointManager``; only the chief writes) before the next step, at most one step after the
one that was running when the signal came, and call ``exit_fn``.

The default ``exit_fn`` exits with :data:`PREEMPTION_EXIT_CODE`, 143 (TensorFlow exits with 42):
it is what a process ended by ``SIGTERM`` reports, what Kubernetes shows for a container
stopped that way, and 128 or above, which the ``ExitCode`` restart policy (of the operator and
of ``strategyjob run``) retries while it treats 1-127 as permanent. ``OnFailure`` and
``Always`` retry it too; under ``Never`` the job fails.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import numbers
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from strategyjob import errors
from strategyjob.train.checkpoint import Checkpoint, strategy_for
from strategyjob.train.checkpoint_manager import CheckpointManager

__all__ = ["PREEMPTION_EXIT_CODE", "PreemptionCheckpointHandler", "TerminationConfig"]

_log = logging.getLogger(__name__)

#: The exit code after a preemption checkpoint: 128 + SIGTERM (see the module docstring).
PREEMPTION_EXIT_CODE = 128 + signal.SIGTERM
#: The checkpoint attribute that holds ``total_run_calls`` (TensorFlow's name).
_ITERATION_NAME = "checkpointed_runs"
_WATCHER_POLL_SECONDS = 1.0


def _exit_for_restart() -> NoReturn:
    sys.exit(PREEMPTION_EXIT_CODE)


class TerminationConfig:
    """How the handler learns of a termination, saves and exits, and how long it has.

    Args:
      termination_watcher_fn: a cheap, non-blocking function returning True once a
        termination notice is available; polled every second on a thread. Default: a
        ``SIGTERM`` handler (what Kubernetes and ``strategyjob run`` send).
      exit_fn: called after the checkpoint is saved. Default: ``sys.exit(143)``, which every
        retrying restart policy restarts. If it returns, training continues.
      grace_period: seconds between the notice and the kill. 0 (the default) saves and exits
        at once; with more, the handler saves at once, trains on, and saves again just before
        the grace period ends (estimated from step and save times), then exits.
      save_fn: called instead of ``CheckpointManager.save`` to save, on every worker, with the
        arguments given to ``save_checkpoint_if_preempted``.
    """

    def __init__(
        self,
        termination_watcher_fn: Callable[[], bool] | None = None,
        exit_fn: Callable[[], Any] | None = None,
        grace_period: float | None = None,
        save_fn: Callable[..., Any] | None = None,
    ) -> None:
        for name, fn in (
            ("termination_watcher_fn", termination_watcher_fn),
            ("exit_fn", exit_fn),
            ("save_fn", save_fn),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"TerminationConfig's {name} must be callable or None, got {fn!r}.")
        if grace_period is not None and (
            not isinstance(grace_period, numbers.Real)
            or isinstance(grace_period, bool)
            or grace_period < 0
        ):
            raise ValueError(
                f"TerminationConfig's grace_period must be a non-negative number of seconds or "
                f"None, got {grace_period!r}."
            )
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = grace_period
        self.save_fn = save_fn

    def __repr__(self) -> str:
        return (
            f"TerminationConfig(termination_watcher_fn={self.termination_watcher_fn!r}, "
            f"exit_fn={self.exit_fn!r}, grace_period={self.grace_period!r}, "
            f"save_fn={self.save_fn!r})"
        )


class _RunCounter:
    """``total_run_calls`` as checkpoint state: the handler counts here, so every save of the
    checkpoint (the handler's, or the user's own periodic ones) records the current count, and
    restoring sets it."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"runs": int(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["runs"])


class _Agreement:
    """The agreement started at one ``run`` call and collected at the next, so it is in flight
    during a whole step."""

    def __init__(self, start: Callable[[bool], Callable[[], bool]]) -> None:
        self._start = start
        self._pending: Callable[[], bool] | None = None

    def collect(self) -> bool:
        """The answer of the agreement started at the previous call (False at the first)."""
        pending, self._pending = self._pending, None
        return pending is not None and pending()

    def start(self, flag: bool) -> None:
        """Start agreeing on ``flag`` (True on any worker); collected at the next call."""
        self._pending = self._start(flag)

    def forget(self) -> None:
        """Let go of the agreement in flight (at exit, where nobody will collect it)."""
        self._pending = None


def _agreement_starter(checkpoint: Checkpoint) -> Callable[[bool], Callable[[], bool]]:
    """``start(flag)`` -> ``answer()``: True when ``flag`` was true on any worker. The strategy
    in scope, else the checkpoint's (as ``Checkpoint`` finds it), else the process's collective
    group, else this process alone."""
    strategy = strategy_for(checkpoint)
    if strategy is not None:
        return strategy.extended.collectives.start_any_has_data
    from strategyjob.collective import process_group

    group = process_group.current_group()
    if group is not None and group.world_size > 1:
        return group.any_async
    return lambda flag: lambda: flag


class PreemptionCheckpointHandler:
    """Saves a checkpoint at the same step on every worker when any of them is told to stop,
    then exits for a restart; restores the latest checkpoint when created.

    Args:
      cluster_resolver: the strategy's ``cluster_resolver`` (names this worker in logs).
      checkpoint_or_checkpoint_manager: a ``strategyjob.train.CheckpointManager`` (pass the
        one that also takes periodic checkpoints, so a restart after a kill without notice
        resumes from those), or a ``strategyjob.train.Checkpoint`` (the handler then keeps
        one checkpoint in ``checkpoint_dir``).
      checkpoint_dir: where the handler saves and restores; needed with a ``Checkpoint``.
      termination_config: a :class:`TerminationConfig`; default: ``SIGTERM``, exit 143, no
        grace period.

    Call ``run`` (or ``save_checkpoint_if_preempted``) on every worker, in the same order:
    they are where the workers agree.
    """

    def __init__(
        self,
        cluster_resolver: Any,
        checkpoint_or_checkpoint_manager: Checkpoint | CheckpointManager,
        checkpoint_dir: str | os.PathLike | None = None,
        termination_config: TerminationConfig | None = None,
    ) -> None:
        if _has_ps(cluster_resolver):
            # TensorFlow's answer too: the coordinator already survives a worker's loss, and
            # the parameter servers' state is saved by the chief's Checkpoint.
            raise NotImplementedError(
                "PreemptionCheckpointHandler does not support usage with "
                "strategyjob.experimental.ParameterServerStrategy."
            )
        manager = _manager_for(checkpoint_or_checkpoint_manager, checkpoint_dir)
        config = _config_for(termination_config)
        self._cluster_resolver = cluster_resolver
        self._manager = manager
        self._watcher_fn = config.termination_watcher_fn
        self._exit_fn = config.exit_fn or _exit_for_restart
        self._grace_period = float(config.grace_period or 0.0)
        self._save_fn = config.save_fn
        self._worker = _worker_name(cluster_resolver)

        checkpoint = manager.checkpoint
        existing = getattr(checkpoint, _ITERATION_NAME, None)  # a tracked object, or None
        if existing is not None and not isinstance(existing, _RunCounter):
            raise ValueError(
                f"The checkpoint already tracks an object named {_ITERATION_NAME!r}, which "
                "PreemptionCheckpointHandler uses for total_run_calls. Rename that object."
            )
        self._runs = _RunCounter()
        setattr(checkpoint, _ITERATION_NAME, self._runs)
        self._agreement = _Agreement(_agreement_starter(checkpoint))
        # the last call's agreement is never collected: let go of it at exit, or the
        # collective group's exit drain would wait its whole timeout for that work
        atexit.register(_forget_pending, weakref.ref(self._agreement))
        self._countdown = False  # saved once; training on through the grace period
        self._estimated_run_time = 0.0
        self._checkpoint_time = 0.0
        self._signal_time: float | None = None
        self._signalled = threading.Event()

        restored = manager.restore_or_initialize()
        if restored:
            _log.info(
                "PreemptionCheckpointHandler restored %s; total_run_calls=%d",
                restored,
                self._runs.count,
            )

        self._stop_watching = threading.Event()
        self._watcher: threading.Thread | None = None
        if self._watcher_fn is not None:
            self._start_watcher(self._watcher_fn)
        else:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- the notice ---------------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._notice()

    def _notice(self) -> None:
        if not self._signalled.is_set():
            self._signal_time = time.time()
            self._signalled.set()

    def _start_watcher(self, watcher_fn: Callable[[], bool]) -> None:
        self._watcher = threading.Thread(
            target=self._poll_watcher,
            args=(watcher_fn,),
            name=f"TerminationWatcher-{self._worker}",
            daemon=True,
        )
        self._watcher.start()

    def _poll_watcher(self, watcher_fn: Callable[[], bool]) -> None:
        while not self._stop_watching.is_set():
            try:
                if watcher_fn():
                    self._notice()
                    return
            except Exception as e:  # a broken watcher must not end training
                _log.warning("termination_watcher_fn raised %s: %s", type(e).__name__, e)
            self._stop_watching.wait(_WATCHER_POLL_SECONDS)

    def _flag(self) -> bool:
        """This worker's vote at this call: it was told to stop (and, during a grace-period
        countdown, its time is nearly up)."""
        if not self._signalled.is_set():
            return False
        if not self._countdown:
            return True
        assert self._signal_time is not None
        margin = 6 * self._estimated_run_time + 2 * self._checkpoint_time
        return time.time() >= self._signal_time + self._grace_period - margin

    # -- public API ---------------------------------------------------------------------------
    @property
    def total_run_calls(self) -> int:
        """How many times ``run`` (or ``save_checkpoint_if_preempted``) was called, counting
        the calls before the restart that the restored checkpoint covers."""
        return self._runs.count

    def run(self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``distributed_train_function(*args, **kwargs)`` (one step, containing
        ``strategy.run``), after saving and exiting if any worker was told to stop."""
        self._check_preemption_and_maybe_checkpoint()
        begin = time.monotonic()
        result = distributed_train_function(*args, **kwargs)
        self._runs.count += 1
        elapsed = time.monotonic() - begin
        self._estimated_run_time += (elapsed - self._estimated_run_time) / self._runs.count
        return result

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        """Save (``CheckpointManager.save(*args, **kwargs)``, or ``save_fn``) and exit if any
        worker was told to stop; call it once per step on every worker, instead of ``run``."""
        self._check_preemption_and_maybe_checkpoint(*args, **kwargs)
        self._runs.count += 1
        self._estimated_run_time = 0.0

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """A scope for the training loop, as in TensorFlow. Preemptions are handled at ``run``
        and ``save_checkpoint_if_preempted``; an error escaping the scope is logged with this
        worker's name and re-raised (peers learn of it through the collectives, as
        ``UnavailableError`` naming this worker)."""
        try:
            yield
        except errors.OpError as e:
            _log.info(
                "%s: error in the preemption scope: %s: %s", self._worker, type(e).__name__, e
            )
            raise

    # -- agreeing, saving, exiting ------------------------------------------------------------
    def _check_preemption_and_maybe_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        if self._agreement.collect():
            self._save_checkpoint(*args, **kwargs)
            if self._grace_period <= 0 or self._countdown:
                self._exit()
            else:
                _log.warning(
                    "%s: continuing training for the grace period (%gs) before a final checkpoint.",
                    self._worker,
                    self._grace_period,
                )
                self._countdown = True
        self._agreement.start(self._flag())

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        who = "this worker" if self._signalled.is_set() else "a peer"
        _log.warning(
            "%s: termination notice received (%s); saving a checkpoint after %d run calls.",
            self._worker,
            who,
            self._runs.count,
        )
        begin = time.monotonic()
        path: str | None
        if self._save_fn is not None:
            self._save_fn(*args, **kwargs)
            path = "save_fn"
        else:
            if len(args) < 2:
                kwargs.setdefault("check_interval", False)
            path = self._manager.save(*args, **kwargs)
            if path is None:  # a periodic save at this very step already holds this state
                path = self._manager.latest_checkpoint
        self._checkpoint_time = time.monotonic() - begin
        _log.warning("%s: checkpoint %s saved in %.2fs.", self._worker, path, self._checkpoint_time)

    def _exit(self) -> None:
        self._stop_watching.set()
        _log.warning("%s: exiting for a restart.", self._worker)
        self._exit_fn()
        # exit_fn returned (an in-process restart): keep training, watch for the next notice
        self._signalled.clear()
        self._signal_time = None
        self._countdown = False
        if self._watcher_fn is not None:
            self._stop_watching = threading.Event()
            self._start_watcher(self._watcher_fn)


def _forget_pending(agreement_ref: weakref.ref[_Agreement]) -> None:
    agreement = agreement_ref()
    if agreement is not None:
        agreement.forget()


def _has_ps(resolver: Any) -> bool:
    spec = getattr(resolver, "cluster_spec", None)
    return callable(spec) and "ps" in spec().as_dict()


def _worker_name(resolver: Any) -> str:
    task_type = getattr(resolver, "task_type", None)
    task_id = getattr(resolver, "task_id", None)
    if task_type is None:
        return "PreemptionCheckpointHandler"
    return f"/job:{task_type}/task:{task_id}"


def _manager_for(
    target: Checkpoint | CheckpointManager, checkpoint_dir: str | os.PathLike | None
) -> CheckpointManager:
    """The manager that saves for the handler: the one given, or one over the Checkpoint
    given, keeping one checkpoint in ``checkpoint_dir`` (TensorFlow's)."""
    if isinstance(target, CheckpointManager):
        return target
    if isinstance(target, Checkpoint):
        if not checkpoint_dir:
            raise errors.InvalidArgumentError(
                "When a checkpoint is passed, a checkpoint_dir must be passed as well."
            )
        return CheckpointManager(target, checkpoint_dir, max_to_keep=1)
    raise TypeError(
        "PreemptionCheckpointHandler expects a strategyjob.train.Checkpoint or "
        f"CheckpointManager, got {type(target).__name__}. Wrap the training state: "
        "Checkpoint(model=model, optimizer=opt)."
    )


def _config_for(termination_config: TerminationConfig | None) -> TerminationConfig:
    """The configuration, checked: a SIGTERM handler can only be installed from the main
    thread, so elsewhere the user must watch for termination themselves."""
    config = termination_config if termination_config is not None else TerminationConfig()
    if not isinstance(config, TerminationConfig):
        raise TypeError(
            "termination_config must be a strategyjob.experimental.TerminationConfig, got "
            f"{type(config).__name__}."
        )
    if config.termination_watcher_fn is None and (
        threading.current_thread() is not threading.main_thread()
    ):
        raise ValueError(
            "PreemptionCheckpointHandler watches SIGTERM, and Python handles signals only "
            "in the main thread: create it there, or pass a "
            "TerminationConfig(termination_watcher_fn=...)."
        )
    return config
