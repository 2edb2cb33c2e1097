"""TFJob replicas edits: which objects go, which replicas are new, and when to look."""

from __future__ import annotations

from typing import Any

from strategyjob import jobspec
from strategyjob_operator import scaling


def job(workers: int) -> jobspec.StrategyJob:
    replica = {"replicas": workers, "template": {"spec": {"containers": [{"name": "tensorflow"}]}}}
    return jobspec.load_tfjob(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "j"},
            "spec": {"tfReplicaSpecs": {"Worker": replica}},
        }
    ).job


def obj(name: str, owner: str = "u", **meta: Any) -> dict[str, Any]:
    ref = {"controller": True, "uid": owner}
    return {"metadata": {"name": name, "uid": f"{name}-uid", "ownerReferences": [ref], **meta}}


def test_surplus_is_what_the_job_controls_beyond_its_replicas() -> None:
    objs = [
        obj("j-worker-0"),
        obj("j-worker-1"),
        obj("j-worker-2"),
        obj("j-worker-3", owner="other"),
        obj("j-worker-4", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    assert scaling.surplus(job(2), objs, "u") == [("j-worker-2", "j-worker-2-uid")]


def test_added_replicas_are_those_without_a_service() -> None:
    assert scaling.added(job(4), [obj("j-worker-0"), obj("j-worker-1")]) == [
        ("worker", 2),
        ("worker", 3),
    ]


def test_scaling_is_looked_at_after_a_spec_edit_of_a_running_job_only() -> None:
    running = {"observedGeneration": 1, "launched": True, "conditions": []}
    assert scaling.scaled(running, 2, suspended=False)
    assert not scaling.scaled(running, 1, suspended=False)  # no edit since
    assert not scaling.scaled(running, 2, suspended=True)
    assert not scaling.scaled({**running, "launched": False}, 2, suspended=False)
    done = {**running, "conditions": [{"type": "Succeeded", "status": "True"}]}
    assert not scaling.scaled(done, 2, suspended=False)
    assert not scaling.scaled({"launched": True}, 2, suspended=False)  # never decided yet
