"""For tests: a local cluster made of the control plane of ``tests/integration`` (with the
controllers a Deployment needs) and the node agent in its own process, plus a check of
whether this machine can run it at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from node_agent import network

TESTS = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS.parent
if str(TESTS / "integration") not in sys.path:
    sys.path.insert(0, str(TESTS / "integration"))

from tests.support.control_plane import ControlPlane, find_binaries  # noqa: E402

#: Controllers beyond garbage collection and namespace cleanup: Deployments (the chart's
#: operator) and the default ServiceAccount of each namespace.
E2E_CONTROLLERS = ("deployment-controller", "replicaset-controller", "serviceaccount-controller")
#: The worker and operator images keep the repository's examples here (worker_image/).
IMAGE_PATHS = {"/opt/strategyjob": str(REPO_ROOT)}


def skip_reason() -> str | None:
    """Why a local cluster cannot run here (no binaries, no network namespaces), or None."""
    bin_dir, why = find_binaries()
    if bin_dir is None:
        return f"no Kubernetes control plane binaries: {why}"
    if reason := network.unsupported_reason():
        return f"the node agent cannot run pods here: {reason}"
    return None


class AgentProcess:
    """``python -m node_agent`` in its own session, stopped with SIGTERM (which makes it
    stop its pods and remove its devices); anything a crash left behind is removed too."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        *,
        nodes: int = 1,
        backoff: float = 1.0,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.ready_file = log_path.with_suffix(".ready.json")
        self.nodes = nodes
        self.backoff = backoff
        self.env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict = {}

    def start(self, timeout: float = 60.0) -> AgentProcess:
        argv = [
            sys.executable, "-m", "node_agent", f"--kubeconfig={self.kubeconfig}",
            f"--nodes={self.nodes}", f"--backoff={self.backoff}", f"--workdir={REPO_ROOT}",
            f"--ready-file={self.ready_file}", *self.extra_args,
            # pods' files and logs next to the agent's log, kept for a failed run's post-mortem
            f"--state-dir={self.log_path.parent / 'node-agent-state'}",
        ]  # fmt: skip
        argv += [f"--image-path={k}={v}" for k, v in IMAGE_PATHS.items()]
        argv += [f"--env={k}={v}" for k, v in self.env.items()]
        paths = [str(TESTS), str(REPO_ROOT / "sdk"), str(REPO_ROOT / "operator")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self.ready_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the node agent exited with {self.proc.returncode} while starting:\n"
                    + self.output()[-3000:]
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the node agent was not ready after {timeout:.0f}s")
            time.sleep(0.1)
        self.info = json.loads(self.ready_file.read_text())
        return self

    @property
    def id(self) -> str:
        return self.info["id"]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 60.0) -> list[str]:
        """Stop the agent; returns what it failed to remove (and was removed for it)."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return network.remove_leftovers(self.id) if self.info else []


class LocalCluster:
    """A control plane with the controllers a Deployment needs, and a node agent running
    its pods."""

    def __init__(self, workdir: Path, *, nodes: int = 1, backoff: float = 1.0) -> None:
        bin_dir, why = find_binaries()
        if bin_dir is None:
            raise RuntimeError(why)
        self.bin_dir = bin_dir
        self.workdir = workdir
        self.nodes = nodes
        self.backoff = backoff
        self.control_plane: ControlPlane | None = None
        self.agent: AgentProcess | None = None

    @property
    def kubeconfig(self) -> Path:
        assert self.control_plane is not None
        return self.control_plane.kubeconfig

    def start(self) -> LocalCluster:
        self.control_plane = ControlPlane(self.bin_dir, extra_controllers=E2E_CONTROLLERS).start()
        try:
            self.agent = AgentProcess(
                self.control_plane.kubeconfig,
                self.workdir / "node-agent.log",
                nodes=self.nodes,
                backoff=self.backoff,
            ).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[str]:
        """Stop the agent, then the control plane; returns what the agent left behind."""
        left = self.agent.stop() if self.agent else []
        if self.control_plane is not None:
            self.control_plane.stop()
        return left
