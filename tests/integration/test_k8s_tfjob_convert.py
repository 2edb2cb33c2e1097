"""``strategyjob convert`` and ``submit`` of Kubeflow TFJobs against the real API server: the
StrategyJob that each of Kubeflow's own TFJob manifests converts to is accepted (the CRD's
schema and CEL rules, strict field validation); a TFJob is submitted as a TFJob; and a
cluster without a resource answers with what to do."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from strategyjob import cli as strategyjob_cli
from strategyjob.client._errors import to_cluster_error

from tests.integration.test_k8s_client import cli
from tests.integration.test_k8s_tfjob_crd import kubectl_apply
from tests.support import kubeflow_tfjobs
from tests.unit.jobspec.test_tfjob_convert import EXPECTED


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [n for n, (s, _) in EXPECTED.items() if s is not None])
def test_each_converted_kubeflow_manifest_is_accepted(own_kube, tmp_path, name):
    source = tmp_path / "tfjob.yaml"
    source.write_text(yaml.safe_dump(kubeflow_tfjobs.load(name, own_kube.ns)))
    target = tmp_path / "strategyjob.yaml"
    assert strategyjob_cli.main(["convert", str(source), "-o", str(target)]) == 0
    manifest = yaml.safe_load(target.read_text())
    # A manifest with generateName cannot be applied: it is created, as the guide does.
    verb = "create" if "generateName" in manifest["metadata"] else "apply"
    done = kubectl_apply(own_kube, manifest, verb)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    stored = own_kube.job(json.loads(done.stdout)["metadata"]["name"])
    assert stored is not None
    assert stored["spec"]["strategy"] == EXPECTED[name][0]
    assert (
        stored["spec"]["runPolicy"]["cleanPodPolicy"]
        == manifest["spec"]["runPolicy"]["cleanPodPolicy"]
    )
    assert {t: s["replicas"] for t, s in stored["spec"]["replicaSpecs"].items()} == {
        t: s["replicas"] for t, s in manifest["spec"]["replicaSpecs"].items()
    }


@pytest.mark.timeout(60)
def test_submit_creates_a_tfjob_as_it_is(control_plane, own_kube, tmp_path):
    manifest = kubeflow_tfjobs.load("example-simple", own_kube.ns)
    del manifest["metadata"]["namespace"]  # -n says where
    source = tmp_path / "tfjob.yaml"
    source.write_text(yaml.safe_dump(manifest))
    submitted = cli(control_plane, own_kube, "submit", str(source))
    assert submitted.returncode == 0, submitted.stderr
    name = manifest["metadata"]["name"]
    assert submitted.stdout.splitlines() == [
        f"TFJob {name} created in namespace {own_kube.ns}. "
        f"Watch it: kubectl get tfjob {name} -n {own_kube.ns} --watch"
    ]
    stored = own_kube.custom.get_namespaced_custom_object(
        "kubeflow.org", "v1", own_kube.ns, "tfjobs", name
    )
    assert (stored["apiVersion"], stored["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert stored["spec"]["tfReplicaSpecs"] == manifest["spec"]["tfReplicaSpecs"]
    assert own_kube.job(name) is None  # no StrategyJob was made of it


@pytest.mark.timeout(60)
def test_a_resource_the_cluster_does_not_serve_says_to_enable_tfjobs_or_convert(own_kube):
    # The API server's own answer for a resource it does not serve (tfjobz: no CRD).
    with pytest.raises(ApiException) as info:
        own_kube.custom.create_namespaced_custom_object(
            "kubeflow.org", "v1", own_kube.ns, "tfjobz", {"metadata": {"name": "a"}}
        )
    error = to_cluster_error(
        info.value, server="", action="create", kind="TFJob", name="a", namespace=own_kube.ns
    )
    assert str(error).startswith("the API server does not serve TFJobs (")
    assert "tfjob.enabled=true" in str(error) and "strategyjob convert FILE" in str(error)
