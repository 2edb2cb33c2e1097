"""RBAC taken away from a running operator (the startup check saw it): the operator stops
with one line naming the refusal and exit status 1 within seconds, rather than staying up
and serving nothing. Runs its own operator as a ServiceAccount of its own."""

from __future__ import annotations

import subprocess
import time

import pytest
from integration_harness import Kube, OperatorProcess, manifest

from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.timeout(240)


def _may_get_jobs(cp: ControlPlane, user: str, namespace: str) -> bool:
    answer = cp.kubectl(
        "auth",
        "can-i",
        "get",
        "strategyjobs.strategyjob.dev",
        "-n",
        namespace,
        f"--as={user}",
        check=False,
    )
    return answer.stdout.strip() == "yes"


def _until(what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # poll interval of a deadline-bounded wait


def test_the_operator_stops_with_one_line_when_its_rbac_is_revoked(
    control_plane: ControlPlane, own_kube: Kube
) -> None:
    cp, kube = control_plane, own_kube
    user = f"system:serviceaccount:{kube.ns}:op"
    binding = f"{kube.ns}-op"
    cp.kubectl("create", "serviceaccount", "op", "-n", kube.ns)
    cp.kubectl(
        "create",
        "clusterrolebinding",
        binding,
        "--clusterrole=cluster-admin",
        f"--serviceaccount={kube.ns}:op",
    )
    try:
        _until("the binding in effect", lambda: _may_get_jobs(cp, user, kube.ns), 30)
        token = cp.kubectl("create", "token", "op", "-n", kube.ns, "--duration=1h").stdout
        config = cp.write_kubeconfig(cp.dir / f"kubeconfig-{kube.ns}", {"token": token.strip()})
        op = OperatorProcess(
            cp,
            "--standalone",
            "-n",
            kube.ns,
            env={"KUBECONFIG": str(config), "STRATEGYJOB_RESYNC_SECONDS": "1"},
        ).start()
        try:
            kube.create_job(manifest("rbac", "MultiWorkerMirroredStrategy", {"worker": 1}))
            kube.wait_pods("rbac", 1, timeout=60)  # it works as that account
            cp.kubectl("delete", "clusterrolebinding", binding)
            _until("the binding gone", lambda: not _may_get_jobs(cp, user, kube.ns), 30)
            revoked = time.monotonic()
            assert op.proc is not None
            try:
                code = op.proc.wait(60)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"still running:\n{op.output()[-3000:]}") from None
            took = time.monotonic() - revoked
        finally:
            op.stop()
    finally:
        cp.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found", check=False)
    last = op.output().strip().splitlines()[-1]
    assert code == 1, op.output()[-3000:]
    assert last.startswith(
        "strategyjob-operator: The API server forbids a request the operator needs (HTTP 403: "
    ), last
    assert "RBAC" in last and "restart the operator" in last, last
    assert took < 45, f"{took:.1f}s"
    print(f"operator stopped {took:.1f}s after its RBAC was revoked")
