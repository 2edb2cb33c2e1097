"""The cluster the end-to-end suite runs against and the helpers its tests share.

Two modes, same tests:

* kind (default): the session's two-node kind cluster made on this machine (``tools/kind``,
  ``tests.support.kind``), with this tree's operator and worker images loaded into its nodes;
  pods are containers started by real kubelets, and kube-router enforces NetworkPolicy;
* existing cluster: ``STRATEGYJOB_E2E_KUBECONFIG=<file>``.

Either way the operator runs as pods of the Helm chart, jobs are applied with ``kubectl``
and logs are read through the API server (``pods/log``), as a user would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.kind import run
from tests.support.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "strategyjob-operator"
EXAMPLES = REPO_ROOT / "examples"
GROUP, VERSION, PLURAL = "strategyjob.dev", "v1alpha1", "strategyjobs"
TFJOB_GROUP, TFJOB_VERSION, TFJOB_PLURAL = "kubeflow.org", "v1", "tfjobs"
#: The label of a job's pods; a TFJob's, as training-operator (and the operator serving
#: TFJobs) labels them.
JOB_LABEL = "strategyjob.dev/job-name"
TFJOB_LABEL_JOB_NAME = "training.kubeflow.org/job-name"
#: A job's final states (StrategyJob's ``status.state``, TFJob's condition types).
_FINAL = frozenset({"Succeeded", "Failed"})

#: An existing cluster to run against instead of the session's kind cluster.
ENV_KUBECONFIG = "STRATEGYJOB_E2E_KUBECONFIG"
#: ``<namespace>/<release>`` of an operator already installed (then not installed by the suite).
ENV_RELEASE = "STRATEGYJOB_E2E_RELEASE"
#: Extra ``helm install`` arguments, e.g. ``--set image.pullPolicy=Never``.
ENV_HELM_ARGS = "STRATEGYJOB_E2E_HELM_ARGS"
#: The image of the jobs' pods (default: the examples' own).
ENV_WORKER_IMAGE = "STRATEGYJOB_E2E_WORKER_IMAGE"
#: A directory every node of an existing cluster mounts from one storage (hostPath volumes).
ENV_SHARED_DIR = "STRATEGYJOB_E2E_SHARED_DIR"


@dataclass
class Cluster:
    """Where the suite runs: a kubeconfig, the kubectl and helm to use, and (kind mode) the
    kind cluster, whose nodes the tests may enter, and the operator image loaded into it."""

    kubeconfig: Path
    kubectl_bin: str
    helm_bin: str
    kind: Any = None  # tests.support.kind.Cluster in kind mode
    operator_image: str | None = None

    def __post_init__(self) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def run(self, tool: str, *args: str, input: str | None = None, timeout: float = 120):
        binary = self.kubectl_bin if tool == "kubectl" else self.helm_bin
        proc = subprocess.run(
            [binary, f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"{tool} {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        return proc.stdout

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        return self.run("kubectl", *args, input=input, timeout=timeout)

    def helm(self, *args: str, timeout: float = 300) -> str:
        return self.run("helm", *args, timeout=timeout)


def tool(name: str, bin_dir: Path | None) -> str:
    """``name`` from the control-plane build when there is one, else from PATH."""
    if bin_dir is not None and (bin_dir / name).is_file():
        return str(bin_dir / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"the end-to-end suite needs {name} on PATH")
    return found


class Namespace:
    """A fresh namespace for one test, with the operations its tests perform."""

    def __init__(self, cluster: Cluster, operator: tuple[str, str]) -> None:
        self.cluster = cluster
        self.operator = operator
        self.name = f"e2e-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", self.name)

    def delete(self) -> None:
        self.cluster.kubectl("delete", "namespace", self.name, "--wait=false")

    # --- jobs ------------------------------------------------------------------------------------
    def apply(self, manifest: dict[str, Any]) -> None:
        """``kubectl apply`` the manifest into this namespace, as a user would."""
        self.cluster.kubectl("apply", "-n", self.name, "-f", "-", input=yaml.safe_dump(manifest))

    def job(self, name: str) -> dict[str, Any]:
        return self.cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.name, PLURAL, name
        )

    def tfjob(self, name: str) -> dict[str, Any]:
        return self.cluster.custom.get_namespaced_custom_object(
            TFJOB_GROUP, TFJOB_VERSION, self.name, TFJOB_PLURAL, name
        )

    def wait_job(self, name: str, state: str, timeout: float) -> dict[str, Any]:
        """Wait until the job's state is ``state``; fail at once (with its pods' logs) if it
        ends in the other final state."""

        def state_of() -> tuple[str | None, dict[str, Any]]:
            job = self.job(name)
            return (job.get("status") or {}).get("state"), job

        return self._wait_final(name, state, state_of, timeout, tfjob=False)

    def wait_tfjob(self, name: str, condition: str, timeout: float) -> dict[str, Any]:
        """Wait until the TFJob's condition ``condition`` (``Succeeded`` or ``Failed``) is
        True and return it; fail at once (with its pods' logs) on the other one."""

        def state_of() -> tuple[str | None, dict[str, Any]]:
            conditions = (self.tfjob(name).get("status") or {}).get("conditions") or []
            final = [c for c in conditions if c["type"] in _FINAL and c["status"] == "True"]
            return (final[-1]["type"], final[-1]) if final else (None, {})

        return self._wait_final(name, condition, state_of, timeout, tfjob=True)

    def _wait_final(
        self,
        name: str,
        state: str,
        state_of: Callable[[], tuple[str | None, dict[str, Any]]],
        timeout: float,
        tfjob: bool,
    ) -> dict[str, Any]:
        """What ``state_of`` gives with ``state``; the failure report if the job ends in the
        other final state or time runs out."""

        def reached() -> dict[str, Any] | None:
            current, found = state_of()
            if current in _FINAL - {state}:
                report = self.report(name, tfjob=tfjob)
                raise AssertionError(f"job {name} is {current}, not {state}:\n{report}")
            return found if current == state else None

        try:
            return wait_for(f"job {name} to be {state}", reached, timeout, interval=0.5)
        except AssertionError as e:
            if "timed out" in str(e):
                raise AssertionError(f"{e}\n{self.report(name, tfjob=tfjob)}") from None
            raise

    def report(self, name: str, tfjob: bool = False) -> str:
        """What a failure needs: the job's (or TFJob's) status, its pods' states and the end
        of their logs, and the operator's warnings."""
        job = self.tfjob(name) if tfjob else self.job(name)
        lines = [json.dumps((job.get("status") or {}), indent=1)]
        for pod in self.pods(name, label=TFJOB_LABEL_JOB_NAME if tfjob else JOB_LABEL):
            meta, status = pod.metadata, pod.status
            states = [
                (c.name, {k: v for k, v in c.state.to_dict().items() if v})
                for c in (status.init_container_statuses or []) + (status.container_statuses or [])
            ]
            lines.append(f"--- pod {meta.name} ({status.phase}): {states}")
            lines.append(self.logs(meta.name)[-1500:])
        namespace, release = self.operator
        for pod in self.cluster.core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={release}"
        ).items:
            log = self.cluster.core.read_namespaced_pod_log(pod.metadata.name, namespace)
            warnings = [
                line for line in log.splitlines() if " WARNING " in line or " ERROR " in line
            ]
            lines.append(f"--- operator {pod.metadata.name}:")
            lines.extend(warnings[-10:])
        return "\n".join(lines)

    # --- pods ------------------------------------------------------------------------------------
    def pods(self, job: str, label: str = JOB_LABEL) -> list[Any]:
        """The pods of job ``job`` (a TFJob's: ``label=TFJOB_LABEL_JOB_NAME``)."""
        return self.cluster.core.list_namespaced_pod(
            self.name, label_selector=f"{label}={job}"
        ).items

    def pod(self, name: str) -> Any | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.cluster.core.read_namespaced_pod(name, self.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def logs(self, pod: str, previous: bool = False) -> str:
        """The pod's log through the API server (``kubectl logs``); '' when it has none."""
        from kubernetes.client.exceptions import ApiException

        try:
            log = self.cluster.core.read_namespaced_pod_log(pod, self.name, previous=previous)
        except ApiException:
            return ""
        return log or ""  # the client gives None for an empty log

    def wait_log(self, pod: str, pattern: str, timeout: float) -> re.Match[str]:
        regex = re.compile(pattern, re.MULTILINE)
        return wait_for(
            f"{pattern!r} in the log of {pod}", lambda: regex.search(self.logs(pod)), timeout
        )

    def kill(self, pod: str) -> str:
        """SIGKILL the pod's training process, as the OOM killer or a crash would: on kind
        from inside its node (the container's first process ignores signals sent from inside
        the container; the pod fails with exit code 137). On another cluster the suite cannot
        reach the node, so the pod is force-deleted. Returns the uid of the pod killed."""
        obj = self.pod(pod)
        assert obj is not None, f"pod {pod} does not exist"
        if self.cluster.kind is not None:
            self.signal(pod, "KILL")
        else:
            self.cluster.kubectl(
                "delete", "pod", pod, "-n", self.name, "--grace-period=0", "--force"
            )
        return obj.metadata.uid

    def signal(self, pod: str, name: str) -> None:
        """Send signal ``name`` (``KILL``, ``STOP``) to the pod's training process from inside
        its kind node (the container's first process ignores signals sent from inside it)."""
        node, container = self._container(pod)
        pid = _crictl_info(node, "inspect", container, "pid")
        assert pid not in ("", "0"), f"pod {pod}'s container {container} is not running"
        _in_node(node, "kill", f"-{name}", pid)

    @contextmanager
    def cut(self, pod: str, peer: str) -> Iterator[None]:
        """Drop every packet between pods ``pod`` and ``peer``, both ways, as a failed link or
        a firewall would: both stay alive and keep their connections, but nothing passes. The
        rules are put in ``pod``'s network namespace (its sandbox's, entered from its kind
        node), so they can reach nothing else and go with the pod whatever happens; they are
        removed on leaving the block if the sandbox is still there."""
        node, container = self._container(pod)
        peer_pod = self.pod(peer)
        assert peer_pod is not None and peer_pod.status.pod_ip, f"pod {peer} has no address"
        address = peer_pod.status.pod_ip
        sandbox = _crictl_info(node, "inspect", container, "sandboxID")
        assert sandbox, f"pod {pod}'s container {container} is gone"
        rules = [["INPUT", "-s", address, "-j", "DROP"], ["OUTPUT", "-d", address, "-j", "DROP"]]

        def iptables(action: str, rule: list[str], pid: str) -> bool:
            argv = ["docker", "exec", node, "nsenter", "-t", pid, "-n", "iptables", "-w"]
            return run([*argv, action, *rule], timeout=60, check=action == "-I").returncode == 0

        def sandbox_pid() -> str | None:
            """Its process's; None once it is stopped (its namespace gone) or removed."""
            pid = _crictl_info(node, "inspectp", sandbox, "pid")
            return pid if pid not in ("", "0") else None

        pid = sandbox_pid()
        assert pid, f"pod {pod} has no running sandbox"
        added: list[list[str]] = []
        try:
            for rule in rules:
                iptables("-I", rule, pid)
                added.append(rule)
            yield
        finally:
            # Once the sandbox stops (the pod deleted, even meanwhile), the rules are gone with
            # its network namespace.
            for rule in added:
                if (pid := sandbox_pid()) and not iptables("-D", rule, pid) and sandbox_pid():
                    raise AssertionError(f"pod {pod}: the rule {rule} could not be removed")

    def _container(self, pod: str) -> tuple[str, str]:
        """The kind node of pod ``pod`` and the ID of its (first) container."""
        assert self.cluster.kind is not None, "a pod's processes are reached on kind only"
        obj = self.pod(pod)
        assert obj is not None, f"pod {pod} does not exist"
        return obj.spec.node_name, obj.status.container_statuses[0].container_id.split("://")[1]


def _crictl_info(node: str, command: str, id: str, field: str) -> str:
    """``crictl <command> <id>``'s ``info.<field>`` in kind node ``node``: ``inspect`` for a
    container, ``inspectp`` for a pod sandbox (``pid``: its first process's, as the node sees
    it; ``0`` once it is stopped); '' if crictl knows no such ``id``."""
    template = f"{{{{.info.{field}}}}}"
    argv = ["crictl", command, "--output", "go-template", "--template", template, id]
    found = run(["docker", "exec", node, *argv], timeout=60, check=False)
    return found.stdout.strip() if found.returncode == 0 else ""


def _in_node(node: str, *command: str) -> str:
    """``command`` run in a kind node (a Docker container named after the node)."""
    return run(["docker", "exec", node, *command], timeout=60).stdout


def worker_image() -> str:
    """The image of the jobs' pods: ``STRATEGYJOB_E2E_WORKER_IMAGE``, else the examples'."""
    return os.environ.get(ENV_WORKER_IMAGE, "strategyjob-worker:0.1.0")


def example(
    name: str,
    *,
    file: str = "k8s.yaml",
    env: dict[str, dict[str, str]] | None = None,
    checkpoints: str | None = None,
    keep_pods: bool = False,
    spread: bool = False,
) -> dict[str, Any]:
    """``examples/<name>/<file>`` (a StrategyJob or a TFJob, whose replica types are
    ``Worker``…) with some env values changed (``env[replica type]``),
    the worker image of ``STRATEGYJOB_E2E_WORKER_IMAGE``, with ``checkpoints`` its hostPath
    checkpoint volume moved to that directory (mounted at the same path), with
    ``keep_pods`` cleanPodPolicy None (so that pods still running when the leader
    succeeds, and their logs, stay), and with ``spread`` each of the job's pods on another
    node (the control plane's taint tolerated: kind's two nodes)."""
    manifest = yaml.safe_load((EXAMPLES / name / file).read_text())
    job_name = manifest["metadata"]["name"]
    tfjob = manifest["kind"] == "TFJob"
    job_label = TFJOB_LABEL_JOB_NAME if tfjob else JOB_LABEL
    replica_specs = manifest["spec"]["tfReplicaSpecs" if tfjob else "replicaSpecs"]
    if keep_pods:
        manifest["spec"].setdefault("runPolicy", {})["cleanPodPolicy"] = "None"
    image = os.environ.get(ENV_WORKER_IMAGE)  # else the manifest's own
    for replica_type, spec in replica_specs.items():
        pod = spec["template"]["spec"]
        if spread:
            pod["tolerations"] = [{"operator": "Exists"}]
            term = {
                "labelSelector": {"matchLabels": {job_label: job_name}},
                "topologyKey": "kubernetes.io/hostname",
            }
            pod["affinity"] = {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
            }
        for container in pod.get("initContainers", []) + pod["containers"]:
            if image:
                container["image"] = image
            for mount in container.get("volumeMounts", []):
                if checkpoints and mount["name"] == "checkpoints":
                    mount["mountPath"] = checkpoints
            for entry in container.get("env", []):
                if entry["name"] == "CHECKPOINT_DIR" and checkpoints:
                    entry["value"] = entry["value"].replace("/checkpoints", checkpoints, 1)
            for key, value in (env or {}).get(replica_type, {}).items():
                entries = container.setdefault("env", [])
                entries[:] = [e for e in entries if e["name"] != key]
                entries.append({"name": key, "value": value})
        for container in pod.get("initContainers", []):
            container["command"] = [
                part.replace("/checkpoints", checkpoints) if checkpoints else part
                for part in container["command"]
            ]
        for volume in pod.get("volumes", []):
            if checkpoints and volume["name"] == "checkpoints":
                volume["hostPath"]["path"] = checkpoints
    return manifest


EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+): loss ([\d.]+)")
STEP_LINE = re.compile(r"step (\d+)/(\d+): loss ([\d.]+)")


def losses(log: str, line: re.Pattern[str] = EPOCH_LINE) -> list[tuple[int, float]]:
    """``(epoch or step, loss)`` of every progress line of a log."""
    return [(int(m.group(1)), float(m.group(3))) for m in line.finditer(log)]


def assert_loss_goes_down(points: list[tuple[int, float]], what: str) -> None:
    assert len(points) >= 3, f"{what}: too few progress lines to judge: {points}"
    first, last = points[0][1], points[-1][1]
    assert last < 0.5 * first, f"{what}: the loss did not go down: {points}"
