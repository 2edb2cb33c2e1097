"""The ``StrategyJob`` reference page, generated from the CRD (``crds/``, the one source of the
schema), so the site never restates a field, a default or a limit by hand."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

Schema = Mapping[str, Any]
#: Replica types whose specs share one schema: listed once, as ``<type>``.
REPLICA_TYPES = ("chief", "worker", "ps", "evaluator")


def load_crd(path: Path) -> Schema:
    """The CRD document of ``path`` (a file holding one CustomResourceDefinition)."""
    return yaml.safe_load(path.read_text())


def type_of(schema: Schema) -> str:
    """A field's type as ``kubectl explain`` shows it: ``[]object``, ``map[string]string``..."""
    kind = schema.get("type", "")
    if kind == "array":
        return "[]" + type_of(schema.get("items", {}))
    if kind == "object" and "additionalProperties" in schema:
        return "map[string]" + type_of(schema["additionalProperties"])
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    return kind or "any"


def constraints(schema: Schema) -> str:
    """Default, allowed values and bounds of a field, as one cell."""
    parts = []
    if "default" in schema:
        parts.append(f"default `{json.dumps(schema['default'])}`")
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]))
    for key, word in (("minimum", "≥"), ("maximum", "≤"), ("maxLength", "length ≤")):
        if key in schema:
            parts.append(f"{word} {schema[key]}")
    return "; ".join(parts)


def fields(schema: Schema, path: str) -> Iterator[tuple[str, Schema, bool]]:
    """(dotted path, schema, required) of every field under ``schema``, depth first, replica
    types that share one schema folded into ``<type>``."""
    props: Mapping[str, Schema] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    items = schema.get("items", {})
    if not props and items.get("properties"):
        yield from fields(items, path + "[]")
        return
    folded = [name for name in REPLICA_TYPES if name in props]
    if len(folded) > 1 and all(props[name] == props[folded[0]] for name in folded):
        yield (f"{path}.<type>", props[folded[0]], False)
        yield from fields(props[folded[0]], f"{path}.<type>")
        props = {k: v for k, v in props.items() if k not in folded}
    for name, child in props.items():
        child_path = f"{path}.{name}" if path else name
        yield (child_path, child, name in required)
        yield from fields(child, child_path)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(schema: Schema, root: str) -> list[str]:
    rows = ["| field | type | | description |", "|---|---|---|---|"]
    for path, child, required in fields(schema, root):
        if ".template." in path and path.split(".template.")[1].count(".") > 1:
            continue  # inside Kubernetes' PodSpec, whose own reference says more than this page
        limits = constraints(child)
        tags = "; ".join(t for t in ("**required**" if required else "", limits) if t)
        rows.append(
            f"| `{path}` | {type_of(child)} | {cell(tags)} | {cell(child.get('description', ''))} |"
        )
    return rows


def rules(schema: Schema, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, what the API server refuses) of every CEL rule, in schema order."""
    for rule in schema.get("x-kubernetes-validations", ()):
        said = rule.get("message") or f"`{rule['rule']}`"
        yield (path or "(the object)", said)
    for name, child in schema.get("properties", {}).items():
        yield from rules(child, f"{path}.{name}" if path else name)


def render(crd: Schema) -> str:
    """The whole reference page of a CRD: each version's spec and status fields, its printer
    columns and its validation rules."""
    names = crd["spec"]["names"]
    out = [
        f"# {names['kind']} reference",
        "",
        f"Generated from `crds/{crd['metadata']['name'].split('.', 1)[1]}_"
        f"{names['plural']}.yaml` (group `{crd['spec']['group']}`, short name "
        + ", ".join(f"`{n}`" for n in names.get("shortNames", ()))
        + "). Replica types that share one schema are listed once as `<type>` ("
        + ", ".join(f"`{t}`" for t in REPLICA_TYPES)
        + "); a pod template's `spec` is Kubernetes' PodSpec, listed to its first level.",
    ]
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        out += ["", f"## {crd['spec']['group']}/{version['name']}"]
        for part in ("spec", "status"):
            if part in schema.get("properties", {}):
                out += ["", f"### `{part}`", ""]
                out += table(schema["properties"][part], part)
        columns = version.get("additionalPrinterColumns", ())
        if columns:
            out += ["", "### `kubectl get` columns", "", "| column | from | |", "|---|---|---|"]
            for col in columns:
                wide = " (`-o wide`)" if col.get("priority", 0) else ""
                said = cell(col.get("description", ""))
                out.append(f"| {col['name']}{wide} | `{col['jsonPath']}` | {said} |")
        checks = list(rules(schema))
        if checks:
            out += ["", "### Refused at `kubectl apply`", "", "| field | rule |", "|---|---|"]
            out += [f"| `{path}` | {cell(said)} |" for path, said in checks]
    return "\n".join(out) + "\n"
