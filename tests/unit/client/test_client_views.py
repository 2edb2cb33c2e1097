"""The client's pure parts: typed views of API objects, the CLI's tables and progress bar,
log merging, wait's decision, and that the package loads without torch or kubernetes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime

import pytest
from strategyjob.client import JobFailedError, StrategyJob, SubmittedJob
from strategyjob.client._client import _as_manifest, _reached
from strategyjob.client._format import (
    format_duration,
    format_progress,
    jobs_table,
    progress_cell,
    status_report,
)
from strategyjob.client._logs import LogLine, merge_by_time, split_lines, timestamp_key
from strategyjob.client._view import replica_infos
from strategyjob.errors import StrategyJobError

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def api_job(state=None, conditions=(), progress=None, restarts=None, **counts):
    counts = counts or {"worker": 2}
    status = {}
    if state:
        status = {
            "state": state,
            "ready": "1/2",
            "restartCount": 1,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastTransitionTime": "2026-11-22T11:59:30Z",
                }
                for t, s, r, m in conditions
            ],
            "replicaStatuses": {t: {"restarts": (restarts or {}).get(t, 0)} for t in counts},
        }
        if progress is not None:
            status["progress"] = progress
    return SubmittedJob(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {
                "name": "mnist",
                "namespace": "ml",
                "creationTimestamp": "2026-11-22T11:57:00Z",
                "resourceVersion": "7",
            },
            "spec": {
                "strategy": "MultiWorkerMirroredStrategy",
                "replicaSpecs": {
                    t: {"replicas": n, "template": {"spec": {"containers": [{"name": "x"}]}}}
                    for t, n in counts.items()
                },
            },
            "status": status,
        }
    )


def pod(name, phase, exit_code=None, reason=None, deleting=False):
    state = {"running": {}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": reason or "Error"}}
    meta = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T12:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": "n1", "containers": [{"name": "sidecar"}, {"name": "strategyjob"}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "sidecar", "state": {"running": {}}},
                {"name": "strategyjob", "state": state},
            ],
        },
    }


FAILED = ("Failed", "True", "BackoffLimitExceeded", "worker-1 exited with 1")
RUNNING = ("Running", "True", "StrategyJobRunning", "all pods run")


def test_views_read_state_conditions_and_replicas():
    job = api_job("Failed", [("Created", "True", "C", ""), FAILED], ps=0, worker=2, chief=1)
    assert (job.name, job.namespace, job.strategy, job.state) == (
        "mnist",
        "ml",
        "MultiWorkerMirroredStrategy",
        "Failed",
    )
    assert job.finished and job.failure.reason == "BackoffLimitExceeded"
    assert job.replicas() == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert api_job().state is None and api_job().progress is None


def test_replica_rows_take_phase_exit_code_of_the_training_container_and_missing_pods():
    job = api_job("Running", [RUNNING], restarts={"worker": 2}, worker=3)
    pods = {
        "mnist-worker-0": pod("mnist-worker-0", "Running"),
        "mnist-worker-1": pod("mnist-worker-1", "Failed", 137, "OOMKilled"),
        "mnist-worker-9": pod("mnist-worker-9", "Running"),  # not the job's: ignored
    }
    rows = replica_infos(job, pods)
    assert [(r.label, r.phase, r.exit_code, r.reason, r.restarts) for r in rows] == [
        ("worker-0", "Running", None, "", 2),
        ("worker-1", "Failed", 137, "OOMKilled", 2),
        ("worker-2", "-", None, "", 2),
    ]
    deleting = replica_infos(job, {"mnist-worker-0": pod("mnist-worker-0", "Running", deleting=1)})
    assert deleting[0].phase == "Terminating"


def test_status_report_has_state_progress_slot_replicas_and_conditions():
    job = api_job("Running", [RUNNING])
    rows = replica_infos(job, {"mnist-worker-1": pod("mnist-worker-1", "Failed", 137, "OOMKilled")})
    report = status_report(job, rows, NOW)
    assert report == textwrap.dedent(
        """\
        StrategyJob mnist  namespace ml  MultiWorkerMirroredStrategy
        state: Running   ready: 1/2   restarts: 1   age: 3m
        progress: -

        NAME            TYPE    INDEX  PHASE                         RESTARTS
        mnist-worker-0  worker  0      -                             0
        mnist-worker-1  worker  1      Failed (exit 137, OOMKilled)  0

        CONDITION  STATUS  REASON              AGE  MESSAGE
        Running    True    StrategyJobRunning  30s  all pods run"""
    )
    pending = status_report(api_job(), [], NOW)
    assert "state: Pending (not yet seen by the operator)" in pending
    assert "CONDITION" not in pending


def test_progress_bar_and_cells():
    progress = {
        "step": 250,
        "totalSteps": 1000,
        "metrics": {"loss": 0.312345, "acc": 0.9},
        "estimatedSecondsLeft": 150,
        "lastReportTime": "2026-11-22T11:59:50Z",
    }
    assert format_progress(progress, NOW) == (
        "[######..................]  25.0%  step 250/1000  loss=0.3123  acc=0.9  eta 2m30s  "
        "(reported 10s ago)"
    )
    assert format_progress({"percentage": 100}) == "[########################] 100.0%"
    assert format_progress({"step": 7}) == "step 7"
    assert format_progress(None) == "-"
    assert progress_cell(progress) == "25%"
    assert progress_cell({"step": 7}) == "step 7"
    assert progress_cell(None) == "-"
    job = api_job("Running", [RUNNING], progress=progress)
    assert "progress: [######" in status_report(job, [], NOW)


def test_jobs_table():
    running = api_job("Running", [RUNNING], progress={"percentage": 42.4})
    table = jobs_table([running, api_job()], NOW)
    assert table.splitlines() == [
        "NAME   STRATEGY                     STATE    READY  RESTARTS  PROGRESS  AGE",
        "mnist  MultiWorkerMirroredStrategy  Running  1/2    1         42%       3m",
        "mnist  MultiWorkerMirroredStrategy  -        -      0         -         3m",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(5, "5s"), (200, "3m20s"), (600, "10m"), (7500, "2h5m"), (3 * 86400 + 4 * 3600, "3d4h")],
)
def test_durations(seconds, text):
    assert format_duration(seconds) == text


def test_wait_decision():
    assert _reached(api_job("Running", [RUNNING]), ("Running",))
    assert not _reached(api_job("Running", [RUNNING]), ("Succeeded",))
    assert not _reached(api_job(), ("Succeeded",))  # the operator has not seen it yet
    assert _reached(api_job("Succeeded", []), ("Running",))  # it went through Running
    with pytest.raises(JobFailedError) as info:
        _reached(api_job("Failed", [FAILED]), ("Succeeded",))
    assert (info.value.reason, info.value.message) == FAILED[2:]
    assert str(info.value) == (
        "StrategyJob mnist in namespace ml failed (BackoffLimitExceeded): worker-1 exited with 1"
    )
    assert _reached(api_job("Failed", [FAILED]), ("Failed",))
    with pytest.raises(StrategyJobError, match="succeeded; it will not be Suspended"):
        _reached(api_job("Succeeded", []), ("Suspended",))


def test_create_accepts_typed_jobs_dicts_yaml_and_paths(tmp_path):
    job = StrategyJob.build(
        "x", strategy="MultiWorkerMirroredStrategy", image="i", command=["python", "t.py"]
    )
    assert _as_manifest(job) == (job.to_manifest(), None)
    in_ns = StrategyJob.build(
        "x", strategy="MirroredStrategy", image="i", command=["a"], namespace="ml"
    )
    assert _as_manifest(in_ns)[1] == "ml"
    text = "apiVersion: strategyjob.dev/v1alpha1\nkind: StrategyJob\nmetadata: {name: y}\n"
    assert _as_manifest(text)[0]["metadata"] == {"name": "y"}
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("{name: y}", "{name: y, namespace: ns1}"))
    assert _as_manifest(path)[1] == "ns1"
    assert _as_manifest(str(path))[1] == "ns1"
    original = {"metadata": {"name": "z"}}
    manifest, _ = _as_manifest(original)
    manifest["metadata"]["namespace"] = "other"
    assert original == {"metadata": {"name": "z"}}  # the caller's dict is not changed
    with pytest.raises(StrategyJobError, match="no such file"):
        _as_manifest(str(tmp_path / "nope.yaml"))
    with pytest.raises(TypeError):
        _as_manifest(42)


def test_split_lines_joins_chunks_cut_anywhere():
    chunks = [b"al", b"pha\nbe", b"ta\r\n", b"\n", b"gam", "ma \xe2\x9c\x93".encode("latin-1")]
    assert list(split_lines(chunks)) == ["alpha", "beta", "", "gamma \u2713"]


def test_merge_by_time_interleaves_replicas_and_strips_timestamps():
    worker0 = "2026-11-22T10:00:00.5Z step 1\n2026-11-22T10:00:01.25Z step 2\n"
    worker1 = (
        "2026-11-22T10:00:00.123456789Z hello\ncontinuation without stamp\n"
        "2026-11-22T10:00:01Z done\n"
    )
    assert merge_by_time([("worker-0", worker0), ("worker-1", worker1)]) == [
        LogLine("worker-1", "hello"),
        LogLine("worker-1", "continuation without stamp"),
        LogLine("worker-0", "step 1"),
        LogLine("worker-1", "done"),
        LogLine("worker-0", "step 2"),
    ]
    assert timestamp_key("2026-11-22T10:00:01Z") < timestamp_key("2026-11-22T10:00:01.1Z")
    assert timestamp_key("hello") is None


def test_client_package_imports_without_torch_or_kubernetes():
    code = textwrap.dedent(
        """
        import sys
        import strategyjob.client, strategyjob.cli
        job = strategyjob.client.StrategyJob.build(
            "x", strategy="MirroredStrategy", image="i", command=["a"])
        bad = [m for m in ("torch", "kubernetes", "kopf") if m in sys.modules]
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_pod_labels_and_states_match_the_operators():
    from strategyjob import _names
    from strategyjob.client import _client, _view
    from strategyjob_operator import constants

    # The client and the operator read one definition of the labels and API coordinates.
    assert _client.LABEL_JOB_NAME is _names.LABEL_JOB_NAME
    for name in ("LABEL_JOB_NAME", "LABEL_REPLICA_TYPE", "LABEL_REPLICA_INDEX", "GROUP"):
        assert getattr(constants, name) is getattr(_names, name)
    assert (_client.GROUP, _client.VERSION, _client.PLURAL) == (
        constants.GROUP,
        constants.VERSION,
        constants.PLURAL,
    )
    assert set(_view.STATES) == set(constants.STATE_PRECEDENCE)
