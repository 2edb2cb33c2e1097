"""The in-memory transport runs the ps servers' own op execution: the same results, update ids
and errors (TensorFlow's, naming the ps) as a ps process reached over gRPC."""

from __future__ import annotations

import pytest
import torch
from strategyjob import errors
from strategyjob.ps import _cluster, _transport
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._inmemory import InMemoryTransport
from strategyjob.ps._transport import Op

UNKNOWN_OPTIMIZER = '{"key": "o", "cls": "no.such.module:Opt", "hparams": {}}'


def test_both_transports_implement_the_protocols():
    memory = InMemoryTransport(num_workers=2, num_ps=3)
    grpc = _cluster.GrpcTransport()
    assert isinstance(memory, _cluster.PSTransport) and isinstance(grpc, _cluster.PSTransport)
    assert (memory.num_workers, memory.num_ps) == (2, 3)
    assert isinstance(memory.worker(1), _cluster.WorkerClient)
    assert isinstance(_cluster.GrpcWorkerClient(0, "127.0.0.1:1"), _cluster.WorkerClient)


@pytest.mark.parametrize(
    ("ops", "error", "message"),
    [
        (
            [Op("read", "missing")],
            errors.OpError,
            "/job:ps/replica:0/task:0: Variable 'missing' is not on this parameter server",
        ),
        ([Op("frobnicate", "v")], ValueError, "Unknown variable operation 'frobnicate'"),
        (
            [Op("apply_dense", "v", torch.ones(2), optimizer="not json")],
            ValueError,
            "got a malformed optimizer description",
        ),
        (
            [Op("apply_dense", "v", torch.ones(2), optimizer=UNKNOWN_OPTIMIZER)],
            ValueError,
            "cannot import the optimizer 'no.such.module:Opt'",
        ),
    ],
    ids=["missing-variable", "unknown-op", "malformed-optimizer", "unknown-optimizer"],
)
def test_a_refused_request_raises_what_grpc_would(ops, error, message):
    transport = InMemoryTransport(1, 1)
    transport.run_ps_ops(0, [Op("create", "v", torch.zeros(2))])
    with pytest.raises(error, match=message):
        transport.run_ps_ops(0, ops)
    (value,) = transport.run_ps_ops(0, [Op("read", "v")])
    assert torch.equal(value, torch.zeros(2))  # nothing applied


def test_a_ps_down_is_unavailable_naming_the_task():
    transport = InMemoryTransport(1, 2)
    transport.set_ps_available(1, False)
    with pytest.raises(errors.UnavailableError, match=r"/job:ps/replica:0/task:1 is unavailable"):
        transport.run_ps_ops(1, [Op("read", "v")])


def test_a_retried_steps_updates_apply_once():
    transport = InMemoryTransport(1, 1)
    transport.run_ps_ops(0, [Op("create", "v", torch.zeros(()))])
    for _ in range(2):  # two attempts of one step
        with _transport.step_scope("step-1"):
            transport.run_ps_ops(0, [Op("assign_add", "v", torch.ones(()))])
            transport.run_ps_ops(0, [Op("assign_add", "v", torch.ones(()))])
    (value,) = transport.run_ps_ops(0, [Op("read", "v")])
    assert value.item() == 2


@pytest.mark.parametrize(
    ("fault", "runs"),
    [("none", 1), ("lost-before-running", 0), ("lost-after-running", 1), ("unavailable", 0)],
)
def test_a_lost_worker_raises_unavailable_like_grpc(fault, runs):
    transport = InMemoryTransport(1, 1)
    client = transport.worker(0)
    incarnation = client.status(timeout=1.0)
    if fault == "lost-before-running":
        transport.lose_worker_on_next(0, after_running=False)
    elif fault == "lost-after-running":
        transport.lose_worker_on_next(0, after_running=True)
    elif fault == "unavailable":
        transport.set_worker_available(0, False)
    request = pb.Closure(function_digest="d", step_id="s")  # no function: "missing_function"
    if fault == "none":
        assert client.run_closure(request).error_kind == "missing_function"
    else:
        with pytest.raises(errors.UnavailableError, match="/job:worker/replica:0/task:0"):
            client.run_closure(request)
        with pytest.raises(errors.UnavailableError):
            client.status(timeout=0.01)
        transport.restart_worker(0)
        assert client.status(timeout=1.0) != incarnation
    assert len(transport.closures) == runs
