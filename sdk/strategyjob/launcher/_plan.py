"""What the launcher starts for each replica: its command line, environment and
working directory, computed from the manifest before any process starts."""

from __future__ import annotations

import os
import re
import resource
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strategyjob import _names
from strategyjob.errors import StrategyJobError
from strategyjob.jobspec import (
    REPLICA_TYPES,
    StrategyJob,
    replica_env,
    training_container,
    training_container_index,
)

LOCAL_HOST = "127.0.0.1"
#: Rendezvous variables never inherited from the launcher's own environment.
_CLEARED_ENV = (
    _names.ENV_TF_CONFIG,  # a one-replica TFJob's replica gets none, as in a cluster
    _names.ENV_RANK,
    _names.ENV_WORLD_SIZE,
    _names.ENV_LOCAL_RANK,
    _names.ENV_LOCAL_WORLD_SIZE,
    _names.ENV_MASTER_ADDR,
    _names.ENV_MASTER_PORT,
)
_PYTHON_NAMES = ("python", "python3")
#: The most replicas ``strategyjob run`` starts, whatever the open-file limit: each is a
#: process (an interpreter of its own) on this one machine, with a port and two launcher
#: threads; beyond this a job belongs on a cluster. Below the manifest's own limit
#: (``jobspec.MAX_TOTAL_REPLICAS``), so that this is the limit a local run meets.
MAX_LOCAL_REPLICAS = 512
#: Open files per replica: the launcher holds its output pipe (and a socket while the
#: ports are chosen); a collective job's replica holds a connection to every other one
#: under the same (inherited) limit.
_FILES_PER_REPLICA = 2
_FILES_RESERVED = 64  # the launcher's own: the interpreter's, the console, the progress file
_VAR_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


#: A replica's injected environment from ``(replica type, index, every replica's address by
#: type, restart attempt)``: :func:`replica_env` for a StrategyJob, ``tfjob_replica_env`` for
#: a Kubeflow TFJob (its ``TF_CONFIG`` as training-operator writes it).
ReplicaEnv = Callable[[str, int, Mapping[str, list[str]], int], dict[str, str]]


class LaunchError(StrategyJobError):
    """The manifest is valid but cannot run locally (e.g. a container has no command)."""


@dataclass(frozen=True)
class ReplicaLaunch:
    """One local process: which replica, what to run, with which environment, where."""

    replica_type: str
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.replica_type, self.index)

    @property
    def name(self) -> str:
        return f"{self.replica_type}-{self.index}"


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined
    reference stays as written, and ``$$`` is an escaped ``$``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return variables.get(name, match.group(0))

    return _VAR_REFERENCE.sub(replace, text)


def free_ports(count: int, host: str = LOCAL_HOST) -> list[int]:
    """``count`` distinct ports free on ``host`` now (all sockets held until every
    port is chosen, so no port is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_cluster(job: StrategyJob, ports: list[int] | None = None) -> dict[str, list[str]]:
    """Every replica's address on 127.0.0.1 with a free port, evaluator included."""
    keys = job.replicas()
    ports = ports if ports is not None else free_ports(len(keys))
    cluster: dict[str, list[str]] = {}
    for (replica_type, _), port in zip(keys, ports, strict=True):
        cluster.setdefault(replica_type, []).append(f"{LOCAL_HOST}:{port}")
    return cluster


#: Pod spec fields that change what a replica sees on a cluster and that ``strategyjob run``,
#: which starts the training container's command as a process here, does not apply. Where
#: pods are scheduled (nodeSelector, affinity, tolerations...) is left out: it changes
#: nothing a replica sees. ``terminationGracePeriodSeconds`` is applied (the grace period).
IGNORED_POD_FIELDS = ("volumes", "initContainers", "securityContext", "hostAliases")
#: The training container's fields likewise: only command, args, env (its values: an entry
#: with valueFrom, a Secret's or the pod's, is left unset), name and image (checked, never
#: pulled) are read.
IGNORED_CONTAINER_FIELDS = (
    "workingDir",
    "volumeMounts",
    "volumeDevices",
    "envFrom",
    "resources",
    "securityContext",
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
)


def ignored_template_fields(job: StrategyJob) -> tuple[list[str], list[str]]:
    """``(fields, replica types)``: the pod-template fields set in ``job`` that only a cluster
    applies (:data:`IGNORED_POD_FIELDS`, other containers, then the training container's
    :data:`IGNORED_CONTAINER_FIELDS`), each once, and the replica types that set them."""
    fields: dict[str, None] = {}  # ordered set
    types = []
    for replica_type, spec in job.replica_specs.items():
        if spec.replicas == 0:
            continue
        pod_spec = spec.template.get("spec") or {}
        found = [f for f in IGNORED_POD_FIELDS if pod_spec.get(f)]
        training = training_container_index(spec.template)
        containers = pod_spec.get("containers") or []
        others = [str(c.get("name")) for i, c in enumerate(containers) if i != training]
        if others:
            found.append(f"other containers ({', '.join(others)})")
        found += [f for f in IGNORED_CONTAINER_FIELDS if containers[training].get(f)]
        found += [
            f"env {entry['name']}'s valueFrom (left unset)"
            for entry in containers[training].get("env") or []
            if _value_from_only(entry)
        ]
        if found:
            fields.update(dict.fromkeys(found))
            types.append(replica_type)
    return list(fields), types


