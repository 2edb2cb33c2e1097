"""The operator's command line: peering priorities, and a bad kubeconfig or an API server out
of reach ends ``python -m strategyjob_operator`` with one line, never a hang."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kopf
import pytest
import yaml
from strategyjob_operator import cluster_login, handlers
from strategyjob_operator.__main__ import peering_priority
from strategyjob_operator.state import OperatorState

REPO = Path(__file__).resolve().parents[3]
#: How long a failing operator may take to exit here, under load (it takes 1 to 3 s alone).
EXIT_WITHIN = 60.0


def test_peered_replicas_draw_distinct_random_priorities_unless_given() -> None:
    drawn = {peering_priority(None, standalone=False) for _ in range(20)}
    assert len(drawn) > 1 and all(p >= 1 for p in drawn)
    assert peering_priority(7, standalone=False) == 7
    assert peering_priority(None, standalone=True) == 0


def run_operator(
    kubeconfig: Path, timeout: float = EXIT_WITHIN, **env: str
) -> tuple[int, list[str], float]:
    """``python -m strategyjob_operator`` in its own process group, killed with the group
    whatever happens: its exit status, its output lines, and the seconds it ran."""
    full_env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONPATH": os.pathsep.join([str(REPO / "sdk"), str(REPO / "operator")]),
        "STRATEGYJOB_METRICS_PORT": "0",
        **env,
    }
    full_env.pop("KUBERNETES_SERVICE_HOST", None)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "strategyjob_operator", "--standalone", "-n", "nowhere"],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = b"(still running: hung)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    return proc.returncode, lines, time.monotonic() - start


def kubeconfig(tmp_path: Path, server: str, user: dict, **cluster: object) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections (bound, never listening)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.timeout(120)
def test_a_missing_kubeconfig_ends_the_operator_with_one_line(tmp_path: Path) -> None:
    rc, lines, _ = run_operator(tmp_path / "no-such-kubeconfig")
    assert rc != 0 and len(lines) == 1, lines
    assert "no-such-kubeconfig" in lines[0] and "No such file" in lines[0], lines


@pytest.mark.timeout(120)
def test_a_kubeconfig_that_is_not_yaml_ends_the_operator_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("{{{ not yaml")
    rc, lines, _ = run_operator(path)
    assert rc != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"strategyjob-operator: Cannot use the kubeconfig '{path}'")


@pytest.mark.timeout(120)
def test_a_missing_client_certificate_file_ends_the_operator_with_one_line(
    tmp_path: Path, closed_port: int
) -> None:
    missing = tmp_path / "gone" / "client.crt"
    config = kubeconfig(
        tmp_path,
        f"https://127.0.0.1:{closed_port}",
        {"client-certificate": str(missing), "client-key": str(tmp_path / "client.key")},
    )
    rc, lines, _ = run_operator(config)
    assert rc != 0 and len(lines) == 1, lines
    assert f"client-certificate file '{missing}'" in lines[0] and "does not exist" in lines[0]


@pytest.mark.timeout(120)
def test_an_unreachable_api_server_is_retried_then_ends_the_operator_with_one_line(
    tmp_path: Path, closed_port: int
) -> None:
    """A pod's operator may start before the API server is reachable: it keeps trying for
    STRATEGYJOB_STARTUP_SECONDS, then exits (and the kubelet restarts it)."""
    server = f"https://127.0.0.1:{closed_port}"
    config = kubeconfig(tmp_path, server, {"token": "t"}, **{"insecure-skip-tls-verify": True})
    rc, lines, took = run_operator(config, STRATEGYJOB_STARTUP_SECONDS="3")
    assert rc != 0 and len(lines) == 1, lines
    assert f"Cannot reach the API server {server} within 3s" in lines[0], lines
    assert "STRATEGYJOB_STARTUP_SECONDS" in lines[0]
    assert took >= 3.0


@pytest.mark.timeout(120)
def test_a_bad_startup_seconds_setting_ends_the_operator_with_one_line(
    tmp_path: Path, closed_port: int
) -> None:
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port}", {"token": "t"})
    rc, lines, _ = run_operator(config, STRATEGYJOB_STARTUP_SECONDS="soon")
    assert rc != 0 and len(lines) == 1, lines
    assert "STRATEGYJOB_STARTUP_SECONDS='soon' is not a positive number" in lines[0]


def test_a_login_that_fails_after_startup_stops_the_operator(
    monkeypatch: pytest.MonkeyPatch, operator_state: OperatorState
) -> None:
    """kopf waits forever for credentials when its login fails: the handler stops kopf and
    leaves the reason for ``__main__`` to print."""

    def broken(**_: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/gone/kubeconfig")

    monkeypatch.setattr(cluster_login, "connection_info", broken)
    with pytest.raises(kopf.PermanentError):
        handlers.login()
    assert operator_state.stop_flag.done()
    assert operator_state.fatal is not None
    assert "Cannot use the cluster credentials" in operator_state.fatal
