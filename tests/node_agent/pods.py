"""One pod's life on the node agent, as the kubelet's pod worker lives it, in small.

A :class:`PodWorker` thread per pod: it sets up the sandbox (network namespace, hosts
file, service-account token, volumes), runs the init containers in order and then the
containers, applies the restart policy with a back-off, runs readiness and liveness
probes, and writes the pod's status (phase, conditions, container states with exit
codes, restart counts, pod IP) whenever it changes. On deletion it sends SIGTERM to
every container's process group, SIGKILL after the grace period, and then deletes the
pod object with grace 0, which only the node may do.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from node_agent import runtime
from node_agent.dns import HostsFiles, PodName
from node_agent.network import Network, PodNetwork

log = logging.getLogger("node_agent")

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3600
DEFAULT_GRACE = 30
TERMINAL = ("Succeeded", "Failed")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeContext:
    """What pod workers share: the API, the network and the node's configuration."""

    core: Any  # kubernetes.client.CoreV1Api
    network: Network
    hosts: HostsFiles
    image: runtime.ImageConfig
    state_dir: Path
    service_env: Mapping[str, str]
    ca_cert: bytes
    allocatable: Mapping[str, str]
    backoff: float
    backoff_cap: float
    forget: Callable[[PodWorker], None]
    created_paths: list[str] = field(default_factory=list)
    paths_lock: threading.Lock = field(default_factory=threading.Lock)

    def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's or Secret's data, decoded; None when it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, namespace, _preload_content=False)
            else:
                obj = self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        body = json.loads(obj.data)
        data = dict(body.get("data") or {})
        if kind == "secret":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        for k, v in (body.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v).decode(errors="replace")
        return data


@dataclass
class Probe:
    spec: Mapping[str, Any]
    next_at: float
    successes: int = 0
    failures: int = 0


@dataclass
class Container:
    """A container's state as the status reports it, plus its current process."""

    spec: Mapping[str, Any]
    init: bool = False
    process: runtime.Process | None = None
    env: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    start_at: float = 0.0  # monotonic time of the next start (restart back-off)
    logs: list[Path] = field(default_factory=list)
    readiness: Probe | None = None
    liveness: Probe | None = None
    killed_by_liveness: bool = False

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def exit_code(self) -> int | None:
        return (self.state.get("terminated") or {}).get("exitCode")

    def status(self) -> dict[str, Any]:
        pid = self.process.pid if self.process else None
        container_id = f"nodeagent://{pid}" if pid else self._last_id()
        out = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": f"nodeagent://{self.spec.get('image', '')}",
            "ready": self.ready,
            "started": "running" in self.state,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if container_id:
            out["containerID"] = container_id
        return out

    def _last_id(self) -> str | None:
        return (self.state.get("terminated") or {}).get("containerID")