def _value_from_only(entry: Mapping[str, Any]) -> bool:
    """An env entry whose value only a cluster can give (``valueFrom`` without ``value``)."""
    return "value" not in entry and "valueFrom" in entry


def check_runnable(job: StrategyJob) -> None:
    """Raise :class:`LaunchError` listing every replica type that cannot start locally."""
    problems = []
    for replica_type in REPLICA_TYPES:
        spec = job.replica_specs.get(replica_type)
        if spec is None or spec.replicas == 0:
            continue
        container = training_container(spec.template)
        path = _container_path(spec.template, container, replica_type)
        command = list(container.get("command") or []) + list(container.get("args") or [])
        if not container.get("command"):
            problems.append(
                f"{path}.command: strategyjob run needs a command to start the replica "
                f'(got {container.get("command")!r}). Add command: ["python", "train.py"].'
            )
        elif not all(isinstance(part, str | int | float) for part in command):
            problems.append(
                f"{path}.command: every part of command and args must be a string "
                f"(got {command!r}). Quote each part."
            )
        for i, entry in enumerate(container.get("env") or []):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                problems.append(
                    f"{path}.env[{i}]: an env entry needs a name (got {entry!r}). "
                    "Write - name: VAR and value: text."
                )
    total = sum(spec.replicas for spec in job.replica_specs.values())
    limit, why = local_replica_limit()
    if total > limit:
        problems.append(
            f"spec.replicaSpecs: {total} replicas in all, more than strategyjob run can start "
            f"on this machine (at most {limit}: {why}). Use fewer replicas, or run the job "
            "on a cluster with strategyjob submit."
        )
    if problems:
        raise LaunchError("\n".join(problems))


def _open_file_limits() -> tuple[float, float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = float("inf")
    return (
        infinite if soft == resource.RLIM_INFINITY else soft,
        infinite if hard == resource.RLIM_INFINITY else hard,
    )


def local_replica_limit() -> tuple[int, str]:
    """The most replicas ``strategyjob run`` starts on this machine, and why: every replica
    needs open files within the hard limit (``ulimit -Hn``), and at most
    :data:`MAX_LOCAL_REPLICAS` are started at all."""
    _, hard = _open_file_limits()
    by_files = (hard - _FILES_RESERVED) // _FILES_PER_REPLICA
    if by_files < MAX_LOCAL_REPLICAS:
        return max(int(by_files), 0), (
            f"each replica needs {_FILES_PER_REPLICA} open files and this process may open "
            f"at most {int(hard)} (ulimit -Hn)"
        )
    return MAX_LOCAL_REPLICAS, "one process per replica on one machine"


def reserve_open_files(replicas: int) -> None:
    """Raise the soft open-file limit (``ulimit -n``, inherited by the replicas) to what
    ``replicas`` need, within the hard limit: 1024, a common default, is too few for a
    few hundred replicas."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = replicas * _FILES_PER_REPLICA + _FILES_RESERVED
    if hard != resource.RLIM_INFINITY:
        needed = min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < needed:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        except (ValueError, OSError):
            pass  # starting may still work; a replica that cannot start is reported


def build_launches(
    job: StrategyJob,
    workdir: str | Path,
    cluster: Mapping[str, list[str]],
    base_env: Mapping[str, str] | None = None,
    job_env: Mapping[str, str] | None = None,
    restart_attempt: int = 0,
    env_of: ReplicaEnv | None = None,
) -> list[ReplicaLaunch]:
    """The process of every replica: the training container's command and args
    (``$(VAR)`` expanded; ``python`` is this interpreter), its plain env values plus
    ``env_of``'s (default :func:`replica_env`) and ``job_env`` (what the launcher adds for
    the whole job: its token and progress file), run in ``workdir``."""
    check_runnable(job)
    if env_of is None:

        def env_of(t: str, i: int, c: Mapping[str, list[str]], attempt: int) -> dict[str, str]:
            return replica_env(job, t, i, c, attempt)

    base = dict(os.environ if base_env is None else base_env)
    for name in _CLEARED_ENV:
        base.pop(name, None)
    launches = []
    for replica_type, index in job.replicas():
        spec = job.replica_specs[replica_type]
        container = training_container(spec.template)
        injected = {
            **env_of(replica_type, index, cluster, restart_attempt),
            **(job_env or {}),
        }
        container_env: dict[str, str] = {}
        for entry in container.get("env") or []:
            if _value_from_only(entry):
                continue  # named once by ignored_template_fields
            scope = {**container_env, **injected}
            container_env[entry["name"]] = expand(str(entry.get("value", "")), scope)
        variables = {**container_env, **injected}
        argv = [
            expand(str(part), variables)
            for part in list(container.get("command") or []) + list(container.get("args") or [])
        ]
        if argv[0] in _PYTHON_NAMES:
            argv[0] = sys.executable
        env = {**base, **container_env, **injected}
        env.setdefault("PYTHONUNBUFFERED", "1")
        launches.append(
            ReplicaLaunch(replica_type, index, tuple(argv), env, str(Path(workdir).resolve()))
        )
    return launches


def _container_path(
    template: Mapping[str, Any], container: Mapping[str, Any], replica_type: str
) -> str:
    containers = template["spec"]["containers"]
    index = next(i for i, c in enumerate(containers) if c is container)
    return f"spec.replicaSpecs.{replica_type}.template.spec.containers[{index}]"
