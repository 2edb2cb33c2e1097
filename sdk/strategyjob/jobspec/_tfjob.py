"""Read a Kubeflow ``kubeflow.org/v1`` TFJob manifest: the one place that knows TFJob's spec.

The TFJob is translated into a StrategyJob manifest (replica keys lowercased, ``Master`` as
the chief, the strategy inferred, TFJob's defaults written out) and validated by the
StrategyJob loader, less its per-strategy topology rules, which TFJob does not have; every
problem names the TFJob's own path (``spec.tfReplicaSpecs.Worker...``). What only a TFJob
has is kept in the :class:`TFJob` record beside the StrategyJob.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from strategyjob.jobspec import _messages as msg
from strategyjob.jobspec._load import load_translated, plain
from strategyjob.jobspec._model import (
    API_VERSION,
    KIND,
    MAX_INT32,
    MAX_NAME_LENGTH,
    ManifestError,
)
from strategyjob.jobspec._tfmodel import (
    MANAGED_BY_VALUES,
    TFJOB_API_VERSION,
    TFJOB_CONTAINER_NAME,
    TFJOB_DEFAULT_CLEAN_POD_POLICY,
    TFJOB_DEFAULT_PORT,
    TFJOB_KIND,
    TFJOB_PORT_NAME,
    TFJOB_REPLICA_KEYS,
    TFJob,
    TFReplica,
)

_Add = Callable[..., None]
_SPEC_FIELDS = ("runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker")
_BY_FOLDED_KEY = {key.lower(): key for key in TFJOB_REPLICA_KEYS}


def infer_strategy(replicas: Mapping[str, int]) -> str:
    """The tf.distribute strategy a TFJob with ``replicas`` (count by StrategyJob type) runs
    as: ps replicas → ParameterServerStrategy; several chief and worker replicas →
    MultiWorkerMirroredStrategy; a single one → MirroredStrategy."""
    if replicas.get("ps", 0) > 0:
        return "ParameterServerStrategy"
    if replicas.get("chief", 0) + replicas.get("worker", 0) > 1:
        return "MultiWorkerMirroredStrategy"
    return "MirroredStrategy"


def load_tfjob(obj: Any, *, cluster_domain: str = "") -> TFJob:
    """Parse and validate a TFJob v1 manifest (a YAML document's dict or an API object) as
    training-operator v1.9.4 defaults and validates it. Raises :class:`ManifestError`
    listing every problem, each naming the TFJob's field. ``cluster_domain``: the serving
    operator's ``CUSTOM_CLUSTER_DOMAIN``, which its ``TF_CONFIG`` addresses end with."""
    problems: list[str] = []

    def add(template: str, value: Any = None, **fields: Any) -> None:
        problems.append(template.format(value=msg.format_value(value), **fields))

    if not isinstance(obj, Mapping):
        add(msg.NOT_A_TFJOB, obj)
        raise ManifestError(problems)
    if obj.get("apiVersion") != TFJOB_API_VERSION:
        add(msg.BAD_TFJOB_API_VERSION, obj.get("apiVersion"))
    if obj.get("kind") != TFJOB_KIND:
        add(msg.BAD_TFJOB_KIND, obj.get("kind"))
    raw_spec = obj.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    for key in spec:
        if key not in _SPEC_FIELDS:
            add(msg.UNKNOWN_FIELD, key, path=f"spec.{key}", known=", ".join(_SPEC_FIELDS))

    written = _replica_keys(spec.get("tfReplicaSpecs"), add)
    replicas: dict[str, TFReplica] = {}
    translated_specs: dict[str, Any] = {}
    paths = {"spec.replicaSpecs": "spec.tfReplicaSpecs"}
    for key, replica_type in written.items():
        raw = spec["tfReplicaSpecs"][key]
        paths[f"spec.replicaSpecs.{replica_type}"] = f"spec.tfReplicaSpecs.{key}"
        fields = dict(raw) if isinstance(raw, Mapping) else raw
        port = TFJOB_DEFAULT_PORT
        if isinstance(fields, dict) and isinstance(fields.get("template"), Mapping):
            fields["template"], port = _with_port(fields["template"], key, add)
        replicas[replica_type] = TFReplica(key=_BY_FOLDED_KEY[key.lower()], port=port)
        translated_specs[replica_type] = fields

    counts = {t: _count(f) for t, f in translated_specs.items()}
    if translated_specs and counts.get("chief", 0) + counts.get("worker", 0) == 0:
        add(msg.TFJOB_NEEDS_TRAINER, {replicas[t].key: n for t, n in counts.items()})
    _check_master_name(obj, replicas, counts, add)

    run_policy = spec.get("runPolicy")
    translated_run_policy = dict(run_policy) if isinstance(run_policy, Mapping) else run_policy
    if translated_run_policy is None:
        translated_run_policy = {}
    extras = _run_policy_extras(translated_run_policy, add)
    enable_dynamic_worker = spec.get("enableDynamicWorker", False)
    if not isinstance(enable_dynamic_worker, bool):
        add(msg.NOT_A_BOOLEAN, enable_dynamic_worker, path="spec.enableDynamicWorker")
        enable_dynamic_worker = False

    translated_spec: dict[str, Any] = {
        "strategy": infer_strategy(counts),
        "replicaSpecs": translated_specs or spec.get("tfReplicaSpecs"),
        "runPolicy": translated_run_policy,
        "port": replicas[_leader_type(replicas)].port if replicas else TFJOB_DEFAULT_PORT,
    }
    if "successPolicy" in spec:
        translated_spec["successPolicy"] = spec["successPolicy"]
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": obj.get("metadata"),
        "spec": translated_spec if raw_spec is not None else None,
    }
    if raw_spec is not None and not isinstance(raw_spec, Mapping):
        add(msg.NOT_A_MAPPING, raw_spec, path="spec")
    job = load_translated(manifest, paths, problems)
    pod_types = {t: r.type_name for t, r in replicas.items() if r.type_name != t}
    job = dataclasses.replace(job, pod_types=pod_types) if pod_types else job
    uid = (obj.get("metadata") or {}).get("uid")
    return TFJob(
        job=job,
        replicas={t: replicas[t] for t in job.replica_specs},
        enable_dynamic_worker=enable_dynamic_worker,
        uid=uid if isinstance(uid, str) else None,
        cluster_domain=cluster_domain,
        **extras,
    )


