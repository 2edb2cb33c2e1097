"""Resizing a job (issue 30) as the API server checks it, with no operator: ``kubectl scale``
through the CRD's scale subresource changes the worker count of a ParameterServerStrategy job;
every other change of a replica count, a count outside ``minReplicas``/``maxReplicas`` and a
resize of a finished job are refused at once, in one line that says what to do."""

from __future__ import annotations

import json

import pytest
from integration_harness import manifest
from kubernetes.client.exceptions import ApiException
from strategyjob.jobspec import messages as msg

pytestmark = pytest.mark.timeout(90)

GROUP, VERSION, PLURAL = "strategyjob.dev", "v1alpha1", "strategyjobs"


def ps_job(name: str, workers: int = 2, **worker: int) -> dict:
    """A suspended ParameterServerStrategy job (no operator runs here either way)."""
    job = manifest(
        name,
        "ParameterServerStrategy",
        {"chief": 1, "ps": 1, "worker": workers},
        run_policy={"suspend": True},
    )
    job["spec"]["replicaSpecs"]["worker"].update(worker)
    return job


def scale(cp, kube, name: str, replicas: int):
    """``kubectl scale sjob/NAME --replicas=N``, the real kubectl."""
    return cp.kubectl("scale", f"sjob/{name}", f"--replicas={replicas}", "-n", kube.ns, check=False)


def refused(call) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 422, err.value.body
    return json.loads(err.value.body)["message"]


def test_kubectl_scale_resizes_the_workers_of_a_ps_job(own_kube, control_plane):
    kube, cp = own_kube, control_plane
    kube.create_job(ps_job("elastic"))
    done = scale(cp, kube, "elastic", 4)
    assert done.returncode == 0, done.stderr
    job = kube.job("elastic")
    assert job["spec"]["replicaSpecs"]["worker"]["replicas"] == 4
    assert job["spec"]["replicaSpecs"]["chief"]["replicas"] == 1  # the others stay
    got = kube.custom.get_namespaced_custom_object_scale(GROUP, VERSION, kube.ns, PLURAL, "elastic")
    assert got["spec"]["replicas"] == 4
    # a plain patch of the spec does the same
    kube.patch_job("elastic", {"spec": {"replicaSpecs": {"worker": {"replicas": 1}}}})
    assert kube.job("elastic")["spec"]["replicaSpecs"]["worker"]["replicas"] == 1


def test_a_one_process_job_cannot_be_resized(own_kube, control_plane):
    kube, cp = own_kube, control_plane
    suspended = {"suspend": True}
    kube.create_job(manifest("one", "MirroredStrategy", {"worker": 1}, run_policy=suspended))
    done = scale(cp, kube, "one", 2)
    assert done.returncode != 0
    assert msg.NOT_RESIZABLE.format(strategy="MirroredStrategy", value=2) in done.stderr
    assert kube.job("one")["spec"]["replicaSpecs"]["worker"]["replicas"] == 1


@pytest.mark.parametrize("replica_type", ["chief", "ps"])
def test_only_the_worker_count_changes(own_kube, replica_type):
    kube = own_kube
    kube.create_job(ps_job("fixed"))
    message = refused(
        lambda: kube.patch_job("fixed", {"spec": {"replicaSpecs": {replica_type: {"replicas": 2}}}})
    )
    assert (
        f"spec.replicaSpecs.{replica_type}.replicas: replicas cannot be changed after the job "
        "is created; only the worker count can (kubectl scale sjob/NAME --replicas=N)."
    ) in message


def test_a_resize_outside_the_bounds_is_refused_naming_them(own_kube, control_plane):
    kube, cp = own_kube, control_plane
    kube.create_job(ps_job("bounded", 3, minReplicas=2, maxReplicas=4))
    below = scale(cp, kube, "bounded", 1)
    assert below.returncode != 0
    assert (
        "spec.replicaSpecs.worker.replicas: below minReplicas 2 (got 1). Ask for 2 workers or "
        "more, or change minReplicas."
    ) in below.stderr
    above = scale(cp, kube, "bounded", 5)
    assert "spec.replicaSpecs.worker.replicas: above maxReplicas 4 (got 5)." in above.stderr
    # counts of one to four digits are spelled right
    message = refused(
        lambda: kube.create_job(ps_job("wide", 1000, minReplicas=10, maxReplicas=120))
    )
    assert "spec.replicaSpecs.worker.replicas: above maxReplicas 120 (got 1000)." in message
    assert kube.job("bounded")["spec"]["replicaSpecs"]["worker"]["replicas"] == 3
    assert scale(cp, kube, "bounded", 4).returncode == 0


def test_bounds_that_cannot_hold_are_refused_at_create(own_kube):
    kube = own_kube
    message = refused(lambda: kube.create_job(ps_job("crossed", 3, minReplicas=4, maxReplicas=2)))
    assert (
        'spec.replicaSpecs.worker: minReplicas is greater than maxReplicas (got {"maxReplicas": '
        '2, "minReplicas": 4}). Set minReplicas <= maxReplicas.'
    ) in message
    job = ps_job("psbound")
    job["spec"]["replicaSpecs"]["ps"]["minReplicas"] = 1
    message = refused(lambda: kube.create_job(job))
    assert (
        "spec.replicaSpecs.ps: minReplicas and maxReplicas bound the worker count only."
    ) in message


def test_a_finished_job_cannot_be_resized(own_kube, control_plane):
    kube, cp = own_kube, control_plane
    kube.create_job(ps_job("over"))
    condition = {
        "type": "Succeeded",
        "status": "True",
        "reason": "JobSucceeded",
        "message": "done",
        "lastTransitionTime": "2026-11-29T00:00:00Z",
    }
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, kube.ns, PLURAL, "over", {"status": {"conditions": [condition]}}
    )
    done = scale(cp, kube, "over", 3)
    assert done.returncode != 0
    assert (
        "spec.replicaSpecs.worker.replicas: the job has finished, and a finished job cannot be "
        "resized. Create a new job."
    ) in done.stderr


def test_the_client_and_cli_scale_as_kubectl_does(own_kube, control_plane):
    from strategyjob.client import StrategyJobClient
    from strategyjob.errors import ClusterError
    from test_k8s_client import cli

    kube, cp = own_kube, control_plane
    kube.create_job(ps_job("viaclient", 2, minReplicas=1, maxReplicas=4))
    with StrategyJobClient(kubeconfig=cp.kubeconfig, namespace=kube.ns) as client:
        job = client.scale("viaclient", 3)
        assert job.raw["spec"]["replicaSpecs"]["worker"]["replicas"] == 3
        with pytest.raises(ClusterError) as err:
            client.scale("viaclient", 9)
        assert "above maxReplicas 4 (got 9)" in str(err.value)
        assert "\n" not in str(err.value)
    done = cli(cp, kube, "scale", "viaclient", "--replicas", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("StrategyJob viaclient: 4 workers asked for")
    assert kube.job("viaclient")["spec"]["replicaSpecs"]["worker"]["replicas"] == 4
    refused = cli(cp, kube, "scale", "viaclient", "--replicas", "0")
    assert refused.returncode != 0 and "below minReplicas 1 (got 0)" in refused.stderr
