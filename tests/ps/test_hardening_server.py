"""``python -m strategyjob.server`` is closed by default and bounded: it refuses to start
without a token (unless ``--insecure``, with a warning), listens on its own address only, says
in one line what is wrong with a bad ``TF_CONFIG``, refuses a call without the token before
reading its body, and serves a bounded number of calls at once. Real server processes on
127.0.0.1; memory is read from ``/proc``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch
from strategyjob.ps import _direct, _transport
from strategyjob.ps._transport import RUN_METHOD, RUN_STREAM_METHOD, Op
from strategyjob.ps._wire import CHANNEL_OPTIONS
from strategyjob.ps.server import MAX_CALLS_ENV, Server

from .conftest import SDK, free_ports

pytestmark = pytest.mark.timeout(180)

TOKEN = "the-jobs-token"


class ServerProcess:
    """One ``python -m strategyjob.server`` for the ps task of a one-ps cluster."""

    def __init__(self, tmp: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> None:
        (port,) = free_ports(1)
        self.address = f"127.0.0.1:{port}"
        self.port = port
        tf_config = {"cluster": {"ps": [self.address]}, "task": {"type": "ps", "index": 0}}
        full_env = dict(os.environ, PYTHONPATH=SDK, OMP_NUM_THREADS="1")
        full_env.update(TF_CONFIG=json.dumps(tf_config), **env)
        self.log = tmp / f"server{port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "strategyjob.server", *args],
                env={k: v for k, v in full_env.items() if v is not None},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        finally:
            channel.close()

    def memory_kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def server_process(tmp_path):
    started: list[ServerProcess] = []

    def start(env: dict[str, str], args: tuple[str, ...] = ()) -> ServerProcess:
        server = ServerProcess(tmp_path, env, args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def listeners(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


# -- closed by default ----------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, ""], ids=["unset", "empty"])
def test_server_without_a_token_refuses_to_start(server_process, token):
    server = server_process({_transport.TOKEN_ENV: token})
    server.proc.wait(timeout=60)
    output = server.log.read_text()
    assert server.proc.returncode == 2
    assert output.count("\n") == 1 and "Traceback" not in output, output
    assert "STRATEGYJOB_TOKEN is not set" in output and "--insecure" in output


def test_insecure_server_warns_and_serves_without_a_token(server_process, monkeypatch):
    server = server_process({_transport.TOKEN_ENV: None}, ("--insecure",))
    server.wait_ready()
    assert "WITHOUT a token (--insecure)" in server.log.read_text()
    monkeypatch.delenv(_transport.TOKEN_ENV)
    _transport.configure({"ps": [server.address]})
    try:
        _transport.run_ps_ops(0, [Op("create", "v", torch.ones(2))])
        (value,) = _transport.run_ps_ops(0, [Op("read", "v")])
        assert torch.equal(value, torch.ones(2))
    finally:
        _transport.close_channels()


def test_sigterm_stops_the_server_at_once_even_as_a_containers_first_process(server_process):
    """A container's first process ignores a signal it has no handler for: without the
    server's own, every ps and worker pod sat out its whole grace period (60 s) at each restart
    or end of its job. With it, SIGTERM ends the server at once with 128 + 15, as a shell says
    (a process killed by the default action would report -15 here)."""
    server = server_process({_transport.TOKEN_ENV: TOKEN})
    server.wait_ready()
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 143, server.log.read_text()
    assert time.monotonic() - started < 5
    assert "Traceback" not in server.log.read_text()


def test_server_listens_on_its_own_address_unless_told(server_process):
    own = server_process({_transport.TOKEN_ENV: TOKEN})
    own.wait_ready()
    # 127.0.0.1 only (gRPC may listen on it as ::ffff:127.0.0.1), not 0.0.0.0 or [::]
    assert len(listeners(own.port)) == 1
    assert listeners(own.port) <= {"0100007F", "0000000000000000FFFF00000100007F"}
    everywhere = server_process({_transport.TOKEN_ENV: TOKEN}, ("--bind", "::"))
    everywhere.wait_ready()
    assert listeners(everywhere.port) == {"0" * 32}  # [::]


# -- a bad TF_CONFIG: one line --------------------------------------------------------------


@pytest.mark.parametrize(
    "tf_config, says",
    [
        ("not json", "TF_CONFIG is not valid JSON"),
        ("[1, 2]", "TF_CONFIG must be a JSON object"),
        ('{"cluster": 5, "task": {"type": "ps", "index": 0}}', "`cluster` must be"),
        ('{"cluster": {"ps": ["nohostport"]}, "task": {"type": "ps", "index": 0}}', "host:port"),
        ('{"cluster": {"ps": ["127.0.0.1:x"]}, "task": {"type": "ps", "index": 0}}', "host:port"),
        ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 3}}', "index 3"),
        ('{"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": "a"}}', '(got "a")'),
        ('{"cluster": {"ps": ["192.0.2.1:2222"]}, "task": {"type": "ps", "index": 0}}', "--bind"),
        ("{}", "TF_CONFIG must name the cluster and this task"),
    ],
)
def test_bad_tf_config_gives_one_line(tf_config, says):
    env = dict(os.environ, PYTHONPATH=SDK, TF_CONFIG=tf_config, STRATEGYJOB_TOKEN=TOKEN)
    proc = subprocess.run(
        [sys.executable, "-m", "strategyjob.server"], env=env, capture_output=True, timeout=60
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("strategyjob.server: "), err
    assert says in err and "Traceback" not in err


# -- a call without the token is refused before its body is read ----------------------------

PAYLOAD = 256 << 20


def test_wrong_token_is_refused_before_the_request_is_read(server_process):
    server = server_process({_transport.TOKEN_ENV: TOKEN})
    server.wait_ready()
    payload = bytes(PAYLOAD)
    channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
    try:
        run = channel.unary_unary(RUN_METHOD)
        run(b"", metadata=((_transport.TOKEN_METADATA, TOKEN),), timeout=30)  # warm up
        before = server.memory_kib("VmHWM")
        for md in (((_transport.TOKEN_METADATA, "wrong"),), ()):
            with pytest.raises(grpc.RpcError) as refused:
                run(payload, metadata=md, timeout=60)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stream = _transport.open_stream(server.address, RUN_STREAM_METHOD, md)
            with pytest.raises(grpc.RpcError) as refused:
                stream.call(payload)
            stream.close()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # gRPC's transport buffers a little of each refused body (33 MB seen once over four
        # 256 MiB calls on a loaded host): far below a read, which costs the whole payload.
        grown = server.memory_kib("VmHWM") - before
        assert grown < (PAYLOAD >> 10) // 4, f"the server's peak memory grew by {grown} KiB"
        # The measure sees a request that is read: the same bytes with the token (a request
        # the ps cannot decode) raise the server's peak by their size.
        with pytest.raises(grpc.RpcError):
            run(payload, metadata=((_transport.TOKEN_METADATA, TOKEN),), timeout=60)
        assert server.memory_kib("VmHWM") - before > (PAYLOAD >> 10) * 3 // 4
    finally:
        channel.close()
        _transport.close_channels()


# -- concurrent calls are bounded -----------------------------------------------------------


@pytest.mark.parametrize("direct_server", [True, False], ids=["direct-server", "grpc-server"])
def test_concurrent_calls_per_server_are_bounded(monkeypatch, direct_server):
    if direct_server and not _direct.SERVER_SUPPORTED:
        pytest.skip("grpc's private layer differs from what ps/_direct uses")
    monkeypatch.setattr(_direct, "SERVER_SUPPORTED", direct_server)
    monkeypatch.setenv(MAX_CALLS_ENV, "2")
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    server = Server({"ps": [address]}, job_name="ps", task_index=0)
    md = _transport.metadata()
    request = _transport.encode_ops([Op("read", "v")])
    streams = []
    try:
        _transport.run_ps_ops(0, [Op("create", "v", torch.ones(3))])
        _transport.close_channels()  # no stream of run_ps_ops stays open

        def open_when_free(what: str) -> None:
            """A stream whose first call is served, once the server has let go of calls that
            ended (it learns of an end a moment after the client; longer under load)."""
            deadline = time.monotonic() + 30
            while True:
                stream = _transport.open_stream(address, RUN_STREAM_METHOD, md)
                try:
                    reply = stream.call(request)
                    streams.append(stream)
                    assert torch.equal(_transport.decode_results(reply)[0], torch.ones(3))
                    return
                except grpc.RpcError as exc:
                    stream.close()
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert time.monotonic() < deadline, what
                    time.sleep(0.05)  # poll interval of a deadline-bounded wait

        for _ in range(2):
            open_when_free("the setup call's place was not freed")
        extra = _transport.open_stream(address, RUN_STREAM_METHOD, md)
        with pytest.raises(grpc.RpcError) as refused:
            extra.call(request)
        extra.close()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # A call that ends frees its place.
        streams.pop().close()
        open_when_free("the ended call's place was not freed")
    finally:
        for stream in streams:
            stream.close()
        _transport.close_channels()
        server.stop(0)
