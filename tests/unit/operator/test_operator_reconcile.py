"""The reconciler's order of effects, against a recording fake of the API client:
deletions, then creations, then one status write, then Events."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from strategyjob_operator.kube import KubeApi
from strategyjob_operator.metrics import Registry
from strategyjob_operator.reconcile import JobGone, Reconciler, StaleChildError

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
TEMPLATE = {"spec": {"containers": [{"name": "strategyjob", "image": "x"}]}}


def job_obj(status=None, policy="OnFailure"):
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {"replicas": 2, "restartPolicy": policy, "template": TEMPLATE}
            },
        },
        "status": status or {},
    }


def pod(i, phase, exit_code=None):
    p = {
        "metadata": {
            "name": f"j-worker-{i}",
            "ownerReferences": [{"uid": "u", "controller": True}],
            "labels": {
                "strategyjob.dev/job-name": "j",
                "strategyjob.dev/replica-type": "worker",
                "strategyjob.dev/replica-index": str(i),
            },
        },
        "status": {"phase": phase},
    }
    if exit_code is not None:
        p["status"]["containerStatuses"] = [
            {"name": "strategyjob", "state": {"terminated": {"exitCode": exit_code}}}
        ]
    return p


class FakeApi:
    core_path = staticmethod(KubeApi.core_path)
    group_path = staticmethod(KubeApi.group_path)

    def __init__(self, job, pods):
        self.job, self.pods, self.calls = job, pods, []
        self.config_maps: dict[str, dict] = {}  # the ones a pass writes after creating them

    async def get(self, path):
        if "/configmaps/" in path:
            return self.config_maps.get(path.rsplit("/", 1)[-1])
        return self.job

    async def list(self, path, selector):
        return self.pods

    async def create(self, path, obj):
        self.calls.append(("create", obj["kind"], obj["metadata"]["name"]))
        if obj["kind"] == "ConfigMap":
            self.config_maps[obj["metadata"]["name"]] = obj
        return True

    async def delete(self, path, grace_seconds=None):
        self.calls.append(("delete", path.rsplit("/", 1)[-1]))
        return True

    async def merge_patch(self, path, patch):
        if "/configmaps/" in path:
            name = path.rsplit("/", 1)[-1]
            self.calls.append(("patch", name, None))
            self.config_maps[name] = {**self.config_maps[name], **patch}
            return {}
        self.calls.append(("patch", path.rsplit("/", 1)[-1], patch["status"].get("state")))
        self.job = {**self.job, "status": patch["status"]}  # what the API server would keep
        return {}

    async def post_event(self, involved, type_, reason, message, now):
        self.calls.append(("event", reason))


def run(api):
    reconciler = Reconciler(api, clock=lambda: NOW, registry=Registry())
    return asyncio.run(reconciler.reconcile("ns", "j"))


def test_first_pass_creates_service_and_pods_then_writes_status_once_then_events():
    api = FakeApi(job_obj(), [])
    run(api)
    api.created_config_map = next(n for v, k, n in api.calls if k == "ConfigMap")
    assert api.created_config_map.startswith("j-strategyjob-cluster-")  # one per worker count
    assert api.calls == [
        # the job's Service, security objects and ConfigMap first (pods reference the
        # ServiceAccount, the Secret and the ConfigMap)
        ("create", "Service", "j"),
        ("create", "ServiceAccount", "j-strategyjob-sa"),
        ("create", "Role", "j"),
        ("create", "RoleBinding", "j-strategyjob-sa"),
        ("create", "Secret", "j-u-strategyjob-token"),
        ("create", "NetworkPolicy", "j"),
        ("create", "ConfigMap", api.created_config_map),  # <job>-strategyjob-cluster-<hash>
        ("create", "Pod", "j-worker-0"),
        ("create", "Pod", "j-worker-1"),
        ("patch", "status", "Created"),
        ("event", "StrategyJobCreated"),
    ]


def test_a_pass_for_a_deleted_job_leaves_its_namesake_alone():
    # the loop of a job deleted and created again may still be in a pass: it must not act on
    # the new job (uid "u"), whose own loop runs
    reconciler = Reconciler(FakeApi(job_obj(), []), clock=lambda: NOW, registry=Registry())
    with pytest.raises(JobGone):  # its loop ends
        asyncio.run(reconciler.reconcile("ns", "j", "an-earlier-uid"))
    assert reconciler.api.calls == []
    asyncio.run(reconciler.reconcile("ns", "j", "u"))
    assert ("create", "Pod", "j-worker-0") in reconciler.api.calls


def test_restart_deletes_pods_before_persisting_the_decision():
    launched = {"launched": True, "conditions": [{"type": "Created", "status": "True"}]}
    api = FakeApi(job_obj(launched), [pod(0, "Running"), pod(1, "Failed", 137)])
    run(api)
    kinds = [c[0] for c in api.calls]
    assert kinds == ["delete", "delete", "patch", "event"]
    assert api.calls[2] == ("patch", "status", "Restarting")
    assert api.calls[3] == ("event", "JobRestarting")


def test_a_settled_job_costs_no_writes():
    api = FakeApi(job_obj(), [pod(0, "Running"), pod(1, "Running")])
    run(api)
    assert ("patch", "status", "Running") in api.calls
    api.calls.clear()
    run(api)  # the same pods, the status the first pass wrote
    assert api.calls == []


def test_the_leaders_progress_annotation_reaches_the_status_once():
    import json

    leader = pod(0, "Running")
    leader["metadata"]["annotations"] = {
        "strategyjob.dev/progress": json.dumps(
            {"step": 5, "totalSteps": 20, "metrics": {"loss": 0.5}, "time": "2026-01-01T11:59:00Z"}
        )
    }
    api = FakeApi(job_obj(), [leader, pod(1, "Running")])
    run(api)
    assert api.job["status"]["progress"] == {
        "step": 5,
        "totalSteps": 20,
        "percentage": 25.0,
        "metrics": {"loss": 0.5},
        "lastReportTime": "2026-01-01T11:59:00Z",
    }
    # folded into the job's metric history, created at the first report
    history = api.config_maps["j-strategyjob-metrics"]["data"]["history.json"]
    assert json.loads(history)["series"] == {"loss": [[5, 0.5]]}
    api.calls.clear()
    run(api)  # the same report: no write
    assert api.calls == []


def test_a_metrics_configmap_that_is_not_the_jobs_is_never_overwritten():
    import json

    leader = pod(0, "Running")
    leader["metadata"]["annotations"] = {
        "strategyjob.dev/progress": json.dumps({"step": 5, "metrics": {"loss": 0.5}})
    }
    api = FakeApi(job_obj(), [leader, pod(1, "Running")])
    foreign = {"metadata": {"name": "j-strategyjob-metrics"}, "data": {"mine": "keep"}}
    api.config_maps["j-strategyjob-metrics"] = foreign
    run(api)
    assert api.config_maps["j-strategyjob-metrics"] is foreign  # untouched
    assert api.job["status"]["progress"]["step"] == 5  # the status goes on


def earlier(obj, uid="old"):
    obj["metadata"]["ownerReferences"] = [{"kind": "StrategyJob", "uid": uid, "controller": True}]
    return obj


def test_pods_of_an_earlier_job_of_the_same_name_go_before_anything_is_created():
    """Deleted and created again before the garbage collector ran: the old pods hold the
    names, and their removal later must not count as failures of the new job."""
    going = earlier(pod(1, "Running"))
    going["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:59Z"
    api = FakeApi(job_obj(), [earlier(pod(0, "Running")), going])
    assert run(api) == 1.0  # a pass again soon
    assert api.calls == [("delete", "j-worker-0")]  # no creation, no status, no Event


class HeldApi(FakeApi):
    """Every job object already exists, controlled by ``holder``."""

    def __init__(self, holder):
        super().__init__(job_obj(), [])
        self.holder = holder

    async def create(self, path, obj):
        self.calls.append(("create", obj["kind"], obj["metadata"]["name"]))
        return obj["kind"] == "Pod"

    async def get_metadata(self, path):
        self.calls.append(("get", path.rsplit("/", 1)[-1]))
        return earlier({"metadata": {"name": path.rsplit("/", 1)[-1]}}, self.holder)


def test_objects_of_an_earlier_job_are_deleted_and_the_pass_retried():
    api = HeldApi("old")
    with pytest.raises(StaleChildError, match="Service ns/j was left by an earlier StrategyJob"):
        run(api)
    assert ("delete", "j") in api.calls and ("delete", "j-u-strategyjob-token") in api.calls
    assert not [c for c in api.calls if c[:2] == ("create", "Pod") or c[0] == "patch"]


def test_objects_this_job_already_owns_are_kept():
    api = HeldApi("u")  # the operator restarted after creating them
    run(api)
    assert not [c for c in api.calls if c[0] == "delete"]
    assert ("create", "Pod", "j-worker-1") in api.calls
