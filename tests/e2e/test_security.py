"""Per-job security on the cluster, both layers: the job's NetworkPolicy keeps a pod of
another job from even connecting to the job's parameter server (kube-router enforces it on
kind), and the job's token makes its servers refuse any process that does not hold it — one
holding another job's token, or none — even one inside the job's own pods, which the policy
lets through. The job's own chief is served throughout."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from e2e.e2e_support import Namespace, wait_for, worker_image

pytestmark = pytest.mark.timeout(180)

#: The vault job's chief: a variable on its own ps, read back through the token it was given.
OWNER = r"""
import time
import strategyjob
from strategyjob.cluster_resolver import TFConfigClusterResolver
strategy = strategyjob.ParameterServerStrategy(TFConfigClusterResolver())
with strategy.scope():
    v = strategyjob.Variable(41.0, name="secret")
v.assign_add(1.0)
print("OWNER READ", float(v.read_value()), flush=True)
time.sleep(600)  # keeps the job running while the intruder knocks; the test ends it
"""

#: A pod of another job: it knows the vault's ps address; the NetworkPolicy lets nothing
#: through, so each connection attempt times out.
INTRUDER = r"""
import os, socket
host, port = os.environ["VAULT_PS"].rsplit(":", 1)
for attempt in range(3):
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print("INTRUDER CONNECTED", flush=True)
    except OSError as e:
        print("INTRUDER BLOCKED:", e, flush=True)
"""

#: Run inside a pod of the vault itself (past the NetworkPolicy): creates a variable on the
#: vault's ps with whatever token its environment holds.
PROBE = r"""
import os
import strategyjob
from strategyjob import errors
from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
spec = ClusterSpec({"chief": ["127.0.0.1:1"], "worker": [os.environ["VAULT_WORKER"]],
                    "ps": [os.environ["VAULT_PS"]]})
strategy = strategyjob.ParameterServerStrategy(
    SimpleClusterResolver(spec, task_type="chief", task_id=0))
try:
    with strategy.scope():
        strategyjob.Variable(0.0, name="probe")
    print("PROBE ACCEPTED", flush=True)
except errors.PermissionDeniedError as e:
    print("PROBE REFUSED:", str(e).splitlines()[0], flush=True)
"""


def job(name: str, strategy: str, specs: dict[str, tuple[int, list[str], dict[str, str]]]):
    replica_specs: dict[str, Any] = {}
    for replica_type, (replicas, command, env) in specs.items():
        container = {
            "name": "strategyjob",
            "image": worker_image(),
            "command": command,
            "env": [{"name": k, "value": v} for k, v in env.items()],
        }
        replica_specs[replica_type] = {
            "replicas": replicas,
            "restartPolicy": "Never",
            "template": {"spec": {"containers": [container]}},
        }
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name},
        "spec": {"strategy": strategy, "replicaSpecs": replica_specs},
    }


def _token_of(ns: Namespace, pod: str) -> str:
    """The token the pod's container gets from its job's Secret (as the kubelet reads it)."""
    container = ns.pod(pod).spec.containers[0]
    ref = next(e for e in container.env if e.name == "STRATEGYJOB_TOKEN").value_from.secret_key_ref
    secret = ns.cluster.core.read_namespaced_secret(ref.name, ns.name)
    return base64.b64decode(secret.data[ref.key]).decode()


def test_a_jobs_servers_are_closed_to_other_jobs_by_policy_and_by_token(ns: Namespace):
    server = ["python", "-m", "strategyjob.server"]
    ns.apply(
        job(
            "vault",
            "ParameterServerStrategy",
            {
                "chief": (1, ["python", "-c", OWNER], {}),
                "worker": (1, server, {}),
                "ps": (1, server, {}),
            },
        )
    )
    ns.wait_log("vault-chief-0", r"OWNER READ 42\.0", timeout=120)

    def ip(pod: str) -> str | None:
        obj = ns.pod(pod)
        return obj.status.pod_ip if obj is not None else None

    port = ns.job("vault")["spec"]["port"]
    addresses = {
        "VAULT_PS": f"{wait_for('the ps pod IP', lambda: ip('vault-ps-0'), 30)}:{port}",
        "VAULT_WORKER": f"{wait_for('the worker pod IP', lambda: ip('vault-worker-0'), 30)}:{port}",
    }
    ns.apply(
        job("intruder", "OneDeviceStrategy", {"worker": (1, ["python", "-c", INTRUDER], addresses)})
    )
    ns.wait_job("intruder", "Succeeded", timeout=120)
    log = ns.logs("intruder-worker-0")
    if ns.cluster.kind is not None:  # kube-router enforces the job's NetworkPolicy
        assert log.count("INTRUDER BLOCKED") == 3 and "CONNECTED" not in log, log

    # Past the policy, inside the vault's own worker pod: the token decides.
    other_token = _token_of(ns, "intruder-worker-0")
    assert other_token and other_token != _token_of(ns, "vault-worker-0")
    env = [f"{k}={v}" for k, v in addresses.items()]
    exec_ = ["exec", "-n", ns.name, "vault-worker-0", "--", "env"]
    for holding, token_env in (
        ("another job's token", [f"STRATEGYJOB_TOKEN={other_token}"]),
        ("no token", ["-u", "STRATEGYJOB_TOKEN"]),
    ):
        out = ns.cluster.kubectl(*exec_, *token_env, *env, "python", "-c", PROBE, timeout=120)
        assert "PROBE REFUSED:" in out and "ACCEPTED" not in out, (holding, out)
        assert "token" in out.split("PROBE REFUSED:", 1)[1].splitlines()[0], (holding, out)
    # The vault is unharmed: its chief still runs, and its servers have not failed.
    assert {p.metadata.name: p.status.phase for p in ns.pods("vault")} == {
        "vault-chief-0": "Running",
        "vault-worker-0": "Running",
        "vault-ps-0": "Running",
    }
