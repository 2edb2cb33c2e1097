"""strategyjob.client and the cluster commands of the CLI against a real kube-apiserver and
the operator. No kubelet runs here: the tests write pod phases through the API
(``Kube.set_phase``), and the log tests serve the kubelet's ``/containerLogs`` endpoint
from a stub that kube-apiserver proxies ``pods/log`` to, so the client's log requests
take their real path through the API server."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from integration_harness import manifest, wait_for
from strategyjob.client import (
    ClusterError,
    JobFailedError,
    JobNotFoundError,
    StrategyJob,
    StrategyJobClient,
)

from tests.support.control_plane import REPO_ROOT

pytestmark = pytest.mark.timeout(180)

CMD = ["python", "train.py"]


@pytest.fixture
def client(control_plane, kube) -> Iterator[StrategyJobClient]:
    with StrategyJobClient(kubeconfig=control_plane.kubeconfig, namespace=kube.ns) as c:
        yield c


def mwms(name: str, workers: int = 2, **kwargs: Any) -> StrategyJob:
    return StrategyJob.build(
        name,
        strategy="MultiWorkerMirroredStrategy",
        image="python:3.11",
        command=CMD,
        workers=workers,
        **kwargs,
    )


def launched(kube, name: str, total: int) -> list[str]:
    """The job's pods once the operator created them all (then phases may be written)."""
    pods = kube.wait_pods(name, total, timeout=60)
    wait_for(
        f"{name} launched",
        lambda: ((kube.job(name) or {}).get("status") or {}).get("launched"),
        timeout=60,
    )
    return sorted(pods)


class Background:
    """Run ``fn`` in a thread; ``result()`` re-raises what it raised (bounded join)."""

    def __init__(self, fn) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as e:
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 90.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background step did not finish"
        if self.error is not None:
            raise self.error


# --- Python client ---------------------------------------------------------------------------


def test_create_then_wait_returns_when_the_job_succeeds(client, kube, operator):
    created = client.create(mwms("ok"))
    assert (created.name, created.namespace) == ("ok", kube.ns)

    def play_kubelet() -> None:
        pods = launched(kube, "ok", 2)
        for pod in pods:
            kube.set_phase(pod, "Running")
        kube.wait_condition("ok", "Running", timeout=60)
        kube.set_phase("ok-worker-0", "Succeeded", exit_code=0)  # the leader finishes

    kubelet = Background(play_kubelet)
    states: list[str | None] = []
    done = client.wait("ok", timeout=120, callback=lambda job: states.append(job.state))
    kubelet.result()
    assert done.state == "Succeeded" and done.condition("Succeeded") is not None
    assert states[-1] == "Succeeded" and len(states) >= 2, states  # it saw the job change
    assert client.get("ok").state == "Succeeded"
    # waiting again for a state the job went through returns at once
    assert client.wait("ok", timeout=5, until="Running").state == "Succeeded"


def test_wait_raises_with_the_failure_reason(client, kube, operator):
    client.create(mwms("boom"))
    for pod in launched(kube, "boom", 2):
        kube.set_phase(pod, "Running")
    kube.set_phase("boom-worker-1", "Failed", exit_code=3)
    with pytest.raises(JobFailedError) as info:
        client.wait("boom", timeout=120)
    condition = kube.wait_condition("boom", "Failed")
    assert info.value.reason == condition["reason"] == "ReplicaFailed"
    assert info.value.message == condition["message"]
    assert "worker-1" in info.value.message and "3" in info.value.message
    assert str(info.value).startswith(f"StrategyJob boom in namespace {kube.ns} failed")
    # waiting for the failure itself is allowed
    assert client.wait("boom", timeout=5, until="Failed").state == "Failed"


def test_wait_times_out_naming_the_job_and_its_state(client, kube, operator):
    client.create(mwms("slow"))
    kube.wait_condition("slow", "Created", timeout=60)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        client.wait("slow", timeout=3)
    assert time.monotonic() - started < 30  # the deadline holds, give or take one request
    assert f"StrategyJob slow in namespace {kube.ns}" in str(info.value)
    assert "to be Succeeded; it is Created" in str(info.value)


