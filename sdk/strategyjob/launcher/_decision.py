"""Pure decisions of the local launcher: given which replicas have exited and how,
is the job still running, succeeded, failed, or to be restarted?

No processes or clocks here: the supervisor passes in plain data (exit codes,
the order in which replicas exited, the elapsed time), so every rule is unit-tested
with tables.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from strategyjob.jobspec import (
    OPTIONAL_REPLICA_TYPES,
    StrategyJob,
    early_exit,
    serves_until_stopped,
    success_replicas,
)

ReplicaKey = tuple[str, int]


@dataclass(frozen=True)
class ReplicaExit:
    """How a replica's process ended. ``returncode`` follows ``subprocess``: negative
    means killed by that signal. ``sequence`` orders exits (lower = earlier).
    ``error``: the error line it printed last (``ValueError: bad batch``), if any."""

    returncode: int
    sequence: int = 0
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0

    @property
    def exit_code(self) -> int:
        """The shell-style exit code: ``128 + signal`` for a killed process."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def describe(self) -> str:
        if self.returncode < 0:
            return f"was killed by {signal_name(-self.returncode)} (exit code {self.exit_code})"
        return f"exited with code {self.returncode}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def replica_name(key: ReplicaKey) -> str:
    return f"{key[0]}-{key[1]}"