class PodWorker:
    """The thread that runs one pod (identified by its uid) on this node."""

    def __init__(self, node: NodeContext, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        self.node = node
        self.pod = pod
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.dir = node.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        spec = pod["spec"]
        self.init_containers = [Container(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [Container(c) for c in spec.get("containers") or []]
        self.net: PodNetwork | None = None
        self.volumes: dict[str, Path] = {}
        self.sa_dir: Path | None = None
        self.token_refresh_at: float | None = None
        self.sandbox_error = ""
        self.retry_at = 0.0
        self.start_time = now_iso()
        status = pod.get("status") or {}
        # A pod that finished before this agent started is only waited on for deletion.
        self.passive = status.get("phase") in TERMINAL
        self.phase = status.get("phase") if self.passive else "Pending"
        self._conditions: dict[str, dict[str, str]] = {}
        self._reported: dict[str, Any] | None = None
        self.gone = False
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    # --- called by the agent's watch ------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.wake.set()

    def vanish(self) -> None:
        """The pod object was removed from the API (forced deletion)."""
        self.gone = True
        self.wake.set()

    def all_containers(self) -> list[Container]:
        return self.init_containers + self.containers

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    # --- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("pod %s: worker failed", self.key)
        finally:
            self._kill_all(0)
            self._teardown()
            self.node.forget(self)

    def _deleting(self) -> bool:
        return self.gone or bool(self.pod["metadata"].get("deletionTimestamp"))

    def _live(self) -> None:
        while not self._deleting():
            if not self.passive and self.phase not in TERMINAL:
                if self.net is None:
                    self._setup_sandbox()
                if self.net is not None:
                    self._sync()
                self.phase = self._phase()
            self._report()
            if self.phase in TERMINAL:
                self._teardown()
            self.wake.wait(self._timeout())
            self.wake.clear()
        self.node.hosts.remove(self.uid)  # a terminating pod's name no longer resolves
        if self.gone:
            self._kill_all(2)
            return
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE)
        self._kill_all(float(grace))
        if not self.passive and self.phase not in TERMINAL:
            self.phase = self._phase(deleted=True)
            self._report()
        self._delete_object()

    def _timeout(self) -> float:
        now = time.monotonic()
        due = [self.retry_at] if self.sandbox_error else []
        if self.net is not None and self.phase not in TERMINAL:
            due += [c.start_at for c in self._startable() if c.process is None]
        for c in self.containers:
            due += [p.next_at for p in (c.readiness, c.liveness) if p and c.process]
        if self.token_refresh_at is not None:
            due.append(self.token_refresh_at)
        wait = min(due, default=now + 30) - now
        return min(max(wait, 0.05), 30.0)

    # --- sandbox ---------------------------------------------------------------------------------
    def _setup_sandbox(self) -> None:
        """Network namespace, hosts file, credentials and volumes; retried while a
        referenced object (ServiceAccount, ConfigMap, Secret) is missing."""
        if time.monotonic() < self.retry_at:
            return
        from kubernetes.client.exceptions import ApiException

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.sa_dir = self._service_account()
            self.volumes = {
                v["name"]: self._volume(v) for v in self.pod["spec"].get("volumes") or []
            }
        except runtime.ConfigError as e:
            self._sandbox_failed(str(e))
            return
        except ApiException as e:  # e.g. the ServiceAccount does not exist yet
            self._sandbox_failed(api_message(e))
            return
        self.net = self.node.network.add_pod(self.uid)
        spec = self.pod["spec"]
        hostname = spec.get("hostname") or self.name[:63]
        self.node.hosts.add(
            self.uid,
            PodName(self.namespace, hostname, spec.get("subdomain", ""), self.net.ip,
                    self.dir / "hosts"),
        )  # fmt: skip
        self.sandbox_error = ""

    def _sandbox_failed(self, message: str) -> None:
        if message != self.sandbox_error:
            log.warning("pod %s: cannot start yet: %s", self.key, message)
        self.sandbox_error = message
        self.retry_at = time.monotonic() + 1.0
        for c in self.all_containers():
            c.state = {"waiting": {"reason": "ContainerCreating", "message": message}}

    def _service_account(self) -> Path | None:
        """The service account's token, CA and namespace in a directory to mount at
        /var/run/secrets/kubernetes.io/serviceaccount (TokenRequest, bound to the pod).

        Only for pods that name their account: with the ServiceAccount admission plugin
        off (as in the local control plane) a pod without one has none to bind a token to.
        """
        spec = self.pod["spec"]
        account = spec.get("serviceAccountName") or spec.get("serviceAccount")
        automount = spec.get("automountServiceAccountToken")
        if not account or automount is False:
            return None
        if automount is None:
            raw = self.node.core.read_namespaced_service_account(
                account, self.namespace, _preload_content=False
            )
            if json.loads(raw.data).get("automountServiceAccountToken") is False:
                return None
        token = self._request_token(account, None, TOKEN_SECONDS)
        sa_dir = self.dir / "serviceaccount"
        sa_dir.mkdir(exist_ok=True)
        _write_atomic(sa_dir / "token", token)
        _write_atomic(sa_dir / "ca.crt", self.node.ca_cert.decode())
        _write_atomic(sa_dir / "namespace", self.namespace)
        self.token_refresh_at = time.monotonic() + 0.8 * TOKEN_SECONDS
        return sa_dir

    def _request_token(self, account: str, audience: str | None, seconds: int) -> str:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": seconds,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.name,
                                   "uid": self.uid},
            },
        }  # fmt: skip
        raw = self.node.core.create_namespaced_service_account_token(
            account, self.namespace, body, _preload_content=False
        )
        return json.loads(raw.data)["status"]["token"]

    def _volume(self, volume: Mapping[str, Any]) -> Path:
        """The directory (or file) on this machine that stands for ``volume``."""
        name = volume["name"]
        target = self.dir / "volumes" / name
        if host := volume.get("hostPath"):
            path = Path(host["path"])
            kind = host.get("type", "")
            if kind == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate" and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            if not path.exists():
                raise runtime.ConfigError(f"hostPath {path} of volume {name!r} does not exist")
            return path
        target.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume:
            return target
        files: dict[str, str] = {}
        if "configMap" in volume or "secret" in volume:
            files = self._keyed_files(volume)
        elif "downwardAPI" in volume:
            files = self._downward_files(volume["downwardAPI"].get("items") or [])
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                if sa := source.get("serviceAccountToken"):
                    account = self.pod["spec"].get("serviceAccountName") or "default"
                    files[sa["path"]] = self._request_token(
                        account, sa.get("audience"), int(sa.get("expirationSeconds", 3600))
                    )
                elif "downwardAPI" in source:
                    files.update(self._downward_files(source["downwardAPI"].get("items") or []))
                else:
                    files.update(self._keyed_files(source))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise runtime.ConfigError(f"volume {name!r}: {kinds} volumes are not supported")
        for rel, text in files.items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(target / rel, text)
        return target

    def _keyed_files(self, source: Mapping[str, Any]) -> dict[str, str]:
        kind = "secret" if "secret" in source else "configmap"
        ref = source.get("secret") or source.get("configMap") or {}
        name = ref.get("secretName") or ref.get("name")
        data = self.node.lookup(kind, self.namespace, name)
        if data is None:
            if ref.get("optional"):
                return {}
            raise runtime.ConfigError(f"{kind} {name!r} not found")
        items = ref.get("items")
        if not items:
            return dict(data)
        return {i["path"]: data[i["key"]] for i in items if i["key"] in data}

    def _downward_files(self, items: list[Mapping[str, Any]]) -> dict[str, str]:
        out = {}
        for item in items:
            if "fieldRef" in item:
                out[item["path"]] = runtime._field(self.pod, item["fieldRef"]["fieldPath"])
            else:
                ref = item["resourceFieldRef"]
                container = next(c for c in self.containers if c.name == ref["containerName"])
                out[item["path"]] = runtime._resource(container.spec, ref, self.node.allocatable)
        return out

    def _teardown(self) -> None:
        """Remove the pod's network and names (its processes die with the namespace)."""
        if self.net is not None:
            self.node.hosts.remove(self.uid)
            self.node.network.remove_pod(self.uid)
            self.net = None

    # --- containers ------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Collect exits, start what is due (init containers first, one at a time), probe."""
        if self.token_refresh_at and time.monotonic() >= self.token_refresh_at:
            self._service_account()
        for c in self.all_containers():
            if c.process is not None and (code := c.process.exit_code()) is not None:
                self._exited(c, code)
        for c in self._startable():
            if c.process is None and time.monotonic() >= c.start_at:
                self._start(c)
        for c in self.containers:
            self._run_probes(c)

    def _startable(self) -> list[Container]:
        """Containers waiting to (re)start: the first unfinished init container, else the
        waiting containers."""
        pending_init = next((c for c in self.init_containers if c.exit_code != 0), None)
        candidates = [pending_init] if pending_init is not None else self.containers
        return [c for c in candidates if "waiting" in c.state]

    def _start(self, c: Container) -> None:
        assert self.net is not None
        status = {"hostIP": self.node.network.gateway, "podIP": self.net.ip,
                  "podIPs": [{"ip": self.net.ip}],
                  "hostIPs": [{"ip": self.node.network.gateway}]}  # fmt: skip
        pod = {**self.pod, "status": {**(self.pod.get("status") or {}), **status}}
        image = self.node.image
        try:
            env = runtime.container_env(
                pod, c.spec, image, self.node.service_env, self.node.lookup, self.node.allocatable
            )
            env.setdefault("HOSTNAME", self.pod["spec"].get("hostname") or self.name[:63])
            argv = runtime.container_argv(c.spec, env, image)
            mounts = self._mounts(c)
        except runtime.ConfigError as e:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            c.start_at = time.monotonic() + 1.0
            return
        workdir = image.workdir
        if wd := c.spec.get("workingDir"):
            mapped = image.map_path(wd)
            workdir = mapped if Path(mapped).is_dir() else workdir
        if c.logs:
            c.restart_count += 1
        log_path = self.dir / "logs" / c.name / f"{len(c.logs)}.log"
        c.logs.append(log_path)
        started = now_iso()
        try:
            process = runtime.start(
                argv, env, netns_path=self.net.netns_path,
                hostname=env["HOSTNAME"], workdir=workdir, mounts=mounts, log_path=log_path,
            )  # fmt: skip
        except FileNotFoundError as e:
            log_path.write_text(f"{e}\n")
            self._exited(c, 128, reason="StartError", message=str(e), started=started)
            return
        log.info("pod %s: started %s (pid %d): %s", self.key, c.name, process.pid, argv)
        c.process, c.env, c.killed_by_liveness = process, env, False
        c.state = {"running": {"startedAt": started}}
        c.ready = "readinessProbe" not in c.spec
        now = time.monotonic()
        for attr in ("readiness", "liveness"):
            spec = c.spec.get(f"{attr}Probe")
            setattr(
                c, attr, Probe(spec, now + spec.get("initialDelaySeconds", 0)) if spec else None
            )
        threading.Thread(target=self._await_exit, args=(process,), daemon=True).start()

    def _await_exit(self, process: runtime.Process) -> None:
        process.popen.wait()
        self.wake.set()

    def _mounts(self, c: Container) -> list[runtime.Mount]:
        assert self.net is not None
        mounts = [
            runtime.Mount(str(self.dir / "hosts"), "/etc/hosts"),
            runtime.Mount(str(self.dir / "resolv.conf"), "/etc/resolv.conf"),
        ]
        volume_mounts = list(c.spec.get("volumeMounts") or [])
        if self.sa_dir and not any(m["mountPath"] == SA_MOUNT for m in volume_mounts):
            mounts.append(runtime.Mount(str(self.sa_dir), SA_MOUNT, read_only=True))
        for vm in sorted(volume_mounts, key=lambda m: m["mountPath"].count("/")):
            if vm["name"] not in self.volumes:
                raise runtime.ConfigError(f"volumeMount {vm['name']!r} names no volume")
            source = self.volumes[vm["name"]]
            if sub := vm.get("subPath"):
                source = source / sub
                if not source.exists():
                    source.mkdir(parents=True)
            mounts.append(runtime.Mount(str(source), vm["mountPath"], bool(vm.get("readOnly"))))
        with self.node.paths_lock:
            for m in mounts:
                # The agent removes the mount points it made when it exits, except the
                # well-known token directory: another agent's pods may have it mounted.
                made = [] if m.target == SA_MOUNT else self.node.created_paths
                runtime.ensure_mountpoint(m.target, Path(m.source).is_file(), made)
        return mounts

    def _exited(
        self,
        c: Container,
        code: int,
        *,
        reason: str | None = None,
        message: str | None = None,
        started: str | None = None,
    ) -> None:
        """Record the container's end and apply the restart policy (with back-off)."""
        begun = started or (c.state.get("running") or {}).get("startedAt") or now_iso()
        terminated = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": begun,
            "finishedAt": now_iso(),
        }
        if c.process is not None:
            terminated["containerID"] = f"nodeagent://{c.process.pid}"
            if code > 128:
                terminated["signal"] = code - 128
            log.info("pod %s: %s exited with %d", self.key, c.name, code)
        if message or c.killed_by_liveness:
            terminated["message"] = message or "Container failed its liveness probe"
        c.process, c.ready = None, False
        c.state = {"terminated": terminated}
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if c.init:
            restart = code != 0 and policy != "Never"
        else:
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if restart and not self._deleting():
            delay = 0.0 if c.restart_count == 0 else self.node.backoff * 2 ** (c.restart_count - 1)
            delay = min(delay, self.node.backoff_cap)
            c.last_state = {"terminated": terminated}
            c.start_at = time.monotonic() + delay
            c.state = {"waiting": {"reason": "CrashLoopBackOff" if delay else "ContainerCreating",
                                   "message": f"back-off {delay:g}s restarting failed container="
                                   f"{c.name} pod={self.name}"}}  # fmt: skip

    def _kill_all(self, grace: float) -> None:
        """SIGTERM every running container's process group; SIGKILL what is left after
        ``grace`` seconds (all containers share the grace period, as on a kubelet)."""
        running = [c for c in self.all_containers() if c.process is not None]
        for c in running:
            c.process.signal_group(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + grace
        for c in running:
            try:
                c.process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                pass
        for c in running:
            process = c.process
            assert process is not None
            process.signal_group(signal.SIGKILL)
            process.popen.wait()
            self._exited(c, process.exit_code() or 0)

    # --- probes ----------------------------------------------------------------------------------
    def _run_probes(self, c: Container) -> None:
        now = time.monotonic()
        for probe, kind in ((c.readiness, "readiness"), (c.liveness, "liveness")):
            if probe is None or c.process is None or now < probe.next_at:
                continue
            probe.next_at = now + probe.spec.get("periodSeconds", 10)
            if self._probe_ok(c, probe.spec):
                probe.successes, probe.failures = probe.successes + 1, 0
            else:
                probe.successes, probe.failures = 0, probe.failures + 1
            if kind == "readiness":
                if probe.successes >= probe.spec.get("successThreshold", 1):
                    c.ready = True
                elif probe.failures >= probe.spec.get("failureThreshold", 3):
                    c.ready = False
            elif probe.failures >= probe.spec.get("failureThreshold", 3):
                log.info("pod %s: %s failed its liveness probe; restarting it", self.key, c.name)
                c.killed_by_liveness = True
                grace = probe.spec.get("terminationGracePeriodSeconds") or self.pod["spec"].get(
                    "terminationGracePeriodSeconds", DEFAULT_GRACE
                )
                process = c.process
                runtime.terminate(process, float(grace))
                self._exited(c, process.exit_code() or 0)

    def _probe_ok(self, c: Container, spec: Mapping[str, Any]) -> bool:
        assert self.net is not None
        timeout = float(spec.get("timeoutSeconds", 1))
        try:
            if get := spec.get("httpGet"):
                port = self._port(c, get["port"])
                host = get.get("host") or self.net.ip
                if get.get("scheme", "HTTP").upper() == "HTTPS":
                    conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                        host, port, timeout=timeout, context=ssl._create_unverified_context()
                    )
                else:
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                try:
                    headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                    conn.request("GET", get.get("path", "/"), headers=headers)
                    return 200 <= conn.getresponse().status < 400
                finally:
                    conn.close()
            if tcp := spec.get("tcpSocket"):
                with socket.create_connection((self.net.ip, self._port(c, tcp["port"])), timeout):
                    return True
            if exec_ := spec.get("exec"):
                assert c.process is not None
                cmd = ["nsenter", "-t", str(c.process.pid), "-n", "-m", "-u", "--",
                       *exec_["command"]]  # fmt: skip
                return subprocess.run(cmd, env=c.env, capture_output=True,
                                      timeout=timeout).returncode == 0  # fmt: skip
        except (OSError, subprocess.TimeoutExpired, http.client.HTTPException):
            return False
        return True  # grpc probes are not supported: they pass

    @staticmethod
    def _port(c: Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise OSError(f"container {c.name} has no port named {port!r}")

    # --- status ----------------------------------------------------------------------------------
    def _phase(self, deleted: bool = False) -> str:
        """The kubelet's rule (``getPhase``); a deleted pod ends Succeeded or Failed."""
        policy = "Never" if deleted else self.pod["spec"].get("restartPolicy", "Always")
        for c in self.init_containers:
            if c.exit_code == 0:
                continue
            if c.exit_code is not None and policy == "Never":
                return "Failed"
            return "Failed" if deleted else "Pending"
        running = waiting = stopped = succeeded = 0
        for c in self.containers:
            if "running" in c.state:
                running += 1
            elif "terminated" in c.state:
                stopped += 1
                succeeded += c.exit_code == 0
            elif c.last_state:
                stopped += 1
            else:
                waiting += 1
        if deleted:
            return "Succeeded" if stopped == succeeded == len(self.containers) else "Failed"
        if waiting:
            return "Pending"
        if running or policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if policy == "Never" else "Running"

    def _condition(self, type_: str, value: bool) -> dict[str, str]:
        status = "True" if value else "False"
        old = self._conditions.get(type_)
        if old is None or old["status"] != status:
            self._conditions[type_] = {"type": type_, "status": status,
                                       "lastTransitionTime": now_iso()}  # fmt: skip
        return self._conditions[type_]

    def status(self) -> dict[str, Any]:
        initialized = all(c.exit_code == 0 for c in self.init_containers)
        ready = (
            self.phase == "Running"
            and initialized
            and all(c.ready and "running" in c.state for c in self.containers)
        )
        status: dict[str, Any] = {
            "phase": self.phase,
            "startTime": self.start_time,
            "hostIP": self.node.network.gateway,
            "hostIPs": [{"ip": self.node.network.gateway}],
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("PodReadyToStartContainers", self.net is not None),
                self._condition("Initialized", initialized),
                self._condition("ContainersReady", ready),
                self._condition("Ready", ready),
            ],
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        if self.net is not None:
            status["podIP"] = self.net.ip
            status["podIPs"] = [{"ip": self.net.ip}]
        return status

    def _report(self) -> None:
        from kubernetes.client.exceptions import ApiException

        if self.passive:
            return
        status = self.status()
        if status == self._reported:
            return
        try:
            self.node.core.patch_namespaced_pod_status(
                self.name, self.namespace, {"status": status}, _preload_content=False
            )
            self._reported = status
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _delete_object(self) -> None:
        """Remove the pod from the API: grace 0 with a uid precondition (kubelet's last act)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.node.core.delete_namespaced_pod(
                self.name, self.namespace,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                _preload_content=False,
            )  # fmt: skip
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        log.info("pod %s: deleted", self.key)

    # --- for the log server ----------------------------------------------------------------------
    def log_file(self, container: str, previous: bool = False) -> Path | None:
        for c in self.all_containers():
            if c.name == container:
                index = -2 if previous else -1
                return c.logs[index] if len(c.logs) >= -index else None
        return None

    def is_running(self, container: str) -> bool:
        return any(c.name == container and c.process is not None for c in self.all_containers())


def api_message(e: Any) -> str:
    """The message of an ApiException's Status body (or its reason)."""
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
