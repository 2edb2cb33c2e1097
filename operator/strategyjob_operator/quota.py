"""Whether a gang's pods fit the namespace's ResourceQuotas, from plain data.

A quota admits pods one at a time, so a job whose pods are created one by one can get some of
them and be refused the rest: several gang jobs in one namespace then each hold part of the
quota and none can start. Like Kueue's admission, the operator creates a gang's pods only when
the room every quota has left (``status.hard - status.used``) holds all of them; this module
computes that room and what a pod is charged, as the API server's ResourceQuota admission
does: ``pods`` and ``count/pods``; ``cpu``/``requests.cpu``, ``limits.cpu``, the same for
``memory`` and ``ephemeral-storage``; ``requests.<name>`` for hugepages and extended resources
(GPUs); a pod's requests are the larger of its containers' sum (with sidecars) and its
largest init container, a container's unset request defaults to its limit, and pod-level
``resources`` win for cpu and memory. Scopes honoured: ``Terminating``, ``NotTerminating``,
``BestEffort``, ``NotBestEffort``, ``PriorityClass`` and ``CrossNamespacePodAffinity``
(``scopes`` and ``scopeSelector``); a scope this module does not know never matches (the API
server still enforces the quota, and the operator undoes a creation it refuses part-way). Not
seen: what a LimitRange fills in and a RuntimeClass's pod overhead (both added at admission).
Also whether a quota's update freed room (:func:`quota_freed`), which wakes the gangs waiting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

#: The reason of the CreateFailed condition and Event of a gang that waits for quota.
REASON_WAITING_FOR_QUOTA = "WaitingForQuota"

_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes quantity (``"500m"``, ``"2Gi"``, ``"1e3"``, ``4``) as an exact number;
    None when it is not one (the API server refuses such a pod; a quota cannot hold one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Fraction(value)
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value.strip())
    if m is None:
        return None
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIXES.get(suffix, Fraction(1))


_BINARY = (("Ei", 1024**6), ("Pi", 1024**5), ("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2))
_BYTES = ("memory", "storage", "hugepages")


def format_quantity(resource: str, value: Fraction) -> str:
    """``value`` as a quantity people read: ``8``, ``1500m``, ``16Gi`` (binary suffixes only
    for byte counts)."""
    if value.denominator == 1:
        n = int(value)
        if any(b in resource for b in _BYTES):
            for suffix, size in _BINARY:
                if n >= size and n % size == 0:
                    return f"{n // size}{suffix}"
        return str(n)
    millis = value * 1000
    if millis.denominator == 1:
        return f"{int(millis)}m"
    return f"{float(value):.3g}"


_NATIVE = ("cpu", "memory", "ephemeral-storage")
_POD_LEVEL = ("cpu", "memory")  # what pod-level resources may set


def _resources(obj: Any, kind: str) -> dict[str, Fraction]:
    """The container's (or pod's) ``resources.<kind>``, parsed; requests default to limits."""
    if not isinstance(obj, Mapping):
        return {}
    res = obj.get("resources")
    if not isinstance(res, Mapping):
        return {}
    out: dict[str, Fraction] = {}
    kinds = ("limits",) if kind == "limits" else ("limits", "requests")  # requests win
    for k in kinds:
        values = res.get(k)
        if isinstance(values, Mapping):
            for name, raw in values.items():
                q = parse_quantity(raw)
                if q is not None:
                    out[str(name)] = q
    return out


def _add(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> dict[str, Fraction]:
    return {k: a.get(k, Fraction(0)) + b.get(k, Fraction(0)) for k in a.keys() | b.keys()}


def _max(a: Mapping[str, Fraction], b: Mapping[str, Fraction]) -> dict[str, Fraction]:
    return {k: max(a.get(k, Fraction(0)), b.get(k, Fraction(0))) for k in a.keys() | b.keys()}


def _list(value: Any) -> list[Any]:
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, list) else []


def pod_totals(pod_spec: Mapping[str, Any], kind: str) -> dict[str, Fraction]:
    """The pod's effective ``requests`` or ``limits``: its containers' sum plus its sidecars
    (init containers with ``restartPolicy: Always``), or its largest init container (with the
    sidecars started before it) if more; pod-level ``resources`` win for cpu and memory."""
    total: dict[str, Fraction] = {}
    for container in _list(pod_spec.get("containers")):
        total = _add(total, _resources(container, kind))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in _list(pod_spec.get("initContainers")):
        own = _resources(container, kind)
        if container.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, own)
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _add(own, sidecars))
    total = _max(_add(total, sidecars), init_peak)
    for name, q in _resources(pod_spec, kind).items():
        if name in _POD_LEVEL:
            total[name] = q
    return total


def _extended_or_hugepages(name: str) -> bool:
    if name.startswith("hugepages-"):
        return True
    return "/" in name and not name.startswith(("kubernetes.io/", "requests."))


def pod_usage(pod_spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """What creating one pod with ``pod_spec`` charges, by the names quotas use
    (``pods``, ``requests.cpu``, ``cpu``, ``limits.memory``, ``requests.nvidia.com/gpu``)."""
    usage = {"pods": Fraction(1), "count/pods": Fraction(1)}
    for name, q in pod_totals(pod_spec, "requests").items():
        if name in _NATIVE:
            usage[name] = usage[f"requests.{name}"] = q
        elif _extended_or_hugepages(name):
            usage[f"requests.{name}"] = q
    for name, q in pod_totals(pod_spec, "limits").items():
        if name in _NATIVE:
            usage[f"limits.{name}"] = q
    return usage


def _best_effort(pod_spec: Mapping[str, Any]) -> bool:
    """No container (nor the pod) requests or limits cpu or memory: QoS class BestEffort."""
    holders = [pod_spec, *_list(pod_spec.get("containers")), *_list(pod_spec.get("initContainers"))]
    for holder in holders:
        for kind in ("requests", "limits"):
            if any(name in _POD_LEVEL for name in _resources(holder, kind)):
                return False
    return True


def _cross_namespace_affinity(pod_spec: Mapping[str, Any]) -> bool:
    affinity = pod_spec.get("affinity")
    if not isinstance(affinity, Mapping):
        return False
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind)
        if not isinstance(rules, Mapping):
            continue
        terms = _list(rules.get("requiredDuringSchedulingIgnoredDuringExecution"))
        terms += [
            t.get("podAffinityTerm")
            for t in _list(rules.get("preferredDuringSchedulingIgnoredDuringExecution"))
            if isinstance(t.get("podAffinityTerm"), Mapping)
        ]
        if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms):
            return True
    return False


def _scope_holds(scope: str, pod_spec: Mapping[str, Any]) -> bool | None:
    """Whether the pod is in ``scope`` (operator ``Exists``); None for a scope not known here."""
    deadline = pod_spec.get("activeDeadlineSeconds")
    terminating = isinstance(deadline, int) and not isinstance(deadline, bool) and deadline >= 0
    if scope == "Terminating":
        return terminating
    if scope == "NotTerminating":
        return not terminating
    if scope == "BestEffort":
        return _best_effort(pod_spec)
    if scope == "NotBestEffort":
        return not _best_effort(pod_spec)
    if scope == "PriorityClass":
        return bool(pod_spec.get("priorityClassName"))
    if scope == "CrossNamespacePodAffinity":
        return _cross_namespace_affinity(pod_spec)
    return None


def _expression_holds(expr: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    scope, op = str(expr.get("scopeName", "")), expr.get("operator")
    values = expr.get("values") or []
    if scope == "PriorityClass" and op in ("In", "NotIn"):
        inside = (pod_spec.get("priorityClassName") or "") in values
        return inside if op == "In" else not inside
    holds = _scope_holds(scope, pod_spec)
    if holds is None:
        return False
    return holds if op != "DoesNotExist" else not holds


def quota_matches(quota: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """Whether the quota counts a pod with ``pod_spec``: every scope and every expression of
    its ``scopeSelector`` holds (no scope: every pod)."""
    spec = quota.get("spec") or {}
    scopes = spec.get("scopes") or []
    selector = spec.get("scopeSelector") or {}
    expressions = _list(selector.get("matchExpressions") if isinstance(selector, Mapping) else [])
    if not all(_scope_holds(str(s), pod_spec) for s in scopes):
        return False
    return all(_expression_holds(e, pod_spec) for e in expressions)


@dataclass(frozen=True)
class Shortfall:
    """One resource of one quota that cannot hold the gang."""

    quota: str
    resource: str
    needed: Fraction
    left: Fraction

    def __str__(self) -> str:
        left = max(self.left, Fraction(0))
        return (
            f"needs {self.resource} {format_quantity(self.resource, self.needed)}, "
            f"{format_quantity(self.resource, left)} left in quota {self.quota}"
        )


def _quantities(values: Any) -> dict[str, Fraction]:
    if not isinstance(values, Mapping):
        return {}
    return {str(k): q for k, v in values.items() if (q := parse_quantity(v)) is not None}


def quota_room(quota_obj: Mapping[str, Any]) -> dict[str, Any]:
    """What of a ResourceQuota decides the room it has (its limits, usage and scopes), as
    plain data: what the operator keeps of each quota it watches to see what an update
    changed (the watch's events carry only the new object)."""
    spec = quota_obj.get("spec") or {}
    status = quota_obj.get("status") or {}
    return {
        "hard": _quantities(status.get("hard")) or _quantities(spec.get("hard")),
        "used": _quantities(status.get("used")),
        "scopes": (spec.get("scopes"), spec.get("scopeSelector")),
    }


def quota_freed(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> bool:
    """Whether a quota's update (:func:`quota_room` of it ``before`` and ``after``; None: not
    seen yet, or deleted) may let a gang that waits for quota in: the usage of a resource went
    down (the quota controller's update after pods went), a limit went up or away, its scopes
    changed, or the quota was deleted. A quota seen for the first time, more usage, and any
    other update (labels, the controller's resync) free nothing: no job is woken for them."""
    if before is None:
        return False
    if after is None:
        return True
    zero = Fraction(0)
    used, hard = after["used"], after["hard"]
    return (
        any(used.get(name, zero) < q for name, q in before["used"].items())
        or any(name not in hard or hard[name] > q for name, q in before["hard"].items())
        or before["scopes"] != after["scopes"]
    )


def shortfalls(
    quotas: Iterable[Mapping[str, Any]], pods: Iterable[tuple[Mapping[str, Any], int]]
) -> list[Shortfall]:
    """The quota resources that cannot hold all of ``pods`` (``(pod spec, how many)``) at
    once, by quota then resource; empty when the gang fits. A quota's room is its
    ``status.hard`` (``spec.hard`` before the quota controller filled it in) less its
    ``status.used``; a resource the gang does not use never stops it (an over-used quota
    on memory does not stop a gang that asks none)."""
    gang = [(spec, count, pod_usage(spec)) for spec, count in pods if count > 0]
    out: list[Shortfall] = []
    for quota in quotas:
        meta = quota.get("metadata") or {}
        room = quota_room(quota)
        hard, used = room["hard"], room["used"]
        needed: dict[str, Fraction] = {}
        for spec, count, usage in gang:
            if not quota_matches(quota, spec):
                continue
            for name, q in usage.items():
                if name in hard:
                    needed[name] = needed.get(name, Fraction(0)) + q * count
        for name in sorted(needed):
            left = hard[name] - used.get(name, Fraction(0))
            if needed[name] > 0 and needed[name] > left:
                out.append(Shortfall(str(meta.get("name", "?")), name, needed[name], left))
    return sorted(out, key=lambda s: (s.quota, s.resource))


#: How many shortfalls the message names.
SHORTFALLS_NAMED = 3


def waiting_message(found: Sequence[Shortfall]) -> str:
    """One line: ``waiting for quota: needs cpu 8, 3 left in quota team; ...``."""
    named = "; ".join(str(s) for s in found[:SHORTFALLS_NAMED])
    if len(found) > SHORTFALLS_NAMED:
        named += f"; and {len(found) - SHORTFALLS_NAMED} more"
    return f"waiting for quota: {named}"
