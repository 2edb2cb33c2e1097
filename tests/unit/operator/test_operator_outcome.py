"""The decisions a pass makes after its I/O (:mod:`strategyjob_operator.outcome`), on plain
data: the CreateFailed condition and the back-off a creation leaves, the ReplicaFailure
condition of a blocked job, the status write, and when the next pass is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from strategyjob import jobspec
from strategyjob_operator import constants as c
from strategyjob_operator import outcome
from strategyjob_operator.create_backoff import CREATE_BACKOFF_SECONDS, CreateBackoff
from strategyjob_operator.flavor import STRATEGYJOB, TFJOB, Loaded
from strategyjob_operator.kube import ApiError
from strategyjob_operator.plan import Action, Plan

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
RUNNING = {"launched": True, "conditions": [{"type": c.RUNNING, "status": "True"}]}
CREATE = Plan(Action.CREATE, dict(RUNNING), create=(("worker", 0),), ensure_service=True)
CONFLICT = ApiError(409, "POST", "/api/v1/namespaces/ns/pods", '{"message": "conflict"}')
QUOTA = ApiError(
    403,
    "POST",
    "/api/v1/namespaces/ns/pods",
    '{"message": "pods \\"j-worker-0\\" is forbidden: exceeded quota: q"}',
)


def failure(error: ApiError, reason: str = c.REASON_CREATE_FAILED) -> outcome.CreateFailure:
    return outcome.CreateFailure(reason, "pod j-worker-0", error, error.status, error.detail)


def create_failed(status: dict) -> dict | None:
    return next((x for x in status.get("conditions") or [] if x["type"] == c.CREATE_FAILED), None)


def test_a_first_failure_backs_off_quietly_and_a_second_one_is_reported_once() -> None:
    first = outcome.note_creation(CREATE, None, 1, failure(CONFLICT), NOW)
    assert first.status == CREATE.status and first.event is None and first.message is None
    assert first.delay == CREATE_BACKOFF_SECONDS and first.backoff is not None
    later = NOW + timedelta(seconds=first.delay)
    second = outcome.note_creation(CREATE, first.backoff, 1, failure(CONFLICT), later)
    assert second.message is not None and second.message.startswith("Cannot create pod j-worker-0")
    assert create_failed(second.status)["status"] == "True"
    assert second.event is not None and second.event.message == second.message
    assert second.delay == 2 * CREATE_BACKOFF_SECONDS  # doubled
    plan = Plan(Action.CREATE, second.status, create=CREATE.create)
    third = outcome.note_creation(plan, second.backoff, 1, failure(CONFLICT), later)
    assert third.event is None  # the same message: one Event, not one per attempt


def test_a_creation_clears_the_back_off_and_the_condition() -> None:
    failing = outcome.note_creation(CREATE, None, 1, failure(CONFLICT), NOW)
    failing = outcome.note_creation(CREATE, failing.backoff, 1, failure(CONFLICT), NOW)
    plan = Plan(Action.CREATE, failing.status, create=CREATE.create)
    done = outcome.note_creation(plan, failing.backoff, 1, None, NOW)
    assert done.backoff is None and done.delay is None and done.event is None
    cleared = create_failed(done.status)
    assert cleared["status"] == "False" and cleared["message"] == outcome.CREATED_MESSAGE


def test_a_pass_with_nothing_to_create_keeps_the_back_off_and_the_status() -> None:
    backoff = CreateBackoff(1, 1, NOW + timedelta(seconds=5), permanent=False)
    idle = Plan(Action.NONE, dict(RUNNING))
    note = outcome.note_creation(idle, backoff, 1, None, NOW)
    assert note.backoff is backoff and note.status is idle.status and note.delay is None


def test_a_wait_for_quota_ends_at_once_when_a_quota_freed_room_during_the_pass() -> None:
    waiting = failure(QUOTA)
    kept = outcome.note_creation(CREATE, None, 1, waiting, NOW)
    assert kept.backoff is not None and kept.backoff.for_quota and kept.delay > 0
    freed = outcome.note_creation(CREATE, None, 1, waiting, NOW, freed_since=True)
    assert freed.backoff is not None and freed.backoff.next_at == NOW and freed.delay == 0.0
    other = outcome.note_creation(CREATE, None, 1, failure(CONFLICT), NOW, freed_since=True)
    assert other.delay == CREATE_BACKOFF_SECONDS  # not a wait for quota: freeing ends nothing


def test_creations_wait_while_the_back_off_holds() -> None:
    assert outcome.held_back(CREATE, None) == (CREATE, None)
    held, wait = outcome.held_back(CREATE, 3.0)
    assert wait == 3.0 and held.create == () and not held.ensure_service
    idle = Plan(Action.NONE, dict(RUNNING))
    assert outcome.held_back(idle, 3.0) == (idle, None)  # nothing to hold back: no wait


def test_a_blocked_job_gets_its_condition_once_and_a_retry_until_it_is_free() -> None:
    blocked = ["Pod ns/j-worker-0 (no controller)"]
    settled = outcome.settle(CREATE, "j", CREATE.status, blocked, None, NOW)
    condition = next(x for x in settled.status["conditions"] if x["type"] == "ReplicaFailure")
    assert condition["reason"] == outcome.REASON_NOT_CONTROLLED
    assert condition["message"] == outcome.blocked_message("j", blocked)
    assert settled.event is not None and settled.event.message == condition["message"]
    assert settled.retry == outcome.BLOCKED_RETRY_SECONDS
    again = outcome.settle(CREATE, "j", settled.status, blocked, None, NOW)
    assert again.event is None and again.status == settled.status  # no Event per pass
    free = outcome.settle(CREATE, "j", settled.status, [], None, NOW)
    assert free.retry is None and free.event is None
    assert all(x["type"] != "ReplicaFailure" for x in free.status["conditions"])


def test_a_job_that_creates_nothing_and_never_launched_is_left_as_it_is() -> None:
    fresh = Plan(Action.NONE, {"conditions": []})
    assert outcome.settle(fresh, "j", fresh.status, [], None, NOW) == outcome.Settled(fresh.status)


def test_the_status_is_written_only_when_it_changed_and_a_tfjob_says_when() -> None:
    spec = {"containers": [{"name": "tensorflow"}]}
    tfjob = jobspec.load_tfjob(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": spec}}}},
        }
    )
    plain, tf = Loaded(tfjob.job), Loaded(tfjob.job, tfjob)
    before = {"launched": True, "stalledReasons": {"worker-0": "x"}}
    assert outcome.status_write(STRATEGYJOB, plain, before, before, dict(before), NOW) is None
    after = {"launched": True}
    patch = outcome.status_write(STRATEGYJOB, plain, before, before, after, NOW)
    assert patch == {"launched": True, "stalledReasons": None}  # what it drops is nulled
    written = TFJOB.external_status(before, tf)
    patch = outcome.status_write(TFJOB, tf, written, before, after, NOW)
    assert patch is not None and patch["lastReconcileTime"] == "2026-01-01T12:00:00Z"


def test_the_next_pass_is_the_soonest_wait_and_finished_jobs_are_not_resynced() -> None:
    assert outcome.next_pass(None, 3.0, None, 1.5) == 1.5
    assert outcome.next_pass(None, None) is None
    running = Plan(Action.NONE, dict(RUNNING))
    assert outcome.resync_wait(running, 60.0, 1.1) == 60.0 * 1.1
    assert outcome.resync_wait(running, None) is None
    done = Plan(Action.NONE, {"conditions": [{"type": c.SUCCEEDED, "status": "True"}]})
    assert outcome.resync_wait(done, 60.0) is None
    assert outcome.resync_wait(Plan(Action.SUSPEND, dict(RUNNING)), 60.0) is None
