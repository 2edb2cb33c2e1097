"""Every strategy's pods and Service: names, DNS, labels, owner references, env, port."""

from __future__ import annotations

import json

import pytest
from integration_harness import manifest, wait_for
from strategyjob import jobspec
from strategyjob_operator import children

TOPOLOGIES = [
    pytest.param("MultiWorkerMirroredStrategy", {"worker": 3}, id="mwms"),
    pytest.param(
        "MultiWorkerMirroredStrategy",
        {"chief": 1, "worker": 2, "evaluator": 1},
        id="mwms-chief-eval",
    ),
    pytest.param("ParameterServerStrategy", {"chief": 1, "worker": 2, "ps": 2}, id="pss"),
    pytest.param("MirroredStrategy", {"worker": 1}, id="mirrored"),
    pytest.param("CentralStorageStrategy", {"chief": 1}, id="central-storage"),
    pytest.param("OneDeviceStrategy", {"worker": 1}, id="one-device"),
    pytest.param("TPUStrategy", {"worker": 2}, id="tpu"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("strategy", "replicas"), TOPOLOGIES)
def test_each_strategy_gets_its_pods_service_and_environment(kube, operator, strategy, replicas):
    job = kube.create_job(manifest("train", strategy, replicas))
    total = sum(replicas.values())
    pods = kube.wait_pods("train", total)
    uid = job["metadata"]["uid"]
    ns = kube.ns

    svc = wait_for("service", lambda: kube.core.read_namespaced_service("train", ns))
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.publish_not_ready_addresses is True
    assert svc.spec.selector == {"strategyjob.dev/job-name": "train"}
    assert svc.metadata.owner_references[0].uid == uid

    cluster = {
        t: [f"train-{t}-{i}.train.{ns}.svc:2222" for i in range(n)] for t, n in replicas.items()
    }
    leader = ("chief", 0) if "chief" in replicas else ("worker", 0)
    loaded = jobspec.load_manifest({**job, "metadata": {"name": "train", "namespace": ns}})
    cm_name = children.cluster_config_map_name(loaded)  # hashed for ParameterServerStrategy
    config_map = kube.core.read_namespaced_config_map(cm_name, ns)
    assert config_map.immutable is True
    assert config_map.metadata.owner_references[0].uid == uid
    assert config_map.metadata.labels == {"strategyjob.dev/job-name": "train"}
    raw_pods = kube.raw_pods("train")
    for t, n in replicas.items():
        for i in range(n):
            pod = pods[f"train-{t}-{i}"]
            assert pod.spec.hostname == f"train-{t}-{i}"
            assert pod.spec.subdomain == "train"
            assert pod.spec.restart_policy == "Never"
            labels = pod.metadata.labels
            assert labels["strategyjob.dev/job-name"] == "train"
            assert labels["strategyjob.dev/replica-type"] == t
            assert labels["strategyjob.dev/replica-index"] == str(i)
            assert (labels.get("strategyjob.dev/job-role") == "chief") == ((t, i) == leader)
            ref = pod.metadata.owner_references[0]
            assert (ref.kind, ref.name, ref.uid, ref.controller) == (
                "StrategyJob",
                "train",
                uid,
                True,
            )
            container = pod.spec.containers[0]
            # the cluster from the job's ConfigMap, TF_CONFIG as the kubelet expands it
            (raw,) = [p for p, _ in raw_pods if p["metadata"]["name"] == f"train-{t}-{i}"]
            env = kube.container_env(raw)
            tf_config = json.loads(env["TF_CONFIG"])
            assert tf_config == {
                "cluster": {k: v for k, v in cluster.items() if k != "evaluator"},
                "task": {"type": t, "index": i},
            }
            assert env["STRATEGYJOB_CLUSTER_SPEC"] == config_map.data["cluster"]
            assert env["MASTER_ADDR"] == f"train-{leader[0]}-0.train.{ns}.svc"
            assert env["MASTER_PORT"] == "2222"
            assert env["STRATEGYJOB_STRATEGY"] == strategy
            assert env["STRATEGYJOB_REPLICA_TYPE"] == t
            assert env["STRATEGYJOB_REPLICA_INDEX"] == str(i)
            if t in ("chief", "worker"):
                trainers = replicas.get("chief", 0) + replicas.get("worker", 0)
                assert env["WORLD_SIZE"] == str(trainers)
                rank = 0 if t == "chief" else i + replicas.get("chief", 0)
                assert env["RANK"] == str(rank)
            assert [p.container_port for p in container.ports] == [2222]

    created = kube.wait_condition("train", "Created")
    assert created["reason"] == "StrategyJobCreated"
    status = wait_for("launched", lambda: (kube.job("train")["status"] or {}).get("launched"))
    assert status is True


@pytest.mark.timeout(60)
def test_env_goes_to_the_container_named_strategyjob(kube, operator):
    # runPolicy.rendezvousTimeoutSeconds (kept by the CRD's schema) reaches the container as
    # STRATEGYJOB_RENDEZVOUS_TIMEOUT, over the template's own value.
    m = manifest(
        "sidecar",
        "MultiWorkerMirroredStrategy",
        {"worker": 1},
        run_policy={"rendezvousTimeoutSeconds": 120},
    )
    own = [
        {"name": "RANK", "value": "99"},
        {"name": "STRATEGYJOB_RENDEZVOUS_TIMEOUT", "value": "5"},
    ]
    m["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"] = [
        {"name": "proxy", "image": "envoy", "env": [{"name": "KEEP", "value": "1"}]},
        {"name": "strategyjob", "image": "train", "env": own},
    ]
    kube.create_job(m)
    pod = kube.wait_pods("sidecar", 1)["sidecar-worker-0"]
    proxy, trainer = pod.spec.containers
    assert [e.name for e in proxy.env] == ["KEEP"]
    env = {e.name: e.value for e in trainer.env}
    assert env["RANK"] == "0"  # the injected value wins over the template's
    assert env["STRATEGYJOB_RENDEZVOUS_TIMEOUT"] == "120"
    (raw,) = [p for p, _ in kube.raw_pods("sidecar")]
    assert json.loads(kube.container_env(raw, 1)["TF_CONFIG"])["task"]["type"] == "worker"
