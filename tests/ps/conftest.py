"""A real local cluster for the parameter-server tests: each ps and worker is a
``python -m strategyjob.server`` subprocess on a free 127.0.0.1 port; the test process is the
chief (coordinator). Every process is killed (by process group) when the test ends.

Servers refuse to start without a token: the session runs with one ``STRATEGYJOB_TOKEN`` (in
the servers' environment and the test process's), as a job does."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.support.ports import free_ports

SDK = str(Path(__file__).resolve().parents[2] / "sdk")


@pytest.fixture(autouse=True, scope="session")
def _job_token():
    """The job's token for every server and client of the session (unless one is set)."""
    if os.environ.get("STRATEGYJOB_TOKEN"):
        yield
        return
    os.environ["STRATEGYJOB_TOKEN"] = secrets.token_urlsafe(16)
    yield
    os.environ.pop("STRATEGYJOB_TOKEN", None)


class LocalCluster:
    def __init__(self, workers: int, ps: int, tmp: Path, env: dict[str, str] | None = None):
        ports = free_ports(1 + workers + ps)
        addr = [f"127.0.0.1:{p}" for p in ports]
        self.cluster = {
            "chief": addr[:1],
            "worker": addr[1 : 1 + workers],
            "ps": addr[1 + workers :],
        }
        self.tmp = tmp
        self.extra_env = env or {}
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        for i in range(ps):
            self.start("ps", i)
        for i in range(workers):
            self.start("worker", i)
        try:
            for kind, i in list(self.procs):
                self.wait_ready(kind, i)
        except BaseException:  # (e.g. a port taken meanwhile): leave no process behind
            self.close()
            raise

    def env(self, kind: str, index: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=SDK + os.pathsep + env.get("PYTHONPATH", ""),
            OMP_NUM_THREADS="1",
            TF_CONFIG=json.dumps({"cluster": self.cluster, "task": {"type": kind, "index": index}}),
        )
        env.update(self.extra_env)
        return env

    def start(self, kind: str, index: int) -> None:
        log = open(self.tmp / f"{kind}{index}.log", "ab")
        self.procs[(kind, index)] = subprocess.Popen(
            [sys.executable, "-m", "strategyjob.server"],
            env=self.env(kind, index),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, kind: str, index: int, timeout: float = 60.0) -> None:
        address = self.cluster[kind][index]
        deadline = time.monotonic() + timeout
        channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        finally:
            channel.close()
        assert time.monotonic() < deadline

    def kill(self, kind: str, index: int) -> None:
        proc = self.procs.pop((kind, index))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def close(self) -> None:
        for key in list(self.procs):
            self.kill(*key)

    def log(self, kind: str, index: int) -> str:
        return (self.tmp / f"{kind}{index}.log").read_text(errors="replace")

    def resolver(self):
        from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver

        return SimpleClusterResolver(ClusterSpec(self.cluster), task_type="chief", task_id=0)


@pytest.fixture
def make_cluster(tmp_path):
    clusters: list[LocalCluster] = []

    def make(workers: int = 2, ps: int = 1, env: dict[str, str] | None = None) -> LocalCluster:
        cluster = LocalCluster(workers, ps, tmp_path, env)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.close()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """Two workers and two ps shared by the non-destructive tests of a module."""
    cluster = LocalCluster(2, 2, tmp_path_factory.mktemp("cluster"))
    yield cluster
    cluster.close()
