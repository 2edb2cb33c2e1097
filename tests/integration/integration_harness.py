"""Helpers for the integration tests: the operator as a subprocess, thin API helpers
that play the kubelet by writing pod status, manifests, and a polling wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from datetime import UTC, datetime
from typing import Any

from tests.support.control_plane import REPO_ROOT, ControlPlane, free_port
from tests.support.waiting import wait_for

#: Volcano's PodGroup API (the ``volcano_pod_group_crd`` fixture installs it).
VOLCANO_GROUP, VOLCANO_VERSION = "scheduling.volcano.sh", "v1beta1"

#: Seconds :meth:`OperatorProcess.stop` waits for the operator to exit before it kills it:
#: about 1 s alone, more on a loaded machine.
STOP_WITHIN = 10.0


class OperatorProcess:
    """The operator in its own process, as it runs in a cluster."""

    def __init__(self, cp: ControlPlane, *extra: str, env: dict[str, str] | None = None) -> None:
        self.cp = cp
        self.extra = extra or ("--standalone", "-A")
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.metrics_port = free_port()
        self.log = cp.dir / f"operator-{uuid.uuid4().hex[:6]}.log"

    def start(self) -> OperatorProcess:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cp.kubeconfig),
            "PYTHONPATH": f"{REPO_ROOT / 'sdk'}{os.pathsep}{REPO_ROOT / 'operator'}",
            "STRATEGYJOB_METRICS_PORT": str(self.metrics_port),
            "OMP_NUM_THREADS": "1",
            **self.env,
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "strategyjob_operator", *self.extra],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGINT, as a terminal's Ctrl-C; SIGKILL if it has not exited within
        :data:`STOP_WITHIN` (it takes about 1 s: test_k8s_operator_shutdown.py bounds it)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_WITHIN)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return r.read().decode()


def create_peering(cp: ControlPlane, namespace: str, name: str) -> None:
    """A KopfPeering in ``namespace``: the operators started with ``--peering=NAME`` there
    elect one among them (the chart creates it in a cluster)."""
    cp.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=f"apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata:\n  name: {name}\n",
    )


class Kube:
    """Thin helpers over the kubernetes client for the tests."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        from kubernetes import client, config

        self.api_client = config.new_client_from_config(config_file=str(cp.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.ns = namespace
        self.cp = cp

    # --- jobs -------------------------------------------------------------------------------
    def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(
            "strategyjob.dev", "v1alpha1", self.ns, "strategyjobs", manifest
        )

    def job(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(
                "strategyjob.dev", "v1alpha1", self.ns, "strategyjobs", name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_job(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            "strategyjob.dev", "v1alpha1", self.ns, "strategyjobs", name, patch
        )

    def delete_job(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            "strategyjob.dev", "v1alpha1", self.ns, "strategyjobs", name
        )

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        job = self.job(name) or {}
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond["type"] == type_ and cond["status"] == "True":
                return cond
        return None

    def wait_condition(self, name: str, type_: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(f"{name} condition {type_}", lambda: self.condition(name, type_), timeout)

    # --- pods -------------------------------------------------------------------------------
    def pods(self, job: str) -> dict[str, Any]:
        items = self.core.list_namespaced_pod(
            self.ns, label_selector=f"strategyjob.dev/job-name={job}"
        ).items
        return {p.metadata.name: p for p in items}

    def raw_pods(self, job: str) -> list[tuple[dict[str, Any], int]]:
        """The job's pods as the API server serves them (JSON), each with its size in bytes."""
        import json

        response = self.core.list_namespaced_pod(
            self.ns, label_selector=f"strategyjob.dev/job-name={job}", _preload_content=False
        )
        try:
            items = json.loads(response.data)["items"]
        finally:
            response.release_conn()
        return [(pod, len(json.dumps(pod, separators=(",", ":")))) for pod in items]

    def container_env(self, pod: dict[str, Any], container: int = 0) -> dict[str, str]:
        """The environment a kubelet gives the pod's container (``tests.support.kubelet_env``:
        ``valueFrom`` ConfigMap and Secret keys read from the API server, ``$(VAR)``
        expanded), without the image's own variables. ``pod``: as :meth:`raw_pods` gives."""
        import base64

        from kubernetes.client.exceptions import ApiException

        from tests.support.kubelet_env import container_env

        def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
            read = {
                "configmap": self.core.read_namespaced_config_map,
                "secret": self.core.read_namespaced_secret,
            }[kind]
            try:
                obj = read(name, namespace)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
            if kind == "secret":
                return {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
            return dict(obj.data or {})

        spec = pod["spec"]["containers"][container]
        return container_env(pod, spec, lookup)

    def wait_pods(self, job: str, count: int, timeout: float = 30.0) -> dict[str, Any]:
        def ready():
            pods = {n: p for n, p in self.pods(job).items() if not p.metadata.deletion_timestamp}
            return pods if len(pods) == count else None

        return wait_for(f"{count} pods of {job}", ready, timeout)

    def set_phase(
        self,
        pod: str,
        phase: str,
        exit_code: int | None = None,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """Play the kubelet: write the pod's phase (and its container's exit, with its
        termination ``message``: the last log lines under ``FallbackToLogsOnError``)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        container = self.core.read_namespaced_pod(pod, self.ns).spec.containers[0].name
        state: dict[str, Any] = {"running": {"startedAt": now}}
        if exit_code is not None:
            state = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                    "startedAt": now,
                    "finishedAt": now,
                }
            }
            if message is not None:
                state["terminated"]["message"] = message
        status = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": container,
                    "ready": phase == "Running",
                    "restartCount": 0,
                    "image": "busybox",
                    "imageID": "",
                    "state": state,
                }
            ],
        }
        self.core.patch_namespaced_pod_status(pod, self.ns, {"status": status})

    def make_ready(self, pod: str) -> None:
        """What a kubelet writes for a started pod: Running, its container ready, Ready."""
        self.set_phase(pod, "Running")
        self.core.patch_namespaced_pod_status(
            pod, self.ns, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        )

    def set_container_states(self, pod: str, phase: str, states: dict[str, dict[str, Any]]) -> None:
        """Play the kubelet for pods with several containers (a sidecar) or containers that
        wait (an image that does not pull): write the phase and each named container's
        ``state`` (e.g. ``{"waiting": {"reason": "ImagePullBackOff", "message": ...}}``)."""
        status = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": name,
                    "ready": "running" in state,
                    "restartCount": 0,
                    "image": "busybox",
                    "imageID": "",
                    "state": state,
                }
                for name, state in states.items()
            ],
        }
        self.core.patch_namespaced_pod_status(pod, self.ns, {"status": status})

    def uid(self, pod: str) -> str:
        return self.core.read_namespaced_pod(pod, self.ns).metadata.uid

    def events(self, job: str) -> list[Any]:
        return [
            e
            for e in self.core.list_namespaced_event(self.ns).items
            if e.involved_object.name == job and e.involved_object.kind == "StrategyJob"
        ]

    def wait_events(self, job: str, *reasons: str, timeout: float = 30.0) -> list[Any]:
        """The job's Events once one of each reason exists: the operator posts Events after
        it patches the status, so a condition being there does not mean its Event is."""

        def posted():
            events = self.events(job)
            return events if set(reasons) <= {e.reason for e in events} else None

        return wait_for(f"{job} events {sorted(reasons)}", posted, timeout)


def template(name: str = "strategyjob") -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {"name": name, "image": "python:3.11", "command": ["python", "train.py"]}
            ]
        }
    }


def manifest(
    name: str,
    strategy: str,
    replicas: dict[str, int],
    *,
    restart_policy: str | dict[str, str] = "Never",
    run_policy: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A StrategyJob manifest with one busybox-like container per replica."""
    specs = {}
    for t, n in replicas.items():
        policy = (
            restart_policy if isinstance(restart_policy, str) else restart_policy.get(t, "Never")
        )
        specs[t] = {"replicas": n, "restartPolicy": policy, "template": template()}
    body: dict[str, Any] = {"strategy": strategy, "replicaSpecs": specs, **spec}
    if run_policy:
        body["runPolicy"] = run_policy
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name},
        "spec": body,
    }
