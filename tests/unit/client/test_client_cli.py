"""The CLI's cluster commands over a fake client: watch redraws and exit codes, log
prefixes and per-replica errors, one-line errors; a real ``strategyjob submit -`` for input
refused before any API call. The real client is covered by
tests/integration/test_k8s_client.py."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from strategyjob import cli
from strategyjob.client import LogLine, SubmittedJob
from strategyjob.errors import ClusterError, JobNotFoundError


def job(state, message=""):
    conditions = [{"type": state, "status": "True", "reason": f"R{state}", "message": message}]
    return SubmittedJob(
        {
            "metadata": {"name": "mnist", "namespace": "ml"},
            "spec": {"strategy": "MultiWorkerMirroredStrategy", "replicaSpecs": {}},
            "status": {"state": state, "conditions": conditions},
        }
    )


class FakeClient:
    namespace = "ml"

    def __init__(self, states=(), lines=(), error=None):
        self.states = list(states)
        self.lines = list(lines)
        self.error = error
        self.closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True

    def get(self, name):
        if self.error:
            raise self.error
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def replicas(self, name):
        return []

    def iter_logs(self, name, follow=False):
        yield from self.lines

    def delete(self, name):
        raise self.error


@pytest.fixture
def use(monkeypatch):
    def install(fake):
        monkeypatch.setattr(cli, "_client", lambda args: fake)
        return fake

    return install


def test_status_watch_redraws_until_the_job_fails_and_exits_1(use, capsys):
    fake = use(FakeClient([job("Created"), job("Running"), job("Running"), job("Failed", "x")]))
    assert cli.main(["status", "mnist", "--watch", "--interval", "0"]) == 1
    out = capsys.readouterr().out
    # three different reports (the repeated Running one is not reprinted)
    assert [line for line in out.splitlines() if line.startswith("state:")] == [
        "state: Created   ready: -   restarts: 0   age: -",
        "state: Running   ready: -   restarts: 0   age: -",
        "state: Failed   ready: -   restarts: 0   age: -",
    ]
    assert fake.closed


def test_status_watch_exits_0_on_success_and_status_alone_draws_once(use, capsys):
    use(FakeClient([job("Running"), job("Succeeded")]))
    assert cli.main(["status", "mnist", "-w", "--interval", "0"]) == 0
    use(FakeClient([job("Running"), job("Succeeded")]))
    assert cli.main(["status", "mnist"]) == 0
    assert capsys.readouterr().out.count("state: Running") == 2


def reporting(state, step):
    raw = job(state).raw
    progress = {"step": step, "totalSteps": 40, "percentage": step * 2.5, "metrics": {"loss": 1}}
    return SubmittedJob({**raw, "status": {**raw["status"], "progress": progress}})


class HistoryClient(FakeClient):
    """Serves the history of the progress last served, as the operator keeps it."""

    def __init__(self, states):
        super().__init__(states)
        self.history_reads = 0
        self.step = 0

    def get(self, name):
        served = super().get(name)
        self.step = served.progress["step"]
        return served

    def metrics(self, name):
        self.history_reads += 1
        return {"loss": [(s, 1 / s) for s in range(10, self.step + 1, 10)]}


def watch_in_a_terminal(monkeypatch, fake) -> list[str]:
    """``strategyjob status mnist --watch`` with a real pseudo-terminal as stdout, 60 columns
    wide; the screens it drew, each after its clear-screen."""
    master, replica = pty.openpty()
    terminal = os.fdopen(replica, "w", encoding="utf-8")
    received = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(cli, "_client", lambda args: fake)
    monkeypatch.setenv("COLUMNS", "60")
    try:
        assert cli.main(["status", "mnist", "--watch", "--interval", "0"]) == 0
    finally:
        terminal.close()
        reader.join(10)
        os.close(master)
    return received.decode().replace("\r\n", "\n").split("\x1b[H\x1b[2J")[1:]


@pytest.mark.timeout(30)
def test_status_watch_in_a_terminal_draws_the_curves_under_the_progress(monkeypatch):
    """The curves under the progress line, redrawn from a history read again only when a
    new report arrived."""
    states = [reporting("Running", s) for s in (10, 10, 20, 20)] + [reporting("Succeeded", 30)]
    fake = HistoryClient(states)
    screens = watch_in_a_terminal(monkeypatch, fake)
    assert fake.history_reads == 3  # steps 10, 20 and 30: not at every redraw
    assert len(screens) == 5
    last = screens[-1].splitlines()
    progress = next(i for i, line in enumerate(last) if line.startswith("progress: "))
    assert last[progress + 2] == "loss  last 0.03333 at step 30"
    assert last[progress + 3] == "    0.1 │" + "█" * 10  # steps 10 to 19: a column each
    assert last.index("NAME  TYPE  INDEX  PHASE  RESTARTS") > progress + 9
    assert "loss  last 0.05 at step 20" in screens[2]


@pytest.mark.timeout(30)
def test_a_history_that_cannot_be_read_is_one_line_in_the_watch_not_its_end(monkeypatch):
    class Forbidden(HistoryClient):
        def metrics(self, name):
            raise ClusterError("permission denied:\n cannot get configmaps")

    screens = watch_in_a_terminal(monkeypatch, Forbidden([reporting("Succeeded", 10)]))
    assert "\ncurves: permission denied: cannot get configmaps\n" in screens[-1]


def test_logs_prefix_each_replica_and_report_unreadable_ones(use, capsys):
    use(
        FakeClient(
            lines=[
                LogLine("ps-0", "pod mnist-ps-0 not found in namespace ml.", error=True),
                LogLine("worker-0", "step 1"),
                LogLine("worker-1", "step 1"),
            ]
        )
    )
    assert cli.main(["logs", "mnist"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "[worker-0] step 1\n[worker-1] step 1\n"
    assert captured.err == "strategyjob logs: [ps-0] pod mnist-ps-0 not found in namespace ml.\n"

    use(FakeClient(lines=[LogLine("worker-0", "cannot read", error=True)]))
    assert cli.main(["logs", "mnist"]) == 1  # nothing could be read at all


def test_cluster_errors_are_one_line_exit_1(use, capsys):
    use(FakeClient(error=JobNotFoundError("StrategyJob mnist not found in namespace ml.")))
    assert cli.main(["delete", "mnist"]) == 1
    assert capsys.readouterr().err == (
        "strategyjob delete: error: StrategyJob mnist not found in namespace ml.\n"
    )
    use(FakeClient(error=ClusterError("forbidden:\n  you may not")))
    assert cli.main(["status", "mnist"]) == 1
    assert capsys.readouterr().err == "strategyjob status: error: forbidden: you may not\n"


def test_ctrl_c_ends_a_watch_quietly_with_130(use, capsys):
    class Interrupted(FakeClient):
        def get(self, name):
            raise KeyboardInterrupt

    use(Interrupted([job("Running")]))
    assert cli.main(["status", "mnist", "--watch"]) == 130
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("document", "shown"),
    [
        ("- a\n- b\n", '["a", "b"]'),
        ("hello\n", '"hello"'),
        ("42\n", "42"),
        (b"\xff\xfe", None),
    ],
    ids=["list", "string", "number", "not-utf8"],
)
def test_submit_stdin_that_is_not_a_manifest_is_one_line_before_any_api_call(
    tmp_path, document, shown
):
    """A real ``strategyjob submit -``; the kubeconfig does not exist, so reaching the
    cluster would fail differently: the manifest is refused first."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "sdk"),
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
    }
    data = document if isinstance(document, bytes) else document.encode()
    done = subprocess.run(
        [sys.executable, "-m", "strategyjob", "submit", "-"],
        input=data,
        capture_output=True,
        env=env,
        timeout=50,
    )
    assert done.returncode == 2
    assert done.stdout == b""
    (line,) = done.stderr.decode().splitlines()
    if shown is None:
        assert line.startswith("strategyjob submit: error: stdin: cannot read the manifest (")
    else:
        assert line == (
            f"strategyjob submit: error: stdin: manifest: a StrategyJob manifest must be a "
            f"mapping (got {shown}). Start the file with apiVersion: strategyjob.dev/v1alpha1 "
            "and kind: StrategyJob."
        )


def test_submit_file_that_is_a_list_is_refused_before_connecting(tmp_path, monkeypatch, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("- apiVersion: strategyjob.dev/v1alpha1\n")

    def no_cluster(args):
        raise AssertionError("the cluster must not be contacted")

    monkeypatch.setattr(cli, "_client", no_cluster)
    assert cli.main(["submit", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"strategyjob submit: error: {path}: manifest: a StrategyJob manifest")


@pytest.mark.parametrize("every", ["-5", "nan"])
def test_tensorboard_refuses_a_copy_interval_that_is_no_duration(every, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["tensorboard", "mnist", "--copy-only", f"--every={every}"])
    assert stopped.value.code == 2
    assert "argument --every: must be a number of seconds" in capsys.readouterr().err


def test_tensorboard_refuses_a_copy_interval_under_a_second(capsys):
    """Each copy runs tar in the pod: a sub-second --every would copy in a busy loop; refused
    in one line before any cluster call."""
    assert cli.main(["tensorboard", "mnist", "--copy-only", "--every=0.5"]) == 2
    assert "--every must be 1 second or more (got 0.5)" in capsys.readouterr().err
