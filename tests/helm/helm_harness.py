"""Helpers for the chart tests: helm against the local control plane, a control plane that
writes an audit log (which API calls the operator's ServiceAccount really made), and the
chart's Deployment container run as a local process (no kubelet here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.control_plane import REPO_ROOT, ControlPlane

CHART = REPO_ROOT / "helm" / "strategyjob-operator"
RUN_TIMEOUT = 120.0


def helm_binary() -> tuple[Path | None, str]:
    """helm from ``K8S_BIN_DIR`` (tools/k8s/build-control-plane.sh puts it there) or PATH."""
    env_dir = os.environ.get("K8S_BIN_DIR")
    if env_dir and (Path(env_dir) / "helm").is_file():
        return Path(env_dir) / "helm", ""
    found = shutil.which("helm")
    if found:
        return Path(found), ""
    where = f"K8S_BIN_DIR={env_dir} has no helm" if env_dir else "K8S_BIN_DIR is not set"
    return None, f"{where} and helm is not on PATH; run tools/k8s/build-control-plane.sh"


class Helm:
    """helm with its own config/cache dirs (nothing read from or written to ~/.config)."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)
        else:  # offline: never reach whatever cluster the environment points at
            self.env["KUBECONFIG"] = str(home / "no-kubeconfig")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.binary), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed (rc={proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def render(
        self, *args: str, release: str = "sjob", namespace: str = "strategyjob-system"
    ) -> list[dict[str, Any]]:
        """``helm template`` of the chart, parsed: one dict per object."""
        out = self.run("template", release, str(CHART), "--namespace", namespace, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]


@dataclass(frozen=True)
class Release:
    """A release a test installed, and what the cluster looked like before."""

    name: str
    namespace: str
    install_output: str
    crds_before_install: frozenset[str]

    @property
    def fullname(self) -> str:
        return f"{self.name}-strategyjob-operator"

    @property
    def service_account(self) -> str:
        """The ServiceAccount's user name, as the API server (and its audit log) knows it."""
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"


def find(
    docs: Iterable[dict[str, Any]], kind: str, name: str | None = None, namespace: str | None = None
) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]


def only(docs: Iterable[dict[str, Any]], kind: str, **kw: str) -> dict[str, Any]:
    found = find(docs, kind, **kw)
    assert len(found) == 1, f"expected one {kind} {kw}, rendered {len(found)}"
    return found[0]


def rule_keys(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """RBAC rules as (group, resource, verb, resourceNames) tuples, one per combination."""
    keys = set()
    for rule in rules:
        names = tuple(sorted(rule.get("resourceNames") or ()))
        for group in rule.get("apiGroups") or ():
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    keys.add((group, resource, verb, names))
    return keys


class AuditedControlPlane(ControlPlane):
    """The integration tests' control plane, plus an audit log of every request made by a
    ServiceAccount: the record of which verbs on which resources the operator really used."""

    POLICY = (
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
        "rules:\n- level: Metadata\n  userGroups: ['system:serviceaccounts']\n- level: None\n"
    )

    def __init__(self, bin_dir: Path) -> None:
        super().__init__(bin_dir)
        self.audit_log = self.dir / "audit.log"
        self.audit_policy = self.dir / "audit-policy.yaml"
        self.audit_policy.write_text(self.POLICY)
        self._audit_flags_added = False

    def _spawn(self, name: str, *args: str) -> None:
        if name == "kube-apiserver":
            args = (
                *args,
                f"--audit-policy-file={self.audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
            )
            self._audit_flags_added = True
        super()._spawn(name, *args)

    def start(self, timeout: float = 120.0) -> AuditedControlPlane:
        super().start(timeout)
        assert self._audit_flags_added, "ControlPlane no longer starts kube-apiserver via _spawn"
        return self

    def audit_events(self, username: str) -> list[dict[str, Any]]:
        """The audit events of resource requests made as ``username``. Non-resource requests
        (API discovery: /api, /apis/...) are left out: every authenticated user may make them
        (the built-in system:discovery role), so the chart grants nothing for them."""
        events = []
        if not self.audit_log.exists():
            return events
        for line in self.audit_log.read_text().splitlines():
            event = json.loads(line)
            if event.get("user", {}).get("username") != username:
                continue
            if "objectRef" in event:
                events.append(event)
            else:
                path = event["requestURI"].split("?")[0]
                assert event["verb"] == "get" and path.startswith(("/api", "/version")), event
        return events


def call_key(event: dict[str, Any]) -> tuple[str, str, str]:
    """(group, resource[/subresource], verb) of an audit event."""
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return (ref.get("apiGroup", ""), resource, event["verb"])


#: What an operator does first in a watched namespace: a 403 on any of these in its log means
#: it started before its RBAC took effect, not that the chart lacks a rule.
FIRST_CALLS = (
    ("watch", "strategyjobs.strategyjob.dev", ""),
    ("patch", "strategyjobs.strategyjob.dev", "status"),
    ("update", "strategyjobs.strategyjob.dev", "finalizers"),
    ("create", "services", ""),
    ("create", "pods", ""),
)


def can(cp: ControlPlane, user: str, verb: str, resource: str, namespace: str) -> bool:
    """Whether ``kubectl auth can-i`` says ``user`` may ``verb`` ``resource`` (``a/sub`` for
    a subresource) in ``namespace``."""
    resource, _, subresource = resource.partition("/")
    answer = cp.kubectl(
        "auth",
        "can-i",
        verb,
        resource,
        f"--subresource={subresource}",
        "-n",
        namespace,
        f"--as={user}",
        check=False,
    )
    return answer.stdout.strip() == "yes"


def wait_until_authorized(cp: ControlPlane, user: str, namespace: str, timeout: float = 30) -> None:
    """Poll ``kubectl auth can-i`` until ``user`` may make FIRST_CALLS in ``namespace``: the
    API server's authorizer learns of new RBAC objects through its informers, a moment after
    they are stored."""
    deadline = time.monotonic() + timeout
    pending = list(FIRST_CALLS)
    while pending:
        verb, resource, subresource = pending[0]
        what = f"{resource}/{subresource}" if subresource else resource
        if can(cp, user, verb, what, namespace):
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"{user} still may not {verb} {what} in {namespace}")
        time.sleep(0.1)  # poll interval of a deadline-bounded wait


RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@dataclass
class ChartAccount:
    """The chart's ServiceAccount for an operator: its RBAC objects as applied, its user name
    and a kubeconfig holding a token of it (the operator's ``KUBECONFIG``)."""

    rbac: list[dict[str, Any]]
    user: str
    kubeconfig: Path

    def only(self, kind: str) -> dict[str, Any]:
        """The one RBAC object of ``kind`` (e.g. the watched namespace's Role)."""
        (doc,) = [d for d in self.rbac if d["kind"] == kind]
        return doc


@contextmanager
def chart_account(
    cp: ControlPlane,
    binary: Path,
    work: Path,
    *,
    watched: str,
    system: str,
    release: str,
    edit: Callable[[list[dict[str, Any]]], None] | None = None,
) -> Iterator[ChartAccount]:
    """The operator as the chart's ServiceAccount: renders the chart's RBAC for a release in
    namespace ``system`` (which must exist) watching ``watched``, lets ``edit`` change it (e.g.
    withhold a rule), applies it, takes a token and writes a kubeconfig under ``work``, and
    waits until the RBAC is in effect. Deletes the cluster-scoped objects on exit (the
    namespaced ones go with their namespaces)."""
    docs = Helm(binary, work / "helm").render(
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--set",
        "rbac.aggregateToDefaultRoles=false",
        release=release,
        namespace=system,
    )
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    if edit is not None:
        edit(rbac)
    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
        (account,) = [d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"]
        token = cp.kubectl("create", "token", account, "-n", system, "--duration=1h").stdout
        kubeconfig = cp.write_kubeconfig(work / "sa-kubeconfig", {"token": token.strip()})
        user = f"system:serviceaccount:{system}:{account}"
        wait_until_authorized(cp, user, watched)
        yield ChartAccount(rbac, user, kubeconfig)
    finally:
        cluster_scoped = [d for d in rbac if d["kind"].startswith("Cluster")]
        cp.kubectl(
            "delete",
            "--ignore-not-found",
            "-f",
            "-",
            input=yaml.safe_dump_all(cluster_scoped),
            check=False,
        )


class ChartOperator:
    """The operator container of a rendered Deployment, run as a local process the way the
    kubelet would run it: its command and args, its env (downward-API fields filled in for
    ``pod_name``), credentials from ``kubeconfig``. Only ``python`` becomes this interpreter."""

    def __init__(self, deployment: dict[str, Any], kubeconfig: Path, log: Path, pod_name: str):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        command = [*container.get("command", []), *container.get("args", [])]
        assert command and command[0] == "python", f"unexpected command {command!r}"
        self.argv = [sys.executable, *command[1:]]
        self.pod_name = pod_name
        self.ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": f"{REPO_ROOT / 'sdk'}{os.pathsep}{REPO_ROOT / 'operator'}",
            "OMP_NUM_THREADS": "1",
        }
        fields = {
            "metadata.name": pod_name,
            "metadata.namespace": deployment["metadata"]["namespace"],
        }
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ChartOperator:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def stop(self) -> None:
        """SIGINT (kopf leaves the peering cleanly), then SIGKILL to the whole group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def get(self, port_name: str, path: str) -> tuple[int, str]:
        """HTTP GET on one of the container's ports; (0, why) when nothing answers."""
        url = f"http://127.0.0.1:{self.ports[port_name]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, str(e)
        except OSError as e:
            return 0, str(e)
