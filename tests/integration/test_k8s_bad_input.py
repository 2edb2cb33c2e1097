"""Bad input against the real API server: the CRD refuses each malformed manifest with a
message naming the field, as the loader does; a bad progress annotation never stops the
job's status updates; and a fuzz of manifests shows the loader and the API server agree."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import event, given
from integration_harness import manifest, wait_for
from kubernetes.client.exceptions import ApiException
from strategyjob import jobspec

from tests.support.bad_manifests import CRD_REFUSES, MISTAKES
from tests.support.manifest_mutations import (
    assert_one_line_problems,
    fuzz_settings,
    mutated_manifests,
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("case", "field"), CRD_REFUSES.items(), ids=CRD_REFUSES.keys())
def test_api_server_and_loader_refuse_each_malformed_manifest_naming_the_field(kube, case, field):
    obj = manifest("bad", "MultiWorkerMirroredStrategy", {"worker": 2})
    MISTAKES[case].apply(obj)
    with pytest.raises(ApiException) as err:
        kube.create_job(copy.deepcopy(obj))
    assert err.value.status in (400, 422)
    message = json.loads(err.value.body)["message"]
    assert field in message, message
    with pytest.raises(jobspec.ManifestError) as info:
        jobspec.load_manifest(obj)
    assert_one_line_problems(info.value)
    assert [p for p in info.value.problems if field in p], info.value.problems
    assert kube.job("bad") is None


def _annotate(kube, pod: str, report: Any) -> None:
    body = {"metadata": {"annotations": {"strategyjob.dev/progress": json.dumps(report)}}}
    kube.core.patch_namespaced_pod(pod, kube.ns, body)


def _progress(kube, name: str) -> dict[str, Any]:
    return ((kube.job(name) or {}).get("status") or {}).get("progress") or {}


@pytest.mark.timeout(120)
def test_a_bad_progress_annotation_never_stops_the_status_updates(kube, operator):
    kube.create_job(manifest("prog", "MultiWorkerMirroredStrategy", {"worker": 2}))
    kube.wait_pods("prog", 2)
    # A step beyond int64 and a time without a zone: the API server would refuse a status
    # holding either, and with it every other change of the job's status.
    _annotate(kube, "prog-worker-0", {"step": 2**63, "totalSteps": 10})
    kube.set_phase("prog-worker-0", "Running")
    kube.set_phase("prog-worker-1", "Running")
    kube.wait_condition("prog", "Running")
    assert _progress(kube, "prog") == {}
    _annotate(kube, "prog-worker-0", {"step": 3, "totalSteps": 10, "time": "2026-01-01T10:00:00"})
    got = wait_for(
        "progress 3", lambda: _progress(kube, "prog").get("step") == 3 and _progress(kube, "prog")
    )
    assert "lastReportTime" not in got and got["percentage"] == 30.0
    _annotate(
        kube,
        "prog-worker-0",
        {"step": 5, "totalSteps": 10, "time": "2026-01-01T12:00:00+02:00", "metrics": {"n": 2**70}},
    )
    got = wait_for(
        "progress 5", lambda: _progress(kube, "prog").get("step") == 5 and _progress(kube, "prog")
    )
    assert got["lastReportTime"] == "2026-01-01T10:00:00Z"
    assert got["metrics"] == {"n": str(2**70)}
    kube.set_phase("prog-worker-0", "Succeeded", exit_code=0)
    kube.wait_condition("prog", "Succeeded")


@pytest.mark.timeout(240)
@fuzz_settings(150)
@given(obj=mutated_manifests(json_only=True))
def test_fuzz_the_loader_and_the_api_server_agree(kube, obj):
    """Whatever the API server admits, the loader reads it back (what the operator does)
    as a job, or refuses it only for an image the kubelet cannot parse, in one-line
    problems, never a traceback; and what the loader accepts, the API server admits."""
    try:
        jobspec.load_manifest(copy.deepcopy(obj))
        loader_ok = True
    except jobspec.ManifestError as e:
        assert_one_line_problems(e)
        loader_ok = False
    try:
        stored = kube.custom.create_namespaced_custom_object(
            "strategyjob.dev", "v1alpha1", kube.ns, "strategyjobs", obj, dry_run="All"
        )
    except ApiException as e:
        assert e.status in (400, 422), e.body  # refused as the client's fault, with a reason
        assert not loader_ok, f"the loader accepts what the API server refuses: {e.body}"
        event("both refuse")
        return
    # the loader refuses an unknown field the API server prunes: the pruned object must load
    event("both accept" if loader_ok else "admitted once pruned, refused as written")
    try:
        jobspec.load_manifest(stored)
    except jobspec.ManifestError as e:
        assert_one_line_problems(e)
        # The one refusal that is the loader's alone: an image string the kubelet cannot
        # parse (the CRD types image as a string; its grammar is beyond CEL's cost budget),
        # so the job fails at once instead of its pods waiting in InvalidImageName.
        if all("InvalidImageName" in problem for problem in e.problems):
            event("admitted, refused by the loader: an image the kubelet cannot parse")
            return
        raise AssertionError(f"the API server admits what the loader refuses: {e}") from None
