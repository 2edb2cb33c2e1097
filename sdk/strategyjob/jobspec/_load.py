"""Parse and validate a StrategyJob manifest, collecting every problem at once."""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from strategyjob.jobspec import _messages as msg
from strategyjob.jobspec._env import (
    SERVICE_ACCOUNT_SUFFIX,
    TOKEN_SECRET_SUFFIX,
    is_service_account_name,
    is_token_secret_name,
    service_account_name,
    token_secret_name,
)
from strategyjob.jobspec._image import image_problem
from strategyjob.jobspec._k8s_fields import (
    CONTAINER_FIELDS,
    POD_SPEC_FIELDS,
    POD_TEMPLATE_FIELDS,
)
from strategyjob.jobspec._labels import label_problem
from strategyjob.jobspec._model import (
    API_VERSION,
    CLEAN_POD_POLICIES,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_CLEAN_POD_POLICY,
    DEFAULT_NAMESPACE,
    DEFAULT_PORT,
    DEFAULT_REPLICAS,
    DEFAULT_RESTART_POLICY,
    KIND,
    MAX_CONTAINERS,
    MAX_ENV,
    MAX_ENV_FROM,
    MAX_INT32,
    MAX_NAME_LENGTH,
    MAX_PROJECTED_SOURCES,
    MAX_REFERENCE_LENGTH,
    MAX_REPLICAS,
    MAX_TOTAL_REPLICAS,
    MAX_VOLUMES,
    PORT_PROTOCOLS,
    REPLICA_TYPES,
    RESTART_POLICIES,
    SINGLE_PROCESS_STRATEGIES,
    STRATEGIES,
    SUCCESS_POLICIES,
    ManifestError,
    ReplicaSpec,
    RunPolicy,
    SchedulingPolicy,
    StrategyJob,
    max_name_length,
)

_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

_TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
_SPEC_FIELDS = ("strategy", "replicaSpecs", "runPolicy", "successPolicy", "port")
_REPLICA_FIELDS = ("replicas", "minReplicas", "maxReplicas", "template", "restartPolicy")
_RUN_POLICY_FIELDS = (
    "backoffLimit",
    "activeDeadlineSeconds",
    "pendingTimeoutSeconds",
    "rendezvousTimeoutSeconds",
    "ttlSecondsAfterFinished",
    "cleanPodPolicy",
    "suspend",
    "schedulingPolicy",
)
_SCHEDULING_FIELDS = ("minAvailable", "queue", "priorityClass")
_MISSING = object()
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_./-]{1,63}$")


def _key(key: Any) -> str:
    """A mapping key as a path segment: as written when plain, else quoted, so a path
    stays one short line whatever the key holds (newlines, long text)."""
    text = str(key)
    return text if _PLAIN_KEY.fullmatch(text) else msg.format_value(text)


