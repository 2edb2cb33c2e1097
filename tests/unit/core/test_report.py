"""strategyjob.report: who publishes, what, where, how often; never raising."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
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
    def __init__(self, fail=False):
        self.records, self.fail = [], fail

    def write(self, record):
        if self.fail:
            raise OSError("refused")
        self.records.append(record)


def test_reports_are_rate_limited_and_the_last_is_flushed():
    now = [0.0]
    sink = Sink()
    r = _progress.Reporter(sink, interval=10.0, clock=lambda: now[0])
    for step in range(5):
        r.report({"step": step})
        now[0] += 1.0
    assert [x["step"] for x in sink.records] == [0]
    now[0] = 10.0
    r.report({"step": 5})
    assert [x["step"] for x in sink.records] == [0, 5]
    r.report({"step": 6})
    r.flush()  # what atexit does
    r.flush()  # nothing new: no write
    assert [x["step"] for x in sink.records] == [0, 5, 6]


def test_failures_warn_once_and_never_raise(caplog):
    r = _progress.Reporter(Sink(fail=True), interval=0.0)
    with caplog.at_level(logging.WARNING, logger="strategyjob"):
        for step in range(3):
            r.report({"step": step})
    assert len([m for m in caplog.messages if "could not publish" in m]) == 1


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
