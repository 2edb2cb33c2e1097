"""The operator acts only on pods its job controls (controller reference and uid, not the
job-name label), deletes only the pod it saw (uid precondition), and passes over every
active job periodically to notice what no event reported. Pure logic with a fake API; the
real API server: tests/integration/test_k8s_ownership.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from strategyjob import jobspec
from strategyjob_operator import constants as c
from strategyjob_operator.job_loop import jobs_to_wake
from strategyjob_operator.kube import ApiError, KubeApi
from strategyjob_operator.metrics import Registry
from strategyjob_operator.observe import left_by_earlier_job, observe
from strategyjob_operator.outcome import status_patch
from strategyjob_operator.reconcile import (
    DEFAULT_RESYNC_SECONDS,
    OperatorSettings,
    Reconciler,
)
from strategyjob_operator.settings import resync_seconds

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
TEMPLATE = {"spec": {"containers": [{"name": "strategyjob", "image": "x"}]}}


def job_obj(name="jb", uid="uid-b", status=None):
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": TEMPLATE}
            },
        },
        "status": status or {},
    }


def pod(job, uid, i, *, label=None, pod_uid=None, phase="Running", index=None):
    return {
        "metadata": {
            "name": f"{job}-worker-{i}",
            "uid": pod_uid or f"{job}-{i}",
            "ownerReferences": [
                {"kind": c.KIND, "name": job, "uid": uid, "controller": True},
            ],
            "labels": {
                c.LABEL_JOB_NAME: label or job,
                c.LABEL_REPLICA_TYPE: "worker",
                c.LABEL_REPLICA_INDEX: str(i if index is None else index),
            },
        },
        "status": {"phase": phase},
    }


class FakeApi:
    core_path = staticmethod(KubeApi.core_path)
    group_path = staticmethod(KubeApi.group_path)

    def __init__(self, job, pods, existing=None):
        self.job, self.pods, self.existing = job, pods, existing or {}
        self.calls: list[tuple[Any, ...]] = []

    async def get(self, path):
        return self.job

    async def list(self, path, selector):
        return self.pods

    async def create(self, path, obj):
        self.calls.append(("create", obj["kind"], obj["metadata"]["name"]))
        return obj["metadata"]["name"] not in self.existing

    async def get_metadata(self, path):
        return self.existing.get(path.rsplit("/", 1)[-1])

    async def delete(self, path, grace_seconds=None, uid=None):
        self.calls.append(("delete", path.rsplit("/", 1)[-1], uid))
        return True

    async def merge_patch(self, path, patch):
        self.calls.append(("patch",))
        self.job = {**self.job, "status": patch["status"]}
        return {}

    async def post_event(self, involved, type_, reason, message, now):
        self.calls.append(("event", reason, message))


def run(api, name="jb", **settings):
    reconciler = Reconciler(
        api, OperatorSettings(**settings), clock=lambda: NOW, registry=Registry()
    )
    return asyncio.run(reconciler.reconcile("ns", name))


def test_another_live_jobs_pod_relabelled_with_this_jobs_name_is_left_alone():
    """The reported bug: jb deleted ja-worker-0 (labelled jb by hand) as an 'earlier job's
    leftover'. Its controller is a StrategyJob of another name: not jb's to touch."""
    stolen = pod("ja", "uid-a", 0, label="jb")
    assert not left_by_earlier_job(stolen, "uid-b", "jb")
    launched = {"launched": True, "startTime": "2026-01-01T11:00:00Z"}
    api = FakeApi(job_obj(status=launched), [pod("jb", "uid-b", 0), pod("jb", "uid-b", 1), stolen])
    run(api)
    assert not [x for x in api.calls if x[0] == "delete"]


def test_only_a_namesakes_leftovers_are_cleaned_up_and_only_the_pods_seen():
    earlier = pod("jb", "uid-old", 0, pod_uid="old-0")
    assert left_by_earlier_job(earlier, "uid-b", "jb")
    assert not left_by_earlier_job(pod("jb", "uid-b", 0), "uid-b", "jb")
    orphan = pod("jb", "uid-b", 1)
    orphan["metadata"]["ownerReferences"] = []
    assert not left_by_earlier_job(orphan, "uid-b", "jb")
    api = FakeApi(job_obj(), [earlier, pod("ja", "uid-a", 1, label="jb")])
    assert run(api) == 1.0
    assert api.calls == [("delete", "jb-worker-0", "old-0")]  # uid precondition


def test_observe_keeps_only_pods_whose_name_matches_their_labels():
    j = jobspec.load_manifest(job_obj("ja", "uid-a"))
    moved = pod("ja", "uid-a", 1, index=0)  # worker-1 relabelled as index 0
    seen = observe(j, [pod("ja", "uid-a", 0), moved, pod("ja", "uid-x", 1)], "uid-a")
    assert {k: r.name for k, r in seen.items()} == {("worker", 0): "ja-worker-0"}


def test_a_restart_deletes_each_pod_only_if_it_is_still_the_one_seen():
    launched = {"launched": True, "startTime": "2026-01-01T11:00:00Z"}
    failed = pod("jb", "uid-b", 1, phase="Failed")
    api = FakeApi(job_obj(status=launched), [pod("jb", "uid-b", 0), failed])
    run(api)
    deletes = sorted(x for x in api.calls if x[0] == "delete")
    assert deletes == [("delete", "jb-worker-0", "jb-0"), ("delete", "jb-worker-1", "jb-1")]


def test_this_jobs_pod_that_lost_its_labels_is_deleted_and_created_again():
    """ja-worker-0 relabelled to jb: ja no longer lists it (its replica is gone), but the pod
    holds the name ja must create again."""
    relabelled = pod("ja", "uid-a", 0, label="jb", pod_uid="p-old")
    api = FakeApi(job_obj("ja", "uid-a"), [pod("ja", "uid-a", 1)], {"ja-worker-0": relabelled})
    assert run(api, "ja") == 1.0  # the pod of that name is going: a pass again soon
    assert ("delete", "ja-worker-0", "p-old") in api.calls
    assert ("create", "Pod", "ja-worker-1") not in api.calls  # ja-worker-1 exists


def test_this_jobs_pod_with_its_labels_is_taken_as_created():
    mine = pod("ja", "uid-a", 0)
    api = FakeApi(job_obj("ja", "uid-a"), [], {"ja-worker-0": mine})
    run(api, "ja")
    assert not [x for x in api.calls if x[0] == "delete"]


def test_a_pod_event_wakes_the_labelled_job_and_the_controlling_job():
    stolen = pod("ja", "uid-a", 0, label="jb")["metadata"]
    assert jobs_to_wake(stolen["labels"], stolen) == {"ja", "jb"}
    assert jobs_to_wake({}, stolen) == {"ja"}  # the label removed: the watch's deletion
    assert jobs_to_wake({c.LABEL_JOB_NAME: "jb"}, {}) == {"jb"}
    other = {"ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}]}
    assert jobs_to_wake({}, other) == set()


@pytest.mark.parametrize(
    ("status", "expect_resync"),
    [
        ({"launched": True, "startTime": "2026-01-01T11:00:00Z"}, True),
        ({}, True),  # being created
        ({"conditions": [{"type": c.SUCCEEDED, "status": "True"}]}, False),
        ({"conditions": [{"type": c.FAILED, "status": "True"}]}, False),
    ],
)
def test_active_jobs_are_resynced_periodically_with_jitter(status, expect_resync):
    pods = [pod("jb", "uid-b", 0), pod("jb", "uid-b", 1)]
    delay = run(FakeApi(job_obj(status=status), pods), resync_seconds=60.0)
    if expect_resync:
        assert delay is not None and 54.0 <= delay <= 66.0
    else:
        assert delay is None
    assert run(FakeApi(job_obj(status=status), pods)) in (None, 1.0)  # off by default


def test_a_suspended_job_is_not_resynced():
    obj = job_obj()
    obj["spec"]["runPolicy"] = {"suspend": True}
    assert run(FakeApi(obj, []), resync_seconds=60.0) is None


def test_the_resync_setting_is_read_with_one_clear_line():
    assert resync_seconds("30") == 30.0 and resync_seconds("0") is None
    assert DEFAULT_RESYNC_SECONDS == 60.0
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match=r"is not a number of seconds: set it to e\.g\. 60"):
            resync_seconds(bad)


class RecordingKube(KubeApi):
    def __init__(self, answer: ApiError | None = None) -> None:  # no session: request is faked
        self.answer, self.bodies = answer, []

    async def request(self, method, path, *, body=None, **_):
        self.bodies.append(body)
        if self.answer is not None:
            raise self.answer
        return {}


def test_delete_with_a_uid_sends_the_precondition_and_a_replaced_pod_is_not_deleted():
    api = RecordingKube()
    assert asyncio.run(api.delete("/p", uid="u1")) is True
    assert api.bodies[-1] == {"propagationPolicy": "Background", "preconditions": {"uid": "u1"}}
    conflict = RecordingKube(ApiError(409, "DELETE", "/p", "Precondition failed: UID"))
    assert asyncio.run(conflict.delete("/p", uid="u1")) is False
    with pytest.raises(ApiError):  # without a uid a conflict is still an error
        asyncio.run(conflict.delete("/p"))


def merge(target, patch):
    """RFC 7386, as the API server applies a merge patch."""
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def test_the_status_patch_nulls_what_the_new_status_drops_at_any_depth():
    old = {
        "stalledReasons": ["Unschedulable"],
        "replicaStatuses": {"worker": {"completedIndexes": "0", "active": 1}},
        "restartCount": 0,
    }
    new = {"replicaStatuses": {"worker": {"active": 2}}, "restartCount": 1}
    patch = status_patch(old, new)
    assert patch["stalledReasons"] is None
    assert patch["replicaStatuses"]["worker"]["completedIndexes"] is None
    assert merge(old, patch) == new


def test_a_job_that_was_stalled_writes_nothing_on_later_passes():
    """Without nulling stalledReasons, every pass (and every resync) wrote the status."""

    class MergingApi(FakeApi):
        async def merge_patch(self, path, patch):
            self.calls.append(("patch",))
            self.job = {**self.job, "status": merge(self.job["status"], patch["status"])}
            return {}

    stalled = {
        "launched": True,
        "startTime": "2026-01-01T11:00:00Z",
        "stalledReasons": ["Unschedulable"],
    }
    api = MergingApi(job_obj(status=stalled), [pod("jb", "uid-b", 0), pod("jb", "uid-b", 1)])
    run(api)
    assert "stalledReasons" not in api.job["status"]
    api.calls.clear()
    run(api, resync_seconds=60.0)
    assert not [x for x in api.calls if x[0] == "patch"]
