"""The pure rules of a local resize (:mod:`strategyjob.launcher._resize`) and its control
files (:mod:`strategyjob.launcher._control`): what is refused, in the API server's words, the
job at its new size, the chief's cluster file, and a request answered once."""

from __future__ import annotations

import json
import os
import threading

import pytest
from strategyjob.jobspec import cluster_spec, load_manifest
from strategyjob.jobspec import messages as msg
from strategyjob.launcher import _control, _resize

from tests.unit.jobspec.conftest import manifest


def ps_job(workers: int = 2, **bounds: int):
    obj = manifest("ParameterServerStrategy", chief=1, ps=1, worker=workers)
    obj["spec"]["replicaSpecs"]["worker"].update(bounds)
    return load_manifest(obj)


@pytest.mark.parametrize(
    ("replicas", "bounds", "expected"),
    [
        (3, {}, None),
        (0, {}, "--replicas must be a whole number of workers, 1 or more (got 0)"),
        ("3", {}, "--replicas must be a whole number of workers, 1 or more (got '3')"),
        (1, {"minReplicas": 2}, msg.BELOW_MIN_REPLICAS.format(value=1, minimum=2)),
        (5, {"maxReplicas": 4}, msg.ABOVE_MAX_REPLICAS.format(value=5, maximum=4)),
    ],
)
def test_what_a_local_resize_refuses(replicas, bounds, expected):
    assert _resize.refusal(ps_job(2, **bounds), replicas) == expected


def test_other_strategies_and_tfjobs_are_refused():
    assert _resize.refusal(load_manifest(manifest()), 3) is None  # MWMS: re-formed
    assert _resize.refusal(load_manifest(manifest("TPUStrategy")), 3) is None  # re-formed too
    mirrored = load_manifest(manifest("MirroredStrategy", worker=1))
    refused = msg.NOT_RESIZABLE.format(strategy="MirroredStrategy", value=2)
    assert _resize.refusal(mirrored, 2) == refused
    assert "a TFJob run by strategyjob run cannot be resized" in _resize.refusal(
        ps_job(), 3, tfjob=True
    )


def test_the_job_at_its_new_size_and_the_chiefs_file():
    job = _resize.with_workers(ps_job(2), 4)
    assert job.num_replicas("worker") == 4 and job.num_replicas("chief") == 1
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"], "evaluator": ["h:5"]}
    assert json.loads(cluster_spec(cluster)) == {  # the chief's file, as the launcher writes it
        "chief": ["h:1"],
        "worker": ["h:2", "h:3"],
        "ps": ["h:4"],
    }


def test_a_request_is_answered_once_by_the_launcher_that_owns_the_name(tmp_path, monkeypatch):
    monkeypatch.setattr(_control, "RUNS_DIR", tmp_path / "runs")
    inbox = _control.ResizeInbox("job")
    assert inbox.owned and inbox.take() is None

    def launcher() -> None:
        while (request := inbox.take()) is None:
            threading.Event().wait(0.01)
        inbox.answer(request, True, f"workers -> {request.replicas}")

    thread = threading.Thread(target=launcher)
    thread.start()
    assert _control.request_resize("job", 3, timeout=10) == (True, "workers -> 3")
    thread.join(5)
    assert inbox.take() is None  # taken once
    inbox.close()
    assert not (tmp_path / "runs").exists()  # the last run's directory: both go
    ok, why = _control.request_resize("job", 3, timeout=1)
    assert not ok and "no job named job runs under strategyjob run" in why


def test_a_second_launcher_of_the_name_leaves_the_first_ones_directory_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(_control, "RUNS_DIR", tmp_path)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "pid").write_text(str(os.getppid()))  # another live launcher
    second = _control.ResizeInbox("job")
    assert not second.owned and second.take() is None
    second.close()
    assert (tmp_path / "job" / "pid").read_text() == str(os.getppid())


def test_a_dead_launchers_directory_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(_control, "RUNS_DIR", tmp_path)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "pid").write_text("999999999")  # no such process
    assert _control.ResizeInbox("job").owned
    assert (tmp_path / "job" / "pid").read_text() == str(os.getpid())