def _replica_keys(raw: Any, add: _Add) -> dict[str, str]:
    """The replica keys as written, each with its StrategyJob type; unknown keys, a type
    written twice (keys are case-insensitive) and more than one Chief/Master reported."""
    if not isinstance(raw, Mapping) or not raw:
        if raw is None or isinstance(raw, Mapping):
            add(msg.MISSING_TF_REPLICA_SPECS, raw)
        else:
            add(msg.NOT_A_MAPPING, raw, path="spec.tfReplicaSpecs")
        return {}
    written: dict[str, str] = {}
    seen: dict[str, str] = {}
    for key in raw:
        camel = _BY_FOLDED_KEY.get(str(key).lower())
        if camel is None:
            add(msg.UNKNOWN_TF_REPLICA_TYPE, key, key=key)
            continue
        if camel in seen:
            add(msg.DUPLICATE_TF_REPLICA_TYPE, key, key=key, other=seen[camel])
            continue
        seen[camel] = str(key)
        written[str(key)] = TFJOB_REPLICA_KEYS[camel]
    chiefs = [k for k, t in written.items() if t == "chief"]
    total = sum(_count(raw[k]) for k in chiefs)
    if len(chiefs) > 1 or total > 1:
        add(msg.TOO_MANY_CHIEFS, {k: _count(raw[k]) for k in chiefs})
        for key in chiefs[1:]:
            del written[key]
    return written


def _count(fields: Any) -> int:
    """A replica type's ``replicas`` for inference (TFJob's default 1); a wrong value is
    reported by the loader."""
    replicas = fields.get("replicas", 1) if isinstance(fields, Mapping) else 1
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1


def _leader_type(replicas: Mapping[str, TFReplica]) -> str:
    return "chief" if "chief" in replicas else next(iter(replicas))


