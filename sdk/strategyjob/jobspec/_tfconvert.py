"""A Kubeflow TFJob as the StrategyJob manifest it becomes for good (``strategyjob convert``).

The TFJob is read by :func:`load_tfjob` (TFJob's defaults written out: ``cleanPodPolicy:
None``, no backoff limit, ``tfjob-port``), rendered as a StrategyJob manifest and checked by
:func:`load_manifest`, per-strategy topology included, so what is printed is what the
StrategyJob CRD accepts. What a StrategyJob cannot hold is named, one note per field, never
dropped in silence.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategyjob.jobspec import _messages as msg
from strategyjob.jobspec._generate_name import SUFFIX_LENGTH, generate_name_of
from strategyjob.jobspec._load import load_manifest
from strategyjob.jobspec._model import (
    REPLICA_TYPES,
    TRAINING_CONTAINER_NAME,
    ManifestError,
    ReplicaSpec,
    StrategyJob,
)
from strategyjob.jobspec._render import to_manifest
from strategyjob.jobspec._tfjob import load_tfjob
from strategyjob.jobspec._tfmodel import (
    TFJOB_API_VERSION,
    TFJOB_CONTAINER_NAME,
    TFJOB_KIND,
    TFJOB_PORT_NAME,
    TFJob,
)

#: What the API server appends to ``metadata.generateName``: the name checks count it.
_GENERATED_SUFFIX = "x" * SUFFIX_LENGTH


@dataclass(frozen=True)
class Conversion:
    """A converted TFJob: the StrategyJob ``manifest`` and one ``notes`` line per TFJob field
    it does not carry as written (``<TFJob field>: <what happened and why>``)."""

    manifest: dict[str, Any]
    notes: tuple[str, ...]


def is_tfjob(obj: object) -> bool:
    """Whether a manifest says it is a Kubeflow TFJob (by apiVersion or kind), so that the
    TFJob reader, not the StrategyJob loader, names what is wrong with it."""
    return isinstance(obj, Mapping) and (
        obj.get("apiVersion") == TFJOB_API_VERSION or obj.get("kind") == TFJOB_KIND
    )


def tensorflow_first(template: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a TFJob pod template whose ``tensorflow`` container comes first, so that it
    stays the training container of a StrategyJob (the one named ``strategyjob``, else the
    first) and keeps its name for ``kubectl logs -c tensorflow``."""
    copied: dict[str, Any] = copy.deepcopy(dict(template))
    containers = (copied.get("spec") or {}).get("containers") or []
    named = [c for c in containers if c.get("name") == TFJOB_CONTAINER_NAME]
    if named:
        copied["spec"]["containers"] = named[:1] + [c for c in containers if c is not named[0]]
    return copied


def local_tfjob(obj: Any) -> TFJob:
    """:func:`load_tfjob`, with each ``tensorflow`` container first in the StrategyJob it
    runs as (see :func:`tensorflow_first`): the job ``strategyjob run`` starts."""
    tfjob = load_tfjob(obj)
    _check_training_container(tfjob)
    job = dataclasses.replace(tfjob.job, replica_specs=_reordered(tfjob.job.replica_specs))
    return dataclasses.replace(tfjob, job=job)