def test_list_get_replicas_delete_and_errors(client, kube, operator, tmp_path):
    client.create(mwms("b-job", workers=1))
    raw = manifest("a-job", "MultiWorkerMirroredStrategy", {"worker": 1})
    client.create(raw)
    assert "namespace" not in raw["metadata"]  # the caller's dict is left alone
    path = tmp_path / "c.yaml"
    path.write_text(
        "apiVersion: strategyjob.dev/v1alpha1\nkind: StrategyJob\nmetadata: {name: c-job}\n"
        "spec:\n  strategy: OneDeviceStrategy\n  replicaSpecs:\n    worker:\n"
        "      template: {spec: {containers: [{name: strategyjob, image: x}]}}\n"
    )
    client.create(path)

    assert [j.name for j in client.list()] == ["a-job", "b-job", "c-job"]
    job = client.get("c-job")
    assert (job.strategy, job.replicas()) == ("OneDeviceStrategy", [("worker", 0)])

    launched(kube, "b-job", 1)
    kube.set_phase("b-job-worker-0", "Running")
    wait_for(
        "worker-0 Running",
        lambda: [(r.label, r.phase) for r in client.replicas("b-job")] == [("worker-0", "Running")],
    )

    with pytest.raises(ClusterError) as dup:
        client.create(mwms("b-job", workers=1))
    assert dup.value.reason == "AlreadyExists" and "already exists" in str(dup.value)

    client.delete("b-job")

    def gone() -> bool:
        try:
            client.get("b-job")
        except JobNotFoundError:
            return True
        return False

    wait_for("b-job deleted", gone, timeout=60)
    assert [j.name for j in client.list()] == ["a-job", "c-job"]
    with pytest.raises(JobNotFoundError) as missing:
        client.delete("b-job")
    assert str(missing.value) == f"StrategyJob b-job not found in namespace {kube.ns}."


def test_api_server_validation_reaches_the_caller_as_one_line(client):
    bad = manifest("bad", "MultiWorkerMirroredStrategy", {"worker": 2, "ps": 1})
    with pytest.raises(ClusterError) as info:
        client.create(bad)
    assert info.value.status == 422
    assert str(info.value) == (
        "the API server rejected StrategyJob bad: spec.replicaSpecs.ps: "
        "MultiWorkerMirroredStrategy takes no ps replicas. Remove spec.replicaSpecs.ps, or "
        "use ParameterServerStrategy."
    )


# --- CLI -------------------------------------------------------------------------------------


def cli(control_plane, kube, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "strategyjob", *args, "-n", kube.ns],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(control_plane),
        cwd=REPO_ROOT,
    )


def cli_env(control_plane) -> dict[str, str]:
    # --kubeconfig is not given: the CLI finds the cluster the way kubectl does
    return {
        **os.environ,
        "KUBECONFIG": str(control_plane.kubeconfig),
        "PYTHONPATH": str(REPO_ROOT / "sdk"),
        "OMP_NUM_THREADS": "1",
    }


