"""A gang's pods and the namespace's ResourceQuotas: all of them fit or none is created (the
fit computed from plain data, tables below), a creation the quota refuses part-way undone,
and a suspended job's PodGroup deleted; the reconciler's part against a recording fake."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from fractions import Fraction as F
from typing import Any

import kopf
import pytest
from strategyjob import jobspec
from strategyjob_operator import decide, gang, handlers, quota
from strategyjob_operator.kube import ApiError, KubeApi
from strategyjob_operator.metrics import Registry
from strategyjob_operator.reconcile import OperatorSettings, Reconciler
from strategyjob_operator.state import OperatorState, installed

from tests.support import manifests

# --- quantities --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("8", F(8)),
        ("500m", F(1, 2)),
        ("1.5", F(3, 2)),
        ("2Gi", F(2 * 1024**3)),
        ("512Mi", F(512 * 1024**2)),
        ("1k", F(1000)),
        ("1e3", F(1000)),
        ("1E3", F(1000)),
        ("2E", F(2 * 10**18)),  # the exa suffix, not an exponent
        ("100n", F(1, 10**7)),
        (".5", F(1, 2)),
        (4, F(4)),
        (" 3 ", F(3)),
    ],
)
def test_parse_quantity(raw: Any, value: F) -> None:
    assert quota.parse_quantity(raw) == value


@pytest.mark.parametrize("raw", ["", "abc", "1Xi", "--1", None, True, [], "1.2.3"])
def test_parse_quantity_refuses_what_is_not_one(raw: Any) -> None:
    assert quota.parse_quantity(raw) is None


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [
        ("cpu", F(8), "8"),
        ("requests.cpu", F(3, 2), "1500m"),
        ("memory", F(16 * 1024**3), "16Gi"),
        ("limits.memory", F(3 * 1024**2), "3Mi"),
        ("memory", F(1000), "1000"),
        ("pods", F(2048), "2048"),  # a count, never 2Ki
        ("cpu", F(1, 3), "0.333"),
    ],
)
def test_format_quantity(resource: str, value: F, text: str) -> None:
    assert quota.format_quantity(resource, value) == text


# --- what a pod is charged ----------------------------------------------------------------------


def ctr(requests: dict | None = None, limits: dict | None = None, **extra: Any) -> dict:
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": "c", "image": "x", "resources": resources, **extra}


GI = 1024**3


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [ctr()]}, {}, id="best-effort"),
        pytest.param(
            {"containers": [ctr({"cpu": "1", "memory": "1Gi"}), ctr({"cpu": "500m"})]},
            {"cpu": F(3, 2), "requests.cpu": F(3, 2), "memory": F(GI), "requests.memory": F(GI)},
            id="containers-sum",
        ),
        pytest.param(
            {"containers": [ctr(limits={"cpu": "2", "memory": "1Gi"})]},
            {
                "cpu": F(2),
                "requests.cpu": F(2),
                "limits.cpu": F(2),
                "memory": F(GI),
                "requests.memory": F(GI),
                "limits.memory": F(GI),
            },
            id="requests-default-to-limits",
        ),
        pytest.param(
            {
                "containers": [ctr({"cpu": "1"})],
                "initContainers": [ctr({"cpu": "3"}), ctr({"cpu": "2"})],
            },
            {"cpu": F(3), "requests.cpu": F(3)},
            id="largest-init-container",
        ),
        pytest.param(
            {
                "containers": [ctr({"cpu": "1"})],
                "initContainers": [ctr({"cpu": "1"}, restartPolicy="Always"), ctr({"cpu": "1"})],
            },
            {"cpu": F(2), "requests.cpu": F(2)},
            id="sidecar-adds-to-containers",
        ),
        pytest.param(
            {"containers": [ctr({"cpu": "1"})], "resources": {"requests": {"cpu": "4"}}},
            {"cpu": F(4), "requests.cpu": F(4)},
            id="pod-level-resources-win",
        ),
        pytest.param(
            {"containers": [ctr(limits={"nvidia.com/gpu": "2"})]},
            {"requests.nvidia.com/gpu": F(2)},
            id="extended-resource",
        ),
        pytest.param(
            {"containers": [ctr({"hugepages-2Mi": "4Mi", "example": "1"})]},
            {"requests.hugepages-2Mi": F(4 * 1024**2)},
            id="hugepages-yes-unknown-native-no",
        ),
    ],
)
def test_pod_usage(spec: dict, expected: dict) -> None:
    assert quota.pod_usage(spec) == {"pods": F(1), "count/pods": F(1), **expected}


# --- which quotas count a pod -------------------------------------------------------------------


def rq(
    name: str = "q",
    hard: dict | None = None,
    used: dict | None = None,
    scopes: list | None = None,
    selector: list | None = None,
    status: bool = True,
) -> dict:
    spec: dict = {"hard": hard or {}}
    if scopes:
        spec["scopes"] = scopes
    if selector:
        spec["scopeSelector"] = {"matchExpressions": selector}
    out = {"metadata": {"name": name}, "spec": spec}
    if status:
        out["status"] = {"hard": hard or {}, "used": used or {}}
    return out


BURSTABLE = {"containers": [ctr({"cpu": "1"})]}
BEST_EFFORT = {"containers": [ctr()]}
TERMINATING = {**BURSTABLE, "activeDeadlineSeconds": 60}
HIGH = {**BURSTABLE, "priorityClassName": "high"}
CROSS_NS = {
    **BURSTABLE,
    "affinity": {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "zone", "namespaceSelector": {}}
            ]
        }
    },
}


def by_priority(operator: str, *values: str) -> dict:
    expr: dict = {"scopeName": "PriorityClass", "operator": operator}
    if values:
        expr["values"] = list(values)
    return rq(selector=[expr])


@pytest.mark.parametrize(
    ("q", "pod", "matches"),
    [
        (rq(), BURSTABLE, True),
        (rq(scopes=["BestEffort"]), BEST_EFFORT, True),
        (rq(scopes=["BestEffort"]), BURSTABLE, False),
        (rq(scopes=["NotBestEffort"]), BURSTABLE, True),
        (rq(scopes=["Terminating"]), TERMINATING, True),
        (rq(scopes=["Terminating"]), BURSTABLE, False),
        (rq(scopes=["NotTerminating"]), BURSTABLE, True),
        (rq(scopes=["NotTerminating", "NotBestEffort"]), TERMINATING, False),
        (by_priority("In", "high"), HIGH, True),
        (by_priority("In", "high"), BURSTABLE, False),
        (by_priority("NotIn", "high"), BURSTABLE, True),
        (by_priority("Exists"), HIGH, True),
        (by_priority("DoesNotExist"), HIGH, False),
        (rq(selector=[{"scopeName": "Terminating", "operator": "Exists"}]), TERMINATING, True),
        (rq(scopes=["CrossNamespacePodAffinity"]), CROSS_NS, True),
        (rq(scopes=["CrossNamespacePodAffinity"]), BURSTABLE, False),
        (rq(scopes=["VolumeAttributesClass"]), BURSTABLE, False),  # a PVC scope
        (rq(scopes=["SomethingNew"]), BURSTABLE, False),  # unknown: the API server decides
    ],
)
def test_quota_matches(q: dict, pod: dict, matches: bool) -> None:
    assert quota.quota_matches(q, pod) is matches


# --- fit -----------------------------------------------------------------------------------------

GANG_OF_4 = [({"containers": [ctr({"cpu": "2", "memory": "1Gi"})]}, 4)]  # cpu 8, memory 4Gi


@pytest.mark.parametrize(
    ("quotas", "pods", "expected"),
    [
        pytest.param([], GANG_OF_4, [], id="no-quota"),
        pytest.param([rq(hard={"cpu": "8"})], GANG_OF_4, [], id="exactly-fits"),
        pytest.param(
            [rq("team", hard={"cpu": "10"}, used={"cpu": "7"})],
            GANG_OF_4,
            ["needs cpu 8, 3 left in quota team"],
            id="cpu-short",
        ),
        pytest.param(
            [rq("team", hard={"requests.cpu": "10", "pods": "5"}, used={"pods": "2"})],
            GANG_OF_4,
            ["needs pods 4, 3 left in quota team"],
            id="pods-short",
        ),
        pytest.param(
            [rq("a", hard={"limits.memory": "1Gi"}), rq("b", hard={"memory": "2Gi"})],
            GANG_OF_4,
            ["needs memory 4Gi, 2Gi left in quota b"],  # no limits: limits.memory not charged
            id="two-quotas",
        ),
        pytest.param(
            [rq("over", hard={"cpu": "4"}, used={"cpu": "6"})],
            GANG_OF_4,
            ["needs cpu 8, 0 left in quota over"],
            id="over-used",
        ),
        pytest.param(
            [rq("gpu", hard={"requests.nvidia.com/gpu": "1"}, used={})],
            GANG_OF_4,
            [],
            id="resource-not-asked",
        ),
        pytest.param(
            [rq("new", hard={"cpu": "4"}, status=False)],
            GANG_OF_4,
            ["needs cpu 8, 4 left in quota new"],
            id="spec-hard-before-the-controller",
        ),
        pytest.param(
            [rq("be", hard={"pods": "1"}, scopes=["BestEffort"])],
            GANG_OF_4,
            [],
            id="scope-excludes-the-gang",
        ),
        pytest.param(
            [rq("q", hard={"cpu": "5"})],
            [(BURSTABLE, 3), ({"containers": [ctr({"cpu": "1"})]}, 3)],
            ["needs cpu 6, 5 left in quota q"],
            id="replica-types-add-up",
        ),
        pytest.param(
            [rq("q", hard={"cpu": "bad", "pods": "1"})],
            GANG_OF_4,
            ["needs pods 4, 1 left in quota q"],
            id="unreadable-hard-ignored",
        ),
    ],
)
def test_shortfalls(quotas: list, pods: list, expected: list) -> None:
    assert [str(s) for s in quota.shortfalls(quotas, pods)] == expected


def test_waiting_message_names_at_most_three() -> None:
    found = [quota.Shortfall("q", f"r{i}", F(2), F(1)) for i in range(5)]
    assert quota.waiting_message(found[:1]) == "waiting for quota: needs r0 2, 1 left in quota q"
    assert quota.waiting_message(found).endswith("needs r2 2, 1 left in quota q; and 2 more")


# --- the gang's pods as a quota sees them ------------------------------------------------


def manifest(
    cpu: str = "2", workers: int = 2, suspend: bool = False, policy: dict | None = None
) -> dict:
    run_policy: dict = {"suspend": suspend}
    if policy:
        run_policy["schedulingPolicy"] = policy
    obj = manifests.manifest(
        {"worker": workers},
        policy=None,
        containers=[ctr({"cpu": cpu}, name="strategyjob")],
        run_policy=run_policy,
        uid="u",
        generation=1,
    )
    return {**obj, "status": {}}


def test_quota_pod_specs_count_each_type_and_carry_the_priority_class() -> None:
    job = jobspec.load_manifest(manifest(policy={"priorityClass": "high"}, workers=3))
    ((spec, count),) = gang.quota_pod_specs(job, [("worker", 0), ("worker", 2)])
    assert count == 2 and spec["priorityClassName"] == "high"
    assert quota.pod_usage(spec)["cpu"] == 2


# --- the reconciler: check, create, undo, suspend -------------------------------------------------

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
QUOTA_403 = ApiError(
    403,
    "POST",
    "/api/v1/namespaces/ns/pods",
    '{"message": "pods \\"j-worker-1\\" is forbidden: exceeded quota: q, requested: cpu=2"}',
)


class FakeApi:
    """What the reconciler asks of the API server, recorded; quotas and refusals as set."""

    core_path = staticmethod(KubeApi.core_path)
    group_path = staticmethod(KubeApi.group_path)

    def __init__(self, job: dict, quotas: list | None = None, refuse: set | None = None):
        self.job, self.quotas, self.refuse = job, quotas or [], refuse or set()
        self.pods: list[dict] = []
        self.pod_group: dict | None = None
        self.calls: list[tuple] = []

    async def get(self, path: str) -> dict:
        return self.job

    async def get_metadata(self, path: str) -> dict | None:
        self.calls.append(("get", path.rsplit("/", 2)[-2]))
        return self.pod_group if "podgroups" in path else None

    async def list(self, path: str, selector: str) -> list:
        return self.pods

    async def list_resource_quotas(self, namespace: str) -> list:
        self.calls.append(("list", "resourcequotas"))
        return self.quotas

    async def create(self, path: str, obj: dict) -> bool:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Pod" and name in self.refuse:
            raise QUOTA_403
        self.calls.append(("create", obj["kind"], name))
        if obj["kind"] == "PodGroup":
            self.pod_group = obj
        return True

    async def delete(self, path: str, grace_seconds: int | None = None, uid: str | None = None):
        self.calls.append(("delete", path.split("/")[-2], path.rsplit("/", 1)[-1]))
        if "podgroups" in path:
            self.pod_group = None
        return True

    async def merge_patch(self, path: str, patch: dict) -> dict:
        self.job = {**self.job, "status": {**self.job.get("status", {}), **patch["status"]}}
        return {}

    async def post_event(self, involved, type_, reason, message, now) -> None:
        self.calls.append(("event", reason, message))

    def created_pods(self) -> list[str]:
        return [x[2] for x in self.calls if x[:2] == ("create", "Pod")]

    def events(self, reason: str) -> list[str]:
        return [x[2] for x in self.calls if x[:2] == ("event", reason)]


def reconciler(api: FakeApi, clock: list[datetime], scheduler=gang.VOLCANO) -> Reconciler:
    settings = OperatorSettings(gang_scheduler=scheduler)
    return Reconciler(api, settings, clock=lambda: clock[0], registry=Registry())


def condition(api: FakeApi) -> dict | None:
    conds = api.job["status"].get("conditions") or []
    return next((x for x in conds if x["type"] == "CreateFailed"), None)


def test_a_gang_that_does_not_fit_gets_no_pod_and_says_why_once() -> None:
    api = FakeApi(manifest(cpu="2", workers=4), [rq("team", {"cpu": "10"}, {"cpu": "7"})])
    clock = [NOW]
    rec = reconciler(api, clock)
    first = asyncio.run(rec.reconcile("ns", "j"))
    assert api.created_pods() == [] and condition(api) is None  # once could be a race
    assert first == pytest.approx(5.0)  # the creation back-off, not a busy loop
    delays = []
    for _ in range(3):
        clock[0] += timedelta(seconds=delays[-1] if delays else first)
        delays.append(asyncio.run(rec.reconcile("ns", "j")))
    assert api.created_pods() == []
    assert delays == [pytest.approx(10.0), pytest.approx(20.0), pytest.approx(40.0)]
    cond = condition(api)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "WaitingForQuota"
    assert (
        "the gang's 4 pods: waiting for quota: needs cpu 8, 3 left in quota team"
        in (cond["message"])
    )
    (event,) = api.events("WaitingForQuota")  # one Event for the same message
    assert event == cond["message"]
    assert api.calls.count(("list", "resourcequotas")) == 4  # once per attempt, not more

    # The quota frees up: the next attempt creates every pod and clears the condition.
    api.quotas = [rq("team", {"cpu": "10"}, {"cpu": "2"})]
    clock[0] += timedelta(seconds=delays[-1])
    asyncio.run(rec.reconcile("ns", "j"))
    assert sorted(api.created_pods()) == [f"j-worker-{i}" for i in range(4)]
    cleared = condition(api)
    assert cleared is not None and cleared["status"] == "False"


def test_a_gang_that_fits_is_created_after_one_quota_read() -> None:
    api = FakeApi(manifest(cpu="2", workers=2), [rq("team", {"cpu": "4", "pods": "2"})])
    asyncio.run(reconciler(api, [NOW]).reconcile("ns", "j"))
    assert sorted(api.created_pods()) == ["j-worker-0", "j-worker-1"]
    assert api.calls.count(("list", "resourcequotas")) == 1
    assert condition(api) is None


def test_without_a_gang_scheduler_quotas_are_not_read() -> None:
    api = FakeApi(manifest(cpu="2", workers=2), [rq("team", {"cpu": "1"})])
    asyncio.run(reconciler(api, [NOW], scheduler=None).reconcile("ns", "j"))
    assert ("list", "resourcequotas") not in api.calls
    assert sorted(api.created_pods()) == ["j-worker-0", "j-worker-1"]


def test_unreadable_quotas_do_not_stop_the_gang() -> None:
    class Forbidden(FakeApi):
        async def list_resource_quotas(self, namespace: str) -> list:
            raise ApiError(403, "GET", "/api/v1/namespaces/ns/resourcequotas", "forbidden")

    api = Forbidden(manifest(workers=2))
    asyncio.run(reconciler(api, [NOW]).reconcile("ns", "j"))
    assert sorted(api.created_pods()) == ["j-worker-0", "j-worker-1"]


def test_a_quota_refusal_part_way_deletes_the_pods_of_that_attempt() -> None:
    api = FakeApi(manifest(workers=3), [rq("q", {"cpu": "100"})], refuse={"j-worker-1"})
    delay = asyncio.run(reconciler(api, [NOW]).reconcile("ns", "j"))
    created = sorted(api.created_pods())
    assert created == ["j-worker-0", "j-worker-2"]
    deleted = sorted(x[2] for x in api.calls if x[:2] == ("delete", "pods"))
    assert deleted == created  # none of the gang's pods holds quota while it waits
    (event,) = api.events("WaitingForQuota")
    assert "refused pod j-worker-1" in event and "deleted the 2 pods" in event
    assert delay == pytest.approx(5.0)  # tried again after the creation back-off


def test_a_refusal_that_is_not_the_quota_keeps_the_created_pods() -> None:
    class Invalid(FakeApi):
        async def create(self, path: str, obj: dict) -> bool:
            if obj["metadata"]["name"] == "j-worker-1":
                raise ApiError(422, "POST", path, "invalid")
            return await super().create(path, obj)

    api = Invalid(manifest(workers=2))
    asyncio.run(reconciler(api, [NOW]).reconcile("ns", "j"))
    assert api.created_pods() == ["j-worker-0"]
    assert not [x for x in api.calls if x[:2] == ("delete", "pods")]


OWNED_GROUP = {
    "metadata": {
        "uid": "pg",
        "ownerReferences": [{"kind": "StrategyJob", "uid": "u", "controller": True}],
    }
}


def test_suspend_deletes_the_pod_group_and_resume_creates_it_again() -> None:
    api = FakeApi(manifest(suspend=True))
    api.pod_group = OWNED_GROUP
    clock = [NOW]
    rec = reconciler(api, clock)
    asyncio.run(rec.reconcile("ns", "j"))
    assert ("delete", "podgroups", "j") in api.calls and api.pod_group is None
    api.calls.clear()
    asyncio.run(rec.reconcile("ns", "j"))  # still suspended: nothing left to delete
    assert not [x for x in api.calls if x[0] == "delete"]

    resumed = manifest(suspend=False)
    api.job = {**resumed, "status": api.job["status"]}
    clock[0] += timedelta(seconds=1)
    asyncio.run(rec.reconcile("ns", "j"))
    assert ("create", "PodGroup", "j") in api.calls
    assert sorted(api.created_pods()) == ["j-worker-0", "j-worker-1"]


def test_suspend_leaves_a_pod_group_the_job_does_not_control() -> None:
    api = FakeApi(manifest(suspend=True))
    api.pod_group = {"metadata": {"uid": "x", "ownerReferences": []}}
    asyncio.run(reconciler(api, [NOW]).reconcile("ns", "j"))
    assert not [x for x in api.calls if x[:2] == ("delete", "podgroups")]


def test_gangs_of_a_namespace_are_admitted_one_at_a_time() -> None:
    """Two gangs' check-and-create never interleave in one namespace (else both see the same
    room and both get part of it); other namespaces and jobs without a gang do not wait."""
    order: list[str] = []

    async def admit(ns: str, who: str, scheduler=gang.VOLCANO) -> None:
        async with gang.admission(scheduler, ns):
            order.append(f"{who}+")
            await asyncio.sleep(0)  # let the others try to get in
            await asyncio.sleep(0)
            order.append(f"{who}-")

    async def main() -> None:
        await asyncio.gather(admit("a", "1"), admit("a", "2"), admit("b", "3"))

    asyncio.run(main())
    assert order.index("1-") < order.index("2+")  # 2 waited for 1 in namespace a
    assert order.index("3+") < order.index("1-")  # namespace b did not wait


# --- a gang that waits for quota is woken when the quota frees room -----------------------------


def room(hard: dict | None = None, used: dict | None = None, **kw: Any) -> dict:
    return quota.quota_room(rq("q", hard or {"cpu": "4"}, used, **kw))


@pytest.mark.parametrize(
    ("before", "after", "freed"),
    [
        pytest.param(None, room(used={"cpu": "3"}), False, id="first-seen"),
        pytest.param(room(used={"cpu": "3"}), None, True, id="deleted"),
        pytest.param(room(used={"cpu": "3"}), room(used={"cpu": "0"}), True, id="usage-down"),
        pytest.param(room(used={"cpu": "3"}), room(used={}), True, id="usage-gone"),
        pytest.param(room(used={"cpu": "3"}), room(used={"cpu": "3500m"}), False, id="usage-up"),
        pytest.param(room(used={"cpu": "3"}), room(used={"cpu": "3.0"}), False, id="same"),
        pytest.param(room({"cpu": "4"}), room({"cpu": "5"}), True, id="limit-up"),
        pytest.param(room({"cpu": "4", "pods": "2"}), room({"cpu": "4"}), True, id="limit-gone"),
        pytest.param(room({"cpu": "4"}), room({"cpu": "3"}), False, id="limit-down"),
        pytest.param(room({"cpu": "4"}), room({"cpu": "4", "pods": "9"}), False, id="new-limit"),
        pytest.param(room(), room(scopes=["BestEffort"]), True, id="scopes-changed"),
        pytest.param(
            room(used={"cpu": "3", "pods": "1"}),
            room(used={"cpu": "4", "pods": "0"}),
            True,
            id="one-resource-down",
        ),
    ],
)
def test_quota_freed(before: dict | None, after: dict | None, freed: bool) -> None:
    assert quota.quota_freed(before, after) is freed


def test_a_quota_room_ignores_what_is_not_room() -> None:
    labelled = {**rq("q", {"cpu": "4"}, {"cpu": "1"}), "metadata": {"labels": {"a": "b"}}}
    assert quota.quota_room(labelled) == room(used={"cpu": "1"})
    assert room(used={"cpu": "1"})["used"] == {"cpu": F(1)}


def test_only_jobs_that_wait_for_quota_are_released() -> None:
    quota_wait = decide.after_create_failure(None, 1, None, "x", NOW, for_quota=True)
    server_error = decide.after_create_failure(None, 1, 500, "x", NOW)
    backoffs = {
        ("ns", "b", "u2"): quota_wait,
        ("ns", "a", "u1"): quota_wait,
        ("other", "c", "u3"): quota_wait,
        ("ns", "d", "u4"): server_error,
    }
    assert decide.quota_waiters(backoffs, "ns") == [("ns", "a", "u1"), ("ns", "b", "u2")]
    later = NOW + timedelta(seconds=1)
    assert decide.create_hold(quota_wait, 1, later) == pytest.approx(4.0)
    released = decide.released(quota_wait, later)
    assert decide.create_hold(released, 1, later) is None
    assert released.attempts == quota_wait.attempts  # a check that fails again waits longer
    assert decide.released(quota_wait, NOW - timedelta(seconds=9)) == decide.released(
        quota_wait, NOW - timedelta(seconds=9)
    )
    permanent = decide.after_create_failure(None, 1, 403, "forbidden", NOW, for_quota=True)
    assert not permanent.for_quota  # what cannot pass as it is waits for no quota


def waiting_gang(attempts: int) -> tuple[FakeApi, Reconciler, list[datetime]]:
    """A gang of 4 x cpu 2 that waits for quota (cpu 3 left), after ``attempts`` checks."""
    api = FakeApi(manifest(cpu="2", workers=4), [rq("team", {"cpu": "10"}, {"cpu": "7"})])
    clock = [NOW]
    rec = reconciler(api, clock)
    delay = 0.0
    for _ in range(attempts):
        clock[0] += timedelta(seconds=delay)
        delay = asyncio.run(rec.reconcile("ns", "j", "u"))
    assert api.created_pods() == [] and delay == pytest.approx(5.0 * 2 ** (attempts - 1))
    return api, rec, clock


def test_a_quota_that_frees_room_wakes_the_gang_past_its_back_off() -> None:
    api, rec, clock = waiting_gang(4)  # its next attempt in 40 s
    clock[0] += timedelta(seconds=1)
    assert rec.wake_quota_waiters("other") == []
    checks = api.calls.count(("list", "resourcequotas"))
    asyncio.run(rec.reconcile("ns", "j", "u"))  # a pass of another cause: held, no check
    assert api.calls.count(("list", "resourcequotas")) == checks

    api.quotas = [rq("team", {"cpu": "10"}, {"cpu": "2"})]  # the quota controller's update
    assert rec.wake_quota_waiters("ns") == ["j"]
    assert asyncio.run(rec.reconcile("ns", "j", "u")) != 0.0
    assert sorted(api.created_pods()) == [f"j-worker-{i}" for i in range(4)]
    assert rec.wake_quota_waiters("ns") == []  # it no longer waits


def test_a_woken_gang_that_still_does_not_fit_waits_for_the_next_room() -> None:
    api, rec, _ = waiting_gang(2)
    api.quotas = [rq("team", {"cpu": "10"}, {"cpu": "6"})]  # cpu 4 left: the gang needs 8
    assert rec.wake_quota_waiters("ns") == ["j"]
    checks = api.calls.count(("list", "resourcequotas"))
    assert asyncio.run(rec.reconcile("ns", "j", "u")) == pytest.approx(20.0)
    assert api.calls.count(("list", "resourcequotas")) == checks + 1
    assert api.created_pods() == []
    assert "4 left in quota team" in (condition(api) or {}).get("message", "")
    assert rec.wake_quota_waiters("ns") == ["j"]  # still waits: the next room wakes it again


def test_room_freed_while_a_pass_checks_ends_the_wait_that_pass_starts() -> None:
    """The quota's update lands after the pass read the quota and before it notes the wait:
    the wake finds no wait to end yet, so the pass itself checks again at once."""

    class FreedDuringTheCheck(FakeApi):
        async def list_resource_quotas(self, namespace: str) -> list:
            seen = await super().list_resource_quotas(namespace)
            self.quotas = [rq("team", {"cpu": "10"}, {"cpu": "0"})]
            assert rec.wake_quota_waiters(namespace) == []
            return seen

    api = FreedDuringTheCheck(
        manifest(cpu="2", workers=4), [rq("team", {"cpu": "10"}, {"cpu": "7"})]
    )
    clock = [NOW]
    rec = reconciler(api, clock)
    assert asyncio.run(rec.reconcile("ns", "j", "u")) == 0.0  # again at once, not in 5 s
    assert api.created_pods() == []
    asyncio.run(rec.reconcile("ns", "j", "u"))
    assert sorted(api.created_pods()) == [f"j-worker-{i}" for i in range(4)]


def test_a_quota_event_that_frees_room_wakes_the_waiting_jobs_loops(
    operator_state: OperatorState,
) -> None:
    class Waiters:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def wake_quota_waiters(self, namespace: str) -> list[str]:
            self.calls.append(namespace)
            return ["j"]

    state = operator_state
    state.reconciler = waiters = Waiters()  # type: ignore[assignment]
    loop = state.wakeups[("strategyjobs", "ns", "j")] = asyncio.Event()

    def event(type_: str | None, used: str) -> None:
        body = rq("team", {"cpu": "4"}, {"cpu": used})
        asyncio.run(handlers.quota_changed(namespace="ns", name="team", body=body, type=type_))

    event(None, "3")  # kopf's listing: seen for the first time
    event("MODIFIED", "4")  # more usage
    event("MODIFIED", "4")  # the controller's resync
    assert waiters.calls == [] and not loop.is_set()
    event("MODIFIED", "1")
    assert waiters.calls == ["ns"] and loop.is_set()
    loop.clear()
    event("DELETED", "1")
    assert waiters.calls == ["ns", "ns"] and loop.is_set()
    assert state.quotas == {}


def quota_selectors(registry: kopf.OperatorRegistry) -> list:
    return [s for s in registry._watching.get_all_selectors() if "resourcequotas" in str(s)]


def test_resource_quotas_are_watched_only_with_a_gang_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chart grants the watch only with a gang scheduler; one the API server forbids
    would stop the operator."""
    assert quota_selectors(kopf.get_default_registry()) == []  # not at import
    monkeypatch.setenv("STRATEGYJOB_METRICS_PORT", "0")
    registry = kopf.OperatorRegistry()
    for scheduler, watched in (("", 0), ("volcano", 1), ("volcano", 1)):
        monkeypatch.setattr(kopf, "get_default_registry", lambda r=registry: r)
        monkeypatch.setenv("STRATEGYJOB_GANG_SCHEDULER", scheduler)
        with installed():  # each startup with a fresh operator state
            asyncio.run(handlers.configure(settings=kopf.OperatorSettings()))
        assert len(quota_selectors(registry)) == watched  # once, however often configured
        assert len(registry._watching.get_all_handlers()) == watched
