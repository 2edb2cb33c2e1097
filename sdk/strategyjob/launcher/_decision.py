"""Pure decisions of the local launcher: given which replicas have exited and how,
is the job still running, succeeded, failed, or to be restarted?

No processes or clocks here: the supervisor passes in plain data (exit codes,
the order in which replicas exited, the elapsed time), so every rule is unit-tested
with tables.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from strategyjob.jobspec import StrategyJob, success_replicas

ReplicaKey = tuple[str, int]


@dataclass(frozen=True)
class ReplicaExit:
    """How a replica's process ended. ``returncode`` follows ``subprocess``: negative
    means killed by that signal. ``sequence`` orders exits (lower = earlier)."""

    returncode: int
    sequence: int = 0

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


@dataclass(frozen=True)
class Failure:
    key: ReplicaKey
    exit: ReplicaExit

    def describe(self) -> str:
        return f"{replica_name(self.key)} {self.exit.describe()}"


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
) -> Decision:
    """The job's next step, from the exits seen so far in the current attempt.

    * Any failure ends the attempt. If every failure is retryable under its
      replica type's ``restartPolicy`` and fewer than ``runPolicy.backoffLimit``
      restarts were made, the job restarts: under ParameterServerStrategy failed
      workers restart alone; every other strategy is collective, so the whole job
      restarts. Otherwise the job fails, first failure first.
    * The job succeeds when its success replicas exited 0 (the chief, or worker 0
      without a chief; every chief and worker under ``AllWorkers``).
    * Past ``runPolicy.activeDeadlineSeconds`` the job fails.
    """
    failures = tuple(
        Failure(key, exit)
        for key, exit in sorted(exits.items(), key=lambda item: item[1].sequence)
        if not exit.succeeded
    )
    if failures:
        first = failures[0].describe()
        retryable = all(
            is_retryable(job.replica_specs[f.key[0]].restart_policy, f.exit) for f in failures
        )
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

    needed = success_replicas(job)
    if all(key in exits for key in needed):
        names = ", ".join(replica_name(k) for k in needed)
        return Decision(Phase.SUCCEEDED, f"{names} succeeded")

    deadline = job.run_policy.active_deadline_seconds
    if deadline is not None and elapsed >= deadline:
        return Decision(
            Phase.FAILED, f"the job ran longer than activeDeadlineSeconds ({deadline}s)"
        )
    return Decision(Phase.RUNNING)
