"""``python -m strategyjob_operator`` against the real API server with credentials it
refuses, a CA that does not match, an exec plugin that breaks after startup, and an API
server that is out of reach for the first seconds (a pod starting before the network):
each ends with one line and a non-zero status within a bounded time, or runs once the
server answers. Each operator runs in its own process group, killed at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.certs import self_signed_ca
from tests.support.control_plane import REPO_ROOT, ControlPlane, free_port

pytestmark = pytest.mark.timeout(150)

#: How long a failing operator may take to exit under load (1 to 3 s alone).
EXIT_WITHIN = 60.0


def _kubeconfig(cp: ControlPlane, user: dict[str, Any], **cluster: Any) -> Path:
    return cp.write_kubeconfig(
        cp.dir / f"kubeconfig-startup-{uuid.uuid4().hex[:6]}", user, **cluster
    )


class Operator:
    """The operator in its own process group; :meth:`kill` ends the group."""

    def __init__(self, kubeconfig: Path, **env: str) -> None:
        self.log = kubeconfig.with_suffix(".log")
        self.metrics_port = free_port()
        full_env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "sdk"), str(REPO_ROOT / "operator")]),
            "STRATEGYJOB_METRICS_PORT": str(self.metrics_port),
            "OMP_NUM_THREADS": "1",
            **env,
        }
        full_env.pop("KUBERNETES_SERVICE_HOST", None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "strategyjob_operator", "--standalone", "-n", "startup-*"],
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def wait(self, timeout: float = EXIT_WITHIN) -> tuple[int | None, float]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.monotonic() - self.started

    def lines(self) -> list[str]:
        return [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@pytest.fixture
def operators() -> Iterator[list[Operator]]:
    started: list[Operator] = []
    try:
        yield started
    finally:
        for op in started:
            op.kill()


def _fails_with_one_line(op: Operator) -> str:
    rc, took = op.wait()
    assert rc not in (None, 0), f"rc={rc} after {took:.0f}s: {op.lines()[-20:]}"
    lines = op.lines()
    assert len(lines) == 1, lines
    return lines[0]


def test_credentials_the_api_server_refuses_end_the_operator_with_one_line(
    control_plane: ControlPlane, operators: list[Operator]
) -> None:
    op = Operator(_kubeconfig(control_plane, {"token": "not-a-valid-token"}))
    operators.append(op)
    line = _fails_with_one_line(op)
    assert f"The API server {control_plane.server} refused the credentials (HTTP 401)" in line


def test_a_certificate_authority_that_does_not_match_ends_the_operator_with_one_line(
    control_plane: ControlPlane, operators: list[Operator], tmp_path: Path
) -> None:
    """The kubeconfig names another cluster's CA (here: the operator's own client's)."""

    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_text(self_signed_ca("some-other-cluster-ca")[0])
    op = Operator(
        _kubeconfig(
            control_plane,
            {"token": control_plane.token},
            **{"certificate-authority": str(other_ca)},
        )
    )
    operators.append(op)
    line = _fails_with_one_line(op)
    assert f"TLS with the API server {control_plane.server} failed" in line
    assert "certificate-authority" in line


def test_an_exec_plugin_that_fails_after_startup_ends_the_operator_with_one_reason(
    control_plane: ControlPlane, operators: list[Operator], tmp_path: Path
) -> None:
    """kopf waits forever for credentials when its login fails: the operator stops instead,
    its last line the reason (kopf's own log of the failed login comes before it)."""
    marker = tmp_path / "used"
    script = (
        "import json, pathlib, sys\n"
        "m = pathlib.Path(sys.argv[1])\n"
        "if m.exists(): sys.exit('the plugin broke: log in again')\n"
        "m.touch()\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
        "'kind': 'ExecCredential', 'status': {'token': sys.argv[2]}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": ["-c", script, str(marker), control_plane.token],
            "interactiveMode": "Never",
        }
    }
    op = Operator(_kubeconfig(control_plane, user))
    operators.append(op)
    rc, took = op.wait()
    lines = op.lines()
    assert rc not in (None, 0), f"rc={rc} after {took:.0f}s: {lines[-20:]}"
    assert marker.exists()
    assert lines[-1].startswith("strategyjob-operator: Cannot use the cluster credentials"), lines


class _Forwarder:
    """A TCP forwarder to the API server on a port that refuses connections until
    :meth:`open` is called: an API server out of reach for a while."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closed = threading.Event()
        self.threads: list[threading.Thread] = []

    def open(self) -> None:
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                t.start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for t in self.threads:
            t.join(5)


def test_an_api_server_out_of_reach_at_startup_is_waited_for(
    control_plane: ControlPlane, operators: list[Operator]
) -> None:
    """In a pod the operator may start before the API server is reachable: within
    STRATEGYJOB_STARTUP_SECONDS it keeps trying, and runs once the server answers."""
    import urllib.request

    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    forwarder = _Forwarder((host, int(port)))
    try:
        config = _kubeconfig(
            control_plane,
            {"token": control_plane.token},
            server=f"https://127.0.0.1:{forwarder.port}",
        )
        op = Operator(config, STRATEGYJOB_STARTUP_SECONDS="120")
        operators.append(op)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # out of reach for 3 s: the operator must not exit
            assert op.proc.poll() is None, op.lines()
            time.sleep(0.2)
        forwarder.open()

        def serving() -> bool:
            assert op.proc.poll() is None, op.lines()[-20:]
            try:
                url = f"http://127.0.0.1:{op.metrics_port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as r:
                    return "strategyjob" in r.read().decode()
            except OSError:
                return False

        deadline = time.monotonic() + 90
        while not serving():
            assert time.monotonic() < deadline, f"the operator never served: {op.lines()[-20:]}"
            time.sleep(0.5)
    finally:
        for op in operators:
            op.kill()
        forwarder.close()