class _Checker:
    """Collects problems while reading typed fields out of plain mappings."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, template: str, value: Any = None, **fields: Any) -> None:
        self.problems.append(template.format(value=msg.format_value(value), **fields))

    def mapping(self, path: str, value: Any, known: Sequence[str] | None) -> Mapping[str, Any]:
        """``value`` as a mapping (``{}`` when absent or wrong), reporting unknown fields."""
        if value is None or value is _MISSING:
            return {}
        if not isinstance(value, Mapping):
            self.add(msg.NOT_A_MAPPING, value, path=path)
            return {}
        if known is not None:
            for key in value:
                if key not in known:
                    field_path = f"{path}.{_key(key)}" if path else _key(key)
                    self.add(msg.UNKNOWN_FIELD, key, path=field_path, known=", ".join(known))
        return value

    def k8s_fields(
        self, path: str, value: Mapping[str, Any], known: Sequence[str], kind: str, explain: str
    ) -> None:
        """Report each field of ``value`` that a Kubernetes ``kind`` does not have, with the
        one it most likely meant: its fields are too many to list in a line."""
        for key in value:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" Did you mean {close[0]}?" if close else ""
                self.add(
                    msg.UNKNOWN_K8S_FIELD,
                    key,
                    path=f"{path}.{_key(key)}",
                    kind=kind,
                    hint=hint,
                    explain=explain,
                )

    def integer(
        self,
        path: str,
        value: Any,
        default: int | None,
        minimum: int | None = None,
        maximum: int | None = None,
        example: int | None = None,
    ) -> int | None:
        if value is None or value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(msg.NOT_AN_INTEGER, value, path=path, example=example or default or 1)
            return default
        if minimum is not None and value < minimum:
            self.add(msg.INTEGER_TOO_SMALL, value, path=path, minimum=minimum)
        elif maximum is not None and value > maximum:
            self.add(msg.INTEGER_TOO_LARGE, value, path=path, maximum=maximum)
        return value

    def boolean(self, path: str, value: Any, default: bool) -> bool:
        if value is None or value is _MISSING:
            return default
        if not isinstance(value, bool):
            self.add(msg.NOT_A_BOOLEAN, value, path=path)
            return default
        return value

    def string(
        self, path: str, value: Any, example: str, max_length: int | None = None
    ) -> str | None:
        if value is None or value is _MISSING:
            return None
        if not isinstance(value, str):
            self.add(msg.NOT_A_STRING, value, path=path, example=example)
            return None
        if max_length is not None and len(value) > max_length:
            # characters, as the API server counts a CRD's maxLength (runes)
            self.add(msg.STRING_TOO_LONG, value, path=path, maximum=max_length, length=len(value))
            return None
        return value

    def name(self, path: str, value: Any, example: str) -> str | None:
        """The name of another object (a Secret, a ServiceAccount), which the CRD types as
        a string of at most :data:`MAX_REFERENCE_LENGTH` characters."""
        return self.string(path, value, example, MAX_REFERENCE_LENGTH)

    def entries(
        self, path: str, value: Any, example: str, maximum: int | None = None
    ) -> list[Mapping[str, Any]]:
        """A list of mappings, of at most ``maximum`` entries (the CRD's ``maxItems``): the
        entries that are mappings (a wrong one reported), ``[]`` when absent or wrong."""
        items = self.sequence(path, value, example, maximum)
        out: list[Mapping[str, Any]] = []
        for i, item in enumerate(items):
            if isinstance(item, Mapping):
                out.append(item)
            else:
                self.add(msg.NOT_A_MAPPING, item, path=f"{path}[{i}]")
                out.append({})
        return out

    def string_map(self, path: str, value: Any) -> dict[str, str]:
        """Labels or annotations: a mapping of strings to strings (``{}`` when absent)."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(msg.NOT_A_MAPPING, value, path=path)
            return {}
        out: dict[str, str] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.add(msg.NOT_A_STRING, key, path=f"{path}.{_key(key)}", example=str(key))
            elif not isinstance(item, str):
                example = _scalar_text(item)
                self.add(msg.NOT_A_STRING, item, path=f"{path}.{_key(key)}", example=example)
            else:
                out[key] = item
        return out

    def sequence(
        self, path: str, value: Any, example: str, maximum: int | None = None
    ) -> list[Any]:
        """``value`` as a list (``[]`` when absent or wrong, reported), of at most
        ``maximum`` entries (the CRD's ``maxItems``)."""
        if value is None:
            return []
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
            self.add(msg.NOT_A_LIST, value, path=path, example=example)
            return []
        if maximum is not None and len(value) > maximum:
            self.add(msg.TOO_MANY_ITEMS, len(value), path=path, maximum=maximum)
        return list(value)

    def one_of(self, path: str, value: Any, allowed: Sequence[str], default: str) -> str:
        if value is None or value is _MISSING:
            return default
        if value not in allowed:
            shown = ", ".join(repr(a) if a == "" else a for a in allowed)
            self.add(msg.NOT_ONE_OF, value, path=path, allowed=shown)
            return default
        return str(value)  # one of ``allowed``: already a str


def load_manifest(obj: Any) -> StrategyJob:
    """Parse and validate a StrategyJob manifest (the dict of a YAML document or an
    API object). Raises :class:`ManifestError` listing every problem found."""
    return _load(obj, _Checker(), topology=True)


def load_translated(obj: Any, paths: Mapping[str, str], problems: Sequence[str]) -> StrategyJob:
    """Validate a StrategyJob manifest translated from another kind of job (a TFJob), which
    has its own topology rules: the per-strategy replica rules are left out, and each
    problem's leading path is written back as the source names it (``paths``: translated
    prefix, e.g. ``spec.replicaSpecs.chief``, to the source's, ``spec.tfReplicaSpecs.Master``;
    longest first). ``problems`` (the source's own) come first in the one error raised."""
    check = _Checker()
    check.problems.extend(problems)
    try:
        return _load(obj, check, topology=False)
    except ManifestError as e:
        raise ManifestError([_renamed(p, paths) for p in e.problems]) from None


def _renamed(problem: str, paths: Mapping[str, str]) -> str:
    path, sep, rest = problem.partition(": ")
    for translated in sorted(paths, key=len, reverse=True):
        if path == translated or path.startswith((translated + ".", translated + "[")):
            return paths[translated] + path[len(translated) :] + sep + rest
    return problem


def _load(obj: Any, check: _Checker, *, topology: bool) -> StrategyJob:
    if not isinstance(obj, Mapping):
        check.add(msg.NOT_A_MANIFEST, obj)
        raise ManifestError(check.problems)
    check.mapping("", obj, _TOP_LEVEL_FIELDS)
    if obj.get("apiVersion") != API_VERSION:
        check.add(msg.BAD_API_VERSION, obj.get("apiVersion"))
    if obj.get("kind") != KIND:
        check.add(msg.BAD_KIND, obj.get("kind"))

    metadata = check.mapping("metadata", obj.get("metadata"), None)
    name = _read_name(check, metadata)
    labels = check.string_map("metadata.labels", metadata.get("labels"))
    for key, value in labels.items():
        reason = label_problem(key, value)
        if reason is not None:
            check.add(msg.INVALID_LABEL, {key: value}, path="metadata.labels", reason=reason)
    annotations = check.string_map("metadata.annotations", metadata.get("annotations"))
    namespace = metadata.get("namespace") or DEFAULT_NAMESPACE
    if not isinstance(namespace, str) or not _DNS_1123_LABEL.fullmatch(namespace):
        check.add(msg.BAD_NAMESPACE, namespace)

    if obj.get("spec") is None:
        check.add(msg.MISSING_SPEC, obj.get("spec"))
        raise ManifestError(check.problems)
    spec = check.mapping("spec", obj.get("spec"), _SPEC_FIELDS)
    strategy = _read_strategy(check, spec)
    before = len(check.problems)
    replica_specs = _read_replica_specs(check, spec.get("replicaSpecs"))
    counts_ok = not any(".replicas:" in p for p in check.problems[before:])
    run_policy = _read_run_policy(check, spec.get("runPolicy"))
    success_policy = check.one_of(
        "spec.successPolicy", spec.get("successPolicy"), SUCCESS_POLICIES, ""
    )
    port = check.integer("spec.port", spec.get("port"), DEFAULT_PORT, 1, 65535)

    if topology and strategy is not None and replica_specs and counts_ok:
        _check_topology(check, strategy, replica_specs)
    if name is not None and replica_specs:
        _check_name_length(check, name, replica_specs)
    if replica_specs and counts_ok:
        _check_job_size(check, name, replica_specs)
    _check_token_secret_refs(check, name, metadata.get("uid"), replica_specs)
    _check_service_account_refs(check, name, replica_specs)
    total = sum(r.replicas for r in replica_specs.values())
    min_available = run_policy.scheduling_policy.min_available
    if min_available is not None and replica_specs and min_available > total:
        check.add(msg.MIN_AVAILABLE_TOO_LARGE, min_available, total=total)

    if check.problems:
        raise ManifestError(check.problems)
    assert name is not None and strategy is not None and port is not None
    return StrategyJob(
        name=name,
        namespace=namespace,
        strategy=strategy,
        replica_specs=replica_specs,
        run_policy=run_policy,
        success_policy=success_policy,
        port=port,
        labels=labels,
        annotations=annotations,
    )


def read_manifest_file(path: str | os.PathLike[str]) -> object:
    """Read the one YAML (or JSON) document of a manifest file without validating it, for
    callers that let the API server judge it (``strategyjob submit``). A missing or
    unreadable file, invalid YAML, or not exactly one document raises :class:`ManifestError`
    naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(
            [f"{path}: no such file. Check the path of the StrategyJob manifest."], str(path)
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError([f"{path}: cannot read the manifest ({e})."], str(path)) from None
    return read_manifest_text(text, str(path))


def read_manifest_text(text: str, source: str = "manifest") -> object:
    """Parse the one YAML document of a manifest without validating it; problems name
    ``source`` (a file name, or ``manifest`` for a string). The document may be any YAML
    value (a list, a scalar): callers check that it is a mapping."""
    import yaml  # local: only reading YAML needs PyYAML

    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        where = ""
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ManifestError(
            [f"{source}: invalid YAML{where}: {problem}. Fix the YAML syntax."], source
        ) from None
    if len(documents) != 1:
        raise ManifestError(
            [
                f"{source}: expected one YAML document with a StrategyJob "
                f"(got {len(documents)}). Put one StrategyJob in the file."
            ],
            source,
        )
    return documents[0]


def load_manifest_file(path: str | Path) -> StrategyJob:
    """Read a YAML (or JSON) manifest file and validate it. A missing or unreadable
    file, or invalid YAML, raises :class:`ManifestError` naming the file."""
    path = Path(path)
    document = read_manifest_file(path)
    try:
        return load_manifest(document)
    except ManifestError as e:
        raise ManifestError([f"{path}: {p}" for p in e.problems], str(path)) from None


def _read_name(check: _Checker, metadata: Mapping[str, Any]) -> str | None:
    name = metadata.get("name")
    if not name:
        check.add(msg.MISSING_NAME, name)
        return None
    if not isinstance(name, str) or not _DNS_1035_LABEL.fullmatch(name):
        check.add(msg.BAD_NAME, name)
        return None
    return name


def _read_strategy(check: _Checker, spec: Mapping[str, Any]) -> str | None:
    strategy = spec.get("strategy")
    allowed = ", ".join(STRATEGIES)
    if strategy is None or strategy == "":
        check.add(msg.MISSING_STRATEGY, strategy, allowed=allowed)
        return None
    if strategy not in STRATEGIES:
        check.add(msg.UNKNOWN_STRATEGY, strategy, allowed=allowed)
        return None
    return str(strategy)  # one of STRATEGIES: already a str


def _read_replica_specs(check: _Checker, raw: Any) -> dict[str, ReplicaSpec]:
    if raw is not None and not isinstance(raw, Mapping):
        check.add(msg.NOT_A_MAPPING, raw, path="spec.replicaSpecs")
        return {}
    if not raw:
        check.add(msg.MISSING_REPLICA_SPECS, raw)
        return {}
    for key in raw:
        if key not in REPLICA_TYPES:
            lower = str(key).lower()
            hint = f" (write {lower!r} in lowercase)" if lower in REPLICA_TYPES else ""
            if lower == "master":
                hint = " (a TFJob Master is a chief here)"
            check.add(msg.UNKNOWN_REPLICA_TYPE, key, replica_type=_key(key), hint=hint)
    specs: dict[str, ReplicaSpec] = {}
    for replica_type in REPLICA_TYPES:
        if replica_type not in raw:
            continue
        path = f"spec.replicaSpecs.{replica_type}"
        fields = check.mapping(path, raw[replica_type], _REPLICA_FIELDS)
        replicas = check.integer(
            f"{path}.replicas",
            fields.get("replicas"),
            DEFAULT_REPLICAS,
            minimum=0,
            maximum=MAX_REPLICAS,
        )
        restart_policy = check.one_of(
            f"{path}.restartPolicy",
            fields.get("restartPolicy"),
            RESTART_POLICIES,
            DEFAULT_RESTART_POLICY,
        )
        template = _read_template(check, replica_type, fields.get("template"))
        count = min(max(replicas or 0, 0), MAX_REPLICAS)
        low, high = _read_bounds(check, replica_type, fields, count)
        specs[replica_type] = ReplicaSpec(
            replicas=count,
            template=template,
            restart_policy=restart_policy,
            min_replicas=low,
            max_replicas=high,
        )
    return specs


def _read_bounds(
    check: _Checker, replica_type: str, fields: Mapping[str, Any], replicas: int
) -> tuple[int | None, int | None]:
    """``minReplicas``/``maxReplicas``: what a resize may ask for, on the workers only."""
    path = f"spec.replicaSpecs.{replica_type}"
    low, high = (
        check.integer(f"{path}.{key}", fields.get(key), None, minimum=0, maximum=MAX_REPLICAS)
        for key in ("minReplicas", "maxReplicas")
    )
    if low is None and high is None:
        return None, None
    if replica_type != "worker":
        given = {k: fields[k] for k in ("minReplicas", "maxReplicas") if k in fields}
        check.add(msg.BOUNDS_NOT_WORKER, given, replica_type=replica_type)
    elif low is not None and high is not None and low > high:
        check.add(msg.BOUNDS_CROSSED, {"minReplicas": low, "maxReplicas": high})
    elif low is not None and replicas < low:
        check.add(msg.BELOW_MIN_REPLICAS, replicas, minimum=low)
    elif high is not None and replicas > high:
        check.add(msg.ABOVE_MAX_REPLICAS, replicas, maximum=high)
    return low, high


def _read_template(check: _Checker, replica_type: str, raw: Any) -> dict[str, Any]:
    path = f"spec.replicaSpecs.{replica_type}.template"
    if raw is None:
        check.add(msg.MISSING_TEMPLATE, raw, replica_type=replica_type)
        return {}
    if not isinstance(raw, Mapping):
        check.add(msg.NOT_A_MAPPING, raw, path=path)
        return {}
    template = raw
    check.k8s_fields(path, template, POD_TEMPLATE_FIELDS, "pod template", "podtemplate.template")
    meta = check.mapping(f"{path}.metadata", template.get("metadata"), None)
    check.string_map(f"{path}.metadata.labels", meta.get("labels"))
    check.string_map(f"{path}.metadata.annotations", meta.get("annotations"))
    pod_spec = check.mapping(f"{path}.spec", template.get("spec"), None)
    check.k8s_fields(f"{path}.spec", pod_spec, POD_SPEC_FIELDS, "pod spec", "pod.spec")
    containers = pod_spec.get("containers")
    if not isinstance(containers, Sequence) or isinstance(containers, str) or not containers:
        check.add(msg.MISSING_CONTAINERS, containers, replica_type=replica_type)
    else:
        _read_containers(check, f"{path}.spec.containers", containers)
    _read_containers(check, f"{path}.spec.initContainers", pod_spec.get("initContainers"))
    _read_pod_references(check, f"{path}.spec", pod_spec)
    return copy.deepcopy(plain(template))


def _read_containers(check: _Checker, path: str, containers: Any) -> None:
    """``containers`` or ``initContainers``: the CRD types both alike (named, with the same
    fields, at most :data:`MAX_CONTAINERS`), so the loader reads both alike."""
    items = check.sequence(path, containers, "- name: strategyjob", MAX_CONTAINERS)
    for index, container in enumerate(items):
        if (
            not isinstance(container, Mapping)
            or not isinstance(container.get("name"), str)
            or not container["name"]
        ):
            check.add(msg.BAD_CONTAINER, container, path=f"{path}[{index}]")
        else:
            explain = f"pod.spec.{path.rpartition('.')[2]}"  # kubectl explain's path
            _read_container(check, f"{path}[{index}]", container, explain)


def _read_pod_references(check: _Checker, path: str, pod_spec: Mapping[str, Any]) -> None:
    """What the CRD types in a pod spec so that its CEL rules can read it within their cost
    budget: ``serviceAccountName``, and ``volumes`` (at most :data:`MAX_VOLUMES`) with their
    Secrets' names and projected sources (at most :data:`MAX_PROJECTED_SOURCES` each), so
    that a template the loader accepts is one the API server admits."""
    check.name(f"{path}.serviceAccountName", pod_spec.get("serviceAccountName"), "my-account")
    volumes = check.entries(f"{path}.volumes", pod_spec.get("volumes"), "- name: data", MAX_VOLUMES)
    for i, volume in enumerate(volumes):
        where = f"{path}.volumes[{i}]"
        secret = check.mapping(f"{where}.secret", volume.get("secret"), None)
        check.name(f"{where}.secret.secretName", secret.get("secretName"), "my-secret")
        projected = check.mapping(f"{where}.projected", volume.get("projected"), None)
        sources = check.entries(
            f"{where}.projected.sources",
            projected.get("sources"),
            "- secret: {name: my-secret}",
            MAX_PROJECTED_SOURCES,
        )
        for j, source in enumerate(sources):
            _read_secret_ref(check, f"{where}.projected.sources[{j}].secret", source.get("secret"))


def _read_secret_ref(check: _Checker, path: str, value: Any) -> None:
    """A reference to a Secret by ``name`` (``secretKeyRef``, ``secretRef``, a projected
    ``secret``), as the CRD types it."""
    ref = check.mapping(path, value, None)
    check.name(f"{path}.name", ref.get("name"), "my-secret")


def _read_container(check: _Checker, path: str, container: Mapping[str, Any], explain: str) -> None:
    """The container fields the operator and ``strategyjob run`` read or extend: command
    and args (lists of strings, never one string split into characters), env and ports
    (lists of mappings), so that a pod built from the template is one the API server takes;
    no field a Kubernetes container lacks (``comand:``), and an image the kubelet can parse."""
    check.k8s_fields(path, container, CONTAINER_FIELDS, "container", explain)
    image = check.string(f"{path}.image", container.get("image"), "python:3.11")
    reason = image_problem(image) if image else None  # none: strategyjob run needs none
    if reason is not None:
        check.add(msg.INVALID_IMAGE, image, path=f"{path}.image", reason=reason)
    for field_name, example in (
        ("command", '["python", "train.py"]'),
        ("args", '["--epochs", "3"]'),
    ):
        parts = container.get(field_name)
        if parts is not None and (
            isinstance(parts, str | bytes | Mapping)
            or not isinstance(parts, Sequence)
            or not all(isinstance(part, str) for part in parts)
        ):
            check.add(msg.NOT_A_STRING_LIST, parts, path=f"{path}.{field_name}", example=example)

    env = check.sequence(f"{path}.env", container.get("env"), "- name: VAR", MAX_ENV)
    for i, entry in enumerate(env):
        where = f"{path}.env[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            check.add(msg.BAD_ENV_ENTRY, entry, path=where)
            continue
        if not entry["name"]:
            check.add(msg.BAD_ENV_ENTRY, entry, path=where)
            continue
        value = entry.get("value")
        if value is not None and not isinstance(value, str):
            check.add(msg.NOT_A_STRING, value, path=f"{where}.value", example=_scalar_text(value))
        value_from = check.mapping(f"{where}.valueFrom", entry.get("valueFrom"), None)
        _read_secret_ref(check, f"{where}.valueFrom.secretKeyRef", value_from.get("secretKeyRef"))

    sources = check.entries(
        f"{path}.envFrom", container.get("envFrom"), "- secretRef: {name: x}", MAX_ENV_FROM
    )
    for i, source in enumerate(sources):
        _read_secret_ref(check, f"{path}.envFrom[{i}].secretRef", source.get("secretRef"))

    ports = check.sequence(f"{path}.ports", container.get("ports"), "- containerPort: 2222")
    for i, entry in enumerate(ports):
        where = f"{path}.ports[{i}]"
        if not isinstance(entry, Mapping) or entry.get("containerPort") is None:
            check.add(msg.BAD_PORT_ENTRY, entry, path=where)
            continue
        check.integer(f"{where}.containerPort", entry["containerPort"], None, 1, 65535, 2222)
        check.string(f"{where}.name", entry.get("name"), "http")
        check.one_of(f"{where}.protocol", entry.get("protocol"), PORT_PROTOCOLS, "TCP")


def _scalar_text(value: Any) -> str:
    """How a scalar reads as the string a user meant (``true`` for True, ``3`` for 3)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return msg.format_value(value)
    return "text"


def _read_run_policy(check: _Checker, raw: Any) -> RunPolicy:
    path = "spec.runPolicy"
    fields = check.mapping(path, raw, _RUN_POLICY_FIELDS)
    scheduling = check.mapping(
        f"{path}.schedulingPolicy", fields.get("schedulingPolicy"), _SCHEDULING_FIELDS
    )
    backoff_limit = check.integer(
        f"{path}.backoffLimit",
        fields.get("backoffLimit"),
        DEFAULT_BACKOFF_LIMIT,
        minimum=0,
        maximum=MAX_INT32,
    )

    def seconds(field: str, minimum: int, example: int) -> int | None:
        """An optional number of seconds of ``runPolicy`` (unset: None)."""
        value = fields.get(field)
        where = f"{path}.{field}"
        return check.integer(
            where, value, None, minimum=minimum, maximum=MAX_INT32, example=example
        )

    return RunPolicy(
        backoff_limit=backoff_limit if backoff_limit is not None else DEFAULT_BACKOFF_LIMIT,
        active_deadline_seconds=seconds("activeDeadlineSeconds", 1, 3600),
        pending_timeout_seconds=seconds("pendingTimeoutSeconds", 1, 600),
        rendezvous_timeout_seconds=seconds("rendezvousTimeoutSeconds", 1, 600),
        ttl_seconds_after_finished=seconds("ttlSecondsAfterFinished", 0, 600),
        clean_pod_policy=check.one_of(
            f"{path}.cleanPodPolicy",
            fields.get("cleanPodPolicy"),
            CLEAN_POD_POLICIES,
            DEFAULT_CLEAN_POD_POLICY,
        ),
        suspend=check.boolean(f"{path}.suspend", fields.get("suspend"), False),
        scheduling_policy=SchedulingPolicy(
            min_available=check.integer(
                f"{path}.schedulingPolicy.minAvailable",
                scheduling.get("minAvailable"),
                None,
                minimum=1,
                maximum=MAX_INT32,
            ),
            queue=check.name(f"{path}.schedulingPolicy.queue", scheduling.get("queue"), "default"),
            priority_class=check.name(
                f"{path}.schedulingPolicy.priorityClass",
                scheduling.get("priorityClass"),
                "high-priority",
            ),
        ),
    )


def _check_topology(check: _Checker, strategy: str, specs: Mapping[str, ReplicaSpec]) -> None:
    """The per-strategy rules on how many replicas of each type a job may have."""
    count = {t: (specs[t].replicas if t in specs else 0) for t in REPLICA_TYPES}
    for replica_type in ("chief", "evaluator"):
        if count[replica_type] > 1:
            check.add(msg.AT_MOST_ONE, count[replica_type], replica_type=replica_type)
    training = count["chief"] + count["worker"]
    shown = {t: count[t] for t in REPLICA_TYPES if t in specs}

    if strategy == "ParameterServerStrategy":
        if count["chief"] == 0:
            check.add(msg.PS_NEEDS_CHIEF, count["chief"])
        if count["worker"] == 0:
            check.add(msg.PS_NEEDS_WORKER, count["worker"])
        if count["ps"] == 0:
            check.add(msg.PS_NEEDS_PS, count["ps"])
        return
    if count["ps"] > 0:
        check.add(msg.TAKES_NO_PS, count["ps"], strategy=strategy)
    if strategy == "TPUStrategy" and count["chief"] > 0:
        check.add(msg.TPU_WORKERS_ONLY, count["chief"])
    if strategy in SINGLE_PROCESS_STRATEGIES:
        if training != 1:
            check.add(msg.SINGLE_PROCESS, shown, strategy=strategy)
    elif training == 0:
        check.add(msg.NEEDS_CHIEF_OR_WORKER, shown, strategy=strategy)


def _check_name_length(check: _Checker, name: str, specs: Mapping[str, ReplicaSpec]) -> None:
    longest = ""
    for replica_type, spec in specs.items():
        if spec.replicas > 0:
            pod_name = f"{name}-{replica_type}-{spec.replicas - 1}"
            if len(pod_name) > len(longest):
                longest = pod_name
    if len(longest) > MAX_NAME_LENGTH:
        suffix = len(longest) - len(name)
        check.add(
            msg.NAME_TOO_LONG,
            name,
            pod_name=longest,
            length=len(longest),
            max_length=MAX_NAME_LENGTH - suffix,
        )


def _check_job_size(check: _Checker, name: str | None, specs: Mapping[str, ReplicaSpec]) -> None:
    """Every replica's TF_CONFIG lists the whole cluster and must fit in one environment
    string (the kernel's 128 KiB): at most :data:`MAX_TOTAL_REPLICAS` replicas, and a name
    short enough for their number (the CRD's rules, in the same words)."""
    total = sum(spec.replicas for spec in specs.values())
    if total > MAX_TOTAL_REPLICAS:
        check.add(msg.TOO_MANY_REPLICAS, total, maximum=MAX_TOTAL_REPLICAS)
    elif name is not None and total > 0 and len(name) > max_name_length(total):
        check.add(
            msg.NAME_TOO_LONG_FOR_REPLICAS, name, total=total, max_length=max_name_length(total)
        )


#: A template naming another job's token Secret (its pods would hold that job's token).
OTHER_JOBS_TOKEN = (
    "{path}: names {value}, the token Secret of another StrategyJob; a job's pods get only "
    "their own token (the operator injects it as STRATEGYJOB_TOKEN). Remove the reference, "
    "or use a Secret whose name does not end in {suffix}."
)


def _secret_names(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(path, name)`` of every Secret a pod spec names: ``secretKeyRef``, ``secretRef``
    (``envFrom``), ``secret`` volumes and projections, ``imagePullSecrets``, volume
    drivers' ``*SecretRef`` and ``secretName``: any field whose name says ``secret``."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{_key(key)}"
            if "secret" in str(key).lower():
                if isinstance(item, str) and str(key).endswith("Name"):
                    yield where, item
                refs = item if isinstance(item, list) else [item]
                for i, ref in enumerate(refs):
                    at = f"{where}[{i}]" if isinstance(item, list) else where
                    if isinstance(ref, Mapping):
                        for field in ("name", "secretName"):
                            if isinstance(ref.get(field), str):
                                yield f"{at}.{field}", ref[field]
            yield from _secret_names(item, where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _secret_names(item, f"{path}[{i}]")


def _check_token_secret_refs(
    check: _Checker, name: str | None, uid: Any, specs: Mapping[str, ReplicaSpec]
) -> None:
    """Refuse templates that name another job's token Secret: the operator would create
    pods that hold that job's token, and so pass as its replicas to its servers. (The job's
    own is allowed; a manifest not yet created has no uid, so it cannot name its own.)"""
    own = token_secret_name(name, uid) if name and isinstance(uid, str) and uid else None
    for replica_type, spec in specs.items():
        path = f"spec.replicaSpecs.{replica_type}.template.spec"
        found = dict(_secret_names(spec.template.get("spec"), path))  # a path once
        for where, secret in found.items():
            if secret != own and is_token_secret_name(secret):
                check.add(OTHER_JOBS_TOKEN, secret, path=where, suffix=TOKEN_SECRET_SUFFIX)


#: A template naming another job's ServiceAccount (its pods would get that job's rights).
OTHER_JOBS_SERVICE_ACCOUNT = (
    "{path}: names {value}, the ServiceAccount the operator made for another StrategyJob "
    "(bound to that job's Role); a job's pods run as their own. Remove serviceAccountName, "
    "or name a ServiceAccount of your own whose name does not end in {suffix}."
)


def _check_service_account_refs(
    check: _Checker, name: str | None, specs: Mapping[str, ReplicaSpec]
) -> None:
    """Refuse templates that run as another job's ServiceAccount (``serviceAccountName``, or
    its deprecated alias ``serviceAccount``): the pods would get that job's rights (patching
    its leader's pod). The job's own, and any ServiceAccount of the user's, are allowed."""
    own = service_account_name(name) if name else None
    for replica_type, spec in specs.items():
        pod_spec = spec.template.get("spec")
        if not isinstance(pod_spec, Mapping):
            continue
        for field in ("serviceAccountName", "serviceAccount"):
            account = pod_spec.get(field)
            if isinstance(account, str) and account != own and is_service_account_name(account):
                where = f"spec.replicaSpecs.{replica_type}.template.spec.{field}"
                check.add(
                    OTHER_JOBS_SERVICE_ACCOUNT, account, path=where, suffix=SERVICE_ACCOUNT_SUFFIX
                )


def plain(value: Any) -> Any:
    """Convert Mapping/Sequence views (e.g. kopf bodies) to plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(v) for v in value]
    return value
