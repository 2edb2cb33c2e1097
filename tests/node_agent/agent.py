"""The node agent: registers Nodes, watches the pods bound to them and runs each as a
:class:`~node_agent.pods.PodWorker`; keeps the Nodes' heartbeat and Leases fresh; serves
``kubectl logs``; and on exit stops every pod process and removes every network device,
namespace and mount point it made.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from node_agent import network as net
from node_agent.dns import HostsFiles
from node_agent.kubelet_api import KubeletServer
from node_agent.pods import NodeContext, PodWorker, now_iso
from node_agent.runtime import ImageConfig
from node_agent.service_proxy import TcpProxy

log = logging.getLogger("node_agent")

HEARTBEAT_SECONDS = 10
LEASE_SECONDS = 40
LEASE_NAMESPACE = "kube-node-lease"
VERSION = "v1.36.3-node-agent"


@dataclass
class AgentConfig:
    """Everything the command line sets (see :func:`parse_args`)."""

    kubeconfig: str
    nodes: int = 1
    node_prefix: str = "node-agent"
    state_dir: str | None = None
    keep_state: bool = False
    workdir: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=dict)
    image_commands: dict[str, list[str]] = field(default_factory=dict)
    image_paths: dict[str, str] = field(default_factory=dict)
    backoff: float = 10.0
    backoff_cap: float = 300.0
    cpu: str = "16"
    memory: str = "64Gi"
    ready_file: str | None = None


class NodeAgent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.id = uuid.uuid4().hex[:4]
        self.node_names = [f"{config.node_prefix}-{i}" for i in range(config.nodes)]
        self.stopping = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.network = net.Network(self.id)
        self.owns_state_dir = config.state_dir is None
        self.state_dir = Path(config.state_dir or tempfile.mkdtemp(prefix="sjob-node-agent-"))
        self.threads: list[threading.Thread] = []
        self.kubelet: KubeletServer | None = None
        self.service_proxy: TcpProxy | None = None
        self.context: NodeContext | None = None

    # --- start -----------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        from kubernetes import client, config

        if reason := net.unsupported_reason():
            raise net.NetworkUnavailable(reason)
        configuration = client.Configuration()
        config.load_kube_config(self.config.kubeconfig, client_configuration=configuration)
        configuration.connection_pool_maxsize = 64
        self.api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        api = urlparse(configuration.host)
        ca = Path(configuration.ssl_ca_cert).read_bytes() if configuration.ssl_ca_cert else b""

        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.network.setup()
        gateway = self.network.gateway
        # Pods reach the API server as https://kubernetes.default.svc:443 (the gateway).
        self.service_proxy = TcpProxy((gateway, 443), (api.hostname, api.port or 443)).start()
        self.context = NodeContext(
            core=self.core,
            network=self.network,
            hosts=HostsFiles(api_ip=gateway),
            image=self._image_config(),
            state_dir=self.state_dir,
            service_env={
                "KUBERNETES_SERVICE_HOST": "kubernetes.default.svc",
                "KUBERNETES_SERVICE_PORT": "443",
                "KUBERNETES_SERVICE_PORT_HTTPS": "443",
                "KUBERNETES_PORT": "tcp://kubernetes.default.svc:443",
            },
            ca_cert=ca,
            allocatable={"cpu": self.config.cpu, "memory": self.config.memory},
            backoff=self.config.backoff,
            backoff_cap=self.config.backoff_cap,
            forget=self._forget,
        )
        self.kubelet = KubeletServer(gateway, self.find_pod, self.state_dir).start()
        for name in self.node_names:
            self._register(name)
        for name in self.node_names:
            self._thread(self._watch, name)
        self._thread(self._heartbeat)
        if self.config.ready_file:
            info = {"id": self.id, "nodes": self.node_names, "bridge": self.network.bridge,
                    "gateway": gateway, "kubelet_port": self.kubelet.port,
                    "state_dir": str(self.state_dir), "pid": os.getpid()}  # fmt: skip
            tmp = Path(self.config.ready_file + ".tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(self.config.ready_file)
        log.info("node agent %s ready: nodes %s on %s (%s)", self.id, self.node_names,
                 self.network.bridge, self.network.subnet)  # fmt: skip
        return self

    def _image_config(self) -> ImageConfig:
        python_dir = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{python_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            **self.config.env,
        }
        return ImageConfig(env, self.config.workdir, self.config.image_commands,
                           self.config.image_paths)  # fmt: skip

    def _thread(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=target.__name__)
        t.start()
        self.threads.append(t)

    # --- nodes -----------------------------------------------------------------------------------
    def _node_status(self, ready: bool = True, reason: str = "KubeletReady") -> dict[str, Any]:
        now = now_iso()
        resources = {"cpu": self.config.cpu, "memory": self.config.memory, "pods": "110",
                     "ephemeral-storage": "100Gi"}  # fmt: skip
        conditions = [
            {"type": t, "status": "False", "reason": f"KubeletHasNo{t}",
             "lastHeartbeatTime": now, "lastTransitionTime": now}
            for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ]  # fmt: skip
        conditions.append({"type": "Ready", "status": "True" if ready else "False",
                           "reason": reason, "message": f"node agent {self.id}",
                           "lastHeartbeatTime": now, "lastTransitionTime": now})  # fmt: skip
        assert self.kubelet is not None
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": self.network.gateway}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet.port}},
            "nodeInfo": {
                "machineID": self.id, "systemUUID": self.id, "bootID": self.id,
                "kernelVersion": platform.release(), "osImage": "StrategyJob node agent",
                "containerRuntimeVersion": "nodeagent://0.1", "kubeletVersion": VERSION,
                "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                    platform.machine(), platform.machine()),
            },
        }  # fmt: skip

    def _register(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        arch = self._node_status()["nodeInfo"]["architecture"]
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": arch, "strategyjob.dev/node-agent": self.id}  # fmt: skip
        try:
            self.core.create_node({"metadata": {"name": name, "labels": labels}})
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.patch_node(name, {"metadata": {"labels": labels}})
        self.core.patch_node_status(name, {"status": self._node_status()})
        # The TaintNodesByCondition admission plugin taints every new Node not-ready; the
        # node-lifecycle controller, which would lift it once the Node is Ready, is not
        # running, so the agent lifts it itself.
        node = json.loads(self.core.read_node(name, _preload_content=False).data)
        taints = node["spec"].get("taints") or []
        kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
        if kept != taints:
            self.core.patch_node(name, {"spec": {"taints": kept}})
        lease = {
            "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
            "spec": self._lease_spec(name),
        }
        try:
            self.coordination.create_namespaced_lease(LEASE_NAMESPACE, lease)
        except ApiException as e:
            if e.status != 409:
                raise

    def _lease_spec(self, name: str) -> dict[str, Any]:
        renew = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew}

    def _heartbeat(self) -> None:
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            for name in self.node_names:
                try:
                    self.core.patch_node_status(name, {"status": self._node_status()})
                    self.coordination.patch_namespaced_lease(
                        name, LEASE_NAMESPACE, {"spec": self._lease_spec(name)}
                    )
                except Exception as e:  # the next beat retries
                    log.warning("heartbeat of %s failed: %s", name, e)

    # --- pods ------------------------------------------------------------------------------------
    def _watch(self, node: str) -> None:
        """List then watch the node's pods, relisting when the watch expires."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        selector = f"spec.nodeName={node}"
        version = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    raw = self.core.list_pod_for_all_namespaces(
                        field_selector=selector, _preload_content=False
                    )
                    body = json.loads(raw.data)
                    version = body["metadata"]["resourceVersion"]
                    self._relist(node, body["items"])
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, field_selector=selector,
                    resource_version=version, timeout_seconds=30, allow_watch_bookmarks=True,
                    deserialize=False,
                )  # fmt: skip
                for event in stream:
                    if self.stopping.is_set():
                        return
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._on_event(event["type"], obj)
            except ApiException as e:
                if e.status != 410:
                    log.warning("watching pods of %s failed: %s", node, e)
                    self.stopping.wait(1)
                version = None
            except Exception as e:
                if not self.stopping.is_set():
                    log.warning("watching pods of %s failed: %s", node, e)
                    self.stopping.wait(1)
                version = None

    def _relist(self, node: str, pods: list[dict[str, Any]]) -> None:
        listed = {p["metadata"]["uid"] for p in pods}
        with self.lock:
            lost = [w for uid, w in self.workers.items()
                    if uid not in listed and w.pod["spec"].get("nodeName") == node]  # fmt: skip
        for worker in lost:
            worker.vanish()
        for pod in pods:
            self._on_event("MODIFIED", pod)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.vanish()
                return
            if worker is not None:
                worker.update(pod)
                return
            if self.stopping.is_set():
                return
            assert self.context is not None
            worker = PodWorker(self.context, pod)
            self.workers[uid] = worker
        worker.thread.start()

    def _forget(self, worker: PodWorker) -> None:
        with self.lock:
            if self.workers.get(worker.uid) is worker:
                del self.workers[worker.uid]

    def find_pod(self, namespace: str, name: str) -> PodWorker | None:
        with self.lock:
            found = [w for w in self.workers.values()
                     if (w.namespace, w.name) == (namespace, name)]  # fmt: skip
        return found[-1] if found else None

    # --- stop ------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every pod (SIGTERM, SIGKILL after 2 s), mark the Nodes NotReady, and remove
        the bridge, namespaces, mount points and (unless kept) the state directory."""
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.vanish()
        for worker in workers:
            worker.thread.join(timeout=15)
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.service_proxy is not None:
            self.service_proxy.stop()
        if self.context is not None:
            for name in self.node_names:
                try:
                    status = self._node_status(ready=False, reason="NodeAgentStopped")
                    self.core.patch_node_status(name, {"status": status}, _request_timeout=3)
                except Exception:
                    pass
            for path in sorted(self.context.created_paths, key=len, reverse=True):
                try:
                    p = Path(path)
                    p.rmdir() if p.is_dir() else p.unlink()
                except OSError:
                    pass
        self.network.teardown()
        if self.owns_state_dir and not self.config.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        log.info("node agent %s stopped", self.id)


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} wants KEY=VALUE, got {value!r}")
        out[key] = rest
    return out


def parse_args(argv: Sequence[str] | None = None) -> AgentConfig:
    p = argparse.ArgumentParser(
        prog="python -m node_agent",
        description="Run the pods bound to this machine's Nodes as local processes, each "
        "in its own network namespace (a stand-in for kubelet + container runtime in tests).",
    )
    p.add_argument("--kubeconfig", required=True, help="credentials of the API server")
    p.add_argument("--nodes", type=int, default=1, help="how many Nodes to register")
    p.add_argument("--node-prefix", default="node-agent", help="Node names: <prefix>-<i>")
    p.add_argument("--state-dir", help="pod files and logs (default: a temporary directory)")
    p.add_argument("--keep-state", action="store_true", help="keep the state dir on exit")
    p.add_argument(
        "--workdir",
        default=os.getcwd(),
        help="working directory of containers without a workingDir here",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment every image would set (repeatable)",
    )
    p.add_argument(
        "--image-command",
        action="append",
        default=[],
        metavar="IMAGE=COMMAND",
        help="entrypoint of an image, for containers without a command",
    )
    p.add_argument(
        "--image-path",
        action="append",
        default=[],
        metavar="IMAGE_DIR=HOST_DIR",
        help="a directory of the images that is HOST_DIR here (repeatable)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=10.0,
        help="first restart back-off in seconds (kubelet: 10), doubling",
    )
    p.add_argument("--cpu", default="16", help="the Nodes' CPU capacity")
    p.add_argument("--memory", default="64Gi", help="the Nodes' memory capacity")
    p.add_argument("--ready-file", help="write JSON about the agent here once it is ready")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not a.verbose:
        logging.getLogger("kubernetes").setLevel(logging.WARNING)
    commands = {k: shlex.split(v) for k, v in _pairs(a.image_command, "--image-command").items()}
    return AgentConfig(
        kubeconfig=a.kubeconfig, nodes=a.nodes, node_prefix=a.node_prefix,
        state_dir=a.state_dir, keep_state=a.keep_state, workdir=a.workdir,
        env=_pairs(a.env, "--env"), image_commands=commands,
        image_paths=_pairs(a.image_path, "--image-path"), backoff=a.backoff,
        cpu=a.cpu, memory=a.memory, ready_file=a.ready_file,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    agent = NodeAgent(config)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        agent.start()
    except net.NetworkUnavailable as e:
        print(f"node agent: {e}", file=sys.stderr)
        agent.shutdown()
        return 3
    except BaseException:
        agent.shutdown()
        raise
    try:
        while not stop.wait(1.0):
            pass
    finally:
        agent.shutdown()
    return 0
