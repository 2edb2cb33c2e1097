"""The CRD declares every PodSpec and Container field the loader knows (and no other), so
what the API server prunes and what the loader calls unknown are the same fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from strategyjob import jobspec
from strategyjob.jobspec import _k8s_fields

from tests.support.manifests import manifest

ROOT = Path(__file__).resolve().parents[3]
REPLICA_TYPES = ("chief", "worker", "ps", "evaluator")
PRESERVED = {"x-kubernetes-preserve-unknown-fields": True}


def _template(crd_file: str, replica_type: str) -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / crd_file).read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    if crd_file.startswith("kubeflow.org_"):  # one schema for every tfReplicaSpecs key
        replica = schema["properties"]["spec"]["properties"]["tfReplicaSpecs"]
        template: dict[str, Any] = replica["additionalProperties"]["properties"]["template"]
        return template
    specs = schema["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]
    template = specs[replica_type]["properties"]["template"]
    return template


@pytest.mark.parametrize(
    ("crd_file", "replica_type"),
    [("strategyjob.dev_strategyjobs.yaml", t) for t in REPLICA_TYPES]
    + [("kubeflow.org_tfjobs.yaml", "Worker")],
)
def test_the_crd_declares_exactly_the_fields_the_loader_knows(crd_file, replica_type):
    template = _template(crd_file, replica_type)
    assert set(template["properties"]) == set(_k8s_fields.POD_TEMPLATE_FIELDS)
    spec = template["properties"]["spec"]
    assert set(spec["properties"]) == set(_k8s_fields.POD_SPEC_FIELDS)
    for field in ("containers", "initContainers"):
        container = spec["properties"][field]["items"]
        assert set(container["properties"]) == set(_k8s_fields.CONTAINER_FIELDS), field
        assert container["properties"]["image"] in ({"type": "string"}, PRESERVED)
    # Preserving unknown fields at these levels would let a misspelt field through.
    for level in (template, spec, spec["properties"]["containers"]["items"]):
        assert "x-kubernetes-preserve-unknown-fields" not in level
    assert spec["properties"]["containers"]["items"]["properties"]["image"]["type"] == "string"


def _problems(**pod_spec_fields: Any) -> list[str]:
    obj = manifest({"worker": 1})
    obj["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(pod_spec_fields)
    with pytest.raises(jobspec.ManifestError) as info:
        jobspec.load_manifest(obj)
    return info.value.problems


def test_init_containers_are_read_as_the_crd_types_them_like_containers():
    where = "spec.replicaSpecs.worker.template.spec.initContainers"
    problems = _problems(
        initContainers=[{"image": "busybox"}, {"name": "i", "image": "Bad", "command": "x"}]
    )
    assert len(problems) == 3, problems
    assert problems[0].startswith(f"{where}[0]: a container needs a name")
    assert problems[1].startswith(f"{where}[1].image: ") and "InvalidImageName" in problems[1]
    assert problems[2].startswith(f"{where}[1].command: ")
    # not a list: the CRD refuses it (the operator no longer meets one when building pods)
    assert _problems(initContainers=3) == [
        f"{where}: must be a list (got 3). Write one `- ` entry per item, e.g. - name: strategyjob."
    ]


@pytest.mark.parametrize(
    ("field", "entry", "maximum"),
    [
        ("containers", {"name": "c", "image": "python:3.11"}, 256),
        ("initContainers", {"name": "c", "image": "python:3.11"}, 256),
    ],
)
def test_lists_beyond_the_crd_bounds_are_refused_naming_the_bound(field, entry, maximum):
    problems = _problems(**{field: [entry] * (maximum + 1)})
    assert problems == [
        f"spec.replicaSpecs.worker.template.spec.{field}: too many entries, at most {maximum} "
        f"(got {maximum + 1}). Use at most {maximum} entries."
    ]


@pytest.mark.parametrize(("field", "maximum"), [("env", 1024), ("envFrom", 256)])
def test_env_beyond_the_crd_bounds_is_refused(field, maximum):
    entry = {"name": "V", "value": "1"} if field == "env" else {"secretRef": {"name": "s"}}
    container = {"name": "strategyjob", "image": "python:3.11", field: [entry] * (maximum + 1)}
    problems = _problems(containers=[container])
    assert [p for p in problems if "too many entries" in p] == [
        f"spec.replicaSpecs.worker.template.spec.containers[0].{field}: too many entries, at most "
        f"{maximum} (got {maximum + 1}). Use at most {maximum} entries."
    ]


@pytest.mark.parametrize(
    ("labels", "refused"),
    [
        ({"app": ":"}, True),
        ({"app": "x" * 64}, True),
        ({"-app": "a"}, True),
        ({"Example.com/app": "a"}, True),
        ({"/app": "a"}, True),
        ({"app": "a\n"}, True),  # a regex's $ would let a trailing newline through
        ({"app\n": "a"}, True),
        ({"app": ""}, False),
        ({"example.com/app_1": "A.b-c"}, False),
        ({"a" * 63: "b" * 63}, False),
    ],
)
def test_a_jobs_own_labels_are_refused_where_the_api_server_refuses_them(labels, refused):
    """The API server validates a custom object's own labels (fuzz-found: app: ":")."""
    obj = manifest({"worker": 1})
    obj["metadata"]["labels"] = labels
    if not refused:
        jobspec.load_manifest(obj)
        return
    with pytest.raises(jobspec.ManifestError) as info:
        jobspec.load_manifest(obj)
    [problem] = info.value.problems
    assert problem.startswith("metadata.labels: not a label the API server admits: "), problem