def convert_tfjob(obj: Any, strategy: str | None = None) -> Conversion:
    """The StrategyJob manifest of TFJob ``obj``, running as ``strategy`` (default: inferred
    from the replicas, as :func:`infer_strategy` does). Raises :class:`ManifestError` when
    ``obj`` is not a valid TFJob, or when its replicas do not fit the strategy."""
    if isinstance(obj, Mapping) and not is_tfjob(obj):
        raise ManifestError(
            [
                msg.NOT_A_TFJOB_TO_CONVERT.format(
                    value=msg.format_value({k: obj.get(k) for k in ("apiVersion", "kind")})
                )
            ]
        )
    generate_name = generate_name_of(obj)
    tfjob = load_tfjob(_named(obj, generate_name))
    _check_training_container(tfjob)
    notes: list[str] = []
    job = dataclasses.replace(tfjob.job, strategy=strategy or tfjob.job.strategy)
    job = _with_chief(job, tfjob, notes, chosen=strategy is not None)
    job = dataclasses.replace(job, replica_specs=_reordered(job.replica_specs))
    job = _one_evaluator(job, tfjob, notes)
    notes += _master_notes(tfjob)
    notes += _port_notes(tfjob)
    notes += _dropped(obj, tfjob)
    manifest = to_manifest(job)
    try:
        load_manifest(manifest)
    except ManifestError as e:
        counts = {tfjob.key(t): s.replicas for t, s in tfjob.job.replica_specs.items()}
        how = "--strategy" if strategy else "inferred"
        raise ManifestError(
            [
                f"spec.tfReplicaSpecs: the TFJob's replicas ({msg.format_value(counts)}) do "
                f"not fit {job.strategy} ({how}): {' '.join(e.problems)}"
            ]
        ) from None
    if generate_name is not None:
        manifest["metadata"].pop("name")
        manifest["metadata"] = {"generateName": generate_name, **manifest["metadata"]}
    return Conversion(manifest=manifest, notes=tuple(notes))


def _named(obj: Any, generate_name: str | None) -> Any:
    """``obj`` with the longest name its ``generateName`` can give, for the name checks."""
    if generate_name is None:
        return obj
    return {**obj, "metadata": {**obj["metadata"], "name": generate_name + _GENERATED_SUFFIX}}


def _check_training_container(tfjob: TFJob) -> None:
    """A container named ``strategyjob`` beside the ``tensorflow`` one would be the
    StrategyJob's training container, silently running the wrong program."""
    problems = [
        f"spec.tfReplicaSpecs.{tfjob.key(t)}.template.spec.containers: a container named "
        f"{TRAINING_CONTAINER_NAME} beside the {TFJOB_CONTAINER_NAME} one would run as the "
        f"training container outside a TFJob (got {msg.format_value(names)}). Rename it."
        for t, spec in tfjob.job.replica_specs.items()
        if TRAINING_CONTAINER_NAME
        in (names := [c.get("name") for c in spec.template["spec"]["containers"]])
    ]
    if problems:
        raise ManifestError(problems)


def _reordered(specs: Mapping[str, ReplicaSpec]) -> dict[str, ReplicaSpec]:
    return {
        t: dataclasses.replace(s, template=tensorflow_first(s.template)) for t, s in specs.items()
    }


def _with_chief(job: StrategyJob, tfjob: TFJob, notes: list[str], *, chosen: bool) -> StrategyJob:
    """A ParameterServerStrategy job needs a chief, its coordinator; a TF1 ps job has none
    and lets worker 0 decide success (TFJob's ``successPolicy`` too), so worker 0 becomes the
    chief, with its template and restart policy."""
    specs = dict(job.replica_specs)
    worker = specs.get("worker")
    pss = job.strategy == "ParameterServerStrategy"
    if not pss or "chief" in specs or "ps" not in specs or worker is None:
        return job
    key = tfjob.key("worker")
    if worker.replicas < 2:
        counts = {tfjob.key(t): s.replicas for t, s in specs.items()}
        raise ManifestError(
            [
                f"spec.tfReplicaSpecs: a TFJob with PS replicas and no Chief converts to "
                "ParameterServerStrategy, which needs a chief (its coordinator) and at least one "
                f"worker beside it (got {msg.format_value(counts)}). Add a Chief to the TFJob, or "
                f"give it 2 or more {key} replicas ({key} 0 becomes the chief); or keep it a "
                "TFJob (the chart's tfjob.enabled=true) and submit it as it is."
            ]
        )
    specs = {
        "chief": dataclasses.replace(worker, replicas=1),
        **{t: s for t, s in specs.items() if t != "worker"},
        "worker": dataclasses.replace(worker, replicas=worker.replicas - 1),
    }
    ordered = {t: specs[t] for t in REPLICA_TYPES if t in specs}
    why = "chosen" if chosen else "inferred from the PS replicas"
    notes.append(
        f"spec.tfReplicaSpecs.{key}: {key} 0 is now spec.replicaSpecs.chief (pod "
        "<job>-chief-0, TF_CONFIG task type chief) and the other "
        f"{worker.replicas - 1} are workers 0..{worker.replicas - 2}: ParameterServerStrategy "
        f"({why}) needs a chief, its coordinator, and a TFJob without one lets {key} 0 decide "
        "success as the chief does."
    )
    return dataclasses.replace(job, replica_specs=ordered)


