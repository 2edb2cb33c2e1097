"""A SIGTERM (a CI runner's cancel, ``timeout``) or a Ctrl-C (SIGINT) to pytest stops the run
within seconds and leaves nothing behind: the fixtures' finalizers run (``tests.support.
interrupts`` turns SIGTERM into KeyboardInterrupt), so the control plane's processes end and
the kind cluster's containers and Docker network are deleted.

Each test runs an inner pytest, in a session of its own, on a test file written to ``tmp_path``
whose fixture starts the real thing and says so in a file; then signals the inner pytest's
process group as a terminal or a supervisor would and checks what remains.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.control_plane import REPO_ROOT, find_binaries
from tests.support.kind import KIND, report
from tests.support.processes import child_env, default_interrupts
from tests.support.waiting import wait_for

#: pytest's exit status for an interrupted run (pytest.ExitCode.INTERRUPTED): it unwound.
INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)

CONTROL_PLANE_TEST = """
import json, os, time
from pathlib import Path

import pytest

from tests.support.control_plane import ControlPlane, find_binaries

READY = Path(os.environ["INNER_READY_FILE"])
WHEN = os.environ["INNER_WHEN"]


def announce(cp):
    # written whole, then renamed: the outer test never reads half a file
    partial = READY.with_suffix(".partial")
    partial.write_text(json.dumps({"dir": str(cp.dir), "pids": [p.pid for p in cp.procs]}))
    partial.rename(READY)


class AnnouncedControlPlane(ControlPlane):
    def _wait_ready(self, timeout):
        if WHEN == "starting":  # etcd and kube-apiserver run, not ready yet
            announce(self)
        super()._wait_ready(timeout)


@pytest.fixture(scope="session")
def control_plane():
    bin_dir, why = find_binaries(build=False)
    assert bin_dir is not None, why
    cp = AnnouncedControlPlane(bin_dir).start()
    try:
        yield cp
    finally:
        cp.stop()


def test_interrupted(control_plane):
    if WHEN == "running":
        announce(control_plane)
    time.sleep(3600)  # what the signal interrupts
"""

KIND_TEST = """
import json, os, time
from pathlib import Path

from tests.support.kind import kind_cluster  # noqa: F401


def test_interrupted(kind_cluster):
    ready = Path(os.environ["INNER_READY_FILE"])
    announced = {"name": kind_cluster.name, "dir": str(kind_cluster.kubeconfig.parent)}
    ready.with_suffix(".partial").write_text(json.dumps(announced))
    ready.with_suffix(".partial").rename(ready)
    time.sleep(3600)  # what the signal interrupts
