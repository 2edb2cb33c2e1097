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
    pod = children.build_pod(j, "worker", 1, owner, jobspec.cluster_for_kubernetes(j), 2)
    assert pod["metadata"]["name"] == "mnist-worker-1"
    assert pod["spec"]["hostname"] == "mnist-worker-1" and pod["spec"]["subdomain"] == "mnist"
    assert pod["spec"]["restartPolicy"] == "Never"
    # the last log lines of a failed container become its termination message, which the
    # failure's condition quotes
    assert pod["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["metadata"]["labels"] == {
        "team": "a",
        c.LABEL_JOB_NAME: "mnist",
        c.LABEL_REPLICA_TYPE: "worker",
        c.LABEL_REPLICA_INDEX: "1",
        children.LABEL_JOB_UID: "u-1",
        c.LABEL_RESTART_ATTEMPT: "2",  # the job's third run
    }
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["STRATEGYJOB_RESTART_ATTEMPT"] == "2"
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
    entries = pod["spec"]["containers"][0]["env"]
    cluster = jobspec.cluster_for_kubernetes(j)
    injected = jobspec.replica_env_by_reference(
        j, "worker", 1, cluster, 2, config_map=children.cluster_config_map_name(j)
    )
    # the injected variables first (the cluster from the job's ConfigMap), then the token,
    # then the template's own
    assert entries[: len(injected)] == injected
    assert entries[len(injected) + 1 :] == [{"name": "A", "value": "1"}]
    env = {e["name"]: e["value"] for e in entries if "value" in e}
    assert env["TF_CONFIG"] == (
        '{"cluster":$(STRATEGYJOB_CLUSTER_SPEC),"task":{"index":1,"type":"worker"}}'
    )
    token = [e for e in entries if e["name"] == "STRATEGYJOB_TOKEN"]
    assert token == [
        {
            "name": "STRATEGYJOB_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "mnist-u-1-strategyjob-token", "key": "token"}},
        }
    ]
    assert pod["spec"]["serviceAccountName"] == "mnist-strategyjob-sa"
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


def test_the_cluster_config_map_holds_the_cluster_part_of_tf_config_once():
    j = make_job()
    owner = children.owner_reference(OWNER)
    cm = children.build_cluster_config_map(j, owner)
    # a ParameterServerStrategy job's worker count changes (kubectl scale): one immutable
    # ConfigMap per cluster, named by its hash, as a TFJob's
    assert children.cluster_config_map_name(j).startswith("mnist-strategyjob-cluster-")
    assert cm["metadata"] == {
        "name": children.cluster_config_map_name(j),
        "namespace": "ml",
        "labels": {c.LABEL_JOB_NAME: "mnist"},
        "ownerReferences": [owner],
    }
    assert cm["immutable"] is True
    assert cm["data"] == {
        "cluster": '{"chief":["mnist-chief-0.mnist.ml.svc:2222"],'
        '"ps":["mnist-ps-0.mnist.ml.svc:2222"],'
        '"worker":["mnist-worker-0.mnist.ml.svc:2222","mnist-worker-1.mnist.ml.svc:2222"]}'
    }
    # what every pod's TF_CONFIG refers to: the text tf_config puts after "cluster":
    cluster = jobspec.cluster_for_kubernetes(j)
    for replica_type, index in j.replicas():
        tf_config = jobspec.tf_config(cluster, replica_type, index)
        assert tf_config.startswith('{"cluster":' + cm["data"]["cluster"] + ',"task":')
        pod = children.build_pod(j, replica_type, index, owner, cluster)
        (ref,) = [e for e in pod["spec"]["containers"][0]["env"] if "configMapKeyRef" in str(e)]
        assert ref["valueFrom"]["configMapKeyRef"] == {
            "name": cm["metadata"]["name"],
            "key": "cluster",
        }


