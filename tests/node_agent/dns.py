"""Cluster DNS without a DNS server: every pod gets its own ``/etc/hosts`` (bind-mounted in
the pod's mount namespace) listing the API server and every pod on this agent that has a
``hostname`` and ``subdomain`` (the names a headless Service gives), as CoreDNS would
answer them: ``<hostname>.<subdomain>.<namespace>.svc.cluster.local``, the shorter
``...svc`` and ``<hostname>.<subdomain>.<namespace>`` forms, and ``<hostname>.<subdomain>``
within the pod's own namespace.

glibc reads ``/etc/hosts`` on every lookup and so does gRPC's c-ares resolver, so a pod
that appears later (or comes back with a new address) becomes resolvable at once. Files
are rewritten in place (the bind mount pins the inode), padded with a comment rather than
truncated, so that a concurrent reader never sees an empty file.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"
#: What pods resolve for the API server (it is in kube-apiserver's certificate).
API_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")
#: Lookups of unknown names fail at once instead of waiting for an unreachable server.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


@dataclass(frozen=True)
class PodName:
    namespace: str
    hostname: str
    subdomain: str
    ip: str
    hosts_file: Path

    def service_names(self, for_namespace: str) -> list[str]:
        if not self.subdomain:
            return []
        base = f"{self.hostname}.{self.subdomain}.{self.namespace}"
        names = [f"{base}.svc.{CLUSTER_DOMAIN}", f"{base}.svc", base]
        if for_namespace == self.namespace:
            names.append(f"{self.hostname}.{self.subdomain}")
        return names


class HostsFiles:
    """The hosts files of every pod of the agent, kept consistent with each other."""

    def __init__(self, api_ip: str) -> None:
        self.api_ip = api_ip
        self._pods: dict[str, PodName] = {}
        self._lock = threading.Lock()

    def add(self, key: str, pod: PodName) -> None:
        pod.hosts_file.touch()
        pod.hosts_file.with_name("resolv.conf").write_text(RESOLV_CONF)
        with self._lock:
            self._pods[key] = pod
            self._rewrite()

    def remove(self, key: str) -> None:
        with self._lock:
            if self._pods.pop(key, None) is not None:
                self._rewrite()

    def _rewrite(self) -> None:
        for pod in self._pods.values():
            write_in_place(pod.hosts_file, self.render(pod))

    def render(self, pod: PodName) -> str:
        own = [*pod.service_names(pod.namespace)[:1], pod.hostname]  # canonical name first
        lines = [
            "# written by the StrategyJob node agent",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{pod.ip}\t{' '.join(own)}",
            f"{self.api_ip}\t{' '.join(API_NAMES)} kubernetes.default.svc.{CLUSTER_DOMAIN}",
        ]
        for other in sorted(self._pods.values(), key=lambda p: p.ip):
            if names := other.service_names(pod.namespace):
                lines.append(f"{other.ip}\t{' '.join(names)}")
        return "\n".join(lines) + "\n"


def write_in_place(path: Path, text: str) -> None:
    """Overwrite ``path`` with one write, never shrinking it (a shorter text is padded
    with a comment line), so that readers see either the old or the new entries."""
    data = text.encode()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        old = os.fstat(fd).st_size
        if len(data) < old:
            data += b"#" * (old - len(data) - 1) + b"\n"
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
