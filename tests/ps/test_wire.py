"""The framed ParameterServer.Run messages (tensors' bytes read in place), the ps's update
rules on them, and the worker's row gathers and deferred parameter reads."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest
import torch
from strategyjob import errors
from strategyjob.ps import _remote, _transport, _wire
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._transport import Op, decode_results, encode_ops, encode_results
from strategyjob.ps.server import Server, Store

from .conftest import free_ports

pytestmark = pytest.mark.timeout(120)

TENSORS = [
    torch.randn(3, 5),
    torch.tensor(2.5, dtype=torch.float64),
    torch.arange(7),  # 56 bytes: the next tensor starts on an 8-byte boundary anyway
    torch.tensor([True, False, True]),  # 3 bytes, padded
    torch.randn(3, 3).to(torch.bfloat16),
    torch.zeros(0, 5),
    torch.randn(4, 4).t(),  # non-contiguous
    torch.randn(2, requires_grad=True),
    torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj(),  # conjugate bit
]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.detach(), b.resolve_conj())


def test_framed_results_round_trip():
    back = decode_results(encode_results(TENSORS))
    assert len(back) == len(TENSORS)
    assert all(_same(b, t) for b, t in zip(back, TENSORS))
    for tensor in back:
        if tensor.numel():
            assert tensor.data_ptr() % 8 == 0  # read in place, aligned


def test_framed_message_is_plain_protobuf():
    data = encode_results(TENSORS)
    message = pb.VarResults.FromString(data)  # any protobuf parser reads it
    assert [list(v.shape) for v in message.values] == [list(t.shape) for t in TENSORS]
    assert len(message.raw) % 8 == 0
    # ... and a message written by protobuf itself (`raw` last) decodes the same.
    back = decode_results(message.SerializeToString())
    assert all(_same(b, t) for b, t in zip(back, TENSORS))


def test_inline_tensor_data_is_still_read():
    message = pb.VarResults(values=[_wire.to_proto(torch.arange(4.0))])
    (back,) = decode_results(message.SerializeToString())
    assert torch.equal(back, torch.arange(4.0))


def test_ops_round_trip_through_a_store():
    store = Store()
    table = torch.randn(10, 4)
    store.run(encode_ops([Op("create", "t", table), Op("create", "s", torch.tensor(3))]))
    table.zero_()  # the store kept its own copy
    reply = store.run(
        encode_ops([Op("gather", "t", indices=torch.tensor([9, 0, 9])), Op("read", "s")])
    )
    rows, scalar = decode_results(reply)
    assert torch.equal(rows, store._vars["t"].detach()[[9, 0, 9]])
    assert scalar.item() == 3 and scalar.shape == ()
    rows.zero_()  # results belong to the caller
    assert store._vars["t"].detach().abs().sum() > 0


def _opt(**hparams) -> str:
    return json.dumps({"key": "o", "cls": "torch.optim.sgd:SGD", "hparams": hparams})


def test_sparse_sgd_adds_up_repeated_rows():
    store = Store()
    store.run(encode_ops([Op("create", "v", torch.zeros(4, 2))]))
    rows, grads = torch.tensor([1, 3, 1]), torch.tensor([[1.0, 2.0], [4.0, 4.0], [1.0, 0.0]])
    store.run(encode_ops([Op("apply_sparse", "v", grads, rows, optimizer=_opt(lr=0.5))]))
    expected = torch.tensor([[0.0, 0.0], [-1.0, -1.0], [0.0, 0.0], [-2.0, -2.0]])
    assert torch.equal(store._vars["v"].detach(), expected)


def test_sparse_update_with_momentum_matches_torch():
    init = torch.randn(5, 3)
    store = Store()
    store.run(encode_ops([Op("create", "v", init)]))
    local = torch.nn.Parameter(init.clone())
    reference = torch.optim.SGD([local], lr=0.1, momentum=0.9)
    spec = _opt(lr=0.1, momentum=0.9)
    for step in range(3):
        rows = torch.tensor([step, 4])
        grads = torch.full((2, 3), float(step + 1))
        store.run(encode_ops([Op("apply_sparse", "v", grads, rows, optimizer=spec)]))
        local.grad = torch.zeros_like(local).index_add_(0, rows, grads)
        reference.step()
    assert torch.allclose(store._vars["v"].detach(), local.detach())


@pytest.fixture
def ps_server():
    (port,) = free_ports(1)
    server = Server({"ps": [f"127.0.0.1:{port}"]}, job_name="ps", task_index=0)
    yield server
    server.stop(0)


def _setup(prefix: str):
    """A table of 6 x 2 in two shards and a dense parameter, all on ps 0."""
    table, weight = torch.arange(12.0).reshape(6, 2), torch.tensor([5.0, 7.0])
    shards = tuple(_remote.ParamRef(f"{prefix}/t{i}", 0, (3, 2), torch.float32) for i in range(2))
    dense = _remote.ParamRef(f"{prefix}/w", 0, (2,), torch.float32)
    _transport.run_ps_ops(
        0,
        [
            Op("create", shards[0].key, table[:3]),
            Op("create", shards[1].key, table[3:]),
            Op("create", dense.key, weight),
        ],
    )
    state = _remote.worker_state()
    return table, weight, state, state.sharded(_remote.ShardedParamRef(shards)), dense


def test_gather_brings_pending_reads_and_pull_on_use_steps_off(ps_server):
    table, weight, state, handle, dense = _setup("gather")
    param = state.param(dense)
    depth = torch._C._len_torch_function_stack()
    state.begin([dense])
    with _remote.PullOnUse(state):
        assert torch._C._len_torch_function_stack() == depth + 1
        rows = handle.gather(torch.tensor([1, 2, 4]))  # both shards; `w` rides along
        assert torch._C._len_torch_function_stack() == depth  # nothing pending: mode left
        assert torch.equal(param.detach(), weight)
    state.end()
    assert torch._C._len_torch_function_stack() == depth
    assert torch.equal(rows, table[[1, 2, 4]])
    assert torch.equal(handle.gather(torch.tensor([4, 5])), table[[4, 5]])  # one shard
    assert handle.gather(torch.tensor([], dtype=torch.long)).shape == (0, 2)
    for bad in ([6], [-1, 0]):
        with pytest.raises(IndexError, match="out of range"):
            handle.gather(torch.tensor(bad))


def test_dense_parameter_used_first_is_read_on_use(ps_server):
    _, weight, state, _, dense = _setup("use")
    param = state.param(dense)
    with torch.no_grad():
        param.zero_()
    depth = torch._C._len_torch_function_stack()
    state.begin([dense])
    with _remote.PullOnUse(state):
        doubled = param * 2  # reads `w` from the ps first
    state.end()
    assert torch._C._len_torch_function_stack() == depth
    assert torch.equal(doubled.detach(), weight * 2)


def test_sparse_ops_merge_several_lookups(ps_server):
    _, _, _, handle, _ = _setup("merge")
    handle.pending[:] = [
        (torch.tensor([1, 4]), torch.ones(2, 2)),
        (torch.tensor([0, 4]), torch.ones(2, 2)),
    ]
    ops = handle.sparse_ops(_opt(lr=1.0))
    assert not handle.pending
    (task_ops,) = ops.values()
    assert [(op.name, op.indices.tolist()) for op in task_ops] == [
        ("merge/t0", [0, 1]),
        ("merge/t1", [1, 1]),  # row 4 twice: the ps adds both up
    ]
    _transport.run_ps_ops(0, task_ops)
    t0, t1 = _transport.run_ps_ops(0, [Op("read", "merge/t0"), Op("read", "merge/t1")])
    table = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(t0, table[:3] - torch.tensor([[1.0], [1.0], [0.0]]))
    assert torch.equal(t1, table[3:] - torch.tensor([[0.0], [2.0], [0.0]]))


# -- requests on streams ------------------------------------------------------------------------


def test_concurrent_requests_get_their_own_replies(ps_server):
    values = {f"conc/{i}": torch.full((3,), float(i)) for i in range(8)}
    _transport.run_ps_ops(0, [Op("create", k, v) for k, v in values.items()])
    errors: list = []

    def reader(key: str) -> None:
        try:
            for _ in range(20):
                (value,) = _transport.run_ps_ops(0, [Op("read", key)])
                assert torch.equal(value, values[key])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    address = _transport.address("ps", 0)
    idle = _transport._idle_streams[(address, _transport.metadata())]
    assert 1 <= len(idle) <= _transport.MAX_IDLE_STREAMS


def test_an_error_ends_only_its_stream(ps_server):
    with pytest.raises(errors.OpError, match="is not on this parameter server"):
        _transport.run_ps_ops(0, [Op("read", "missing")])
    _transport.run_ps_ops(0, [Op("create", "after_error", torch.ones(2))])
    (value,) = _transport.run_ps_ops(0, [Op("read", "after_error")])
    assert torch.equal(value, torch.ones(2))


def test_a_restarted_ps_is_reached_again():
    (port,) = free_ports(1)
    cluster = {"ps": [f"127.0.0.1:{port}"]}
    server = Server(cluster, job_name="ps", task_index=0)
    try:
        _transport.run_ps_ops(0, [Op("create", "v", torch.ones(2))])  # leaves an idle stream
        server.stop(0)
        idle = _transport._idle_streams[(cluster["ps"][0], _transport.metadata())]
        deadline = time.monotonic() + 10
        while any(s.alive() for s in idle) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(errors.UnavailableError, match="/job:ps/replica:0/task:0"):
            _transport.run_ps_ops(0, [Op("read", "v")])
        server = Server(cluster, job_name="ps", task_index=0)
        # Once the channel has reconnected (as for any call), a new stream is used: the
        # idle one, broken, is not.
        grpc.channel_ready_future(_transport.channel(cluster["ps"][0])).result(timeout=30)
        _transport.run_ps_ops(0, [Op("create", "v", torch.zeros(2))])
        (value,) = _transport.run_ps_ops(0, [Op("read", "v")])
        assert torch.equal(value, torch.zeros(2))
    finally:
        server.stop(0)
