"""A :class:`StrategyJob` back to the manifest a user would write, and the builder for the
common case (one image, one command, N workers).

The builder writes a manifest and validates it with :func:`load_manifest`, so a bad build
fails here with the same messages as a bad YAML file, and the model stays the one
definition of the fields. Rendering leaves out every field at its default, so
``load_manifest(job.to_manifest()) == job`` and a built job renders exactly what
``build`` wrote.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from strategyjob.jobspec._model import (
    API_VERSION,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_CLEAN_POD_POLICY,
    DEFAULT_NAMESPACE,
    DEFAULT_PORT,
    DEFAULT_RESTART_POLICY,
    KIND,
    SINGLE_PROCESS_STRATEGIES,
    TRAINING_CONTAINER_NAME,
    BuildOptions,
    ManifestError,
    bind_build_options,
    takes_build_options,
)

if TYPE_CHECKING:
    from strategyjob.jobspec._model import StrategyJob

#: What the worker and ps replicas of a ParameterServerStrategy job run: they only serve
#: the chief (the coordinator), which runs the training program.
PS_SERVER_COMMAND: tuple[str, ...] = ("python", "-m", "strategyjob.server")
#: The extended resource the NVIDIA device plugin advertises.
GPU_RESOURCE = "nvidia.com/gpu"


def to_manifest(job: StrategyJob) -> dict[str, Any]:
    """The manifest of ``job``: only the fields that differ from their defaults. The
    ``default`` namespace is left out too, so the job lands where it is submitted."""
    metadata: dict[str, Any] = {"name": job.name}
    if job.namespace != DEFAULT_NAMESPACE:
        metadata["namespace"] = job.namespace
    if job.labels:
        metadata["labels"] = dict(job.labels)
    if job.annotations:
        metadata["annotations"] = dict(job.annotations)

    replica_specs: dict[str, Any] = {}
    for replica_type, spec in job.replica_specs.items():
        rendered: dict[str, Any] = {"replicas": spec.replicas}
        if spec.restart_policy != DEFAULT_RESTART_POLICY:
            rendered["restartPolicy"] = spec.restart_policy
        if spec.min_replicas is not None:
            rendered["minReplicas"] = spec.min_replicas
        if spec.max_replicas is not None:
            rendered["maxReplicas"] = spec.max_replicas
        rendered["template"] = copy.deepcopy(dict(spec.template))
        replica_specs[replica_type] = rendered

    spec_out: dict[str, Any] = {"strategy": job.strategy, "replicaSpecs": replica_specs}
    run_policy = _run_policy(job)
    if run_policy:
        spec_out["runPolicy"] = run_policy
    if job.success_policy:
        spec_out["successPolicy"] = job.success_policy
    if job.port != DEFAULT_PORT:
        spec_out["port"] = job.port
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec_out}


def _run_policy(job: StrategyJob) -> dict[str, Any]:
    rp = job.run_policy
    out: dict[str, Any] = {}
    if rp.backoff_limit != DEFAULT_BACKOFF_LIMIT:
        out["backoffLimit"] = rp.backoff_limit
    if rp.active_deadline_seconds is not None:
        out["activeDeadlineSeconds"] = rp.active_deadline_seconds
    if rp.pending_timeout_seconds is not None:
        out["pendingTimeoutSeconds"] = rp.pending_timeout_seconds
    if rp.rendezvous_timeout_seconds is not None:
        out["rendezvousTimeoutSeconds"] = rp.rendezvous_timeout_seconds
    if rp.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = rp.ttl_seconds_after_finished
    if rp.clean_pod_policy != DEFAULT_CLEAN_POD_POLICY:
        out["cleanPodPolicy"] = rp.clean_pod_policy
    if rp.suspend:
        out["suspend"] = True
    sp = rp.scheduling_policy
    scheduling = {
        key: value
        for key, value in (
            ("minAvailable", sp.min_available),
            ("queue", sp.queue),
            ("priorityClass", sp.priority_class),
        )
        if value is not None
    }
    if scheduling:
        out["schedulingPolicy"] = scheduling
    return out


@takes_build_options(returns=dict[str, Any])
def build_manifest(name: str, **options: Unpack[BuildOptions]) -> dict[str, Any]:
    """The manifest :meth:`StrategyJob.build` validates; see there for the arguments
    (:class:`BuildOptions`). Raises :class:`ManifestError` for arguments no manifest could
    express (a command given as one string, a negative GPU count)."""
    args = bind_build_options("build_manifest", name, options)
    strategy: str = args["strategy"]
    image: str = args["image"]
    command: Sequence[str] = args["command"]
    workers: int | None = args["workers"]
    ps: int | None = args["ps"]
    chief: bool | None = args["chief"]
    evaluator: bool = args["evaluator"]
    gpus_per_worker: int = args["gpus_per_worker"]
    env: Mapping[str, Any] | None = args["env"]
    namespace: str | None = args["namespace"]
    restart_policy: str | None = args["restart_policy"]
    resources: Mapping[str, Any] | None = args["resources"]
    labels: Mapping[str, str] | None = args["labels"]
    annotations: Mapping[str, str] | None = args["annotations"]

    problems = _check_container_args(image, command, gpus_per_worker)
    if problems:
        raise ManifestError(problems)

    is_ps = strategy == "ParameterServerStrategy"
    if workers is None:
        workers = 1 if strategy in SINGLE_PROCESS_STRATEGIES else 2
    if ps is None:
        ps = 1 if is_ps else 0
    if chief is None:
        chief = is_ps  # the coordinator; the other strategies lead from worker 0

    def container(run: Sequence[str], gpus: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": TRAINING_CONTAINER_NAME,
            "image": image,
            "command": list(run),
        }
        if env:
            out["env"] = [{"name": str(k), "value": _env_value(v)} for k, v in env.items()]
        limits = dict((resources or {}).get("limits") or {})
        if gpus > 0:
            limits[GPU_RESOURCE] = gpus
        res = {k: copy.deepcopy(v) for k, v in (resources or {}).items() if k != "limits"}
        if limits:
            res["limits"] = limits
        if res:
            out["resources"] = res
        return out

    def replica(count: int, run: Sequence[str], gpus: int) -> dict[str, Any]:
        out: dict[str, Any] = {"replicas": count}
        if restart_policy is not None and restart_policy != DEFAULT_RESTART_POLICY:
            out["restartPolicy"] = restart_policy
        out["template"] = {"spec": {"containers": [container(run, gpus)]}}
        return out

    server = PS_SERVER_COMMAND if is_ps else tuple(command)
    replica_specs: dict[str, Any] = {}
    if chief:
        replica_specs["chief"] = replica(1, command, 0 if is_ps else gpus_per_worker)
    if workers or not chief:
        replica_specs["worker"] = replica(workers, server, gpus_per_worker)
    if ps:
        replica_specs["ps"] = replica(ps, PS_SERVER_COMMAND, 0)
    if evaluator:
        replica_specs["evaluator"] = replica(1, command, 0)

    metadata: dict[str, Any] = {"name": name}
    if namespace is not None and namespace != DEFAULT_NAMESPACE:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)

    spec: dict[str, Any] = {"strategy": strategy, "replicaSpecs": replica_specs}
    run_policy = {
        key: value
        for key, value, default in (
            ("backoffLimit", args["backoff_limit"], DEFAULT_BACKOFF_LIMIT),
            ("activeDeadlineSeconds", args["active_deadline_seconds"], None),
            ("ttlSecondsAfterFinished", args["ttl_seconds_after_finished"], None),
            ("cleanPodPolicy", args["clean_pod_policy"], DEFAULT_CLEAN_POD_POLICY),
        )
        if value is not None and value != default
    }
    if run_policy:
        spec["runPolicy"] = run_policy
    if args["success_policy"]:
        spec["successPolicy"] = args["success_policy"]
    if args["port"] is not None and args["port"] != DEFAULT_PORT:
        spec["port"] = args["port"]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def _check_container_args(image: Any, command: Any, gpus_per_worker: Any) -> list[str]:
    problems = []
    if not isinstance(image, str) or not image:
        problems.append(
            f"image: the container image is required (got {image!r}). "
            "Pass image=, e.g. image='strategyjob-worker:latest'."
        )
    if (
        isinstance(command, str | bytes)
        or not isinstance(command, Sequence)
        or not command
        or not all(isinstance(part, str) for part in command)
    ):
        problems.append(
            f"command: must be a non-empty list of strings (got {command!r}). "
            "Write it as a list, e.g. command=['python', 'train.py']."
        )
    if isinstance(gpus_per_worker, bool) or not isinstance(gpus_per_worker, int):
        problems.append(
            f"gpus_per_worker: must be a whole number (got {gpus_per_worker!r}). "
            "Pass e.g. gpus_per_worker=1."
        )
    elif gpus_per_worker < 0:
        problems.append(
            f"gpus_per_worker: must be at least 0 (got {gpus_per_worker}). "
            "Pass 0 for CPU-only workers."
        )
    return problems


def _env_value(value: Any) -> str:
    """Kubernetes takes only string env values; write booleans the way YAML users do."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
