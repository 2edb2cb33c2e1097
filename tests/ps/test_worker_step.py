"""What a worker does on each step, kept cheap: the embedding lookup's own torch calls skip
``PullOnUse`` (its gather takes the closure's pending parameter reads along, and the mode steps
off), the optimizer's JSON is reused while its hyperparameters stay the same."""

from __future__ import annotations

import json

import pytest
import torch
from strategyjob.ps import _remote, _transport
from strategyjob.ps._transport import Op
from strategyjob.ps.server import Server

from .conftest import free_ports

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ps_server():
    (port,) = free_ports(1)
    server = Server({"ps": [f"127.0.0.1:{port}"]}, job_name="ps", task_index=0)
    yield server
    server.stop(0)


def test_lookup_skips_pull_on_use_and_takes_pending_reads_along(ps_server, monkeypatch):
    table, weight = torch.arange(12.0).reshape(6, 2), torch.tensor([5.0, 7.0])
    shards = tuple(_remote.ParamRef(f"step/t{i}", 0, (3, 2), torch.float32) for i in range(2))
    dense = _remote.ParamRef("step/w", 0, (2,), torch.float32)
    _transport.run_ps_ops(
        0,
        [
            Op("create", shards[0].key, table[:3]),
            Op("create", shards[1].key, table[3:]),
            Op("create", dense.key, weight),
        ],
    )
    state = _remote.worker_state()
    param = state.param(dense)
    with torch.no_grad():
        param.zero_()
    embedding = _remote.RemoteEmbedding(_remote.ShardedParamRef(shards), None)
    ids = torch.tensor([[1, 4], [4, 0]])
    intercepted = []
    on_call = _remote.PullOnUse.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        intercepted.append(func)
        return on_call(self, func, types, args, kwargs)

    monkeypatch.setattr(_remote.PullOnUse, "__torch_function__", counting)
    depth = torch._C._len_torch_function_stack()
    state.begin([dense])
    with _remote.PullOnUse(state):
        rows = embedding(ids)
        assert not intercepted  # the lookup's calls on the ids skipped the mode
        assert torch._C._len_torch_function_stack() == depth  # nothing pending: mode left
        assert torch.equal(param.detach(), weight)  # read along with the gather
        loss = (rows * param).sum()
    state.end()
    assert torch.equal(rows.detach(), table[ids])
    loss.backward()
    ((unique, grads),) = embedding.handle.pending
    assert unique.tolist() == [0, 1, 4]
    assert torch.equal(grads, torch.stack([weight, weight, 2 * weight]))
    embedding.handle.pending.clear()


def test_optimizer_json_follows_hyperparameter_changes():
    param = torch.nn.Parameter(torch.zeros(2))
    param._sj_ref = _remote.ParamRef("opt/w", 0, (2,), torch.float32)
    opt = torch.optim.SGD([param], lr=0.1)
    cls, args = _remote._reduce_optimizer(opt)
    remote = cls(*args)
    (group,) = remote.param_groups
    first = remote._opt_json(group)
    assert remote._opt_json(group) is first  # unchanged hyperparameters: the same text
    assert json.loads(first)["hparams"]["lr"] == 0.1
    group["lr"] = torch.tensor(0.05)  # e.g. a schedule inside the closure
    assert json.loads(remote._opt_json(group))["hparams"]["lr"] == pytest.approx(0.05)
    group["lr"] = 0.1
    assert json.loads(remote._opt_json(group)) == json.loads(first)
