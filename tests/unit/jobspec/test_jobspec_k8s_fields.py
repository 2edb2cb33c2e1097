"""The CRD declares every PodSpec and Container field the loader knows (and no other), so
what the API server prunes and what the loader calls unknown are the same fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from strategyjob.jobspec import _k8s_fields

ROOT = Path(__file__).resolve().parents[3]
REPLICA_TYPES = ("chief", "worker", "ps", "evaluator")


def _template(replica_type: str) -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "strategyjob.dev_strategyjobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    specs = schema["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]
    template: dict[str, Any] = specs[replica_type]["properties"]["template"]
    return template


@pytest.mark.parametrize("replica_type", REPLICA_TYPES)
def test_the_crd_declares_exactly_the_fields_the_loader_knows(replica_type):
    template = _template(replica_type)
    assert set(template["properties"]) == set(_k8s_fields.POD_TEMPLATE_FIELDS)
    spec = template["properties"]["spec"]
    assert set(spec["properties"]) == set(_k8s_fields.POD_SPEC_FIELDS)
    for field in ("containers", "initContainers"):
        container = spec["properties"][field]["items"]
        assert set(container["properties"]) == set(_k8s_fields.CONTAINER_FIELDS), field
        assert container["properties"]["image"] == {"type": "string"}
    # Preserving unknown fields at these levels would let a misspelt field through.
    for level in (template, spec, spec["properties"]["containers"]["items"]):
        assert "x-kubernetes-preserve-unknown-fields" not in level