def _one_evaluator(job: StrategyJob, tfjob: TFJob, notes: list[str]) -> StrategyJob:
    evaluator = job.replica_specs.get("evaluator")
    if evaluator is None or evaluator.replicas <= 1:
        return job
    key = tfjob.key("evaluator")
    notes.append(
        f"spec.tfReplicaSpecs.{key}.replicas: {evaluator.replicas} evaluators not carried: a "
        "StrategyJob has at most one evaluator; converted with replicas: 1."
    )
    specs = {**job.replica_specs, "evaluator": dataclasses.replace(evaluator, replicas=1)}
    return dataclasses.replace(job, replica_specs=specs)


def _master_notes(tfjob: TFJob) -> list[str]:
    if "chief" not in tfjob.replicas or tfjob.key("chief") == "Chief":
        return []
    key = tfjob.key("chief")
    return [
        f"spec.tfReplicaSpecs.{key}: carried as spec.replicaSpecs.chief (a StrategyJob has "
        f"no {key}): its pod is <job>-chief-0, not <job>-{key.lower()}-0, and its TF_CONFIG "
        "task type chief."
    ]


def _port_notes(tfjob: TFJob) -> list[str]:
    """A TFJob reads ``tfjob-port`` per replica type; a StrategyJob has one ``spec.port``
    (the reader takes the chief's, else the first type's)."""
    port = tfjob.job.port
    return [
        f"spec.tfReplicaSpecs.{tfjob.key(t)}: {TFJOB_PORT_NAME} {tfjob.port(t)} not carried: a "
        f"StrategyJob has one spec.port for every replica; all use {port}."
        for t in tfjob.replicas
        if tfjob.port(t) != port
    ]


def _dropped(obj: Mapping[str, Any], tfjob: TFJob) -> list[str]:
    """One line for each TFJob field that has no StrategyJob counterpart."""
    notes = []
    if tfjob.enable_dynamic_worker:
        notes.append(
            "spec.enableDynamicWorker: not carried: a StrategyJob's replicas cannot change and "
            "every replica's TF_CONFIG lists the whole cluster; under ParameterServerStrategy "
            "a failed worker is recreated alone and does not fail the job."
        )
    if tfjob.managed_by is not None:
        notes.append(
            f"spec.runPolicy.managedBy: {tfjob.managed_by} not carried: a StrategyJob has no "
            "managedBy; the StrategyJob operator of the cluster it is created in runs it."
        )
    scheduling = "spec.runPolicy.schedulingPolicy"
    if tfjob.min_resources:
        notes.append(
            f"{scheduling}.minResources: not carried: a StrategyJob's schedulingPolicy has "
            "minAvailable, queue and priorityClass only; the gang's PodGroup takes none."
        )
    if tfjob.schedule_timeout_seconds is not None:
        notes.append(
            f"{scheduling}.scheduleTimeoutSeconds: not carried: a StrategyJob's "
            "schedulingPolicy has no schedule timeout; runPolicy.pendingTimeoutSeconds fails a "
            "job whose pods stay pending."
        )
    if "status" in obj:
        notes.append("status: not carried: the operator writes the StrategyJob's own status.")
    return notes
