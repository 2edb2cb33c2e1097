"""End to end: torch modules created in scope live on the ps (a big nn.Embedding sharded),
scheduled training steps update them there, and the loss goes down."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F
from strategyjob.ps import _remote
from strategyjob.ps.coordinator import ClusterCoordinator
from strategyjob.ps.partitioners import FixedShardsPartitioner
from strategyjob.strategies.parameter_server import ParameterServerStrategy
from torch import nn

pytestmark = pytest.mark.timeout(150)

VOCAB, DIM = 1000, 8

# Workers cannot import this test module: ship its classes by value, as `__main__`'s are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(DIM, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


def test_sharded_embedding_model_trains(shared_cluster):
    strategy = ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(2))
    with strategy.scope():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=2.0)
    emb_ref = model.emb.weight._sj_ref
    assert isinstance(emb_ref, _remote.ShardedParamRef)
    assert [s.shape for s in emb_ref.shards] == [(500, DIM), (500, DIM)]
    assert strategy.extended._parameter_device(model.emb.weight) == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    ]
    assert isinstance(model.head.weight._sj_ref, _remote.ParamRef)  # dense: never sharded
    initial = model.emb.weight.detach().clone()
    coordinator = ClusterCoordinator(strategy)

    def dataset_fn():
        g = torch.Generator().manual_seed(1)
        labels = torch.randint(0, 4, (64,), generator=g)
        # Every id of an example has the example's class mod 4; rows >= 400 are never touched.
        ids = labels[:, None] + 4 * torch.randint(0, 100, (64, 5), generator=g)
        while True:
            yield ids, labels

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def train_step(it):
        def step_fn(batch):
            ids, labels = batch
            opt.zero_grad()
            loss = F.cross_entropy(model(ids), labels)
            loss.backward()
            opt.step()
            return loss.detach()

        return strategy.run(step_fn, args=(next(it),))

    losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(80)]
    coordinator.join()
    values = [float(rv.fetch()) for rv in losses]
    assert sum(values[-5:]) / 5 < 0.75 * sum(values[:5]) / 5, values

    trained = model.state_dict()["emb.weight"]  # the chief's state_dict reads the ps
    assert not torch.equal(trained[:400], initial[:400])
    # Sparse updates: rows no batch touched are exactly as initialised.
    assert torch.equal(trained[400:], initial[400:])


def test_optimizer_rule_runs_on_the_ps(shared_cluster):
    """Adam's update applied on the ps equals a local Adam step on the same gradient."""
    strategy = ParameterServerStrategy(shared_cluster.resolver())
    with strategy.scope():
        torch.manual_seed(0)
        layer = nn.Linear(3, 2)
        opt = torch.optim.Adam(layer.parameters(), lr=0.1, betas=(0.8, 0.9))
    reference = nn.Linear(3, 2)
    reference.load_state_dict(layer.state_dict())
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.1, betas=(0.8, 0.9))
    x = torch.randn(5, 3)

    def step():
        opt.zero_grad()
        layer(x).pow(2).sum().backward()
        opt.step()

    coordinator = ClusterCoordinator(strategy)
    for _ in range(3):
        coordinator.schedule(step).fetch()
        ref_opt.zero_grad()
        reference(x).pow(2).sum().backward()
        ref_opt.step()
    got = layer.state_dict()
    torch.testing.assert_close(got["weight"], reference.weight.detach())
    torch.testing.assert_close(got["bias"], reference.bias.detach())


def test_sharded_embedding_step_matches_local_step(shared_cluster):
    """One scheduled SGD step through the sharded table equals the same step done locally."""
    strategy = ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(2))
    with strategy.scope():
        torch.manual_seed(3)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.3)
    reference = Net()
    reference.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.3)
    ids = torch.tensor([[1, 2, 2, 999], [500, 499, 1, 0]])  # rows on both shards, a repeat
    labels = torch.tensor([0, 3])

    def step():
        opt.zero_grad()
        F.cross_entropy(model(ids), labels).backward()
        opt.step()

    ClusterCoordinator(strategy).schedule(step).fetch()
    ref_opt.zero_grad()
    F.cross_entropy(reference(ids), labels).backward()
    ref_opt.step()
    with torch.no_grad():  # a forward pass on the chief reads the trained values first
        torch.testing.assert_close(model(ids), reference(ids))
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


def test_chief_state_dict_round_trip_restores_the_ps(shared_cluster):
    """Save on the chief after training; a new chief (a restarted one) builds the model,
    loads the checkpoint, and the workers compute with the restored values; nothing is pulled
    again while nothing was scheduled."""
    strategy = ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(2))
    with strategy.scope():
        torch.manual_seed(4)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.tensor([[1, 2, 600, 999], [3, 4, 5, 6]])

    def step():
        opt.zero_grad()
        F.cross_entropy(model(ids), torch.tensor([1, 2])).backward()
        opt.step()

    coordinator = ClusterCoordinator(strategy)
    for _ in range(3):
        coordinator.schedule(step)
    coordinator.join()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    pulls = []
    original = strategy.extended.pull_parameters
    strategy.extended.pull_parameters = lambda params: pulls.append(1) or original(params)
    model.state_dict()
    with torch.no_grad():
        model(ids)
    assert pulls == [], "pulled again though nothing was scheduled"

    restarted = ParameterServerStrategy(shared_cluster.resolver(), FixedShardsPartitioner(2))
    with restarted.scope():
        torch.manual_seed(5)  # other initial values
        fresh = Net()
    fresh.load_state_dict(saved)  # after the scope: pushed to the ps

    def forward():
        with torch.no_grad():
            return fresh(ids)

    on_worker = ClusterCoordinator(restarted).schedule(forward).fetch()
    with torch.no_grad():
        local = Net()
        local.load_state_dict(saved)
        torch.testing.assert_close(torch.as_tensor(on_worker), local(ids))
