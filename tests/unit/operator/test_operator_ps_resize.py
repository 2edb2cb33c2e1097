"""The pure decisions of resizing a ParameterServerStrategy job's workers (issue 30,
:mod:`strategyjob_operator.scaling`): who the chief follows, what the members ConfigMap says,
which pods a resize adds, the ``Resizing`` condition, and the chief's mount."""

from __future__ import annotations

import dataclasses
import json

import pytest
from strategyjob import jobspec
from strategyjob_operator import children, scaling
from strategyjob_operator import constants as c

from tests.unit.operator.test_operator_children import OWNER, make_job


def resized(workers: int) -> jobspec.StrategyJob:
    job = make_job()
    specs = dict(job.replica_specs)
    specs["worker"] = dataclasses.replace(specs["worker"], replicas=workers)
    return dataclasses.replace(job, replica_specs=specs)


def pod(index: int, ready: bool = True, going: bool = False, kind: str = "worker") -> dict:
    meta = {
        "name": f"mnist-{kind}-{index}",
        "labels": {c.LABEL_REPLICA_TYPE: kind, c.LABEL_REPLICA_INDEX: str(index)},
    }
    if going:
        meta["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "status": status}


def test_only_a_ps_strategyjob_is_resizable():
    assert scaling.resizable(make_job(), None)
    mwms = dataclasses.replace(make_job(), strategy="MultiWorkerMirroredStrategy")
    assert not scaling.resizable(mwms, None)


def test_new_workers_join_once_ready_and_removed_ones_leave_at_once():
    before = scaling.initial_members(make_job())
    assert before == scaling.Members((0, 1), 2)
    up = resized(4)
    # 2 -> 4: worker 2 Ready, worker 3 not yet
    after = scaling.next_members(up, before, scaling.ready_workers([pod(0), pod(2), pod(3, False)]))
    assert after == scaling.Members((0, 1, 2), 4)
    # a followed worker whose pod is being replaced stays (the chief waits for it)
    assert scaling.next_members(up, after, set()).workers == (0, 1, 2)
    # 4 -> 1: everyone above 0 leaves, Ready or not
    down = scaling.next_members(resized(1), after, {0, 1, 2, 3})
    assert down == scaling.Members((0,), 1)


def test_ready_workers_reads_only_ready_worker_pods_that_stay():
    pods = [pod(0), pod(1, ready=False), pod(2, going=True), pod(0, kind="chief"), {}]
    assert scaling.ready_workers(pods) == {0}


def test_the_members_configmap_round_trips_and_names_sparse_workers():
    job = resized(4)
    data = scaling.members_data(job, scaling.Members((0, 2, 3), 4))
    cluster = json.loads(data[scaling.MEMBERS_FILE_KEY])
    assert cluster["worker"] == {
        "0": "mnist-worker-0.mnist.ml.svc:2222",
        "2": "mnist-worker-2.mnist.ml.svc:2222",
        "3": "mnist-worker-3.mnist.ml.svc:2222",
    }
    assert cluster["chief"] == ["mnist-chief-0.mnist.ml.svc:2222"]
    assert cluster["ps"] == ["mnist-ps-0.mnist.ml.svc:2222"]
    assert scaling.read_members(data) == scaling.Members((0, 2, 3), 4)
    assert scaling.read_members({}) is None
    assert scaling.read_members({scaling.REPLICAS_KEY: "x"}) is None


def test_a_resize_adds_pods_only_above_the_count_they_were_made_for():
    before = scaling.Members((0, 1), 2)
    # worker-0's pod is gone (a failure the decisions count): not recreated here
    assert scaling.added_workers(resized(4), before, [pod(1), pod(3)]) == [("worker", 2)]
    assert scaling.added_workers(resized(1), before, []) == []


def test_a_worker_removed_then_added_again_gets_a_new_pod_once_its_old_one_is_gone():
    """Scaled 4 -> 1 -> 3 before workers 1 and 2 finished terminating: their going pods are
    not theirs any more. (Counted as there, the count the pods were made for moved to 3 and
    the two were never made again: found on kind.)"""
    before = scaling.Members((0,), 1)
    going = [pod(0), pod(1, going=True), pod(2, going=True)]
    assert scaling.added_workers(resized(3), before, going) == [("worker", 1), ("worker", 2)]


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ((0, 1, 2, 3), (False, c.REASON_RESIZED, "StrategyJob mnist runs 4 workers.")),
        (
            (0, 1),
            (
                True,
                c.REASON_RESIZING,
                "StrategyJob mnist: resizing to 4 workers; the chief follows 2, waiting for "
                "mnist-worker-2, mnist-worker-3 to be Ready.",
            ),
        ),
    ],
)
def test_the_resizing_condition_names_the_workers_waited_for(workers, expected):
    assert scaling.resize_condition(resized(4), scaling.Members(workers, 4)) == expected


def test_a_job_that_stopped_running_is_not_resizing():
    assert scaling.resize_condition(make_job(), None) == (
        False,
        c.REASON_RESIZED,
        "StrategyJob mnist is not running.",
    )


def test_the_event_says_who_joined_and_who_left():
    message = scaling.resized_message(make_job(), (0, 1), (0, 2, 3))
    assert message == (
        "StrategyJob mnist: workers 2 -> 3 (joined: worker 2-3; left: worker 1); the chief "
        "follows them without a restart."
    )


def test_the_chief_follows_the_members_file_and_no_other_pod_does():
    job = make_job()
    owner = children.owner_reference(OWNER)
    cluster = jobspec.cluster_for_kubernetes(job)
    chief = children.build_pod(job, "chief", 0, owner, cluster)
    container = chief["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[c.ENV_CLUSTER_FILE] == f"{scaling.MEMBERS_DIR}/{scaling.MEMBERS_FILE_KEY}"
    (volume,) = chief["spec"]["volumes"]
    assert volume["configMap"] == {"name": "mnist-strategyjob-members"}
    assert container["volumeMounts"] == [
        {"name": volume["name"], "mountPath": scaling.MEMBERS_DIR, "readOnly": True}
    ]
    worker = children.build_pod(job, "worker", 0, owner, cluster)
    assert "volumes" not in worker["spec"]
    assert c.ENV_CLUSTER_FILE not in {e["name"] for e in worker["spec"]["containers"][0]["env"]}
    members = children.build_members_config_map(job, owner, scaling.initial_members(job))
    assert members["metadata"]["name"] == "mnist-strategyjob-members"
    assert "immutable" not in members


def test_the_resizing_condition_says_why_an_added_worker_cannot_start():
    """Its pod is unschedulable: reason ResizeStalled, the scheduler's words, and that the job
    runs on at its old size."""
    from strategyjob_operator.observe import Replica

    stuck = Replica(
        "worker",
        3,
        "mnist-worker-3",
        "Pending",
        stuck_reason="Unschedulable",
        stuck_message="0/2 nodes are available: 2 Insufficient cpu.",
    )
    members = scaling.Members((0, 1), 4)
    assert scaling.joining(resized(4), members) == {("worker", 2), ("worker", 3)}
    held = scaling.resize_condition(resized(4), members, {("worker", 3): stuck})
    assert held == (
        True,
        c.REASON_RESIZE_STALLED,
        "StrategyJob mnist: resizing to 4 workers; the chief follows 2, waiting for "
        "mnist-worker-2, mnist-worker-3 to be Ready. Pod mnist-worker-3 cannot start: "
        "Unschedulable: 0/2 nodes are available: 2 Insufficient cpu; the job runs on with 2 "
        "workers meanwhile.",
    )
    assert scaling.joining(resized(4), None) == frozenset()