class Phase(enum.Enum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RESTART_JOB = "RestartJob"
    RESTART_REPLICAS = "RestartReplicas"
    #: An evaluator restarted alone, not counted against ``backoffLimit``.
    RESTART_OPTIONAL = "RestartOptional"
    #: An evaluator not restarted any more: reported once, the job goes on without it.
    GIVE_UP = "GiveUp"


@dataclass(frozen=True)
class Failure:
    """A replica's failure. ``early``: a replica that serves until the job ends (a ps)
    exited, with code 0, while the job ran."""

    key: ReplicaKey
    exit: ReplicaExit
    early: bool = False

    def describe(self) -> str:
        """E.g. ``worker-1 exited with code 1: ValueError: bad batch``."""
        what = early_exit(self.key[0]) if self.early else self.exit.describe()
        text = f"{replica_name(self.key)} {what}"
        return f"{text}: {self.exit.error}" if self.exit.error else text

    def retryable(self, restart_policy: str) -> bool:
        """Whether ``restart_policy`` retries it: an early exit with code 0 is retried by
        ``OnFailure`` and ``Always`` only (``ExitCode`` retries signals, not a program
        that ended on its own)."""
        if self.early:
            return restart_policy in ("OnFailure", "Always")
        return is_retryable(restart_policy, self.exit)


@dataclass(frozen=True)
class Decision:
    """What to do next. ``failures`` are in the order the replicas failed (the
    root cause first); ``restart`` names the replicas to restart alone."""

    phase: Phase
    reason: str = ""
    failures: tuple[Failure, ...] = ()
    restart: tuple[ReplicaKey, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED)


def is_retryable(restart_policy: str, exit: ReplicaExit) -> bool:
    """``OnFailure``/``Always`` retry every failure; ``ExitCode`` retries exit codes
    of 128 and above (killed, preempted, out of memory) and treats 1-127 as bugs."""
    if exit.succeeded:
        return False
    if restart_policy in ("OnFailure", "Always"):
        return True
    if restart_policy == "ExitCode":
        return exit.exit_code >= 128
    return False


def decide(
    job: StrategyJob,
    exits: Mapping[ReplicaKey, ReplicaExit],
    restarts: int = 0,
    elapsed: float = 0.0,
    *,
    optional_restarts: int = 0,
    given_up: Set[ReplicaKey] = frozenset(),
    optional_types: tuple[str, ...] = OPTIONAL_REPLICA_TYPES,
) -> Decision:
    """The job's next step, from the exits seen so far in the current attempt.

    * Any failure ends the attempt. If every failure is retryable under its
      replica type's ``restartPolicy`` and fewer than ``runPolicy.backoffLimit``
      restarts were made, the job restarts: under ParameterServerStrategy failed
      workers restart alone; every other strategy is collective, so the whole job
      restarts. Otherwise the job fails, first failure first.
    * An evaluator's failure never fails the job (``optional_types``: also a TFJob's workers
      under ``enableDynamicWorker``, :attr:`TFJob.optional_types`): it restarts alone while
      its policy retries it and ``optional_restarts`` (such restarts so far) is under
      ``backoffLimit``, else it is given up (the caller passes it in ``given_up`` from then
      on) and the job goes on without it.
    * A replica that serves until the job ends (:func:`serves_until_stopped`: a ps, a
      ParameterServerStrategy worker) fails when it exits at all, code 0 included, unless
      the job had already succeeded.
    * The job succeeds when its success replicas exited 0 (the chief, or worker 0
      without a chief; every chief and worker under ``AllWorkers``).
    * Past ``runPolicy.activeDeadlineSeconds`` the job fails.
    """
    needed = success_replicas(job)
    leaders = [exits.get(k) for k in needed]
    # When the job succeeded (None: not yet); a server's exit after that is no failure.
    succeeded_at = (
        max(e.sequence for e in leaders if e is not None)
        if all(e is not None and e.succeeded for e in leaders)
        else None
    )
    failures = tuple(
        Failure(key, exit, early=exit.succeeded)
        for key, exit in sorted(exits.items(), key=lambda item: item[1].sequence)
        if key not in given_up
        and (
            not exit.succeeded
            or (
                serves_until_stopped(job, key[0])
                and (succeeded_at is None or exit.sequence < succeeded_at)
            )
        )
    )
    optional = tuple(f for f in failures if f.key[0] in optional_types)
    failures = tuple(f for f in failures if f.key[0] not in optional_types)
    if failures:
        first = failures[0].describe()
        retryable = all(f.retryable(job.replica_specs[f.key[0]].restart_policy) for f in failures)
        if not retryable:
            return Decision(Phase.FAILED, first, failures)
        limit = job.run_policy.backoff_limit
        if restarts >= limit:
            return Decision(
                Phase.FAILED, f"{first}; backoff limit of {limit} restarts reached", failures
            )
        if job.strategy == "ParameterServerStrategy" and all(
            f.key[0] == "worker" for f in failures
        ):
            return Decision(Phase.RESTART_REPLICAS, first, failures, tuple(f.key for f in failures))
        return Decision(Phase.RESTART_JOB, first, failures)
    if all(key in exits for key in needed):
        names = ", ".join(replica_name(k) for k in needed)
        return Decision(Phase.SUCCEEDED, f"{names} succeeded")
    if optional:
        return _decide_optional(job, optional, optional_restarts)

    deadline = job.run_policy.active_deadline_seconds
    if deadline is not None and elapsed >= deadline:
        return Decision(
            Phase.FAILED, f"the job ran longer than activeDeadlineSeconds ({deadline}s)"
        )
    return Decision(Phase.RUNNING)


def _decide_optional(job: StrategyJob, failures: tuple[Failure, ...], restarts: int) -> Decision:
    """Restart failed evaluators alone, or give them up, as the operator does."""
    first = failures[0].describe()
    keys = tuple(f.key for f in failures)
    limit = job.run_policy.backoff_limit
    permanent = [f for f in failures if not f.retryable(job.replica_specs[f.key[0]].restart_policy)]
    if not permanent and restarts < limit:
        return Decision(Phase.RESTART_OPTIONAL, first, failures, keys)
    if permanent:
        policy = job.replica_specs[permanent[0].key[0]].restart_policy
        why = f"restartPolicy {policy} does not retry it"
    else:
        why = f"it was restarted {restarts} times (backoffLimit={limit})"
    return Decision(Phase.GIVE_UP, f"{first}; {why}", failures, keys)