"""


class Inner:
    """The inner pytest: its process, its output file and the file its fixture writes."""

    def __init__(self, tmp_path: Path, source: str, inner_timeout: int, **env: str) -> None:
        test_file = tmp_path / "inner" / "test_inner.py"
        test_file.parent.mkdir()
        test_file.write_text(source)
        self.ready = tmp_path / "ready.json"
        self.log = tmp_path / "inner.log"
        environment = child_env(INNER_READY_FILE=str(self.ready), **env)
        environment.pop("STRATEGYJOB_KIND_CLUSTER", None)  # the inner run makes its own cluster
        environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), environment["PYTHONPATH"]])
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
        argv += [f"--rootdir={REPO_ROOT}", "-c", str(REPO_ROOT / "pyproject.toml")]
        argv += [f"--timeout={inner_timeout}", str(test_file)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=tmp_path,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=default_interrupts,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def wait_ready(self, timeout: float) -> str:
        """The fixture's file, once written (skips the test if the inner run skipped)."""
        wait_for(
            "the inner pytest's fixture to start",
            lambda: self.ready.exists() or self.proc.poll() is not None,
            timeout=timeout,
            interval=0.2,
        )
        if not self.ready.exists():
            self.ended_first()
        return self.ready.read_text()

    def ended_first(self) -> None:
        """The inner pytest ended before it was signalled: skip as it did, or fail."""
        out = self.output()
        if self.proc.returncode == 0 and " skipped" in out:
            pytest.skip(f"the inner run skipped: {out.strip().splitlines()[-1]}")
        pytest.fail(f"the inner pytest ended ({self.proc.returncode}) first:\n{out}")

    def interrupt(
        self, sig: signal.Signals, within: float, again_once: Callable[[], object] | None = None
    ) -> float:
        """Send ``sig`` to the inner pytest's process group (as a terminal's Ctrl-C or
        ``timeout`` does), and once more as soon as ``again_once()`` is true (it unwinds);
        the seconds until it exited, having unwound (status 2)."""
        sent = time.monotonic()
        os.killpg(self.proc.pid, sig)
        if again_once is not None:
            wait_for("the inner pytest to unwind", again_once, timeout=within, interval=0.05)
            os.killpg(self.proc.pid, sig)
        try:
            returncode = self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the inner pytest still runs {within:.0f} s after {sig.name}")
        took = time.monotonic() - sent
        assert returncode == INTERRUPTED, (
            f"the inner pytest exited {returncode} after {sig.name}, not {INTERRUPTED} "
            f"(interrupted):\n{self.output()}"
        )
        assert "KeyboardInterrupt" in self.output(), self.output()
        return took

    def left_in_session(self) -> list[int]:
        """Processes still in the inner pytest's session (its children that are no session
        leaders of their own)."""
        return list(_processes(lambda pid, _: _sid(pid) == self.proc.pid))

    def stop(self, grace: float) -> None:
        """End the inner pytest if it still runs (the test failed or was itself interrupted):
        SIGTERM first, so that its fixtures clean up, SIGKILL to its whole session ``grace``
        seconds later; then reap it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.left_in_session():
            _kill(pid)
        self.proc.wait()


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _processes(match: Callable[[int, str], bool]) -> dict[int, str]:
    """Live processes (zombies have no command line) whose pid and command line match: their
    command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmdline and match(int(entry.name), cmdline):
            found[int(entry.name)] = cmdline
    return found


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
def k8s_bin_dir() -> Path:
    bin_dir, why = find_binaries()
    if bin_dir is None:
        pytest.skip(f"no Kubernetes control plane binaries: {why}")
    return bin_dir


@pytest.mark.signal_timing
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("when", "sig", "twice"),
    [
        ("starting", signal.SIGTERM, False),
        ("starting", signal.SIGINT, False),
        ("running", signal.SIGTERM, False),
        ("running", signal.SIGINT, False),
        ("running", signal.SIGTERM, True),
    ],
    ids=[
        "starting-SIGTERM",
        "starting-SIGINT",
        "running-SIGTERM",
        "running-SIGINT",
        "running-SIGTERM-twice",
    ],
)
def test_interrupt_stops_the_control_plane(
    tmp_path: Path, k8s_bin_dir: Path, when: str, sig: signal.Signals, twice: bool
) -> None:
    """Interrupted while the control plane starts (the fixture's setup) or while a test runs
    on it: the inner pytest exits within seconds, etcd and kube-apiserver with it. A second
    SIGTERM while the control plane stops (a supervisor that repeats itself) cuts nothing
    short."""
    inner = Inner(tmp_path, CONTROL_PLANE_TEST, 240, K8S_BIN_DIR=str(k8s_bin_dir), INNER_WHEN=when)
    cp_dir = ""
    try:
        announced = json.loads(inner.wait_ready(timeout=180))
        cp_dir = announced["dir"]
        pids = set(announced["pids"])

        def running() -> set[int]:
            # every process of the control plane names its directory in its arguments
            return set(_processes(lambda _, cmd: cp_dir in cmd))

        assert pids and pids <= running(), (announced, running())
        # the second signal once the first of its processes has stopped
        stopping = (lambda: not pids <= running()) if twice else None
        took = inner.interrupt(sig, within=30, again_once=stopping)
        what = f"{sig.name} twice" if twice else sig.name
        report(f"control plane ({when}): pytest exited {took:.1f} s after {what}")
        assert not running(), f"{sig.name} left control-plane processes {running()}"
        assert not inner.left_in_session(), "processes of the inner pytest's session remain"
        assert not Path(cp_dir).exists(), f"{cp_dir} remains"
        if twice:
            assert "SIGTERM again" in inner.output(), inner.output()
    finally:
        inner.stop(grace=30)
        if cp_dir:  # the test failed: what it left goes anyway
            for pid in _processes(lambda _, cmd: cp_dir in cmd):
                _kill(pid)


