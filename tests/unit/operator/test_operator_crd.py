"""The CRD's rule messages say what jobspec's messages say (one wording for the API
server, `strategyjob run` and the operator), and its defaults match jobspec's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from strategyjob import jobspec
from strategyjob.jobspec import messages

CRD = Path(__file__).resolve().parents[3] / "crds" / "strategyjob.dev_strategyjobs.yaml"


def crd_text() -> str:
    return re.sub(r"\s+", " ", CRD.read_text())


def schema() -> dict:
    return yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


SHARED = [
    pytest.param(messages.TAKES_NO_PS, id="takes-no-ps"),
    pytest.param(messages.SINGLE_PROCESS, id="single-process"),
    pytest.param(messages.NEEDS_CHIEF_OR_WORKER, id="needs-chief-or-worker"),
    pytest.param(messages.PS_NEEDS_CHIEF, id="ps-needs-chief"),
    pytest.param(messages.PS_NEEDS_WORKER, id="ps-needs-worker"),
    pytest.param(messages.PS_NEEDS_PS, id="ps-needs-ps"),
    pytest.param(messages.TPU_WORKERS_ONLY, id="tpu-workers-only"),
    pytest.param(messages.AT_MOST_ONE.replace("{replica_type}", "chief"), id="one-chief"),
    pytest.param(messages.AT_MOST_ONE.replace("{replica_type}", "evaluator"), id="one-evaluator"),
]


@pytest.mark.parametrize("template", SHARED)
def test_crd_message_matches_jobspec(template):
    """The problem (before "(got ...)") and the fix (after it) are worded alike; the CRD
    leaves out the offending value where CEL cannot afford to print it."""
    problem, _, fix = template.partition(" (got {value}). ")
    text = crd_text()
    for fragment in (*problem.split("{strategy}"), fix):
        assert fragment.strip() in text, f"CRD lacks {fragment.strip()!r}"


def test_crd_defaults_match_jobspec():
    spec = schema()["properties"]["spec"]["properties"]
    replica = spec["replicaSpecs"]["properties"]["worker"]["properties"]
    run_policy = spec["runPolicy"]["properties"]
    assert replica["replicas"]["default"] == jobspec.DEFAULT_REPLICAS
    assert replica["restartPolicy"]["default"] == jobspec.DEFAULT_RESTART_POLICY
    assert replica["restartPolicy"]["enum"] == list(jobspec.RESTART_POLICIES)
    assert run_policy["backoffLimit"]["default"] == jobspec.DEFAULT_BACKOFF_LIMIT
    assert run_policy["cleanPodPolicy"]["default"] == jobspec.DEFAULT_CLEAN_POD_POLICY
    assert run_policy["cleanPodPolicy"]["enum"] == list(jobspec.CLEAN_POD_POLICIES)
    assert spec["port"]["default"] == jobspec.DEFAULT_PORT
    assert spec["strategy"]["enum"] == list(jobspec.STRATEGIES)
    assert spec["successPolicy"]["enum"] == list(jobspec.SUCCESS_POLICIES)
    assert set(spec["replicaSpecs"]["properties"]) == set(jobspec.REPLICA_TYPES)
