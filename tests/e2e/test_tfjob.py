"""A Kubeflow TFJob, written as for training-operator and applied with kubectl, trains to
``Succeeded`` on the operator installed with ``tfjob.enabled=true`` (conftest's ``operator``):
training-operator's condition reason, per-replica Services and ``kubectl get tfjobs``
columns, as the tools that watch TFJobs read them."""

from __future__ import annotations

import pytest

from e2e.e2e_support import (
    TFJOB_LABEL_JOB_NAME,
    Namespace,
    assert_loss_goes_down,
    example,
    losses,
)

pytestmark = pytest.mark.timeout(240)

NAME = "multi-worker-digits"


def test_tfjob_example_trains_to_succeeded(ns: Namespace, shared_dir: str):
    # One node: on kind, a job's NetworkPolicy (kube-router) refuses its worker-1 on the
    # control-plane node the connection to worker-0 on the other (seen with Keras too).
    manifest = example(
        "tfjob_digits", file="tfjob.yaml", env={"Worker": {"EPOCHS": "4"}}, checkpoints=shared_dir
    )
    ns.apply(manifest)
    succeeded = ns.wait_tfjob(NAME, "Succeeded", timeout=180)
    assert succeeded["reason"] == "TFJobSucceeded", succeeded
    pods = ns.pods(NAME, label=TFJOB_LABEL_JOB_NAME)  # cleanPodPolicy None: they stay
    assert sorted(p.metadata.name for p in pods) == [f"{NAME}-worker-0", f"{NAME}-worker-1"]

    worker0, worker1 = ns.logs(f"{NAME}-worker-0"), ns.logs(f"{NAME}-worker-1")
    assert "2 replicas in sync, chief=True" in worker0, worker0
    assert "2 replicas in sync, chief=False" in worker1, worker1
    points = losses(worker0)
    assert [epoch for epoch, _ in points] == [1, 2, 3, 4]
    assert_loss_goes_down(points, "worker-0")
    assert losses(worker1) == points  # global figures: gradients averaged across the pods

    # training-operator's headless Service per replica, which TF_CONFIG names
    for i in (0, 1):
        service = ns.cluster.core.read_namespaced_service(f"{NAME}-worker-{i}", ns.name)
        assert service.spec.cluster_ip == "None"
        assert [(p.name, p.port) for p in service.spec.ports] == [("tfjob-port", 2222)]

    header, row = ns.cluster.kubectl("get", "tfjobs", "-n", ns.name).splitlines()
    assert header.split() == ["NAME", "STATE", "AGE"], header
    assert row.split()[:2] == [NAME, "Succeeded"], row
