"""Bad input to the manifest loader: each mistake is one problem of one line naming the
field and the fix, never a traceback, and a manifest that loads is one the operator and
``strategyjob run`` can act on. Ends with a property-based fuzz of the loader."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given
from strategyjob import jobspec
from strategyjob.jobspec import ManifestError, load_manifest
from strategyjob.jobspec import messages as msg

from tests.support.bad_manifests import (
    CONTAINER,
    MISTAKES,
    WORKER,
    container_of,
    template_of,
)
from tests.support.manifest_mutations import (
    assert_one_line_problems,
    fuzz_settings,
    mutated_manifests,
)


@pytest.mark.parametrize("mistake", MISTAKES.values(), ids=MISTAKES.keys())
def test_each_mistake_is_one_line_naming_the_field_and_the_fix(make_manifest, mistake):
    obj = make_manifest()
    mistake.apply(obj)
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    assert_one_line_problems(info.value)
    assert len(info.value.problems) == 1, info.value.problems
    (problem,) = info.value.problems
    assert problem.startswith(f"{mistake.field}: "), problem
    assert "(got " in problem and mistake.fix in problem, problem


def test_command_as_a_string_is_not_split_into_characters(make_manifest):
    obj = make_manifest()
    container_of(obj)["command"] = "python train.py"
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    assert info.value.problems == [
        msg.NOT_A_STRING_LIST.format(
            path=f"{CONTAINER}.command",
            value='"python train.py"',
            example='["python", "train.py"]',
        )
    ]


def test_every_container_is_checked_not_only_the_training_one(make_manifest, make_container):
    obj = make_manifest()
    template_of(obj)["spec"]["containers"].append(make_container("sidecar", env="A=1"))
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    assert info.value.problems[0].startswith(f"{WORKER}.template.spec.containers[1].env:")


def test_well_formed_env_ports_labels_and_limits_load(make_manifest):
    obj = make_manifest()
    container_of(obj).update(
        env=[
            {"name": "A", "value": "1"},
            {"name": "B"},
            {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        ports=[{"containerPort": 8080, "name": "http", "protocol": "UDP"}],
        args=["--lr", "0.1"],
    )
    template_of(obj)["metadata"] = {"labels": {"a": "b"}, "annotations": {"c": ""}}
    obj["metadata"]["labels"] = {"team": "vision"}
    obj["spec"]["runPolicy"] = dict(
        activeDeadlineSeconds=jobspec.MAX_INT32, ttlSecondsAfterFinished=jobspec.MAX_INT32
    )
    obj["spec"]["replicaSpecs"]["worker"]["replicas"] = jobspec.MAX_REPLICAS
    job = load_manifest(obj)
    assert job.labels == {"team": "vision"}
    assert job.run_policy.active_deadline_seconds == 2**31 - 1
    assert job.num_replicas("worker") == 1000


@pytest.mark.parametrize("key", ["a\nb", "x" * 200, "bad key"])
def test_odd_keys_stay_on_one_line(make_manifest, key):
    obj = make_manifest()
    obj["spec"][key] = 1
    obj["spec"]["replicaSpecs"][key] = {}
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    assert_one_line_problems(info.value)
    assert len(info.value.problems) == 2


def test_load_manifest_file_names_the_file_on_the_same_line(tmp_path, make_manifest):
    import yaml

    obj = make_manifest()
    container_of(obj)["ports"] = "2222"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj))
    with pytest.raises(ManifestError) as info:
        jobspec.load_manifest_file(path)
    assert info.value.problems == [
        f'{path}: {CONTAINER}.ports: must be a list (got "2222"). '
        "Write one `- ` entry per item, e.g. - containerPort: 2222."
    ]


@fuzz_settings(300)
@given(mutated_manifests(json_only=False))
def test_fuzz_loader_rejects_with_one_line_problems_or_loads(obj):
    before = copy.deepcopy(obj)
    try:
        job = load_manifest(obj)
    except ManifestError as e:
        assert_one_line_problems(e)
    else:
        # what the launcher and the operator read from a loaded job is well-typed
        assert isinstance(job.labels, dict) and all(isinstance(v, str) for v in job.labels.values())
        for spec in job.replica_specs.values():
            container = jobspec.training_container(spec.template)
            assert all(isinstance(p, str) for p in container.get("command") or [])
            assert all(isinstance(e, dict) and e["name"] for e in container.get("env") or [])
            assert all(isinstance(p, dict) for p in container.get("ports") or [])
        assert load_manifest(job.to_manifest()) == job
    assert obj == before  # the loader never changes its input


def test_the_crd_bounds_and_types_what_the_loader_bounds_and_types():
    """The CRD in crds/ (the chart's is a copy) refuses what the loader refuses, so the API
    server turns it away at create instead of the operator failing the job later."""
    import yaml

    crd = Path(__file__).resolve().parents[3] / "crds" / "strategyjob.dev_strategyjobs.yaml"
    schema = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    replica = spec["replicaSpecs"]["properties"]["worker"]["properties"]
    assert replica["replicas"]["maximum"] == jobspec.MAX_REPLICAS
    run_policy = spec["runPolicy"]["properties"]
    for name in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        assert run_policy[name]["maximum"] == jobspec.MAX_INT32, name
    scheduling = run_policy["schedulingPolicy"]["properties"]
    assert scheduling["minAvailable"]["maximum"] == jobspec.MAX_INT32

    template = replica["template"]["properties"]
    for field in ("labels", "annotations"):
        assert template["metadata"]["properties"][field]["additionalProperties"] == {
            "type": "string"
        }
    container = template["spec"]["properties"]["containers"]["items"]["properties"]
    for field in ("command", "args"):
        assert container[field] | {"description": ""} == {
            "type": "array",
            "items": {"type": "string"},
            "description": "",
        }
    env = container["env"]["items"]
    assert env["required"] == ["name"] and env["properties"]["value"] == {"type": "string"}
    port = container["ports"]["items"]
    assert port["required"] == ["containerPort"]
    number = port["properties"]["containerPort"]
    assert (number["minimum"], number["maximum"]) == (1, 65535)
    assert port["properties"]["protocol"]["enum"] == list(jobspec.PORT_PROTOCOLS)

    pod = template["spec"]["properties"]
    assert pod["serviceAccountName"]["maxLength"] == jobspec.MAX_REFERENCE_LENGTH
    volumes = pod["volumes"]
    assert volumes["maxItems"] == jobspec.MAX_VOLUMES
    volume = volumes["items"]["properties"]
    secret_name = volume["secret"]["properties"]["secretName"]
    assert secret_name["maxLength"] == jobspec.MAX_REFERENCE_LENGTH
    sources = volume["projected"]["properties"]["sources"]
    assert sources["maxItems"] == jobspec.MAX_PROJECTED_SOURCES
    secret_ref = sources["items"]["properties"]["secret"]["properties"]["name"]
    assert secret_ref["maxLength"] == jobspec.MAX_REFERENCE_LENGTH
    env_from = container["envFrom"]["items"]["properties"]["secretRef"]["properties"]["name"]
    assert env_from["maxLength"] == jobspec.MAX_REFERENCE_LENGTH
    for name in ("queue", "priorityClass"):
        assert scheduling[name]["maxLength"] == jobspec.MAX_REFERENCE_LENGTH, name
