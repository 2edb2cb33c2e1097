"""The environment a kubelet gives a container, computed from the pod as the API server
serves it: ``envFrom``, then ``env`` in order, each ``$(VAR)`` expanded against what the pod
declared before it (``$$`` is a literal ``$``), with ``valueFrom`` field, resource, ConfigMap
and Secret references. The integration tests read it to check what a container will see
(``TF_CONFIG`` as a reference to the job's ConfigMap) without a node; the kind tests show
real kubelets agree."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")

Lookup = Callable[[str, str, str], dict[str, str] | None]
"""``lookup(kind, namespace, name)``: a ConfigMap's or Secret's data (decoded), or None."""


class ConfigError(Exception):
    """The container could not start (the kubelet's CreateContainerConfigError)."""


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of an env value (the kubelet's
    ``third_party/forked/golang/expansion.Expand``), written out character by character:
    ``$$`` gives ``$``; ``$(NAME)`` gives NAME's value when it is defined, else stays as
    written; ``$(`` without a closing parenthesis, and ``$`` before anything else, stay."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        rest = text[i + 1 :]
        if rest[0] == "$":
            out.append("$")
            i += 2
        elif rest[0] == "(":
            close = rest.find(")")
            if close == -1:
                out.append("$(")
                i += 2
            else:
                name = rest[1:close]
                out.append(variables.get(name, f"$({name})"))
                i += 1 + close + 1
        else:
            out.append("$" + rest[0])
            i += 2
    return "".join(out)


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``128Mi``, ``1G``) as a number."""
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not m or m.group(2) not in ("", *suffixes):
        raise ConfigError(f"cannot parse the quantity {text!r}")
    return float(m.group(1)) * suffixes.get(m.group(2), 1)


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    if m := _FIELD_LABEL.match(path):
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
    }
    if path not in values:
        raise ConfigError(f"fieldRef {path!r} is not modelled here")
    return str(values[path] or "")


def _resource(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name) or (resources.get("limits") or {}).get(name)
    quantity = parse_quantity(value if value is not None else "0")
    return str(math.ceil(quantity / parse_quantity(ref.get("divisor") or "1")))


def _keyed(lookup: Lookup, kind: str, namespace: str, ref: Mapping[str, Any]) -> str | None:
    data = lookup(kind, namespace, ref["name"])
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = (
            f"key {ref['key']!r} of {kind} {ref['name']!r}" if data else f"{kind} {ref['name']!r}"
        )
        raise ConfigError(f"{what} not found")
    return data[ref["key"]]


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], lookup: Lookup
) -> dict[str, str]:
    """The variables the pod declares for ``container`` (not the image's own)."""
    namespace = pod["metadata"]["namespace"]
    declared: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if ref := source.get(key):
                data = lookup(kind, namespace, ref["name"])
                if data is None and not ref.get("optional"):
                    raise ConfigError(f"{kind} {ref['name']!r} not found")
                for k, v in (data or {}).items():
                    declared[source.get("prefix", "") + k] = v
    for entry in container.get("env") or []:
        name, source = entry["name"], entry.get("valueFrom")
        if source is None:
            declared[name] = expand(str(entry.get("value", "")), declared)
        elif "fieldRef" in source:
            declared[name] = _field(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            declared[name] = _resource(container, source["resourceFieldRef"])
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "configmap" if "configMapKeyRef" in source else "secret"
            ref = source.get("configMapKeyRef") or source["secretKeyRef"]
            if (value := _keyed(lookup, kind, namespace, ref)) is not None:
                declared[name] = value
        else:
            raise ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return declared
