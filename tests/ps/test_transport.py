"""The wire: tensors as raw bytes (never pickled), functions by value, big tensors, tokens."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import strategyjob
import torch
from strategyjob import errors
from strategyjob.ps import _remote, _transport
from strategyjob.ps._wire import dumps, from_proto, loads, to_proto
from strategyjob.ps.coordinator import ClusterCoordinator
from strategyjob.ps.server import Server
from strategyjob.strategies.parameter_server import ParameterServerStrategy

from .conftest import SDK, free_ports

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 4),
        torch.tensor(2.5, dtype=torch.float64),
        torch.arange(6, dtype=torch.int64).reshape(2, 3),
        torch.tensor([True, False]),
        torch.randn(2, 2).to(torch.bfloat16),
        torch.zeros(0, 5),
        torch.randn(4, 4).t(),  # non-contiguous
    ],
)
def test_tensor_round_trip(tensor):
    message = to_proto(tensor)
    assert list(message.shape) == list(tensor.shape)
    assert len(message.data) == tensor.numel() * tensor.element_size()
    assert torch.equal(from_proto(message), tensor)


def test_tensors_are_never_pickled():
    big = torch.full((1000,), 7.0)
    payload, tensors = dumps({"f": lambda x: x + big, "t": big})
    assert len(payload) < 2000 and len(tensors) >= 1
    assert torch.tensor(7.0).numpy().tobytes() * 10 not in payload  # the raw data is not inside
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(payload)  # needs the side list of tensors
    obj = loads(payload, tensors)
    assert torch.equal(obj["f"](torch.zeros(1000)), big)


def test_module_ships_as_handles_not_weights():
    ref = _remote.ParamRef(key="k", task=0, shape=(100_000, 64), dtype=torch.float32)
    weight = torch.nn.Parameter(torch.zeros(2, 2))
    weight._sj_ref = ref
    layer = torch.nn.Linear(2, 2)
    layer.weight = weight
    payload, tensors = dumps(layer, _remote.coordinator_hook)
    assert len(tensors) == 1  # the bias only: the weight went as its ps reference
    state = _remote.worker_state()
    touched: list = []
    rebuilt = loads(payload, tensors, state.loader(touched))
    assert touched == [ref] and rebuilt.weight.shape == (100_000, 64)


@pytest.fixture
def token_ps(monkeypatch):
    (port,) = free_ports(1)
    cluster = {"ps": [f"127.0.0.1:{port}"]}
    monkeypatch.setenv(_transport.TOKEN_ENV, "s3cret")
    server = Server(cluster, job_name="ps", task_index=0)
    yield server
    server.stop(0)


def test_token_is_required_when_set(token_ps, monkeypatch):
    op = _remote.var_op("create", "x", torch.ones(2))
    _transport.run_ps_ops(0, [op])  # this process carries the token
    monkeypatch.setenv(_transport.TOKEN_ENV, "wrong")
    with pytest.raises(errors.PermissionDeniedError, match="token"):
        _transport.run_ps_ops(0, [_remote.var_op("read", "x")])
    monkeypatch.delenv(_transport.TOKEN_ENV)
    with pytest.raises(errors.PermissionDeniedError, match="STRATEGYJOB_TOKEN"):
        _transport.run_ps_ops(0, [_remote.var_op("read", "x")])


def test_large_tensor_round_trip(token_ps):
    table = torch.randn(100_000, 64)  # 25.6 MB in one message
    _transport.run_ps_ops(0, [_remote.var_op("create", "table", table)])
    (back,) = _transport.run_ps_ops(0, [_remote.var_op("read", "table")])
    assert torch.equal(back, table)
    (rows,) = _transport.run_ps_ops(
        0, [_remote.var_op("gather", "table", indices=torch.tensor([99_999, 0]))]
    )
    assert torch.equal(rows, table[[99_999, 0]])


def test_server_main_needs_tf_config():
    env = dict(os.environ, PYTHONPATH=SDK, TF_CONFIG=json.dumps({}))
    proc = subprocess.run(
        [sys.executable, "-m", "strategyjob.server"], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 2
    assert b"TF_CONFIG must name the cluster and this task" in proc.stderr


def test_token_across_processes(make_cluster, monkeypatch):
    cluster = make_cluster(workers=1, ps=1, env={_transport.TOKEN_ENV: "job-token"})
    monkeypatch.setenv(_transport.TOKEN_ENV, "job-token")
    strategy = ParameterServerStrategy(cluster.resolver())
    with strategy.scope():
        v = strategyjob.Variable(1.0, name="v")
    coordinator = ClusterCoordinator(strategy)
    assert coordinator.schedule(lambda: v.assign_add(1.0)).fetch() == 2.0
    monkeypatch.setenv(_transport.TOKEN_ENV, "intruder")
    with pytest.raises(errors.PermissionDeniedError):
        v.read_value()
    # A coordinator without the token gets the error, not a hang: from join(), or already
    # from schedule() when its worker thread was refused before (it connects at once).
    intruder = ClusterCoordinator(ParameterServerStrategy(cluster.resolver()))
    with pytest.raises(errors.PermissionDeniedError, match="token"):
        intruder.schedule(lambda: 1)
        intruder.join()
