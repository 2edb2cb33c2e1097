"""Conditions keep their transition times; pods reduce to replicas with exit codes;
the metrics exposition is valid Prometheus text."""

from __future__ import annotations

import urllib.request

from strategyjob import jobspec
from strategyjob_operator import conditions as cond
from strategyjob_operator import constants as c
from strategyjob_operator import metrics, observe


def test_transition_time_changes_only_when_status_flips():
    conds = cond.set_condition([], c.RUNNING, True, "R", "running", "t1")
    conds = cond.set_condition(conds, c.RUNNING, True, "R", "still running", "t2")
    (running,) = conds
    assert running["lastTransitionTime"] == "t1" and running["lastUpdateTime"] == "t2"
    assert cond.set_condition(conds, c.RUNNING, True, "R", "still running", "t3") == conds


def test_running_and_restarting_exclude_each_other():
    conds = cond.set_condition([], c.RUNNING, True, "R", "running", "t1")
    conds = cond.set_condition(conds, c.RESTARTING, True, "X", "restarting", "t2")
    assert not cond.is_true(conds, c.RUNNING) and cond.state(conds) == c.RESTARTING
    conds = cond.set_condition(conds, c.RUNNING, True, "R", "running", "t3")
    assert not cond.is_true(conds, c.RESTARTING) and cond.state(conds) == c.RUNNING


def test_false_condition_that_never_held_is_not_recorded():
    assert cond.set_condition([], c.SUSPENDED, False, "R", "m", "t") == []


def _pod(name, t, i, phase, terminated=None, deleting=False):
    status = {"phase": phase}
    if terminated:
        status["containerStatuses"] = [
            {"name": "sidecar", "state": {"running": {}}},
            {"name": "strategyjob", "state": {"terminated": terminated}},
        ]
    meta = {"name": name, "labels": {c.LABEL_REPLICA_TYPE: t, c.LABEL_REPLICA_INDEX: str(i)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": status}


def test_observe_reads_the_training_containers_exit_code_and_skips_strangers():
    job = jobspec.load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "j"},
            "spec": {
                "strategy": "MultiWorkerMirroredStrategy",
                "replicaSpecs": {
                    "worker": {
                        "replicas": 2,
                        "template": {
                            "spec": {
                                "containers": [
                                    {"name": "sidecar", "image": "s"},
                                    {"name": "strategyjob", "image": "t"},
                                ]
                            }
                        },
                    }
                },
            },
        }
    )
    pods = [
        _pod("j-worker-0", "worker", 0, "Failed", {"exitCode": 137, "reason": "OOMKilled"}),
        _pod("j-worker-1", "worker", 1, "Running", deleting=True),
        _pod("j-worker-7", "worker", 7, "Running"),  # not an index of this job
    ]
    seen = observe.observe(job, pods)
    assert set(seen) == {("worker", 0), ("worker", 1)}
    for p in pods[1:]:
        p["metadata"]["ownerReferences"] = [{"uid": "old-job", "controller": True}]
    assert set(observe.observe(job, pods, owner_uid="new-job")) == set()
    failed = seen[("worker", 0)]
    assert (failed.exit_code, failed.reason) == (137, "OOMKilled")
    assert seen[("worker", 1)].terminating


def test_metrics_are_served_in_prometheus_text_format():
    registry = metrics.Registry()
    registry.inc("pods_created", "ml", 3)
    registry.observe_reconcile(0.02)
    server = metrics.serve(0, host="127.0.0.1", registry=registry)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    finally:
        server.shutdown()
    assert 'strategyjob_operator_pods_created_total{job_namespace="ml"} 3' in text
    assert 'strategyjob_operator_reconcile_duration_seconds_bucket{le="0.025"} 1' in text
    assert 'strategyjob_operator_reconcile_duration_seconds_bucket{le="0.01"} 0' in text
    assert "strategyjob_operator_reconcile_duration_seconds_count 1" in text
