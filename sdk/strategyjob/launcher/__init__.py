"""The local launcher behind ``strategyjob run``: one process per replica on this
machine, with the environment the operator injects in a cluster. Torch-free."""

from strategyjob.launcher._control import request_resize
from strategyjob.launcher._decision import (
    Decision,
    Failure,
    Phase,
    ReplicaExit,
    decide,
    is_retryable,
)
from strategyjob.launcher._output import Console
from strategyjob.launcher._plan import (
    MAX_LOCAL_REPLICAS,
    LaunchError,
    ReplicaLaunch,
    build_launches,
    check_runnable,
    expand,
    free_ports,
    local_cluster,
    local_replica_limit,
)
from strategyjob.launcher._runner import (
    DEFAULT_GRACE_PERIOD,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_SUCCEEDED,
    RunOptions,
    grace_period_of,
    run_file,
    run_job,
)
from strategyjob.launcher._supervisor import LocalProcessSupervisor, ProcessSupervisor

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_SUCCEEDED",
    "MAX_LOCAL_REPLICAS",
    "Console",
    "Decision",
    "Failure",
    "LaunchError",
    "LocalProcessSupervisor",
    "Phase",
    "ProcessSupervisor",
    "ReplicaExit",
    "ReplicaLaunch",
    "RunOptions",
    "build_launches",
    "check_runnable",
    "decide",
    "expand",
    "free_ports",
    "grace_period_of",
    "is_retryable",
    "local_cluster",
    "local_replica_limit",
    "request_resize",
    "run_file",
    "run_job",
]
