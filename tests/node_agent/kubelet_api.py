"""The part of the kubelet's HTTPS API that ``kubectl logs`` needs.

kube-apiserver proxies ``pods/log`` to ``https://<node InternalIP>:<kubeletEndpoint
port>/containerLogs/<namespace>/<pod>/<container>`` (without verifying the serving
certificate unless ``--kubelet-certificate-authority`` is set), so serving that path from
the container log files is enough for ``kubectl logs`` (``--previous``, ``--tail``,
``--limit-bytes``, ``-f``) to work against the agent's pods.
"""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from node_agent.pods import PodWorker

FindPod = Callable[[str, str], PodWorker | None]


def self_signed_cert(directory: Path, host: str) -> tuple[Path, Path]:
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7",
         "-subj", "/CN=strategyjob-node-agent", "-addext", f"subjectAltName=IP:{host}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class KubeletServer:
    """``/containerLogs`` and ``/healthz`` over HTTPS, in a background thread."""

    def __init__(self, host: str, find_pod: FindPod, cert_dir: Path) -> None:
        cert, key = self_signed_cert(cert_dir, host)
        handler = type("Handler", (_Handler,), {"find_pod": staticmethod(find_pod)})
        self.server = ThreadingHTTPServer((host, 0), handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> KubeletServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    find_pod: FindPod

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["healthz"]:
            return self._reply(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._reply(404, b"not found")
        _, namespace, name, container = parts
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        worker = self.find_pod(namespace, name)
        path = worker.log_file(container, query.get("previous") == "true") if worker else None
        if worker is None or path is None or not path.exists():
            what = (
                "previous terminated container" if query.get("previous") == "true" else "container"
            )
            return self._reply(400, f'{what} "{container}" in pod "{name}" has no logs'.encode())
        data = path.read_bytes()
        if tail := query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail) :]) if int(tail) > 0 else b""
        if limit := query.get("limitBytes"):
            data = data[: int(limit)]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(data)
        if query.get("follow") == "true" and not limit:
            self._follow(worker, container, path, path.stat().st_size)

    def _follow(self, worker: PodWorker, container: str, path: Path, offset: int) -> None:
        """Stream what the container writes until it stops (or the client goes away)."""
        with open(path, "rb") as f:
            f.seek(offset)
            while True:
                chunk = f.read(65536)
                if chunk:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                elif not worker.is_running(container) or worker.log_file(container) != path:
                    self.wfile.write(f.read())  # what it wrote just before it stopped
                    return
                else:
                    time.sleep(0.2)

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
