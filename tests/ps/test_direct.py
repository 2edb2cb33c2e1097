"""Streams made and served on the threads that use them (``ps/_direct``), grpc's own streaming
calls where those are not available, and the serving process's malloc settings."""

from __future__ import annotations

import ctypes
import signal
import threading
from concurrent import futures

import grpc
import pytest
import torch
from strategyjob import errors
from strategyjob import server as server_main
from strategyjob.ps import _direct, _transport
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._transport import Op
from strategyjob.ps._wire import CHANNEL_OPTIONS
from strategyjob.ps.server import Server

from .conftest import free_ports

pytestmark = pytest.mark.timeout(120)

direct_only = pytest.mark.skipif(
    not (_direct.CLIENT_SUPPORTED and _direct.SERVER_SUPPORTED),
    reason="grpc's private layer differs from what ps/_direct uses",
)
ECHO, FAIL, CRASH = "/t.T/Echo", "/t.T/Fail", "/t.T/Crash"


def _fail(request: bytes) -> bytes:
    raise _direct.Status(grpc.StatusCode.NOT_FOUND, f"no {request.decode()}")


def _crash(request: bytes) -> bytes:
    raise RuntimeError("boom")


class _EchoServer:
    """A bare grpc server whose streaming methods are served by ``DirectStreams``."""

    def __init__(self, token: str | None = None) -> None:
        (port,) = free_ports(1)
        self.address = f"127.0.0.1:{port}"
        self.server = grpc.server(futures.ThreadPoolExecutor(4), options=CHANNEL_OPTIONS)
        self.name = f"echo{port}"
        self.streams = _direct.DirectStreams(
            self.server,
            {ECHO: lambda request: request[::-1], FAIL: _fail, CRASH: _crash},
            _direct.token_check(token, "no token"),
            name=self.name,
        )
        assert self.server.add_insecure_port(self.address)
        self.server.start()
        self.streams.start()
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        grpc.channel_ready_future(self.channel).result(timeout=30)

    def threads(self, kind: str) -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == f"{self.name}-{kind}"]

    def stop(self) -> None:
        self.server.stop(0)
        self.channel.close()


@pytest.fixture
def echo():
    server = _EchoServer()
    yield server
    server.stop()


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), thread.name


@direct_only
def test_requests_get_their_replies_in_order(echo):
    stream = _direct.DirectStream(echo.channel, ECHO, ())
    big = bytes(range(256)) * 12_000  # 3 MB
    for request in (b"abc", big, b"x"):
        assert stream.call(request) == request[::-1]
    assert stream.alive()
    stream.close()
    assert not stream.alive()


@direct_only
@pytest.mark.parametrize(
    ("method", "code", "details"),
    [(FAIL, grpc.StatusCode.NOT_FOUND, "no key"), (CRASH, grpc.StatusCode.UNKNOWN, "boom")],
)
def test_a_failed_request_ends_only_its_call(echo, method, code, details):
    stream = _direct.DirectStream(echo.channel, method, ())
    with pytest.raises(_direct.StreamEnded) as failure:
        stream.call(b"key")
    assert failure.value.code() == code
    assert details in failure.value.details()
    assert not stream.alive()
    with pytest.raises(_direct.StreamEnded):  # the stream is of no further use
        stream.call(b"key")
    stream.close()
    assert _direct.DirectStream(echo.channel, ECHO, ()).call(b"ok") == b"ko"


@direct_only
def test_token_is_checked_on_direct_streams():
    server = _EchoServer(token="tok")
    try:
        good = _direct.DirectStream(server.channel, ECHO, (("strategyjob-token", "tok"),))
        assert good.call(b"ab") == b"ba"
        for md in ((), (("strategyjob-token", "bad"),)):
            with pytest.raises(_direct.StreamEnded) as failure:
                _direct.DirectStream(server.channel, ECHO, md).call(b"ab")
            assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert failure.value.details() == "no token"
        good.close()
    finally:
        server.stop()


@direct_only
def test_closing_a_stream_ends_its_server_thread(echo):
    stream = _direct.DirectStream(echo.channel, ECHO, ())
    assert stream.call(b"ab") == b"ba"
    (thread,) = echo.threads("stream")
    stream.close()
    assert stream._due == 0  # every event of the call was taken: grpc frees it
    _join([thread])


@direct_only
def test_stopping_the_server_ends_open_streams(echo):
    streams = [_direct.DirectStream(echo.channel, ECHO, ()) for _ in range(3)]
    for stream in streams:
        assert stream.call(b"ab") == b"ba"
    serving = echo.threads("stream") + echo.threads("calls")
    assert len(serving) == 4
    echo.server.stop(0)
    _join(serving)
    for stream in streams:
        with pytest.raises(grpc.RpcError):
            stream.call(b"ab")
        stream.close()


class _Interrupted(Exception):
    pass


