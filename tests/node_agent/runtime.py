"""The container runtime of the node agent: a container is a local process.

Its environment is computed from the pod spec as the kubelet does (``env`` with
``$(VAR)`` expansion, ``valueFrom`` field, resource, ConfigMap and Secret references,
``envFrom``) on top of the "image" environment the agent was given. The process runs in
the pod's network namespace, in a private mount and UTS namespace of its own where the
pod's hosts file, resolv.conf and volumes are bind-mounted and the hostname is the pod's:

    nsenter --net=<pod netns> unshare --mount --uts --propagation private \\
        sh -c '<hostname; mount --bind ...; cd <workdir>; exec "$@"' sh <command> <args>

nsenter, unshare and sh all ``exec``, so the process the agent started *is* the
container's program, leader of its own process group. The image is ignored: ``python``
and ``python3`` are the agent's interpreter and ``--image-path`` maps paths inside the
image to directories of this machine.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_VAR_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class ConfigError(Exception):
    """The container cannot start yet (kubelet: CreateContainerConfigError)."""


@dataclass(frozen=True)
class ImageConfig:
    """What stands in for the images: their environment, default commands and paths."""

    env: Mapping[str, str]
    workdir: str
    commands: Mapping[str, list[str]] = field(default_factory=dict)
    paths: Mapping[str, str] = field(default_factory=dict)

    def map_path(self, path: str) -> str:
        for image_dir, host_dir in self.paths.items():
            if path == image_dir or path.startswith(image_dir.rstrip("/") + "/"):
                return host_dir + path[len(image_dir.rstrip("/")) :]
        return path

    def command_for(self, image: str) -> list[str]:
        """The configured entrypoint of ``image`` (matched without tag or digest, with or
        without its registry path)."""
        name = image.split("@", 1)[0]
        last = name.rsplit("/", 1)[-1]
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
        command = self.commands.get(name) or self.commands.get(name.rsplit("/", 1)[-1])
        return list(command or [])


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)``: defined variables are replaced, others stay, ``$$`` is ``$``."""

    def replace(m: re.Match[str]) -> str:
        return "$" if m.group(1) is None else variables.get(m.group(1), m.group(0))

    return _VAR_REFERENCE.sub(replace, text)


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``128Mi``, ``1G``) as a number."""
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not m or m.group(2) not in ("", *suffixes):
        raise ConfigError(f"cannot parse the quantity {text!r}")
    return float(m.group(1)) * suffixes.get(m.group(2), 1)


Lookup = Callable[[str, str, str], dict[str, str] | None]
"""``lookup(kind, namespace, name)``: a ConfigMap's or Secret's data (decoded), or None."""


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    if m := _FIELD_LABEL.match(path):
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.hostIP": status.get("hostIP"),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
    }
    if path not in values:
        raise ConfigError(f"fieldRef {path!r} is not supported by the node agent")
    return str(values[path] or "")


def _resource(container: Mapping[str, Any], ref: Mapping[str, Any], node: Mapping[str, str]):
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name) or (resources.get("limits") or {}).get(name)
    quantity = parse_quantity(value if value is not None else node.get(name, "0"))
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(math.ceil(quantity / divisor))


def _keyed(lookup: Lookup, kind: str, namespace: str, ref: Mapping[str, Any]) -> str | None:
    data = lookup(kind, namespace, ref["name"])
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = (
            f"key {ref['key']!r} of {kind} {ref['name']!r}" if data else f"{kind} {ref['name']!r}"
        )
        raise ConfigError(f"{what} not found")
    return data[ref["key"]]


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    image: ImageConfig,
    service_env: Mapping[str, str],
    lookup: Lookup,
    node_allocatable: Mapping[str, str],
) -> dict[str, str]:
    """The environment of ``container``: image env, then service variables, ``envFrom``
    and ``env`` (each ``$(VAR)`` expanded against what the pod declared before it)."""
    namespace = pod["metadata"]["namespace"]
    declared: dict[str, str] = dict(service_env)
    for source in container.get("envFrom") or []:
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if ref := source.get(key):
                data = lookup(kind, namespace, ref["name"])
                if data is None and not ref.get("optional"):
                    raise ConfigError(f"{kind} {ref['name']!r} not found")
                for k, v in (data or {}).items():
                    declared[source.get("prefix", "") + k] = v
    for entry in container.get("env") or []:
        name, source = entry["name"], entry.get("valueFrom")
        if source is None:
            declared[name] = expand(str(entry.get("value", "")), declared)
        elif "fieldRef" in source:
            declared[name] = _field(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            declared[name] = _resource(container, source["resourceFieldRef"], node_allocatable)
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "configmap" if "configMapKeyRef" in source else "secret"
            value = _keyed(lookup, kind, namespace, source.get("configMapKeyRef")
                           or source["secretKeyRef"])  # fmt: skip
            if value is not None:
                declared[name] = value
        else:
            raise ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return {**image.env, **declared}


def container_argv(
    container: Mapping[str, Any], env: Mapping[str, str], image: ImageConfig
) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded, ``python`` the agent's interpreter
    and image paths mapped; an empty ``command`` is the image's, as configured."""
    command = list(container.get("command") or []) or image.command_for(container.get("image", ""))
    if not command:
        raise ConfigError(
            f"container {container['name']!r} has no command and the node agent knows no "
            f"entrypoint for image {container.get('image')!r} (see --image-command)"
        )
    argv = [
        image.map_path(expand(str(a), env)) for a in command + list(container.get("args") or [])
    ]
    if _PYTHON.match(argv[0]):
        argv[0] = sys.executable
    return argv


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass
class Process:
    """A running container process and where its output goes."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def exit_code(self) -> int | None:
        """The exit code as a container runtime reports it (128 + signal when killed)."""
        rc = self.popen.poll()
        return None if rc is None else (128 - rc if rc < 0 else rc)


def start(
    argv: list[str],
    env: Mapping[str, str],
    *,
    netns_path: str,
    hostname: str,
    workdir: str,
    mounts: list[Mount],
    log_path: Path,
) -> Process:
    """Start the container's process in the pod's namespaces (see the module docstring).
    Raises FileNotFoundError when the program does not exist here."""
    program = argv[0]
    if "/" not in program and shutil.which(program, path=env.get("PATH")) is None:
        raise FileNotFoundError(f'exec: "{program}": executable file not found in $PATH')
    steps = [f"PATH={_TOOLS_PATH} hostname {shlex.quote(hostname)}"]
    for m in mounts:
        src, dst = shlex.quote(m.source), shlex.quote(m.target)
        steps.append(f"PATH={_TOOLS_PATH} mount --bind {src} {dst}")
        if m.read_only:
            steps.append(f"PATH={_TOOLS_PATH} mount -o remount,bind,ro {dst}")
    steps += [f"cd {shlex.quote(workdir)}", 'exec "$@"']
    script = "set -e\n" + "\n".join(steps)
    wrapper = [
        "nsenter", f"--net={netns_path}", "--",
        "unshare", "--mount", "--uts", "--propagation", "private", "--",
        "/bin/sh", "-c", script, "sh",
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            wrapper + argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )
    return Process(popen, log_path)


def ensure_mountpoint(target: str, is_file: bool, created: list[str]) -> None:
    """Create a missing mount point on this machine's file system (the pod's mount namespace
    shares it), remembering what was made so that the agent removes it when it exits."""
    path = Path(target)
    if path.exists():
        return
    missing = [p for p in (path, *path.parents) if not p.exists()]
    if is_file:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    else:
        path.mkdir(parents=True, exist_ok=True)
    created.extend(str(p) for p in missing)


def terminate(process: Process, grace: float) -> None:
    """SIGTERM the container's process group, SIGKILL it after ``grace`` seconds."""
    process.signal_group(signal.SIGTERM)
    try:
        process.popen.wait(timeout=max(grace, 0))
    except subprocess.TimeoutExpired:
        pass
    process.signal_group(signal.SIGKILL)
    process.popen.wait()
