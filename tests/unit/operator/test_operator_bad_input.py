"""Bad input that reaches the operator's pure functions: decide() never raises (a huge
deadline, a status edited by hand, a job no check foresaw fail the job once, with one
line), and a progress annotation with a bad time or step never reaches the status. Ends
with property-based fuzzing of both."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategyjob import jobspec
from strategyjob_operator import children, progress
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide
from strategyjob_operator.observe import Replica

from tests.support import manifests
from tests.support.manifest_mutations import (
    assert_one_line_problems,
    fuzz_settings,
    mutated_manifests,
    values,
)
from tests.support.pods import NOW

OWNER = {"apiVersion": "strategyjob.dev/v1alpha1", "kind": "StrategyJob", "name": "j", "uid": "u"}
INT64 = 2**63 - 1
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{6})?Z$")


def job(**run_policy: Any) -> jobspec.StrategyJob:
    """Two workers under the default restart policy."""
    return manifests.job(policy=None, **run_policy)


def running(j: jobspec.StrategyJob) -> dict[tuple[str, int], Replica]:
    return {(t, i): Replica(t, i, j.pod_name(t, i), "Running") for t, i in j.replicas()}


STARTED = {
    "launched": True,
    "startTime": "2026-01-01T11:00:00Z",
    "conditions": [{"type": c.CREATED, "status": "True", "reason": c.REASON_CREATED}],
}


def with_run_policy(j: jobspec.StrategyJob, **fields) -> jobspec.StrategyJob:
    """A job past the loader's limits, as one built in Python (or admitted by an older CRD)."""
    return dataclasses.replace(j, run_policy=dataclasses.replace(j.run_policy, **fields))


# --- decide ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [10**12, 10**30, 2**63])
def test_a_deadline_past_the_last_date_never_comes_and_never_raises(seconds):
    j = with_run_policy(job(), active_deadline_seconds=seconds)
    plan = decide(j, 1, STARTED, running(j), NOW)
    assert plan.action is Action.NONE
    assert plan.status["state"] == c.RUNNING
    assert plan.requeue_after is None or plan.requeue_after > 0


def test_a_ttl_past_the_last_date_keeps_the_finished_job():
    j = with_run_policy(job(), ttl_seconds_after_finished=10**30)
    done = {
        **STARTED,
        "completionTime": "2026-01-01T11:30:00Z",
        "conditions": [{"type": c.SUCCEEDED, "status": "True", "reason": c.REASON_SUCCEEDED}],
    }
    plan = decide(j, 1, done, {}, NOW)
    assert plan.action is Action.NONE and not plan.delete_job


def test_a_deadline_within_range_still_fails_the_job_on_time():
    j = job(activeDeadlineSeconds=jobspec.MAX_INT32)
    assert decide(j, 1, STARTED, running(j), NOW).requeue_after == pytest.approx(
        jobspec.MAX_INT32 - 3600
    )
    j = job(activeDeadlineSeconds=60)
    assert decide(j, 1, STARTED, running(j), NOW).action is Action.FAIL


@pytest.mark.parametrize(
    "status",
    [
        {**STARTED, "startTime": "yesterday"},
        {**STARTED, "startTime": 5},
        {**STARTED, "startTime": "2026-01-01T11:00:00"},  # no zone
        {**STARTED, "restartCount": "three"},
        {**STARTED, "restartCount": -4},
        {**STARTED, "replicaStatuses": ["worker"]},
        {**STARTED, "replicaStatuses": {"worker": {"restarts": "x"}}},
        {**STARTED, "launched": "yes"},
        {**STARTED, "completionTime": 12},
    ],
    ids=lambda s: json.dumps(s)[-40:],
)
def test_a_status_edited_by_hand_does_not_stop_the_job(status):
    j = job(activeDeadlineSeconds=7200, ttlSecondsAfterFinished=60)
    plan = decide(j, 1, status, running(j), NOW)
    assert plan.action in (Action.NONE, Action.CREATE)
    assert plan.status["state"] in (c.RUNNING, c.CREATED)
    assert isinstance(plan.status["restartCount"], int) and plan.status["restartCount"] >= 0
    json.dumps(plan.status, allow_nan=False)


def test_what_no_check_foresaw_fails_the_job_once_with_one_line():
    # No chief and no worker: the loader refuses it, so it only arrives built in Python.
    j = job()
    j = dataclasses.replace(j, replica_specs={"ps": j.replica_specs["worker"]})
    plan = decide(j, 3, {}, {("ps", 0): Replica("ps", 0, "j-ps-0", "Running")}, NOW)
    assert plan.action is Action.FAIL
    assert plan.status["state"] == c.FAILED
    assert plan.status["observedGeneration"] == 3
    assert plan.delete_pods == ("j-ps-0",)
    failed = next(x for x in plan.status["conditions"] if x["type"] == c.FAILED)
    assert failed["reason"] == c.REASON_INVALID_SPEC
    (event,) = [e for e in plan.events if e.type == "Warning"]
    assert event.reason == c.REASON_INVALID_SPEC and "\n" not in event.message
    assert event.message.startswith("StrategyJob j cannot be run: ValueError: ")
    assert event.message.endswith("Fix its spec (or status) and create the job again.")
    again = decide(j, 3, plan.status, {}, NOW)  # the next pass: nothing more to say
    assert again.action is Action.NONE and again.events == ()