@direct_only
def test_an_interrupted_call_leaves_a_closed_stream():
    """A signal handler raising while the call waits (Ctrl-C): grpc drops the call, the
    stream knows it has nothing left to take from it."""
    started, release = threading.Event(), threading.Event()

    def slow(request: bytes) -> bytes:
        started.set()
        release.wait(60)
        return request

    server = _EchoServer()
    server.streams._methods[ECHO] = slow

    def interrupt(signum, frame):
        raise _Interrupted

    def signal_once_waiting() -> None:
        if started.wait(60):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        stream = _direct.DirectStream(server.channel, ECHO, ())
        threading.Thread(target=signal_once_waiting, daemon=True).start()
        with pytest.raises(_Interrupted):
            stream.call(b"ab")
        assert not stream.alive()
        stream.close()  # nothing left to take: returns at once
        release.set()
        server.streams._methods[ECHO] = lambda request: request[::-1]
        assert _direct.DirectStream(server.channel, ECHO, ()).call(b"ab") == b"ba"
    finally:
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        server.stop()


# -- the ps and worker servers, with and without direct streams --------------------------------


@pytest.fixture
def fresh_transport():
    """Streams and channels of this test only (the cluster is reconfigured by ``Server``)."""
    _transport.close_channels()
    yield
    _transport.close_channels()


@pytest.mark.usefixtures("fresh_transport")
@pytest.mark.parametrize("direct_client", [True, False], ids=["direct-client", "grpc-client"])
@pytest.mark.parametrize("direct_server", [True, False], ids=["direct-server", "grpc-server"])
def test_ps_streams_with_and_without_direct_calls(monkeypatch, direct_client, direct_server):
    if (direct_client or direct_server) and not (
        _direct.CLIENT_SUPPORTED and _direct.SERVER_SUPPORTED
    ):
        pytest.skip("grpc's private layer differs from what ps/_direct uses")
    monkeypatch.setattr(_direct, "SERVER_SUPPORTED", direct_server)
    monkeypatch.setattr(_transport, "_direct_client", direct_client)
    (port,) = free_ports(1)
    cluster = {"ps": [f"127.0.0.1:{port}"]}
    server = Server(cluster, job_name="ps", task_index=0)
    try:
        assert (server._direct is not None) == direct_server
        _transport.run_ps_ops(0, [Op("create", "v", torch.arange(4.0))])
        (value,) = _transport.run_ps_ops(0, [Op("read", "v")])
        assert torch.equal(value, torch.arange(4.0))
        (idle,) = _transport._idle_streams[(cluster["ps"][0], _transport.metadata())]
        assert isinstance(idle, _direct.DirectStream) == direct_client
        with pytest.raises(errors.OpError, match="is not on this parameter server"):
            _transport.run_ps_ops(0, [Op("read", "missing")])
        (value,) = _transport.run_ps_ops(0, [Op("read", "v")])  # on a new stream
        assert torch.equal(value, torch.arange(4.0))
    finally:
        _transport.close_channels()  # the client's streams first: it half-closes or cancels
        server.stop(0)


@pytest.mark.usefixtures("fresh_transport")
@pytest.mark.parametrize("direct_server", [True, False], ids=["direct-server", "grpc-server"])
def test_closure_stream_rejects_an_undecodable_request(monkeypatch, direct_server):
    if direct_server and not _direct.SERVER_SUPPORTED:
        pytest.skip("grpc's private layer differs from what ps/_direct uses")
    monkeypatch.setattr(_direct, "SERVER_SUPPORTED", direct_server)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    server = Server({"worker": [address]}, job_name="worker", task_index=0)
    try:
        md = _transport.metadata()  # the session's token (conftest)
        stream = _transport.open_stream(address, "/strategyjob.ps.Worker/RunClosureStream", md)
        reply = pb.ClosureResult.FromString(stream.call(pb.Closure().SerializeToString()))
        assert reply.error_kind == "missing_function"  # a closure without its function
        with pytest.raises(grpc.RpcError) as failure:
            stream.call(b"\xff\xff")
        assert failure.value.code() == grpc.StatusCode.INTERNAL
        stream.close()
    finally:
        server.stop(0)


# -- malloc settings of a serving process -------------------------------------------------------


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

        def mallopt(param: int, value: int) -> int:
            self.calls.append((param, value))
            return 1

        self.mallopt = mallopt


def test_malloc_keeps_step_buffers_unless_told_otherwise(monkeypatch):
    libc = _Libc()
    monkeypatch.setattr(ctypes, "CDLL", lambda _name: libc)
    for env in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(env, raising=False)
    server_main._tune_malloc()
    assert libc.calls == [(-3, 32 << 20), (-1, 128 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    libc.calls.clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")  # the user's setting wins
    server_main._tune_malloc()
    assert libc.calls == [(-3, 32 << 20)]


def test_malloc_settings_skipped_without_mallopt(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda _name: object())  # a libc without mallopt
    server_main._tune_malloc()  # nothing to do, no error