def test_cli_submit_list_status_watch_delete(control_plane, kube, operator, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: strategyjob.dev/v1alpha1\nkind: StrategyJob\nmetadata: {name: digits}\n"
        "spec:\n  strategy: MultiWorkerMirroredStrategy\n  replicaSpecs:\n    worker:\n"
        "      replicas: 2\n"
        "      template: {spec: {containers: [{name: strategyjob, image: x}]}}\n"
    )
    submit = cli(control_plane, kube, "submit", str(path))
    assert submit.returncode == 0, submit.stderr
    assert submit.stdout.startswith(f"StrategyJob digits created in namespace {kube.ns}.")

    pods = launched(kube, "digits", 2)
    kube.set_phase(pods[0], "Running")
    listed = cli(control_plane, kube, "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "STRATEGY", "STATE", "READY", "RESTARTS", "PROGRESS", "AGE"]
    assert row.split()[:2] == ["digits", "MultiWorkerMirroredStrategy"]

    status = cli(control_plane, kube, "status", "digits")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"StrategyJob digits  namespace {kube.ns}  MultiWorkerMirroredStrategy"
    assert lines[2] == "progress: -"
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("digits-")}
    assert rows["digits-worker-0"][1:4] == ["worker", "0", "Running"]
    assert rows["digits-worker-1"][1:4] == ["worker", "1", "Pending"]
    assert any(line.startswith("Created    True") for line in lines), status.stdout

    watch_args = ["status", "digits", "--watch", "--interval", "0.3", "--namespace", kube.ns]
    watch = subprocess.Popen(
        [sys.executable, "-m", "strategyjob", *watch_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(control_plane),
    )
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(watch.stdout), daemon=True)
    reader.start()
    try:
        # the job changes only once the watch has drawn it, so the redraw is observed
        wait_for("the first report", lambda: any(p.startswith("state:") for p in printed), 60)
        kube.set_phase(pods[1], "Running")
        kube.wait_condition("digits", "Running", timeout=60)
        kube.set_phase("digits-worker-0", "Succeeded", exit_code=0)
        watch.wait(90)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
        reader.join(10)
    assert watch.returncode == 0, watch.stderr.read()
    reports = "".join(printed).split("\n\nStrategyJob digits")
    assert len(reports) >= 2, printed  # redrawn as the job changed (not a terminal: reprinted)
    assert "state: Succeeded" in reports[-1] and "state: Succeeded" not in reports[0]

    deleted = cli(control_plane, kube, "delete", "digits")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == f"StrategyJob digits deleted from namespace {kube.ns}."
    wait_for("digits deleted", lambda: kube.job("digits") is None, timeout=60)

    missing = cli(control_plane, kube, "status", "digits")
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert missing.stderr == (
        f"strategyjob status: error: StrategyJob digits not found in namespace {kube.ns}.\n"
    )


def test_cli_shows_api_server_rejections_as_one_line(control_plane, kube, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: strategyjob.dev/v1alpha1\nkind: StrategyJob\nmetadata: {name: bad}\n"
        "spec:\n  strategy: MultiWorkerMirroredStrategy\n  replicaSpecs:\n"
        "    worker: {replicas: 2, template: {spec: {containers: [{name: strategyjob}]}}}\n"
        "    ps: {replicas: 1, template: {spec: {containers: [{name: strategyjob}]}}}\n"
    )
    proc = cli(control_plane, kube, "submit", str(path))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        "strategyjob submit: error: the API server rejected StrategyJob bad: "
        "spec.replicaSpecs.ps: MultiWorkerMirroredStrategy takes no ps replicas. "
        "Remove spec.replicaSpecs.ps, or use ParameterServerStrategy.\n"
    )
    assert kube.job("bad") is None

    gone = cli(control_plane, kube, "delete", "nope")
    assert (gone.returncode, gone.stderr) == (
        1,
        f"strategyjob delete: error: StrategyJob nope not found in namespace {kube.ns}.\n",
    )
    empty = cli(control_plane, kube, "list")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr == f"No StrategyJobs in namespace {kube.ns}.\n"


# --- logs, through kube-apiserver's pods/log proxy to a stub kubelet -------------------------

#: What each replica "printed", with the times the kubelet would stamp.
LOGS = {
    "worker-0": [("2026-11-22T10:00:00.5Z", "w0 step 1"), ("2026-11-22T10:00:02Z", "w0 step 2")],
    "worker-1": [("2026-11-22T10:00:01.25Z", "w1 step 1"), ("2026-11-22T10:00:03Z", "w1 done")],
}