# --- progress ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"step": 2**63},
        {"step": 10**30},
        {"step": -1},
        {"step": "5"},
        {"step": 1e300},
        {"step": float("nan")},
        {"step": True},
        {"step": None},
        {"step": [1]},
    ],
    ids=repr,
)
def test_a_step_out_of_range_or_not_a_number_is_no_report(fields):
    assert progress.parse_report(json.dumps({**fields, "totalSteps": 10})) is None


@pytest.mark.parametrize(
    "when",
    [
        "yesterday",
        "2026-01-01",
        "2026-01-01T10:00:00",  # no zone: the API server refuses it as a date-time
        "2026-01-01 10:00:00Z",
        "2026-13-01T10:00:00Z",
        "20260101T100000Z",
        "\uff12\uff10\uff12\uff16-01-01T10:00:00Z",  # full-width digits
        12,
        None,
    ],
)
def test_a_bad_time_is_left_out(when):
    assert progress.parse_report(json.dumps({"step": 3, "time": when})) == {"step": 3}


def test_times_are_written_in_utc_as_the_api_server_writes_them():
    def time_of(when: str) -> str:
        return progress.parse_report(json.dumps({"step": 1, "time": when}))["time"]

    assert time_of("2026-01-01T12:30:00+02:00") == "2026-01-01T10:30:00Z"
    assert time_of("2026-01-01t10:30:00.123456789z") == "2026-01-01T10:30:00.123456Z"


def test_out_of_range_totals_metrics_and_estimates_never_reach_the_status():
    report = progress.parse_report(
        json.dumps({"step": 1, "totalSteps": 2**64, "metrics": {"big": 2**70, "inf": 1e999}})
    )
    assert report == {"step": 1, "metrics": {"big": str(2**70), "inf": "inf"}}
    slow = [
        progress.parse_report(
            json.dumps({"step": s, "totalSteps": INT64, "time": f"2026-01-01T{h}:00:00Z"})
        )
        for s, h in ((1, "10"), (2, "12"))
    ]
    out = progress.aggregate(slow[1], progress.aggregate(slow[0], None))
    assert "estimatedSecondsLeft" not in out  # 7200 * 2**63 seconds is beyond int64


@pytest.mark.parametrize(
    "previous",
    [
        "garbage",
        ["x"],
        {"step": "x", "lastReportTime": "2026-01-01T10:00:00", "estimatedSecondsLeft": "y"},
    ],
    ids=repr,
)
def test_a_previous_progress_edited_by_hand_is_not_fatal(previous):
    report = progress.parse_report(
        json.dumps({"step": 5, "totalSteps": 10, "time": "2026-01-01T11:00:00Z"})
    )
    out = progress.aggregate(report, previous)
    assert out["step"] == 5 and out["percentage"] == 50.0
    progress.merge_patch(previous, out)


def test_deep_nesting_is_no_report():
    assert progress.parse_report("[" * 100_000 + "]" * 100_000) is None
    assert progress.parse_report('{"step": ' + "9" * 5000 + "}") is None


# --- fuzz --------------------------------------------------------------------------------------

_reports = st.fixed_dictionaries(
    {},
    optional={
        "step": values(json_only=False),
        "totalSteps": values(json_only=False),
        "time": st.one_of(
            values(json_only=False),
            st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
            st.from_regex(
                r"\A\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,12})?([Zz]|[+-]\d{2}:\d{2})?\Z"
            ),
        ),
        "metrics": st.dictionaries(st.text(max_size=5), values(json_only=False), max_size=3),
    },
)


@fuzz_settings(300)
@given(first=_reports, second=_reports)
def test_fuzz_progress_is_always_a_status_the_api_server_takes(first, second):
    status = None
    for fields in (first, second):
        report = progress.parse_report(json.dumps(fields))
        status = progress.aggregate(report, status)
        if status is None:
            continue
        json.dumps(status, allow_nan=False)  # JSON the API server can read
        assert isinstance(status["step"], int) and 0 <= status["step"] <= INT64
        assert 0 < status.get("totalSteps", 1) <= INT64
        assert 0 <= status.get("estimatedSecondsLeft", 0) <= INT64
        assert RFC3339_UTC.match(status.get("lastReportTime", "2026-01-01T00:00:00Z"))
        for metric in (status.get("metrics") or {}).values():
            assert isinstance(metric, str | float) or -INT64 - 1 <= metric <= INT64


@fuzz_settings(200)
@given(mutated_manifests(json_only=False))
def test_fuzz_a_job_that_loads_is_decided_and_built_without_raising(obj):
    try:
        j = jobspec.load_manifest(obj)
    except jobspec.ManifestError as e:
        assert_one_line_problems(e)
        return
    plan = decide(j, 1, {}, {}, NOW)
    assert plan.action in (Action.CREATE, Action.SUSPEND)
    json.dumps(plan.status, allow_nan=False)
    if j.total_replicas <= 64:  # the pods the operator would create from it
        for pod in children.missing_pods(j, OWNER, j.replicas()):
            json.dumps(pod, allow_nan=False)
            for container in pod["spec"]["containers"]:
                assert all(isinstance(e["name"], str) for e in container.get("env") or [])
    plan = decide(j, 1, STARTED, running(j), NOW)
    json.dumps(plan.status, allow_nan=False)
