"""A TFJob's status, translated both ways between the decisions and the API server, and
the TFJob setting of the operator."""

from __future__ import annotations

import pytest
from strategyjob import jobspec
from strategyjob_operator import settings
from strategyjob_operator.flavor import STRATEGYJOB, TFJOB, Loaded


def tfjob() -> jobspec.TFJob:
    def replica(n: int) -> dict:
        return {"replicas": n, "template": {"spec": {"containers": [{"name": "tensorflow"}]}}}

    return jobspec.load_tfjob(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {
                "tfReplicaSpecs": {"Master": replica(1), "PS": replica(1), "worker": replica(2)}
            },
        }
    )


def test_status_reads_as_tfjob_writes_it_and_back() -> None:
    tf = tfjob()
    loaded = Loaded(tf.job, tf)
    internal = {
        "conditions": [
            {
                "type": "Created",
                "status": "True",
                "reason": "StrategyJobCreated",
                "message": "StrategyJob j (ParameterServerStrategy, 4 replicas) is created.",
            },
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"},
        ],
        "replicaStatuses": {
            "chief": {"active": 1},
            "worker": {"failed": 1, "restarts": 2, "failedIndexes": "1"},
            "ps": {},
        },
        "startTime": "2026-01-01T00:00:00Z",
    }
    written = TFJOB.external_status(internal, loaded)
    assert [c["reason"] for c in written["conditions"]] == ["TFJobCreated", "BackoffLimitExceeded"]
    assert written["conditions"][0]["message"].startswith("TFJob j (ParameterServerStrategy")
    # replicaStatuses as TFJob's CRD has them; StrategyJob's bookkeeping beside them
    assert written["strategyjobReplicaStatuses"]["Worker"] == {"restarts": 2, "failedIndexes": "1"}
    assert written["replicaStatuses"] == {
        "Master": {"active": 1},
        "Worker": {"failed": 1},
        "PS": {},
    }
    assert written["startTime"] == internal["startTime"]
    assert TFJOB.internal_status(written, loaded) == internal
    assert TFJOB.reason("StrategyJobRunning") == "TFJobRunning"
    # a StrategyJob's status is its own
    plain = Loaded(tf.job)
    assert STRATEGYJOB.external_status(internal, plain) == internal
    assert STRATEGYJOB.reason("StrategyJobRunning") == "StrategyJobRunning"
    assert (
        TFJOB.job_path("ns", "j", "status") == "/apis/kubeflow.org/v1/namespaces/ns/tfjobs/j/status"
    )


def test_serve_tfjobs_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATEGYJOB_SERVE_TFJOBS", raising=False)
    assert settings.settings_from_env().serve_tfjobs is False
    monkeypatch.setenv("STRATEGYJOB_SERVE_TFJOBS", "true")
    assert settings.settings_from_env().serve_tfjobs is True
    monkeypatch.setenv("STRATEGYJOB_SERVE_TFJOBS", "maybe")
    with pytest.raises(ValueError, match="STRATEGYJOB_SERVE_TFJOBS='maybe' is not true or false"):
        settings.settings_from_env()


def test_cluster_domain_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """training-operator's ``CUSTOM_CLUSTER_DOMAIN``, read as it names it; a value no address
    could end with stops the operator with one line."""
    monkeypatch.delenv("CUSTOM_CLUSTER_DOMAIN", raising=False)
    assert settings.settings_from_env().cluster_domain == ""
    monkeypatch.setenv("CUSTOM_CLUSTER_DOMAIN", "cluster.local")
    assert settings.settings_from_env().cluster_domain == "cluster.local"
    for bad in (".cluster.local", "Cluster.Local", "cluster.local.", "a_b"):
        monkeypatch.setenv("CUSTOM_CLUSTER_DOMAIN", bad)
        with pytest.raises(ValueError, match=r"CUSTOM_CLUSTER_DOMAIN=.* is not a lowercase DNS"):
            settings.settings_from_env()
    # a StrategyJob's addresses are its pods' own: the domain is a TFJob's alone
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tf"}]}},
                }
            }
        },
    }
    loaded = TFJOB.load(manifest, "cluster.local")
    assert loaded.tfjob is not None
    assert loaded.tfjob.address("worker", 1) == "j-worker-1.ns.svc.cluster.local:2222"


def test_pod_group_of_a_tfjob_has_its_min_resources_and_schedule_timeout() -> None:
    from strategyjob_operator import gang

    replica = {"replicas": 2, "template": {"spec": {"containers": [{"name": "tensorflow"}]}}}
    scheduling = {"minResources": {"cpu": "4"}, "scheduleTimeoutSeconds": 90, "queue": "q"}
    tf = jobspec.load_tfjob(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {
                "tfReplicaSpecs": {"Worker": replica},
                "runPolicy": {"schedulingPolicy": scheduling},
            },
        }
    )
    owner = {"kind": "TFJob", "uid": "u"}
    volcano = gang.build_pod_group(tf.job, owner, gang.VOLCANO, tf)["spec"]
    assert volcano == {"minMember": 2, "queue": "q", "minResources": {"cpu": "4"}}
    plugins = gang.build_pod_group(tf.job, owner, gang.SCHEDULER_PLUGINS, tf)["spec"]
    assert plugins == {"minMember": 2, "minResources": {"cpu": "4"}, "scheduleTimeoutSeconds": 90}
