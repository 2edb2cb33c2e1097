"""A TFJob under ``enableDynamicWorker`` shaped for ParameterServerStrategy (a chief and ps):
its chief follows its workers through the members file as a StrategyJob's does (issue 30),
with the TFJob's own cluster in it; every other TFJob keeps training-operator's edits."""

from __future__ import annotations

import json
from typing import Any

import pytest
from strategyjob import jobspec
from strategyjob.ps._cluster_file import ClusterFile
from strategyjob_operator import children, scaling
from strategyjob_operator import constants as c
from strategyjob_operator.flavor import TFJOB, Loaded

from tests.unit.operator.test_operator_children import OWNER

FILE = f"{scaling.MEMBERS_DIR}/{scaling.MEMBERS_FILE_KEY}"


def tfjob(dynamic: bool = True, chief: str | None = "Master", ps: int = 1, workers: int = 2):
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "template": {"spec": {"containers": [{"name": "tensorflow"}]}}}

    specs = {"Worker": replica(workers)}
    if chief:
        specs[chief] = replica(1)
    if ps:
        specs["PS"] = replica(ps)
    return jobspec.load_tfjob(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"tfReplicaSpecs": specs, "enableDynamicWorker": dynamic},
        },
        cluster_domain="cluster.local",
    )


def test_only_a_dynamic_tfjob_with_a_chief_and_ps_follows_its_workers():
    for tf in (tfjob(), tfjob(chief="Chief")):
        assert scaling.resizable(tf.job, tf)
    for tf in (tfjob(dynamic=False), tfjob(ps=0), tfjob(chief=None)):
        assert not scaling.resizable(tf.job, tf)


def test_the_members_file_is_the_tfjobs_own_cluster_with_sparse_workers(tmp_path):
    tf = tfjob(workers=3)
    data = scaling.members_data(tf.job, scaling.Members((0, 2), 3), tf)
    cluster = json.loads(data[scaling.MEMBERS_FILE_KEY])
    svc = "ns.svc.cluster.local:2222"
    assert cluster == {
        "master": [f"j-master-0.{svc}"],
        "ps": [f"j-ps-0.{svc}"],
        "worker": {"0": f"j-worker-0.{svc}", "2": f"j-worker-2.{svc}"},
    }
    # the same addresses and type names as the TFJob's own (dense) TF_CONFIG writes
    dense = json.loads(jobspec.tfjob_cluster_spec(tf))
    assert {k: v for k, v in dense.items() if k != "worker"} == {
        k: v for k, v in cluster.items() if k != "worker"
    }
    assert scaling.read_members(data) == scaling.Members((0, 2), 3)
    # what the chief's coordinator takes from the file
    path = tmp_path / scaling.MEMBERS_FILE_KEY
    path.write_text(data[scaling.MEMBERS_FILE_KEY])
    assert ClusterFile(str(path)).poll() == {0: f"j-worker-0.{svc}", 2: f"j-worker-2.{svc}"}


def test_the_chief_of_a_dynamic_tfjob_mounts_the_members_file():
    tf = tfjob()
    owner = children.owner_reference(OWNER)
    cluster = jobspec.cluster_for_kubernetes(tf.job)
    chief = children.build_pod(tf.job, "chief", 0, owner, cluster, tfjob=tf)
    assert chief["metadata"]["name"] == "j-master-0"
    container = chief["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[c.ENV_CLUSTER_FILE] == FILE
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "master", "index": 0}
    (volume,) = chief["spec"]["volumes"]
    assert volume["configMap"] == {"name": "j-strategyjob-members"}
    worker = children.build_pod(tf.job, "worker", 1, owner, cluster, tfjob=tf)
    assert "volumes" not in worker["spec"]
    members = children.build_members_config_map(tf.job, owner, scaling.initial_members(tf.job), tf)
    assert json.loads(members["data"][scaling.MEMBERS_FILE_KEY])["worker"] == {
        "0": "j-worker-0.ns.svc.cluster.local:2222",
        "1": "j-worker-1.ns.svc.cluster.local:2222",
    }


@pytest.mark.parametrize("tf", [tfjob(dynamic=False), tfjob(ps=0, chief="Chief")])
def test_other_tfjobs_chiefs_are_as_training_operator_makes_them(tf):
    owner = children.owner_reference(OWNER)
    cluster = jobspec.cluster_for_kubernetes(tf.job)
    chief = children.build_pod(tf.job, "chief", 0, owner, cluster, tfjob=tf)
    container = chief["spec"]["containers"][0]
    assert c.ENV_CLUSTER_FILE not in {e["name"] for e in container["env"]}
    assert "volumes" not in chief["spec"] and "volumeMounts" not in container
    # a non-dynamic one's TF_CONFIG still refers to its (immutable) cluster ConfigMap
    if not tf.enable_dynamic_worker:
        (tf_config,) = [e for e in container["env"] if e["name"] == "TF_CONFIG"]
        assert "$(" in tf_config["value"]


def test_a_dynamic_tfjobs_other_types_are_added_as_training_operator_adds_them():
    tf = tfjob(ps=2, workers=3)
    services = [{"metadata": {"name": n}} for n in ("j-master-0", "j-ps-0", "j-worker-0")]
    assert scaling.added_others(tf.job, services) == [("ps", 1)]


def test_resizing_reads_as_a_tfjobs_and_its_state_stays_the_last_condition():
    tf = tfjob(workers=3)
    held = scaling.resize_condition(tf.job, scaling.Members((0, 1), 3))
    assert TFJOB.message(held[2], "j") == (
        "TFJob j: resizing to 3 workers; the chief follows 2, waiting for j-worker-2 to be Ready."
    )
    event = scaling.resized_message(tf.job, (0, 1), (0, 1, 2))
    assert TFJOB.message(event, "j").startswith("TFJob j: workers 2 -> 3 (joined: worker 2)")
    internal = {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "StrategyJobCreated"},
            {"type": "Running", "status": "True", "reason": "StrategyJobRunning"},
            {"type": "Resizing", "status": "True", "reason": c.REASON_RESIZING},
        ]
    }
    loaded = Loaded(tf.job, tf)
    written = TFJOB.external_status(internal, loaded)
    # kubectl get tfjob's State column: .status.conditions[-1:].type
    assert [x["type"] for x in written["conditions"]] == ["Resizing", "Created", "Running"]
    again = TFJOB.internal_status(written, loaded)
    assert TFJOB.external_status(again, loaded) == written
