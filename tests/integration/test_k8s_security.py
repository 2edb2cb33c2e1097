"""Per-job security and progress against a real API server: each job's ServiceAccount,
Role, RoleBinding, token Secret and NetworkPolicy (owned by the job); strategyjob.report
with the job's own ServiceAccount token reaches status.progress, and the same token is
refused for any other pod.

The token's other half, a gRPC server refusing calls without it or with a wrong one, is
tested in tests/ps/test_transport.py against real ``python -m strategyjob.server``
processes. NetworkPolicies are only objects here: the local control plane has no network
plugin to enforce them, so refused connections are not tested.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from integration_harness import manifest, wait_for

from tests.support.control_plane import REPO_ROOT

pytestmark = pytest.mark.timeout(120)


def owned_by(obj, uid: str) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r["uid"] == uid and r["kind"] == "StrategyJob" and r.get("controller") for r in refs)


def get(kube, resource: str, name: str):
    out = kube.cp.kubectl("get", resource, name, "-n", kube.ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def service_account_dir(kube, tmp_path: Path, account: str) -> Path:
    """What the kubelet mounts in the pod: the ServiceAccount's token and the cluster CA."""
    token = kube.cp.kubectl("create", "token", account, "-n", kube.ns).stdout.strip()
    sa = tmp_path / f"sa-{account}"
    sa.mkdir()
    (sa / "token").write_text(token)
    shutil.copy(kube.cp.ca_path, sa / "ca.crt")
    return sa


def report_as_leader(kube, sa: Path, pod: str, code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh process with the environment the operator gives worker 0 of a
    chief-less job (the leader), the API address and its ServiceAccount files."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO_ROOT / "sdk"),
        "STRATEGYJOB_REPLICA_TYPE": "worker",
        "STRATEGYJOB_REPLICA_INDEX": "0",
        "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {}}),
        "STRATEGYJOB_POD_NAME": pod,
        "STRATEGYJOB_NAMESPACE": kube.ns,
        "STRATEGYJOB_KUBE_API": kube.cp.server,
        "STRATEGYJOB_SERVICEACCOUNT_DIR": str(sa),
    }
    return subprocess.run(
        [sys.executable, "-c", f"import strategyjob\n{code}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def patch_status_code(kube, sa: Path, path: str) -> int:
    """HTTP status of a merge patch of an annotation at ``path`` with the token in ``sa``."""
    request = urllib.request.Request(
        kube.cp.server + path,
        data=json.dumps({"metadata": {"annotations": {"x": "y"}}}).encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {(sa / 'token').read_text()}",
            "Content-Type": "application/merge-patch+json",
        },
    )
    context = ssl.create_default_context(cafile=str(sa / "ca.crt"))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_each_job_gets_owned_security_objects_and_its_pods_use_them(kube, operator):
    job = kube.create_job(
        manifest("sec", "ParameterServerStrategy", {"chief": 1, "worker": 1, "ps": 1})
    )
    uid = job["metadata"]["uid"]
    pods = kube.wait_pods("sec", 3)

    sa = wait_for("ServiceAccount", lambda: get(kube, "serviceaccount", "sec-strategyjob-sa"))
    role = wait_for("Role", lambda: get(kube, "role", "sec"))
    binding = wait_for("RoleBinding", lambda: get(kube, "rolebinding", "sec-strategyjob-sa"))
    token_secret = f"sec-{uid}-strategyjob-token"
    secret = wait_for("Secret", lambda: get(kube, "secret", token_secret))
    policy = wait_for("NetworkPolicy", lambda: get(kube, "networkpolicy", "sec"))
    for obj in (sa, role, binding, secret, policy):
        assert owned_by(obj, uid), obj["metadata"]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": ["sec-chief-0"],
            "verbs": ["get", "patch"],
        }
    ]
    assert binding["roleRef"]["name"] == "sec"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sec-strategyjob-sa", "namespace": kube.ns}
    ]
    assert len(secret["data"]["token"]) >= 40  # base64 of 32 random bytes, url-safe
    same_job = {"matchLabels": {"strategyjob.dev/job-name": "sec"}}
    assert policy["spec"]["podSelector"] == same_job
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    this_job = {"matchLabels": {"strategyjob.dev/job-name": "sec", "strategyjob.dev/job-uid": uid}}
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": this_job}]}]

    for pod in pods.values():
        assert pod.spec.service_account_name == "sec-strategyjob-sa"
        (token,) = [e for e in pod.spec.containers[0].env if e.name == "STRATEGYJOB_TOKEN"]
        assert token.value is None
        assert (token.value_from.secret_key_ref.name, token.value_from.secret_key_ref.key) == (
            token_secret,
            "token",
        )
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["STRATEGYJOB_POD_NAME"] == pod.metadata.name

    kube.delete_job("sec")  # the garbage collector takes them with the job
    for resource, name in [
        ("serviceaccount", "sec-strategyjob-sa"),
        ("role", "sec"),
        ("rolebinding", "sec-strategyjob-sa"),
        ("secret", token_secret),
        ("networkpolicy", "sec"),
    ]:
        wait_for(
            f"{resource} {name} deleted", lambda r=resource, n=name: get(kube, r, n) is None, 60
        )


