"""Values of a job's pod templates that the API server cannot decode into a Pod.

The CRD keeps pod templates open (x-kubernetes-preserve-unknown-fields), so a job whose
template holds a quantity that is not one (a CPU limit of ``lots``) is admitted, and its pods
are refused with HTTP 400 and only the parser's regular expression ("quantities must match the
regular expression ..."), no field. These pure functions find the fields in the job's spec, so
that the CreateFailed condition names them: the template is what the user edits."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from strategyjob_operator.kube import ApiError
from strategyjob_operator.quota import parse_quantity

#: The container lists of a pod spec, each container's ``resources`` holding quantities.
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
#: A map key written as ``.key`` in a field path; others (``nvidia.com/gpu``) as ``[key]``.
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _key(path: str, key: str) -> str:
    return f"{path}.{key}" if _PLAIN_KEY.match(key) else f"{path}[{key}]"


def _resource_lists(resources: Any, path: str) -> Iterator[tuple[str, Any]]:
    """The quantities of a ResourceRequirements (``limits``, ``requests``)."""
    for kind in ("limits", "requests"):
        for name, value in _map(_map(resources).get(kind)).items():
            yield _key(f"{path}.{kind}", str(name)), value


def _divisors(items: Any, path: str) -> Iterator[tuple[str, Any]]:
    """The ``resourceFieldRef.divisor`` of downward API items (``path`` is their list)."""
    for i, item in enumerate(_items(items)):
        ref = _map(_map(item).get("resourceFieldRef"))
        if "divisor" in ref:
            yield f"{path}[{i}].resourceFieldRef.divisor", ref["divisor"]


def pod_spec_quantities(spec: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every quantity field of the pod spec ``spec`` (at ``path``), with its value: the
    containers' resources and downward-API divisors, the pod's resources and overhead, and the
    volumes' emptyDir size limit, ephemeral claim resources and downward-API divisors."""
    spec = _map(spec)
    for group in _CONTAINER_LISTS:
        for i, container in enumerate(_items(spec.get(group))):
            at = f"{path}.{group}[{i}]"
            yield from _resource_lists(_map(container).get("resources"), f"{at}.resources")
            for j, env in enumerate(_items(_map(container).get("env"))):
                ref = _map(_map(_map(env).get("valueFrom")).get("resourceFieldRef"))
                if "divisor" in ref:
                    yield f"{at}.env[{j}].valueFrom.resourceFieldRef.divisor", ref["divisor"]
    yield from _resource_lists(spec.get("resources"), f"{path}.resources")
    for name, value in _map(spec.get("overhead")).items():
        yield _key(f"{path}.overhead", str(name)), value
    for i, volume in enumerate(_items(spec.get("volumes"))):
        at, volume = f"{path}.volumes[{i}]", _map(volume)
        empty_dir = _map(volume.get("emptyDir"))
        if "sizeLimit" in empty_dir:
            yield f"{at}.emptyDir.sizeLimit", empty_dir["sizeLimit"]
        claim = _map(_map(_map(volume.get("ephemeral")).get("volumeClaimTemplate")).get("spec"))
        claim_at = f"{at}.ephemeral.volumeClaimTemplate.spec.resources"
        yield from _resource_lists(claim.get("resources"), claim_at)
        downward = _map(volume.get("downwardAPI")).get("items")
        yield from _divisors(downward, f"{at}.downwardAPI.items")
        for k, source in enumerate(_items(_map(volume.get("projected")).get("sources"))):
            items = _map(_map(source).get("downwardAPI")).get("items")
            yield from _divisors(items, f"{at}.projected.sources[{k}].downwardAPI.items")


#: The map of replica specs in a StrategyJob's spec and in a Kubeflow TFJob's, with the path of
#: one replica type in each, as the API server writes it: a StrategyJob's types are fields, a
#: TFJob's the keys of a map.
REPLICA_KEYS = {"replicaSpecs": "spec.replicaSpecs.{}", "tfReplicaSpecs": "spec.tfReplicaSpecs[{}]"}


def bad_quantities(job_spec: Mapping[str, Any], replicas_key: str | None = None) -> list[str]:
    """Each quantity of the job's pod templates that the API server cannot parse, as
    ``<field>: "<value>" is not a quantity``, in the order of the spec. ``replicas_key`` names
    the map of replica specs; None: whichever of :data:`REPLICA_KEYS` the spec has."""
    if replicas_key is None:
        replicas_key = next((k for k in REPLICA_KEYS if k in job_spec), "replicaSpecs")
    found = []
    replica_path = REPLICA_KEYS.get(replicas_key, f"spec.{replicas_key}.{{}}")
    for rtype, replica in _map(job_spec.get(replicas_key)).items():
        pod_spec = _map(_map(replica).get("template")).get("spec")
        at = f"{replica_path.format(rtype)}.template.spec"
        for field, value in pod_spec_quantities(pod_spec, at):
            if value is not None and parse_quantity(value) is None:
                found.append(f"{field}: {json.dumps(value)} is not a quantity")
    return found


def naming_fields(
    error: Exception, job_spec: Mapping[str, Any], replicas_key: str | None = None
) -> Exception:
    """``error``, a refused pod creation, with the template fields the API server could not
    decode named first (HTTP 400: it names none), and what to write instead; any other error
    is returned as it is. ``replicas_key`` as in :func:`bad_quantities`."""
    if not isinstance(error, ApiError) or error.status != 400:
        return error
    fields = bad_quantities(job_spec, replicas_key)
    if not fields:
        return error
    detail = (
        f"{'; '.join(fields)}: write a number with an optional suffix, e.g. 500m, 2 or 1.5Gi "
        f"(the API server: {error.detail})"
    )
    return ApiError(error.status, error.method, error.path, json.dumps({"message": detail}))