def _docker_ids(*argv: str) -> list[str]:
    done = subprocess.run(
        ["docker", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"docker {' '.join(argv)}: {done.stderr.strip()}"
    return done.stdout.split()


def _kind_leftovers(name: str) -> dict[str, list[str]]:
    """The containers and Docker network of the kind cluster ``name`` that still exist."""
    left = {
        "containers": _docker_ids("ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}"),
        "networks": _docker_ids("network", "ls", "-q", "--filter", f"name=kind-{name}"),
    }
    return {what: ids for what, ids in left.items() if ids}


@pytest.fixture
def inner_cluster_names() -> Iterator[list[str]]:
    """The kind clusters the inner pytest made; any left after a failure is deleted (only
    those: other people's clusters on this Docker engine are never touched), again until
    nothing remains (a node container still being created is not found by a first delete)."""
    names: list[str] = []
    yield names

    def deleted(name: str) -> bool:
        if not _kind_leftovers(name):
            return True
        cmd = ["bash", str(KIND / "cluster.sh"), "delete", name]
        subprocess.run(cmd, capture_output=True, timeout=180, check=False)
        return False

    for name in names:
        wait_for(f"{name} deleted", functools.partial(deleted, name), timeout=300, interval=2)


def _cluster_being_created(inner: Inner) -> str | None:
    """The name of the cluster the inner pytest's fixture is creating (its ``cluster.sh
    create`` runs), if any; fails the test if the inner pytest ended."""
    if inner.proc.poll() is not None:
        inner.ended_first()
    marker = f"{KIND / 'cluster.sh'} create "
    creating = _processes(lambda pid, cmd: marker in cmd and _ppid(pid) == inner.proc.pid)
    return next((cmd.split(marker)[1].split()[0] for cmd in creating.values()), None)


@pytest.mark.kind
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("when", "sig"),
    # SIGINT takes the same path as SIGTERM (the control-plane cases run both); "nodes-created"
    # is the hard moment: node containers Docker is still creating survive a first delete.
    [("running", signal.SIGTERM), ("nodes-created", signal.SIGTERM)],
    ids=["running-SIGTERM", "nodes-created-SIGTERM"],
)
def test_interrupt_deletes_the_kind_cluster(
    tmp_path: Path,
    k8s_bin_dir: Path,
    inner_cluster_names: list[str],
    when: str,
    sig: signal.Signals,
) -> None:
    """Interrupted while a test runs on the session's kind cluster, or while the fixture
    creates it (as soon as its first node container exists, not Ready yet):
    the cluster's containers, its Docker network and its directory are gone once the inner
    pytest has exited."""
    inner = Inner(tmp_path, KIND_TEST, 660, K8S_BIN_DIR=str(k8s_bin_dir))
    try:
        cluster_dir = None
        if when == "running":
            announced = json.loads(inner.wait_ready(timeout=600))
            name, cluster_dir = announced["name"], Path(announced["dir"])
            inner_cluster_names.append(name)
            assert _kind_leftovers(name), f"no cluster {name!r} runs"
        else:
            name = wait_for(
                "the inner pytest's fixture to create a kind cluster",
                lambda: _cluster_being_created(inner),
                timeout=300,
                interval=0.2,
            )
            inner_cluster_names.append(name)
            wait_for(
                f"cluster {name}'s first node container",
                lambda: "containers" in _kind_leftovers(name),
                timeout=300,
                interval=0.2,
            )
            assert not inner.ready.exists(), f"cluster {name} was ready before the signal"
        took = inner.interrupt(sig, within=240)
        report(f"kind cluster {name} ({when}): pytest exited {took:.1f} s after {sig.name}")
        wait_for(
            f"cluster {name}'s containers and network to be gone",
            lambda: not _kind_leftovers(name),
            timeout=60,
            interval=1,
        )
        assert cluster_dir is None or not cluster_dir.exists(), f"{cluster_dir} remains"
        assert not inner.left_in_session(), "processes of the inner pytest's session remain"
    finally:
        inner.stop(grace=240)