def test_report_with_the_jobs_token_reaches_the_status_and_nothing_else(kube, operator, tmp_path):
    kube.create_job(manifest("prog", "MultiWorkerMirroredStrategy", {"worker": 2}))
    kube.create_job(manifest("other", "MultiWorkerMirroredStrategy", {"worker": 1}))
    kube.wait_pods("prog", 2)
    kube.wait_pods("other", 1)
    wait_for("prog's RoleBinding", lambda: get(kube, "rolebinding", "prog-strategyjob-sa"))
    sa = service_account_dir(kube, tmp_path, "prog-strategyjob-sa")

    # two reports in one process: the first at once, the second (rate-limited) at exit
    done = report_as_leader(
        kube,
        sa,
        "prog-worker-0",
        "strategyjob.report(5, total_steps=20, loss=0.5)\n"
        "strategyjob.report(6, total_steps=20, loss=0.4, phase='train')\n",
    )
    assert done.returncode == 0 and "could not publish" not in done.stderr, done.stderr

    def progress():
        p = (kube.job("prog").get("status") or {}).get("progress") or {}
        return p if p.get("step") == 6 else None

    got = wait_for("status.progress of prog", progress, timeout=30)
    assert got["totalSteps"] == 20 and got["percentage"] == 30.0
    assert got["metrics"] == {"loss": 0.4, "phase": "train"}
    assert got["lastReportTime"].endswith("Z")
    annotation = kube.core.read_namespaced_pod("prog-worker-0", kube.ns).metadata.annotations
    assert json.loads(annotation["strategyjob.dev/progress"])["step"] == 6
    printed = kube.cp.kubectl("get", "sjob", "prog", "-n", kube.ns).stdout
    header, row = (line.split() for line in printed.splitlines())
    assert dict(zip(header, row))["PROGRESS"] == "30", printed

    # the same token may touch nothing but the leader's pod
    pods = f"/api/v1/namespaces/{kube.ns}/pods"
    assert patch_status_code(kube, sa, f"{pods}/prog-worker-0") == 200
    assert patch_status_code(kube, sa, f"{pods}/other-worker-0") == 403  # another job
    assert patch_status_code(kube, sa, f"{pods}/prog-worker-1") == 403  # not the leader
    refused = report_as_leader(kube, sa, "other-worker-0", "strategyjob.report(1)\n")
    assert refused.returncode == 0  # a refused report never fails training ...
    assert "HTTP 403" in refused.stderr  # ... it is logged once
    assert refused.stderr.count("could not publish") == 1
    assert not ((kube.job("other").get("status") or {}).get("progress"))
    for verb, resource in [("get", "secrets"), ("list", "pods"), ("create", "pods")]:
        allowed = kube.cp.kubectl(
            "auth",
            "can-i",
            verb,
            resource,
            "-n",
            kube.ns,
            f"--as=system:serviceaccount:{kube.ns}:prog-strategyjob-sa",
            check=False,
        )
        assert allowed.stdout.strip() == "no", (verb, resource)
