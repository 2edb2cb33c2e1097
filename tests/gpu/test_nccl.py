"""MultiWorkerMirroredStrategy and its collective layer on a CUDA device (NCCL).

Skipped without CUDA (CI). With one GPU: local mode places the replica on cuda:0 and trains
there; the SDK's ``CollectiveGroup`` runs NCCL for CUDA tensors and gloo for CPU tensors on
one world-size-1 group; and the strategy's multi-worker path (gradient buckets, reduce,
gather, ``ReplicaContext.all_reduce``) runs on NCCL. Process groups live in subprocesses
(``nccl_worker.py``), each bounded by a timeout and killed with its process group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import strategyjob as sj
import torch
import torch.nn.functional as F
from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
from strategyjob.launcher import free_ports
from torch import nn

from tests.support.processes import CLUSTER_ENV, child_env, result_line, run_in_session

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch):
    for key in CLUSTER_ENV:
        monkeypatch.delenv(key, raising=False)


def _one_gpu_strategy() -> sj.MultiWorkerMirroredStrategy:
    """Local mode with the default resolver on a one-GPU machine (else one GPU asked for)."""
    if torch.cuda.device_count() == 1:
        return sj.MultiWorkerMirroredStrategy()
    resolver = SimpleClusterResolver(ClusterSpec({}), num_accelerators={"GPU": 1})
    return sj.MultiWorkerMirroredStrategy(resolver)


# --- local mode (no TF_CONFIG): one replica per local GPU ----------------------------------
def test_local_mode_replicas_are_the_local_gpus():
    strategy = sj.MultiWorkerMirroredStrategy()
    count = torch.cuda.device_count()
    assert strategy.extended.topology.local_devices == tuple(
        torch.device("cuda", i) for i in range(count)
    )
    assert strategy.extended.worker_devices[0] == "/job:localhost/replica:0/task:0/device:GPU:0"
    assert strategy.num_replicas_in_sync == count


def test_local_mode_trains_on_cuda_and_reduces_cuda_values():
    strategy = _one_gpu_strategy()
    device = torch.device("cuda", 0)
    assert strategy.extended.topology.local_devices == (device,)
    torch.manual_seed(0)
    with strategy.scope():
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
        head = nn.Linear(4, 4, device=device)  # created on the GPU
        opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.2)
    inputs = torch.randn(256, 16)
    data = torch.utils.data.TensorDataset(inputs, inputs[:, :4].argmax(1))  # learnable
    loader = torch.utils.data.DataLoader(data, batch_size=64)
    dist_ds = strategy.experimental_distribute_dataset(loader)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert x.device == device and y.device == device
        opt.zero_grad()
        loss = F.cross_entropy(head(model(x)), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = []
    for _ in range(15):
        for x, y in dist_ds:
            per_replica = strategy.run(step, args=(x, y))
            (local,) = strategy.experimental_local_results(per_replica)
            assert local.device == device
            losses.append(float(strategy.reduce("MEAN", per_replica, axis=None)))
    assert all(p.device == device for p in [*model.parameters(), *head.parameters()])
    assert losses[-1] < 0.7 * losses[0], losses[:: len(losses) // 5]

    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.tensor([1.0, 2.0, 3.0], device=device)
    )
    for op, axis, expected in [
        ("SUM", None, [1.0, 2.0, 3.0]),
        ("MEAN", None, [1.0, 2.0, 3.0]),
        ("SUM", 0, 6.0),
        ("MEAN", 0, 2.0),
    ]:
        result = strategy.reduce(op, values, axis=axis)
        assert result.device.type == "cpu"  # Strategy.reduce returns on the host
        assert torch.equal(result, torch.tensor(expected)), (op, axis, result)


# --- NCCL process groups, in subprocesses ---------------------------------------------------
def _run_worker(scenario: str, extra_env: dict[str, str], timeout: float = 150) -> dict:
    argv = [sys.executable, str(HERE / "nccl_worker.py"), scenario]
    run = run_in_session(argv, child_env(**extra_env), timeout)
    if run.timed_out:
        pytest.fail(f"{scenario} ran past {timeout} s:\n{run.output[-4000:]}")
    result = result_line(run.output)
    assert result, (
        f"{scenario} exited {run.returncode} without a RESULT line:\n{run.output[-4000:]}"
    )
    failed = "\n".join(f"--- {name}\n{tb}" for name, tb in result["failures"].items())
    assert not failed, f"{scenario}: {sorted(result['failures'])} failed:\n{failed}"
    assert run.returncode == 0, f"{scenario} exited {run.returncode}:\n{run.output[-4000:]}"
    return result


def _group_env() -> dict[str, str]:
    return {"STRATEGYJOB_TEST_PORT": str(free_ports(1)[0])}


@pytest.mark.timeout(200)
def test_collective_group_runs_cuda_tensors_on_nccl_and_cpu_tensors_on_gloo():
    result = _run_worker("collectives", _group_env())
    assert result["backends"] == {"cpu": "ProcessGroupGloo", "cuda": "ProcessGroupNCCL"}


@pytest.mark.timeout(200)
def test_nccl_collective_may_outlast_a_poll_slice():
    result = _run_worker("slow", _group_env())
    assert result["waited_s"] >= 1.5


@pytest.mark.timeout(200)
def test_multi_worker_code_path_on_nccl():
    port = free_ports(1)[0]
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}  # WORLD_SIZE=1 overrides: never dialled
    env = {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    result = _run_worker("mwms", env)
    first, last = result["losses"]
    assert last < first
