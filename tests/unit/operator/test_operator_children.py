"""Desired children: names, DNS, labels, owner reference, env from jobspec, port."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from strategyjob import jobspec
from strategyjob_operator import children
from strategyjob_operator import constants as c

OWNER = {"metadata": {"name": "mnist", "uid": "u-1"}}


def make_job():
    tpl = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {
            "containers": [
                {"name": "strategyjob", "image": "x", "env": [{"name": "A", "value": "1"}]}
            ]
        },
    }
    return jobspec.load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "mnist", "namespace": "ml"},
            "spec": {
                "strategy": "ParameterServerStrategy",
                "replicaSpecs": {
                    "chief": {"replicas": 1, "template": tpl},
                    "worker": {"replicas": 2, "template": tpl},
                    "ps": {"replicas": 1, "template": tpl},
                },
            },
        }
    )


def test_pod_is_named_addressed_labelled_and_owned():
    j = make_job()
    owner = children.owner_reference(OWNER)
    pod = children.build_pod(j, "worker", 1, owner, jobspec.cluster_for_kubernetes(j))
    assert pod["metadata"]["name"] == "mnist-worker-1"
    assert pod["spec"]["hostname"] == "mnist-worker-1" and pod["spec"]["subdomain"] == "mnist"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"] == {
        "team": "a",
        c.LABEL_JOB_NAME: "mnist",
        c.LABEL_REPLICA_TYPE: "worker",
        c.LABEL_REPLICA_INDEX: "1",
    }
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "name": "mnist",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env == {
        "A": "1",
        **jobspec.replica_env(j, "worker", 1, jobspec.cluster_for_kubernetes(j)),
    }
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 2222


def test_chief_carries_the_leader_label_and_template_is_not_mutated():
    j = make_job()
    before = json.dumps(j.replica_specs["chief"].template, sort_keys=True)
    pod = children.build_pod(
        j, "chief", 0, children.owner_reference(OWNER), jobspec.cluster_for_kubernetes(j)
    )
    assert pod["metadata"]["labels"][c.LABEL_JOB_ROLE] == c.ROLE_CHIEF
    assert json.dumps(j.replica_specs["chief"].template, sort_keys=True) == before


def test_service_is_headless_and_publishes_not_ready_addresses():
    svc = children.build_service(make_job(), children.owner_reference(OWNER))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {c.LABEL_JOB_NAME: "mnist"}


def test_operator_never_imports_torch():
    code = (
        "import sys, strategyjob_operator.__main__\n"
        "assert 'torch' not in sys.modules, 'the operator imported torch'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
