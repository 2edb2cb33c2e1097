"""A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) on 127.0.0.1, for the integration tests and the operator benchmark.

Plain module, no pytest: ``bench/bench_operator.py`` starts it the same way. The binaries
come from ``tools/k8s/build-control-plane.sh`` (directory in ``K8S_BIN_DIR``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "k8s" / "build-control-plane.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
TOKEN = "strategyjob-test-admin-token"


def find_binaries(build: bool = True) -> tuple[Path | None, str]:
    """The directory holding the control-plane binaries, or ``(None, why not)``.

    Uses ``K8S_BIN_DIR`` when set; otherwise runs the build script, which answers from its
    cache in seconds (a cold build takes minutes, so CI runs it as its own step first).
    """
    env_dir = os.environ.get("K8S_BIN_DIR")
    if env_dir:
        missing = [b for b in BINARIES if not (Path(env_dir) / b).is_file()]
        if missing:
            return None, f"K8S_BIN_DIR={env_dir} lacks {', '.join(missing)}; run {BUILD_SCRIPT}"
        return Path(env_dir), ""
    if not build:
        return None, "K8S_BIN_DIR is not set"
    if shutil.which("go") is None:
        return None, f"K8S_BIN_DIR is not set and there is no go toolchain to run {BUILD_SCRIPT}"
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        return None, f"{BUILD_SCRIPT} failed (rc={proc.returncode}): " + " | ".join(tail)
    return Path(proc.stdout.strip().splitlines()[-1]), ""


class ControlPlane:
    """Starts the control plane in a temporary directory; :meth:`stop` removes everything.

    ``extra_controllers``: controller-manager controllers beyond garbage collection and
    namespace cleanup, e.g. ``deployment-controller`` for a chart's Deployment.
    ``apiserver_args``: more kube-apiserver flags, e.g. an admission plugin or a client CA.
    """

    def __init__(
        self,
        bin_dir: Path,
        *,
        controllers: bool = True,
        extra_controllers: tuple[str, ...] = (),
        apiserver_args: tuple[str, ...] = (),
    ) -> None:
        self.bin = Path(bin_dir)
        self.apiserver_args = tuple(apiserver_args)
        self.dir = Path(tempfile.mkdtemp(prefix="sjob-cp-"))
        self.controllers = controllers
        self.extra_controllers = tuple(extra_controllers)
        self.procs: list[subprocess.Popen] = []
        self.token = TOKEN
        self.server = ""
        #: etcd's client URL once started (benchmarks read what is stored there).
        self.etcd_url = ""
        self.kubeconfig = self.dir / "kubeconfig"
        self.ca_path = self.dir / "pki" / "apiserver.crt"

    def _spawn(self, name: str, *args: str) -> None:
        with open(self.dir / f"{name}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [str(self.bin / name), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def start(self, timeout: float = 120.0) -> ControlPlane:
        pki = self.dir / "pki"
        pki.mkdir()
        subprocess.run(
            ["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"],
            check=True,
            capture_output=True,
        )
        (pki / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            "--name=default",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        self._spawn(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={pki}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.key'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            # the benchmark creates thousands of objects quickly; don't throttle it server-side
            "--max-requests-inflight=1000",
            "--max-mutating-requests-inflight=1000",
            "--enable-priority-and-fairness=false",
            *self.apiserver_args,
        )
        self.server = f"https://127.0.0.1:{api_port}"
        try:
            self._wait_ready(timeout)
        except BaseException:  # KeyboardInterrupt (Ctrl-C, SIGTERM) too: nothing outlives it
            self.stop()
            raise
        self.write_kubeconfig(self.kubeconfig, {"token": self.token})
        if self.controllers:
            common = (f"--kubeconfig={self.kubeconfig}", "--leader-elect=false")
            self._spawn(
                "kube-controller-manager",
                *common,
                f"--secure-port={free_port()}",
                "--bind-address=127.0.0.1",
                f"--root-ca-file={self.ca_path}",
                # only what the tests need: garbage collection and namespace cleanup
                "--controllers=garbage-collector-controller,namespace-controller"
                + "".join(f",{c}" for c in self.extra_controllers),
            )
            self._spawn(
                "kube-scheduler",
                *common,
                f"--secure-port={free_port()}",
                "--bind-address=127.0.0.1",
            )
        return self

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=None)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # only for the readiness probe, before the CA exists
        req = urllib.request.Request(
            self.server + "/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{p.args[0]} exited with {p.returncode} while starting; logs in {self.dir}"
                    )
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f}s; logs in {self.dir}")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True):
        """Run kubectl against this control plane; returns the CompletedProcess."""
        return subprocess.run(
            [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Wait until the API server serves every CRD named (``kubectl wait`` alone has been
        seen to fail right after an apply: poll ``get`` until a deadline instead)."""
        deadline = time.monotonic() + timeout
        query = '{.status.conditions[?(@.type=="Established")].status}'
        pending = list(crds)
        last = ""
        while pending:
            done = self.kubectl("get", f"crd/{pending[0]}", "-o", f"jsonpath={query}", check=False)
            if done.returncode == 0 and done.stdout.strip() == "True":
                pending.pop(0)
                continue
            last = (done.stderr or done.stdout).strip()
            if time.monotonic() > deadline:
                why = last or "no condition yet"
                raise RuntimeError(f"CRD {pending[0]} not Established after {timeout:.0f} s: {why}")
            time.sleep(0.2)  # polling a condition with a deadline

    def write_kubeconfig(self, path: Path, user: dict[str, Any], **cluster: Any) -> Path:
        """A kubeconfig for this API server at ``path`` (owner-only), whose user entry is
        ``user`` (``{"token": ...}``: the admin's, a ServiceAccount's) and whose cluster entry
        has ``cluster`` over the server and CA (e.g. ``insecure-skip-tls-verify``)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.ca_path),
                        **cluster,
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
            "current-context": "local",
        }
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        path.chmod(0o600)
        return path

    def stop(self, keep_dir: bool = False) -> None:
        """SIGTERM to every process, SIGKILL to those still running 3 s later, or at once
        when the wait is interrupted (a second Ctrl-C): none outlives the call."""
        try:
            for p in reversed(self.procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            # kube-apiserver drains for over a minute after SIGTERM; nothing here needs its
            # graceful shutdown (the whole directory goes away).
            deadline = time.monotonic() + 3
            for p in reversed(self.procs):
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
            for p in self.procs:
                p.wait()
            self.procs.clear()
            if not keep_dir:
                shutil.rmtree(self.dir, ignore_errors=True)