def _with_port(template: Mapping[str, Any], key: str, add: _Add) -> tuple[dict[str, Any], int]:
    """The template with the ``tfjob-port`` port on its ``tensorflow`` container (added
    with 2222 when absent, as TFJob's defaulter does) and that port's number."""
    copied: dict[str, Any] = copy.deepcopy(plain(template))
    pod_spec = copied.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    if not isinstance(containers, list) or not containers:
        return copied, TFJOB_DEFAULT_PORT  # the loader names what is missing
    named = [c for c in containers if isinstance(c, dict) and c.get("name") == TFJOB_CONTAINER_NAME]
    if not named:
        names = [c.get("name") for c in containers if isinstance(c, Mapping)]
        add(msg.NO_TENSORFLOW_CONTAINER, names, key=key)
        return copied, TFJOB_DEFAULT_PORT
    container = named[0]
    ports = container.get("ports")
    if ports is None:
        ports = container["ports"] = []
    if not isinstance(ports, list):
        return copied, TFJOB_DEFAULT_PORT  # the loader reports it
    for port in ports:
        if isinstance(port, Mapping) and port.get("name") == TFJOB_PORT_NAME:
            number = port.get("containerPort")
            if isinstance(number, int) and not isinstance(number, bool):
                return copied, number
            return copied, TFJOB_DEFAULT_PORT  # the loader reports it
    ports.append({"name": TFJOB_PORT_NAME, "containerPort": TFJOB_DEFAULT_PORT})
    return copied, TFJOB_DEFAULT_PORT


def _check_master_name(
    obj: Mapping[str, Any], replicas: Mapping[str, TFReplica], counts: Mapping[str, int], add: _Add
) -> None:
    """A Master's pods are named ``<job>-master-<i>``, one character longer than the
    chief's that the StrategyJob loader checks."""
    name = (obj.get("metadata") or {}).get("name")
    chief = replicas.get("chief")
    if not isinstance(name, str) or chief is None or chief.type_name != "master":
        return
    pod_name = f"{name}-master-{max(counts.get('chief', 1) - 1, 0)}"
    if len(pod_name) > MAX_NAME_LENGTH:
        suffix = len(pod_name) - len(name)
        add(
            msg.NAME_TOO_LONG,
            name,
            pod_name=pod_name,
            length=len(pod_name),
            max_length=MAX_NAME_LENGTH - suffix,
        )


def _run_policy_extras(run_policy: Any, add: _Add) -> dict[str, Any]:
    """Take what StrategyJob's ``runPolicy`` lacks out of ``run_policy`` (edited in place)
    and write TFJob's defaults into it: ``cleanPodPolicy: None``, and no backoff limit
    (the int32 maximum) when none is set."""
    if not isinstance(run_policy, dict):
        if run_policy is not None:
            return {}  # the loader reports it
        run_policy = {}
    extras: dict[str, Any] = {"backoff_limit": run_policy.get("backoffLimit")}
    managed_by = run_policy.pop("managedBy", None)
    if managed_by is not None and managed_by not in MANAGED_BY_VALUES:
        add(msg.BAD_MANAGED_BY, managed_by)
    extras["managed_by"] = managed_by if managed_by in MANAGED_BY_VALUES else None
    run_policy.setdefault("cleanPodPolicy", TFJOB_DEFAULT_CLEAN_POD_POLICY)
    if run_policy.get("backoffLimit") is None:
        run_policy["backoffLimit"] = MAX_INT32
    scheduling = run_policy.get("schedulingPolicy")
    if isinstance(scheduling, Mapping):
        scheduling = dict(scheduling)
        run_policy["schedulingPolicy"] = scheduling
        min_resources = scheduling.pop("minResources", None)
        if min_resources is not None and not isinstance(min_resources, Mapping):
            add(
                msg.NOT_A_MAPPING,
                min_resources,
                path="spec.runPolicy.schedulingPolicy.minResources",
            )
            min_resources = None
        extras["min_resources"] = dict(min_resources) if min_resources else None
        timeout = scheduling.pop("scheduleTimeoutSeconds", None)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int)):
            add(
                msg.NOT_AN_INTEGER,
                timeout,
                path="spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds",
                example=60,
            )
            timeout = None
        extras["schedule_timeout_seconds"] = timeout
    return extras