class StubKubelet:
    """``GET /containerLogs/<ns>/<pod>/<container>`` over HTTPS, as the kubelet serves it
    (``timestamps``, ``follow``). A followed stream sends its first line, then the rest
    once ``release`` is set, so a test can see lines arrive before the stream ends."""

    def __init__(self, workdir: Path, job: str) -> None:
        cert, key = workdir / "kubelet.crt", workdir / "kubelet.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=stub-kubelet", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.release = threading.Event()
        self.requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                stub.requests.append(self.path)
                parts = url.path.strip("/").split("/")
                replica = parts[2].removeprefix(f"{job}-") if len(parts) == 4 else ""
                if parts[0] != "containerLogs" or replica not in LOGS:
                    self.send_error(404)
                    return
                query = parse_qs(url.query)
                stamped = query.get("timestamps") == ["true"]
                lines = [(f"{ts} {text}" if stamped else text) + "\n" for ts, text in LOGS[replica]]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                if query.get("follow") != ["true"]:
                    body = "".join(lines).encode()
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for number, line in enumerate(lines):
                    if number == 1:
                        stub.release.wait(60)
                    data = line.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def logs_job(control_plane, kube, operator, client, tmp_path):
    """A running two-worker job whose pods are bound to a node served by a StubKubelet."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make the stub kubelet's serving certificate")
    name = "logs"
    kubelet = StubKubelet(tmp_path, name)
    node = f"stub-kubelet-{uuid.uuid4().hex[:6]}"
    kube.core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node},
            # nothing else may be scheduled here: only the pods this test binds
            "spec": {"unschedulable": True},
        }
    )
    try:
        kube.core.patch_node_status(
            node,
            {
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port}},
                }
            },
        )
        client.create(mwms(name))
        pods = launched(kube, name, 2)
        for pod in pods:
            kube.core.create_namespaced_pod_binding(
                pod,
                kube.ns,
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": pod},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                },
                _preload_content=False,
            )
            kube.set_phase(pod, "Running")
        try:
            probe = client.logs(name, replica="worker-0")
        except ClusterError as e:
            pytest.skip(f"kube-apiserver cannot reach a stub kubelet for pods/log here: {e}")
        if not kubelet.requests:
            pytest.skip(f"kube-apiserver answered pods/log without asking a kubelet: {probe!r}")
        yield name, kubelet
    finally:
        kubelet.stop()
        for pod in kube.pods(name):  # bound pods wait for their kubelet; there is none
            kube.core.delete_namespaced_pod(pod, kube.ns, grace_period_seconds=0)
        kube.core.delete_node(node)


def test_logs_of_one_replica_text_and_followed(client, logs_job):
    name, kubelet = logs_job
    assert client.logs(name, replica="worker-1") == "w1 step 1\nw1 done\n"
    assert kubelet.requests[-1].startswith(f"/containerLogs/{client.namespace}/{name}-worker-1/")
    assert "/strategyjob?" in kubelet.requests[-1] or kubelet.requests[-1].endswith("/strategyjob")

    lines = client.logs(name, replica="worker-0", follow=True)
    assert next(lines) == "w0 step 1"  # arrives while the container still "runs"
    kubelet.release.set()
    assert list(lines) == ["w0 step 2"]

    with pytest.raises(JobNotFoundError, match=f"pod {name}-worker-7 not found"):
        client.logs(name, replica="worker-7")


def test_cli_logs_interleave_replicas_with_prefixes(control_plane, kube, logs_job):
    name, kubelet = logs_job
    merged = cli(control_plane, kube, "logs", name)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.splitlines() == [
        "[worker-0] w0 step 1",
        "[worker-1] w1 step 1",
        "[worker-0] w0 step 2",
        "[worker-1] w1 done",
    ]
    one = cli(control_plane, kube, "logs", name, "--replica", "worker-1")
    assert (one.returncode, one.stdout) == (0, "w1 step 1\nw1 done\n")

    kubelet.release.set()  # followed streams end after their lines
    followed = cli(control_plane, kube, "logs", name, "--follow")
    assert followed.returncode == 0, followed.stderr
    out = followed.stdout.splitlines()
    assert sorted(out) == sorted(f"[{r}] {text}" for r, lines in LOGS.items() for _, text in lines)
    for replica, lines in LOGS.items():  # each replica's lines in its own order
        mine = [line for line in out if line.startswith(f"[{replica}]")]
        assert mine == [f"[{replica}] {text}" for _, text in lines]
