"""kube-proxy's one job here: the ``kubernetes`` Service. In-cluster clients dial
``https://kubernetes.default.svc:443`` (kopf's service-account login hard-codes it); pods
resolve that name to the bridge's gateway, where this forwards each TCP connection to the
API server wherever it listens (e.g. 127.0.0.1 and a random port). TLS passes through
untouched: the API server's certificate names ``kubernetes.default.svc``."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forward connections accepted on ``listen`` to ``target``, both ways, until either
    side closes."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen, reuse_port=False)
        self.address = self.server.getsockname()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="service-proxy")

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self.server.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            _Connection(client, upstream).start()


class _Connection:
    """One proxied connection: two pumps; the last one to finish closes both sockets."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.pumping = 2
        self.lock = threading.Lock()

    def start(self) -> None:
        for source, sink in ((self.client, self.upstream), (self.upstream, self.client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        try:
            sink.shutdown(socket.SHUT_WR)  # pass the end of the stream on
        except OSError:
            pass
        with self.lock:
            self.pumping -= 1
            last = self.pumping == 0
        if last:
            self.client.close()
            self.upstream.close()