def test_a_template_variable_named_like_an_injected_one_is_replaced():
    j = make_job()
    spec = j.replica_specs["worker"].template["spec"]
    spec["containers"][0]["env"] = [
        {"name": "STRATEGYJOB_CLUSTER_SPEC", "value": "mine"},
        {"name": "TF_CONFIG", "value": "{}"},
        {"name": "A", "value": "$(TF_CONFIG)"},
    ]
    pod = children.build_pod(
        j, "worker", 0, children.owner_reference(OWNER), jobspec.cluster_for_kubernetes(j)
    )
    env = pod["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("STRATEGYJOB_CLUSTER_SPEC") == 1 and names.count("TF_CONFIG") == 1
    assert names.index("STRATEGYJOB_CLUSTER_SPEC") == 0
    assert names[-1] == "A"  # after TF_CONFIG: its $(TF_CONFIG) gets the expanded one


def test_operator_never_imports_torch():
    code = (
        "import sys, strategyjob_operator.__main__\n"
        "assert 'torch' not in sys.modules, 'the operator imported torch'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_security_objects_are_owned_and_least_privilege():
    j = make_job()
    owner = children.owner_reference(OWNER)
    sa = children.build_service_account(j, owner)
    role = children.build_role(j, owner)
    binding = children.build_role_binding(j, owner)
    secret = children.build_token_secret(j, owner, "t0ken")
    policy = children.build_network_policy(j, owner)
    for obj in (sa, role, binding, secret, policy):
        assert obj["metadata"]["ownerReferences"] == [owner]
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"] == {c.LABEL_JOB_NAME: "mnist"}
    # the ServiceAccount and its binding carry a suffix the loader refuses in other jobs
    assert sa["metadata"]["name"] == binding["metadata"]["name"] == "mnist-strategyjob-sa"
    assert role["metadata"]["name"] == policy["metadata"]["name"] == "mnist"
    # only get and patch, only on the leader's pod (the chief here)
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": ["mnist-chief-0"],
            "verbs": ["get", "patch"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "mnist",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mnist-strategyjob-sa", "namespace": "ml"}
    ]
    assert secret["metadata"]["name"] == "mnist-u-1-strategyjob-token"
    assert secret["stringData"] == {"token": "t0ken"}
    same_job = {"matchLabels": {c.LABEL_JOB_NAME: "mnist"}}
    this_job = {"matchLabels": {c.LABEL_JOB_NAME: "mnist", children.LABEL_JOB_UID: "u-1"}}
    assert policy["spec"] == {
        "podSelector": same_job,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": this_job}]}],
    }


def test_worker_zero_leads_without_a_chief_and_template_service_account_is_kept():
    manifest = {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "mw", "namespace": "ml"},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "serviceAccountName": "mine",
                            "containers": [
                                {
                                    "name": "strategyjob",
                                    "image": "x",
                                    "env": [{"name": "STRATEGYJOB_TOKEN", "value": "leak"}],
                                }
                            ],
                        }
                    },
                }
            },
        },
    }
    j = jobspec.load_manifest(manifest)
    owner = children.owner_reference({"metadata": {"name": "mw", "uid": "u"}})
    assert children.build_role(j, owner)["rules"][0]["resourceNames"] == ["mw-worker-0"]
    pod = children.build_pod(j, "worker", 1, owner, jobspec.cluster_for_kubernetes(j))
    assert pod["spec"]["serviceAccountName"] == "mine"
    env = pod["spec"]["containers"][0]["env"]
    token = [e for e in env if e["name"] == "STRATEGYJOB_TOKEN"]
    assert token == [
        {
            "name": "STRATEGYJOB_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "mw-u-strategyjob-token", "key": "token"}},
        }
    ]
    names = [e["name"] for e in env]
    # right after the injected variables, so $(STRATEGYJOB_TOKEN) is not needed earlier
    assert names.index("STRATEGYJOB_TOKEN") == 1 + len(
        jobspec.replica_env(j, "worker", 1, jobspec.cluster_for_kubernetes(j))
    )
