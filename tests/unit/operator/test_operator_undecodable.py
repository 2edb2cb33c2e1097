"""A pod template value the API server cannot decode (a CPU limit of ``lots``) is named by its
field in the job's spec, on plain data: the API server's 400 names none."""

from __future__ import annotations

import json

import pytest
from strategyjob_operator.decide import create_failed_message
from strategyjob_operator.kube import ApiError
from strategyjob_operator.undecodable import bad_quantities, naming_fields

REGEX = (
    'Pod in version \\"v1\\" cannot be handled as a Pod: quantities must match the regular '
    "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
UNDECODABLE = ApiError(400, "POST", "/api/v1/namespaces/ns/pods", f'{{"message": "{REGEX}"}}')


def job_spec(pod_spec: dict, key: str = "replicaSpecs", rtype: str = "worker") -> dict:
    return {key: {rtype: {"replicas": 2, "template": {"spec": pod_spec}}}}


def container(**resources: dict) -> dict:
    return {"name": "strategyjob", "image": "img", "resources": resources}


def test_a_cpu_limit_that_is_no_quantity_is_named_by_its_field() -> None:
    spec = job_spec({"containers": [container(limits={"cpu": "lots", "memory": "1Gi"})]})
    assert bad_quantities(spec) == [
        'spec.replicaSpecs.worker.template.spec.containers[0].resources.limits.cpu: "lots" '
        "is not a quantity"
    ]


@pytest.mark.parametrize(
    "value", ["500m", "2", "1.5Gi", "1e3", ".5", "+1", "-1", "100Ki", 4, 1.5, " 2 ", None]
)
def test_every_form_of_a_quantity_passes(value) -> None:
    spec = job_spec({"containers": [container(requests={"cpu": value})]})
    assert bad_quantities(spec) == []


@pytest.mark.parametrize("value", ["lots", "1 Gi", "1GB", "1Gib", "", "0x10", True, [1], {}])
def test_what_the_api_server_cannot_parse_is_found(value) -> None:
    spec = job_spec({"containers": [container(requests={"memory": value})]})
    assert len(bad_quantities(spec)) == 1


def test_every_quantity_field_of_a_pod_is_looked_at() -> None:
    divisor = {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "x1"}}
    pod = {
        "initContainers": [container(requests={"cpu": "x2"})],
        "containers": [
            container(limits={"cpu": "1"}),
            {
                **container(limits={"nvidia.com/gpu": "x3"}),
                "env": [{"name": "CPU", "valueFrom": divisor}],
            },
        ],
        "ephemeralContainers": [container(limits={"memory": "x4"})],
        "resources": {"limits": {"cpu": "x5"}},
        "overhead": {"memory": "x6"},
        "volumes": [
            {"name": "a", "emptyDir": {"sizeLimit": "x7"}},
            {
                "name": "b",
                "ephemeral": {
                    "volumeClaimTemplate": {"spec": {"resources": {"requests": {"storage": "x8"}}}}
                },
            },
            {"name": "c", "downwardAPI": {"items": [{"path": "cpu", **divisor}]}},
            {
                "name": "d",
                "projected": {"sources": [{"downwardAPI": {"items": [{"path": "p", **divisor}]}}]},
            },
        ],
    }
    at = "spec.replicaSpecs.worker.template.spec"
    assert [p.split(":")[0] for p in bad_quantities(job_spec(pod))] == [
        f"{at}.initContainers[0].resources.requests.cpu",
        f"{at}.containers[1].resources.limits[nvidia.com/gpu]",
        f"{at}.containers[1].env[0].valueFrom.resourceFieldRef.divisor",
        f"{at}.ephemeralContainers[0].resources.limits.memory",
        f"{at}.resources.limits.cpu",
        f"{at}.overhead.memory",
        f"{at}.volumes[0].emptyDir.sizeLimit",
        f"{at}.volumes[1].ephemeral.volumeClaimTemplate.spec.resources.requests.storage",
        f"{at}.volumes[2].downwardAPI.items[0].resourceFieldRef.divisor",
        f"{at}.volumes[3].projected.sources[0].downwardAPI.items[0].resourceFieldRef.divisor",
    ]


def test_a_tfjob_template_is_named_under_its_own_replica_key() -> None:
    """A TFJob's replica types are map keys: ``[Worker]``, as the API server writes them."""
    spec = job_spec({"containers": [container(limits={"cpu": "lots"})]}, "tfReplicaSpecs", "Worker")
    named = [
        'spec.tfReplicaSpecs[Worker].template.spec.containers[0].resources.limits.cpu: "lots" '
        "is not a quantity"
    ]
    assert bad_quantities(spec, "tfReplicaSpecs") == named
    assert bad_quantities(spec) == named  # the key the spec has
    assert bad_quantities(spec, "replicaSpecs") == []
    message = str(naming_fields(UNDECODABLE, spec))
    assert "spec.tfReplicaSpecs[Worker].template.spec.containers[0].resources.limits.cpu" in message


def test_each_replica_type_is_named_in_the_order_of_the_spec() -> None:
    spec = job_spec({"containers": [container(limits={"cpu": "lots"})]}, rtype="chief")
    worker = {"containers": [container(requests={"memory": "much"})]}
    spec["replicaSpecs"]["worker"] = {"replicas": 2, "template": {"spec": worker}}
    assert bad_quantities(spec) == [
        'spec.replicaSpecs.chief.template.spec.containers[0].resources.limits.cpu: "lots" '
        "is not a quantity",
        'spec.replicaSpecs.worker.template.spec.containers[0].resources.requests.memory: "much" '
        "is not a quantity",
    ]
    message = str(naming_fields(UNDECODABLE, spec))
    assert '"lots" is not a quantity; spec.replicaSpecs.worker.template' in message


def test_malformed_templates_are_skipped_not_crashed_on() -> None:
    for spec in (
        {},
        {"replicaSpecs": None},
        {"replicaSpecs": {"worker": None}},
        {"replicaSpecs": {"worker": {"template": {"spec": {"containers": "x"}}}}},
        job_spec({"containers": [None, {"resources": []}], "volumes": [3]}),
    ):
        assert bad_quantities(spec) == []


def test_the_create_failed_message_names_the_field_and_says_what_to_do() -> None:
    spec = job_spec({"containers": [container(limits={"cpu": "lots"})]})
    named = naming_fields(UNDECODABLE, spec)
    assert isinstance(named, ApiError) and named.status == 400
    message = create_failed_message("pod j-worker-0", named, permanent=True)
    field = "spec.replicaSpecs.worker.template.spec.containers[0].resources.limits.cpu"
    assert message.startswith(
        "Cannot create pod j-worker-0: POST /api/v1/namespaces/ns/pods failed with HTTP 400: "
        f'{field}: "lots" '
        "is not a quantity: write a number with an optional suffix, e.g. 500m, 2 or 1.5Gi "
        '(the API server: Pod in version "v1" cannot be handled as a Pod: quantities must match'
    ), message
    assert "fix the job's spec" in message


def test_other_errors_are_left_as_they_are() -> None:
    spec = job_spec({"containers": [container(limits={"cpu": "lots"})]})
    invalid = ApiError(422, "POST", "/p", json.dumps({"message": "is invalid"}))
    assert naming_fields(invalid, spec) is invalid
    timeout = TimeoutError("read timed out")
    assert naming_fields(timeout, spec) is timeout
    fine = job_spec({"containers": [container(limits={"cpu": "1"})]})
    assert naming_fields(UNDECODABLE, fine) is UNDECODABLE
