"""The kind cluster the ``kind`` and ``e2e`` tests share: made by ``tools/kind`` entirely on this
machine (control-plane node + one worker), created once per test session (``tests/conftest.py``
exposes :func:`kind_cluster`) and deleted afterwards, containers and Docker network included, even
when a test fails or pytest is interrupted (SIGTERM included). dockerd is stopped only if the
fixture started it.

``tools/kind/cluster.sh create`` builds what it lacks first (cached: seconds; the first build
on a machine takes about a quarter of an hour). Skipped only where Docker cannot run at all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.control_plane import REPO_ROOT, find_binaries

KIND = REPO_ROOT / "tools" / "kind"
DOCKERD = REPO_ROOT / "tools" / "images" / "dockerd.sh"
BUILD_IMAGES = REPO_ROOT / "tools" / "images" / "build.sh"
#: Where every node mounts the cluster's shared directory (tools/kind/cluster.sh).
KIND_SHARED_PATH = "/var/strategyjob-shared"


def run(argv: list[str], timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    """``argv`` in its own process group, all of which is stopped on timeout or interrupt (a
    script's children, kind among them, would otherwise outlive it)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=15)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        raise
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{err[-4000:]}")
    return result


def poll(what: str, attempt: Callable[[], object], timeout: float, every: float = 1.0) -> object:
    """``attempt()`` until it returns something true (returned), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (result := attempt()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return result


#: What :func:`report` noted, for the terminal summary (the conftest prints it).
MEASURED: list[str] = []


def report(line: str) -> None:
    """A measurement for the end of the run's output, whatever pytest captures (CI logs
    keep the figures)."""
    MEASURED.append(line)


@dataclass
class Cluster:
    name: str
    kubeconfig: Path
    kubectl_path: str
    bin_dir: Path

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        argv = [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args]
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, *documents: dict) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))

    def exec_ok(self, namespace: str, pod: str, *command: str) -> tuple[bool, str]:
        argv = [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), "-n", namespace]
        argv += ["exec", pod, "--", *command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return False, "kubectl exec timed out"
        return done.returncode == 0, done.stdout + done.stderr

    @property
    def shared_dir(self) -> Path:
        """This machine's side of the directory every node mounts at ``KIND_SHARED_PATH``."""
        return self.kubeconfig.parent / "shared"

    def load(self, *images: str) -> float:
        """Load local Docker images into every node (no registry is reachable); returns the
        seconds it took. The 7.8 GB worker image takes minutes: load each once per cluster."""
        began = time.monotonic()
        run(["bash", str(KIND / "load.sh"), self.name, *images], timeout=1200)
        return time.monotonic() - began

    def nodes_by_role(self) -> dict[str, str]:
        """``{"control-plane": name, "worker": name}``."""
        control = "node-role.kubernetes.io/control-plane"
        by_role = {}
        for node in self.get("nodes")["items"]:
            role = "control-plane" if control in node["metadata"]["labels"] else "worker"
            by_role[role] = node["metadata"]["name"]
        return by_role


#: The name of a kind cluster made by ``tools/kind/cluster.sh`` to use instead of a new one.
ENV_EXISTING = "STRATEGYJOB_KIND_CLUSTER"


def _kind_cache() -> Path:
    """Where tools/kind keeps what it builds and its clusters (as tools/kind/versions.sh)."""
    if cache := os.environ.get("STRATEGYJOB_KIND_CACHE"):
        return Path(cache)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "strategyjob-kind"


def _docker_answers() -> bool:
    try:
        return run(["docker", "info"], timeout=30, check=False).returncode == 0
    except FileNotFoundError:
        return False


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[Cluster]:
    """A 2-node kind cluster (Ready), shared by every ``kind`` test of the session; with
    ``STRATEGYJOB_KIND_CLUSTER=NAME``, the one ``tools/kind/cluster.sh create NAME`` made,
    left as it is afterwards (to iterate without creating a cluster each run)."""
    bin_dir, why = find_binaries()
    if bin_dir is None:
        pytest.skip(f"no kubectl: {why}")
    if existing := os.environ.get(ENV_EXISTING):
        kubeconfig = _kind_cache() / "clusters" / existing / "kubeconfig"
        if not kubeconfig.is_file():
            pytest.fail(f"{ENV_EXISTING}={existing}: no {kubeconfig}; create the cluster with "
                        f"`bash tools/kind/cluster.sh create {existing}` or unset it")  # fmt: skip
        yield Cluster(existing, kubeconfig, str(Path(bin_dir) / "kubectl"), Path(bin_dir))
        return
    started_dockerd = False
    if not _docker_answers():
        started = run(["bash", str(DOCKERD), "start"], timeout=120, check=False)
        if started.returncode != 0:
            reason = (started.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"Docker cannot run here: tools/images/dockerd.sh start failed: {reason}")
        started_dockerd = True
    name = f"sj-{uuid.uuid4().hex[:8]}"
    # A SIGTERM to pytest deletes the cluster too: tests.support.interrupts makes it unwind.
    try:
        run(["bash", str(KIND / "build.sh")], timeout=2400)
        began = time.monotonic()
        created = run(["bash", str(KIND / "cluster.sh"), "create", name, "1"], timeout=420)
        kubeconfig = Path(created.stdout.strip().splitlines()[-1])
        cluster = Cluster(name, kubeconfig, str(Path(bin_dir) / "kubectl"), Path(bin_dir))
        report(f"cluster {name}: 2 nodes Ready in {time.monotonic() - began:.0f} s")
        yield cluster
    finally:
        try:
            run(["bash", str(KIND / "cluster.sh"), "delete", name], timeout=180)
            left = run(
                ["docker", "ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}"],
                timeout=30,
            ).stdout.split()
            networks = run(
                ["docker", "network", "ls", "-q", "--filter", f"name=kind-{name}"], timeout=30
            ).stdout.split()
            assert not left and not networks, f"cluster {name} left {left} and networks {networks}"
        finally:
            if started_dockerd:
                run(["bash", str(DOCKERD), "stop"], timeout=60, check=False)


def project_images() -> tuple[str, str]:
    """``(operator, worker)`` images of this tree: those ``tools/test.sh`` built and named in
    ``STRATEGYJOB_IMAGES``, else built now by ``tools/images/build.sh`` (cached: seconds)."""
    names = [n for n in os.environ.get("STRATEGYJOB_IMAGES", "").split(",") if n]
    if len(names) != 2:
        names = run(["bash", str(BUILD_IMAGES)], timeout=3600).stdout.split()
    operator, worker = names
    return operator, worker
