"""strategyjob.report: who publishes, what, where, how often; never raising."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time

import pytest
import strategyjob
from strategyjob import _progress


def env(replica_type, index, chief=False, **extra):
    cluster = {"worker": ["a:1", "b:1"], **({"chief": ["c:1"]} if chief else {})}
    return {
        "STRATEGYJOB_REPLICA_TYPE": replica_type,
        "STRATEGYJOB_REPLICA_INDEX": str(index),
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {}}),
        **extra,
    }


def test_the_leader_is_the_chief_else_worker_zero():
    assert _progress.is_leader(env("chief", 0, chief=True))
    assert not _progress.is_leader(env("worker", 0, chief=True))
    assert _progress.is_leader(env("worker", 0))
    assert not _progress.is_leader(env("worker", 1))
    assert not _progress.is_leader(env("ps", 0))
    assert not _progress.is_leader({})  # no job: nothing to report to


def test_record_keeps_numbers_and_strings():
    class Scalar:  # a tensor or numpy scalar
        def item(self):
            return 0.25

    record = _progress.make_record(
        7, 10, {"loss": Scalar(), "n": 3, "phase": "eval", "bad": float("nan"), "ok": True}
    )
    assert record["step"] == 7 and record["totalSteps"] == 10
    assert record["metrics"] == {"loss": 0.25, "n": 3, "phase": "eval", "bad": "nan", "ok": "true"}
    assert record["time"].endswith("Z")
    assert "totalSteps" not in _progress.make_record(1, None, {})


class Sink:
    """Records what is written; ``fail`` refuses every write, ``gate`` holds each write
    until it is set (a slow API server)."""

    def __init__(self, fail=False, gate=None):
        self.records, self.fail, self.gate = [], fail, gate
        self.started = threading.Event()

    def write(self, record):
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.fail:
            raise OSError("refused")
        self.records.append(record)


def wait_until(predicate, timeout=10.0, what="a condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def reporters():
    made = []

    def make(sink, interval):
        made.append(_progress.Reporter(sink, interval))
        return made[-1]

    yield make
    for reporter in made:
        if reporter.sink.gate is not None:
            reporter.sink.gate.set()
        reporter.close(5)
        assert reporter._thread is None or not reporter._thread.is_alive()


def test_reports_are_rate_limited_and_the_last_is_flushed(reporters):
    sink = Sink()
    r = reporters(sink, interval=60.0)
    for step in range(5):
        r.report({"step": step})
    wait_until(lambda: sink.records, what="the first write")
    assert len(sink.records) == 1  # the others wait for the interval ...
    assert r.flush(5)  # ... or the exit, which writes only the newest
    r.flush(5)  # nothing new: no write
    steps = [x["step"] for x in sink.records]
    assert steps[-1] == 4 and len(steps) <= 2 and steps == sorted(steps)


def test_a_slow_sink_never_blocks_report_and_only_the_newest_is_sent(reporters):
    gate = threading.Event()
    sink = Sink(gate=gate)
    r = reporters(sink, interval=0.0)
    r.report({"step": 0})
    assert sink.started.wait(10)  # the publishing thread is stuck in step 0's write
    started = time.monotonic()
    for step in range(1, 1000):
        r.report({"step": step})
    assert time.monotonic() - started < 0.5
    assert not r.flush(0.2)  # exit waits only so long for a stuck write
    gate.set()
    assert r.flush(10)
    assert [x["step"] for x in sink.records] == [0, 999]


def test_failures_warn_once_and_never_raise(caplog, reporters):
    r = reporters(Sink(fail=True), interval=0.0)
    with caplog.at_level(logging.WARNING, logger="strategyjob"):
        for step in range(3):
            r.report({"step": step})
            assert r.flush(5)
    assert len([m for m in caplog.messages if "could not publish" in m]) == 1


class Unprintable:
    def __str__(self):
        raise RuntimeError("no")

    __repr__ = __str__


@pytest.fixture
def leader_with_file(tmp_path, monkeypatch):
    """This process as the leader under `strategyjob run`; yields the progress file."""
    path = tmp_path / "progress.jsonl"
    for key, value in env("worker", 0, STRATEGYJOB_PROGRESS_FILE=str(path)).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STRATEGYJOB_PROGRESS_INTERVAL", "0")
    _progress._reset()
    yield path
    _progress._reset(5)


BAD_STEPS = [
    float("inf"),
    float("-inf"),
    float("nan"),
    -1,
    2**63,
    10**400,
    1e300,
    "7",
    None,
    True,
    object(),
    Unprintable(),
]


def test_report_never_raises_and_drops_bad_values_with_one_warning(leader_with_file, caplog):
    with caplog.at_level(logging.WARNING, logger="strategyjob"):
        for bad in BAD_STEPS:
            strategyjob.report(bad)
            strategyjob.report(1, total_steps=bad)
            strategyjob.report(1, total_steps=1, **{"loss": bad})
        strategyjob.report(2, total_steps=float("inf"), weird=Unprintable())
        strategyjob.report(3, total_steps=0)
        strategyjob.report(4.0, total_steps=10.0, loss=float("nan"))
        assert _progress._reporter().flush(5)
    warnings = [m for m in caplog.messages if m.startswith("strategyjob.report")]
    assert len(warnings) == 1, warnings
    assert "step must be a whole number from 0 to 2**63 - 1, got inf" in warnings[0]
    records = [json.loads(line) for line in leader_with_file.read_text().splitlines()]
    # only well-formed records were written: steps kept, bad totals and metrics left out
    assert all(isinstance(r["step"], int) and 0 <= r["step"] < 2**63 for r in records)
    assert all(1 <= r.get("totalSteps", 1) < 2**63 for r in records)
    assert records[-1]["step"] == 4 and records[-1]["totalSteps"] == 10
    assert records[-1]["metrics"] == {"loss": "nan"}


def test_make_record_rejects_a_bad_step_and_leaves_out_a_bad_total():
    with pytest.raises(ValueError, match="step must be a whole number"):
        _progress.make_record(float("inf"), None, {})
    problems = []
    record = _progress.make_record(3, float("inf"), {"x": Unprintable()}, problems)
    assert record["step"] == 3 and "totalSteps" not in record and "metrics" not in record
    assert len(problems) == 2 and "total_steps must be None or" in problems[0]


def test_sink_from_env(tmp_path):
    assert _progress._sink_from_env({}) is None
    sink = _progress._sink_from_env({"STRATEGYJOB_PROGRESS_FILE": str(tmp_path / "p")})
    sink.write({"step": 1})
    sink.write({"step": 2})
    lines = (tmp_path / "p").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    # in a cluster: the pod's own annotation, with the service account's token
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    (sa / "namespace").write_text("team")
    cluster = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "STRATEGYJOB_POD_NAME": "j-chief-0",
        "STRATEGYJOB_SERVICEACCOUNT_DIR": str(sa),
    }
    sink = _progress._sink_from_env(cluster)
    assert sink.url == "https://10.0.0.1:443/api/v1/namespaces/team/pods/j-chief-0"
    sink = _progress._sink_from_env({**cluster, "STRATEGYJOB_NAMESPACE": "ns2"})
    assert sink.url.endswith("/namespaces/ns2/pods/j-chief-0")
    assert _progress._sink_from_env({**cluster, "STRATEGYJOB_POD_NAME": ""}) is None
    (sa / "token").unlink()
    assert _progress._sink_from_env(cluster) is None


@pytest.mark.timeout(60)
def test_report_is_a_cheap_torch_free_no_op_outside_a_job(tmp_path):
    code = (
        "import sys, strategyjob\n"
        "for i in range(1000): strategyjob.report(i, total_steps=1000, loss=0.1)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env={"PATH": ""})


def test_a_created_summary_writer_rides_on_the_leaders_reports(leader_with_file, tmp_path):
    """``strategyjob.summary.create_file_writer`` on the leader names its directory in every
    later report: the directory above all of them (TensorBoard's ``--logdir``)."""
    from strategyjob import summary

    strategyjob.report(1, loss=0.5)
    assert _progress._reporter().flush(5)
    summary.create_file_writer(tmp_path / "logs" / "train")
    summary.create_file_writer(tmp_path / "logs" / "validation")
    strategyjob.report(2, loss=0.4)
    assert _progress._reporter().flush(5)
    records = [json.loads(line) for line in leader_with_file.read_text().splitlines()]
    assert "logdir" not in records[0]
    assert records[-1]["logdir"] == str(tmp_path / "logs")
    # writers with nothing but / above them: the first, never the whole filesystem
    assert _progress._common_logdir({"/b/logs", "/a/eval"}) == "/a/eval"


class ResendingSink(Sink):
    """The annotation sink's way: room in a write is filled with points already written."""

    resends_points = True
    keeps_points = True
    points_per_write = 4


def test_a_write_the_operator_missed_leaves_no_gap_once_the_next_comes(reporters):
    """An operator restarted between two annotations never sees the first: the next one
    carries its points again (as many as fit), and folding a point twice changes nothing."""
    from strategyjob._history import MetricHistory

    sink = ResendingSink()
    r = reporters(sink, interval=0.0)
    for steps in ([1, 2, 3], [4], [5]):
        for step in steps:
            r.report({"step": step, "metrics": {"loss": 1.0 / step}})
        assert r.flush(5)
    written = [[step for step, _ in record["points"]] for record in sink.records]
    # (how the reports group into writes depends on the publishing thread's timing)
    assert written[-1] == [2, 3, 4, 5] and len(written) >= 3, written
    for points in written:  # the newest already written, then the new: at most 4
        assert points == list(range(points[0], points[-1] + 1)) and len(points) <= 4, written
    for missed in range(1, len(written) - 1):  # one write never reached the operator
        seen = MetricHistory()
        for record in sink.records[:missed] + sink.records[missed + 1 :]:
            seen.add_points(record["points"])
        assert [step for step, _ in seen.series()["loss"]] == [1, 2, 3, 4, 5], (missed, written)
    plain = Sink()
    plain.keeps_points = True
    r = reporters(plain, interval=0.0)
    for step in (1, 2):
        r.report({"step": step, "metrics": {"loss": 1.0}})
        assert r.flush(5)
    assert [[s for s, _ in x["points"]] for x in plain.records] == [[1], [2]]  # each once
