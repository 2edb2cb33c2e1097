"""The node agent behaves like a kubelet where the operator and the jobs depend on it:
environment (downward API included), phases and exit codes, restart policies, volumes,
in-cluster credentials, probes, graceful deletion, logs, and a clean exit."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from node_agent import network
from node_agent.conftest import Pods, wait_for
from node_agent.harness import AgentProcess, LocalCluster

pytestmark = pytest.mark.timeout(120)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_pod_gets_its_environment_and_succeeds(pods: Pods):
    pods.core.create_namespaced_config_map(
        pods.ns, {"metadata": {"name": "settings"}, "data": {"mode": "fast", "level": "3"}}
    )
    pods.core.create_namespaced_secret(
        pods.ns, {"metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}}
    )
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "MESSAGE", "value": "$(GREETING) world $(UNDEFINED) $$(GREETING)"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        # a value from a ConfigMap, referred to later (the operator's TF_CONFIG does this)
        {"name": "MODE_JSON", "value": '{"mode":$(MODE),"x":"$$(MODE)"}'},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
    ]
    script = (
        "import json, os, socket; print(json.dumps({**os.environ, 'HOST': socket.gethostname()}))"
    )
    pods.create(
        "env",
        script,
        labels={"role": "tester"},
        container={
            "env": env,
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CM_"}],
        },
    )
    pod = pods.wait_phase("env", "Succeeded")
    seen = json.loads(pods.logs("env"))
    assert seen["MESSAGE"] == "hello world $(UNDEFINED) $(GREETING)"
    assert (seen["POD_NAME"], seen["POD_NS"], seen["ROLE"]) == ("env", pods.ns, "tester")
    assert (seen["MODE"], seen["PASSWORD"], seen["CM_level"]) == ("fast", "s3cret", "3")
    assert seen["MODE_JSON"] == '{"mode":fast,"x":"$(MODE)"}'
    assert seen["NODE"] == pod.spec.node_name == "node-agent-0"
    assert seen["POD_IP"] == pod.status.pod_ip != pod.status.host_ip
    assert seen["HOST"] == "env"  # the pod's own UTS namespace
    assert seen["KUBERNETES_SERVICE_HOST"] == "kubernetes.default.svc"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "False"


def test_failure_reports_the_exit_code_and_never_restarts(pods: Pods):
    pods.create("fails", "import sys; print('hello'); print('bye'); sys.exit(3)")
    pod = pods.wait_phase("fails", "Failed")
    status = pod.status.container_statuses[0]
    assert (status.state.terminated.exit_code, status.state.terminated.reason) == (3, "Error")
    assert status.restart_count == 0
    # kubectl logs, through the API server to the agent
    assert pods.kubectl("logs", "fails") == "hello\nbye\n"
    assert pods.kubectl("logs", "--tail=1", "-f", "fails") == "bye\n"


def test_on_failure_restarts_the_container_which_keeps_its_empty_dir(pods: Pods):
    script = (
        "import os, sys\n"
        "if os.path.exists('/scratch/tried'): print('second'); sys.exit(0)\n"
        "open('/scratch/tried', 'w').close(); print('first'); sys.exit(1)\n"
    )
    pods.create(
        "retry",
        script,
        restartPolicy="OnFailure",
        volumes=[{"name": "scratch", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
    )
    pod = pods.wait_phase("retry", "Succeeded")
    status = pod.status.container_statuses[0]
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1
    assert pods.logs("retry") == "second\n"
    assert pods.logs("retry", previous=True) == "first\n"


def test_always_restarts_with_a_back_off(pods: Pods):
    pods.create("again", "print('ran')", restartPolicy="Always")
    pod = wait_for(
        "two restarts",
        lambda: (p := pods.get("again")) and p.status.container_statuses
        and p.status.container_statuses[0].restart_count >= 2 and p,
    )  # fmt: skip
    assert pod.status.phase == "Running"  # a pod that always restarts never finishes


def test_deletion_sends_sigterm_then_sigkill_after_the_grace_period(pods: Pods, tmp_path: Path):
    """One container exits on SIGTERM; one ignores it and has a child in a session of its
    own: both die, the second only after the grace period, and nothing survives."""
    graceful = (
        "import signal, sys, time\n"
        "def stop(*_): print('got SIGTERM', flush=True); open('/shared/graceful', 'w').close()"
        "; sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop); print('ready', flush=True); time.sleep(600)\n"
    )
    stubborn = (
        "import os, signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "open('/shared/pids', 'w').write(f'{os.getpid()} {child.pid}')\n"
        "print('ready', flush=True); time.sleep(600)\n"
    )
    shared = {"volumes": [{"name": "shared", "hostPath": {"path": str(tmp_path)}}]}
    mount = {"volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}
    pods.create("graceful", graceful, container=mount, **shared)
    pods.create("stubborn", stubborn, container=mount, **shared)
    for name in ("graceful", "stubborn"):
        pods.wait_phase(name, "Running")
        wait_for(f"{name} to be ready", lambda n=name: "ready" in pods.logs(n))
    pids = wait_for(
        "the pids", lambda: (tmp_path / "pids").exists() and (tmp_path / "pids").read_text()
    )
    pid, child = (int(p) for p in pids.split())

    pods.core.delete_namespaced_pod("graceful", pods.ns, grace_period_seconds=30)
    wait_for("graceful to be gone", lambda: pods.get("graceful") is None, timeout=20)
    assert (tmp_path / "graceful").exists()  # it ran its SIGTERM handler

    started = time.monotonic()
    pods.core.delete_namespaced_pod("stubborn", pods.ns, grace_period_seconds=3)
    wait_for("stubborn to be gone", lambda: pods.get("stubborn") is None, timeout=30)
    assert time.monotonic() - started >= 2.5  # SIGKILL came only after the grace period
    wait_for("no process of stubborn left", lambda: not alive(pid) and not alive(child), 10)


def test_in_cluster_credentials_are_the_pods_service_account(pods: Pods):
    """The token mounted where in-cluster clients look is the pod's ServiceAccount's: it
    can do what its Role allows and nothing else."""
    pods.core.create_namespaced_service_account(pods.ns, {"metadata": {"name": "reader"}})
    pods.rbac.create_namespaced_role(
        pods.ns,
        {
            "metadata": {"name": "read-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    )
    pods.rbac.create_namespaced_role_binding(
        pods.ns,
        {
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-pods",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": pods.ns}],
        },
    )
    script = (
        "import os\n"
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "api = client.CoreV1Api()\n"
        "ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()\n"
        "print('phase', api.read_namespaced_pod(os.environ['HOSTNAME'], ns).status.phase)\n"
        "try:\n"
        "    api.list_namespaced_secret(ns)\n"
        "except client.exceptions.ApiException as e:\n"
        "    print('secrets', e.status)\n"
    )
    pods.create("whoami", script, serviceAccountName="reader")
    pods.wait_phase("whoami", "Succeeded")
    assert pods.logs("whoami").split("\n")[:2] == ["phase Running", "secrets 403"]


def test_readiness_probe_gates_the_ready_condition(pods: Pods):
    script = (
        "import http.server, time\n"
        "time.sleep(2)\n"
        "http.server.HTTPServer(('', 8000), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    probe = {"httpGet": {"path": "/", "port": "web"}, "periodSeconds": 1}
    container = {"ports": [{"name": "web", "containerPort": 8000}], "readinessProbe": probe}
    pods.create("web", script, container=container)

    def ready() -> bool | None:
        pod = pods.get("web")
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        return pod.status.phase == "Running" and conditions.get("Ready") == "True"

    pods.wait_phase("web", "Running")
    assert not ready()  # running, but not serving yet
    wait_for("web to be ready", ready)


def test_stopping_the_agent_stops_its_pods_and_removes_its_network(
    local_cluster: LocalCluster, pods: Pods, tmp_path: Path
):
    """A second agent with its own Node runs a pod whose child escaped its process group;
    when the agent stops, both processes are gone, and so are its namespaces and links."""
    agent = AgentProcess(
        local_cluster.kubeconfig, tmp_path / "agent.log", extra_args=("--node-prefix=extra",)
    ).start()
    try:
        script = (
            "import os, subprocess, time\n"
            "child = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
            "open('/shared/pids', 'w').write(f'{os.getpid()} {child.pid}')\n"
            "time.sleep(600)\n"
        )
        pods.create(
            "pinned",
            script,
            nodeName="extra-0",
            volumes=[{"name": "shared", "hostPath": {"path": str(tmp_path)}}],
            container={"volumeMounts": [{"name": "shared", "mountPath": "/shared"}]},
        )
        pods.wait_phase("pinned", "Running")
        pids = wait_for(
            "the pids", lambda: (tmp_path / "pids").exists() and (tmp_path / "pids").read_text()
        )
        assert network.leftovers(agent.id)  # its bridge, veth and namespace exist
    finally:
        left = agent.stop()
    assert left == [], f"the agent did not remove {left}"
    for pid in (int(p) for p in pids.split()):
        assert not alive(pid), f"process {pid} survived the agent"
    assert "node agent" in agent.output() and "stopped" in agent.output()


def test_unsupported_machine_is_reported_with_the_reason(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in (network.unsupported_reason() or "")
