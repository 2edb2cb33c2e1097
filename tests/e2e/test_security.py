"""Per-job security on the cluster: a job's parameter server serves the job's own chief
(whose pods get the token from the job's Secret), and refuses a pod of another job, which
carries that job's token, and a process with no token at all.

The NetworkPolicy that also isolates jobs needs a CNI that enforces it; the local cluster has
none, so this checks the token, the layer that holds without one."""

from __future__ import annotations

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

#: A pod of another job: it knows the vault's ps address and holds its own job's token.
INTRUDER = r"""
import os
import strategyjob
from strategyjob import errors
from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
spec = ClusterSpec({"chief": ["127.0.0.1:1"], "worker": [os.environ["VAULT_WORKER"]],
                    "ps": [os.environ["VAULT_PS"]]})
strategy = strategyjob.ParameterServerStrategy(
    SimpleClusterResolver(spec, task_type="chief", task_id=0))
assert os.environ["STRATEGYJOB_TOKEN"]
for attempt in ("own-job-token", "no-token"):
    if attempt == "no-token":
        del os.environ["STRATEGYJOB_TOKEN"]
    try:
        with strategy.scope():
            strategyjob.Variable(0.0, name="probe")
        print("INTRUDER", attempt, "ACCEPTED", flush=True)
    except errors.PermissionDeniedError as e:
        print("INTRUDER", attempt, "REFUSED:", str(e).splitlines()[0], flush=True)
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


def test_a_jobs_servers_refuse_another_jobs_pod_and_tokenless_calls(ns: Namespace):
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
    for attempt in ("own-job-token", "no-token"):
        assert f"INTRUDER {attempt} REFUSED:" in log, log
    assert "ACCEPTED" not in log, log
    assert "token" in log.split("REFUSED:", 1)[1].splitlines()[0], log
    # The vault is unharmed: its chief still runs, and its servers have not failed.
    assert {p.metadata.name: p.status.phase for p in ns.pods("vault")} == {
        "vault-chief-0": "Running",
        "vault-worker-0": "Running",
        "vault-ps-0": "Running",
    }
