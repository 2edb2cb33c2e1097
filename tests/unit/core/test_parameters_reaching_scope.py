"""Module parameters that reach ``strategy.scope()`` without being built there.

TensorFlow distributes every variable created in scope, however it was made. A module
deep-copied, loaded with ``torch.load``, attached in scope, or handed to an optimizer created in
scope must train under ``MirroredStrategy``/``CentralStorageStrategy`` (2 CPU replicas) exactly
as one process on the global batch; parameters attached later to a synchronised module or
added to its optimizer too; an optimizer over parameters of no strategy stepped in ``run`` is
refused instead of training each replica's copy apart.
"""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import strategyjob as sj
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.timeout(60)

STEPS = 3


class Net(nn.Module):
    """A small MLP; a ``head`` attached later (outside any scope) is applied when present."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return self._modules["head"](out) if "head" in self._modules else out


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(12, 5, generator=g), torch.randint(0, 3, (12,), generator=g)


def _base() -> Net:
    torch.manual_seed(0)
    return Net()


def _make_opt(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.05)


def _reference(steps: int = STEPS) -> list[torch.Tensor]:
    x, y = _data()
    model = _base()
    opt = _make_opt(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _train(strategy: sj.Strategy, model: nn.Module, opt: torch.optim.Optimizer, steps: int):
    x, y = _data()

    def step_fn(xb: torch.Tensor, yb: torch.Tensor) -> None:
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()

    for batch_x, batch_y in strategy.experimental_distribute_dataset([(x, y)] * steps):
        strategy.run(step_fn, args=(batch_x, batch_y))


def _assert_trained_like_one_process(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    for p, q in zip(model.parameters(), _reference()):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)
    assert int(opt.state[model.body[0].weight]["step"]) == STEPS  # one update per step


def _two_replica_strategies():
    yield pytest.param(lambda: sj.MirroredStrategy(["cpu:0", "cpu:1"]), id="mirrored-2")
    yield pytest.param(lambda: sj.CentralStorageStrategy(["cpu:0", "cpu:1"]), id="central-2")


def _deepcopy_with_optimizer_in_scope(strategy):
    base = _base()
    with strategy.scope():
        model = copy.deepcopy(base)
        opt = _make_opt(model.parameters())
    return model, opt


def _deepcopy_in_scope_optimizer_outside(strategy):
    base = _base()
    with strategy.scope():
        model = copy.deepcopy(base)
    return model, _make_opt(model.parameters())


def _built_outside_optimizer_in_scope(strategy):
    model = _base()
    with strategy.scope():
        opt = _make_opt(model.parameters())
    return model, opt


def _torch_load_in_scope(strategy):
    saved = io.BytesIO()
    torch.save(_base(), saved)
    saved.seek(0)
    with strategy.scope():
        model = torch.load(saved, weights_only=False)
    return model, _make_opt(model.parameters())


def _attached_in_scope(strategy):
    body = _base().body
    with strategy.scope():
        model = Net()
        model.body = body  # built outside, attached inside
    return model, _make_opt(model.parameters())


ROUTES = [
    _deepcopy_with_optimizer_in_scope,
    _deepcopy_in_scope_optimizer_outside,
    _built_outside_optimizer_in_scope,
    _torch_load_in_scope,
    _attached_in_scope,
]


@pytest.mark.parametrize("make_strategy", list(_two_replica_strategies()))
@pytest.mark.parametrize("route", ROUTES, ids=lambda f: f.__name__.strip("_"))
def test_module_reaching_scope_trains_like_one_process(make_strategy, route):
    strategy = make_strategy()
    model, opt = route(strategy)
    _train(strategy, model, opt, STEPS)
    _assert_trained_like_one_process(model, opt)


@pytest.mark.parametrize("make_strategy", list(_two_replica_strategies()))
def test_optimizer_over_parameters_of_no_strategy_is_refused_in_run(make_strategy):
    strategy = make_strategy()
    model = _base()  # built, and its optimizer created, outside any scope
    opt = _make_opt(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as raised:
        _train(strategy, model, opt, 1)
    message = str(raised.value)
    assert message.startswith("Variable (<Parameter shape=(8, 5) dtype=torch.float32>) was not ")
    assert "was not created in the distribution strategy scope of (" in message
    assert "with strategy.scope():\n  model=_create_model()\n  optimizer=torch.optim" in message
    for p, q in zip(model.parameters(), before):  # refused before any update
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)
    # Outside run the same objects are plain torch: nothing to refuse.
    F.cross_entropy(model(_data()[0]), _data()[1]).backward()
    opt.step()


@pytest.mark.parametrize("make_strategy", list(_two_replica_strategies()))
def test_parameters_added_later_are_synchronised(make_strategy):
    """A head attached and a free parameter added to the optimizer in scope after training
    started train like one process."""
    x, y = _data()

    def later_parts() -> tuple[nn.Module, nn.Parameter]:
        torch.manual_seed(5)
        return nn.Linear(3, 3), nn.Parameter(torch.randn(3))

    def run(model, opt, extra_holder, step, scope=contextlib.nullcontext):
        for k in range(4):
            if k == 2:  # after two steps
                with scope():
                    model.head, extra = later_parts()
                    opt.add_param_group({"params": model.head.parameters()})
                    opt.add_param_group({"params": [extra]})
                extra_holder.append(extra)
            step(model, opt, extra_holder)

    def loss(model, extra_holder, xb, yb):
        out = model(xb)
        return F.cross_entropy(out + extra_holder[0] if extra_holder else out, yb)

    def make_opt(params) -> torch.optim.Optimizer:  # not Adam: it hides a gradient's scale
        return torch.optim.SGD(params, lr=0.5, momentum=0.9)

    reference, ref_extra = _base(), []
    ref_opt = make_opt(reference.parameters())

    def ref_step(model, opt, extra_holder):
        opt.zero_grad()
        loss(model, extra_holder, x, y).backward()
        opt.step()

    run(reference, ref_opt, ref_extra, ref_step)

    strategy = make_strategy()
    with strategy.scope():
        model = _base()
        opt = make_opt(model.parameters())
    extra_holder: list = []
    batches = iter(strategy.experimental_distribute_dataset([(x, y)] * 4))

    def step(model, opt, extra_holder):
        def step_fn(xb, yb):
            opt.zero_grad()
            loss(model, extra_holder, xb, yb).backward()
            opt.step()

        strategy.run(step_fn, args=next(batches))

    run(model, opt, extra_holder, step, strategy.scope)
    trained = [*model.parameters(), *extra_holder]
    expected = [*reference.parameters(), *ref_extra]
    assert len(trained) == len(expected) == 7
    for p, q in zip(trained, expected):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_parameter_attached_later_to_a_synchronised_module_is_synchronised():
    from strategyjob.collective import grad_sync

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _base()
    model.plain = nn.Parameter(torch.ones(1))  # outside scope: TF does not distribute it
    with strategy.scope():
        model.scale = nn.Parameter(torch.ones(1))  # next to synchronised ones
        replaced = nn.Parameter(torch.zeros(3))
        model.body[2].bias = replaced  # replacing one (as load_state_dict(assign=True) does)
    sync = strategy.extended.gradient_synchronizer
    assert grad_sync.owner_of(model.scale) is sync
    assert grad_sync.owner_of(replaced) is sync
    assert grad_sync.owner_of(model.plain) is None
    opt = _make_opt(model.parameters())  # steps it in run: refused, as TF refuses
    with pytest.raises(ValueError, match="was not created in the distribution strategy scope"):
        _train(strategy, model, opt, 1)


def test_copy_made_outside_scope_stays_plain_and_frozen_parameters_are_accepted():
    from strategyjob.collective import grad_sync

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _base()
        model.register_parameter("frozen", nn.Parameter(torch.zeros(2), requires_grad=False))
        twin = copy.deepcopy(model)  # a frozen parameter is copied and registered too
    ema = copy.deepcopy(model)  # outside scope: plain torch, e.g. an EMA of the weights
    sync = strategy.extended.gradient_synchronizer
    assert all(grad_sync.owner_of(p) is sync for p in twin.parameters())
    assert all(grad_sync.owner_of(p) is None for p in ema.parameters())


def test_single_replica_strategies_are_unaffected(monkeypatch):
    """OneDevice, the default strategy and one-worker MWMS (local mode) have nothing to
    synchronise: copies are not registered and no optimizer is refused."""
    from strategyjob.collective import grad_sync

    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategies = [  # (strategy, whether it mirrors copies made in its scope)
        (sj.OneDeviceStrategy("cpu:0"), False),
        (sj.get_strategy(), False),
        (sj.MultiWorkerMirroredStrategy(), True),
        (sj.MirroredStrategy(["cpu:0"]), True),
    ]
    for strategy, mirrors in strategies:
        base = _base()
        with strategy.scope():
            copied = copy.deepcopy(base)
        assert all((grad_sync.owner_of(p) is not None) == mirrors for p in copied.parameters())
        model = _base()  # module and optimizer outside any scope
        opt = _make_opt(model.parameters())
        _train(strategy, model, opt, STEPS)
        _assert_trained_like_one_process(model, opt)


def test_checks_run_once_per_optimizer_not_per_step(monkeypatch):
    """The hot path stays as it was: the refusal check runs when an optimizer's param groups
    are first seen, and no per-parameter gradient hook runs without bucketed all-reduces."""
    from strategyjob.collective import grad_sync

    calls = []
    original = grad_sync._check_synchronised
    monkeypatch.setattr(
        grad_sync, "_check_synchronised", lambda *a: calls.append(1) or original(*a)
    )
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    model, opt = _deepcopy_with_optimizer_in_scope(strategy)
    _train(strategy, model, opt, STEPS)
    assert len(calls) == 1
    assert all(p._post_accumulate_grad_hooks is None for p in model.parameters())


@pytest.mark.parametrize("outside_first", [True, False])
def test_optimizer_over_synchronised_and_outside_parameters_adopts_them_all(outside_first):
    """Created in scope, an optimizer adopts every parameter it updates; created outside, it
    is refused at its first step in ``run`` (TF's error), not adopted behind the user's back."""
    from strategyjob.collective import grad_sync

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        inside = nn.Linear(2, 2)
    outside = nn.Linear(2, 2)
    groups = [{"params": outside.parameters()}, {"params": inside.parameters(), "lr": 0.5}]
    groups = groups if outside_first else groups[::-1]
    late = torch.optim.SGD(groups, lr=0.1)  # created outside scope
    assert all(grad_sync.owner_of(p) is None for p in outside.parameters())

    def step_fn():
        late.step()

    with pytest.raises(ValueError, match="was not created in the distribution strategy scope"):
        strategy.run(step_fn)
    with strategy.scope():
        torch.optim.SGD(groups, lr=0.1)
    sync = strategy.extended.gradient_synchronizer
    assert all(grad_sync.owner_of(p) is sync for p in outside.parameters())


def test_adopted_parameters_take_the_strategys_placement_in_place(monkeypatch):
    """What CentralStorageStrategy asks for (the parameter device) is done to the very
    parameter the module and the optimizer hold; a dtype stands in for a device here."""
    strategy = sj.CentralStorageStrategy(["cpu:0", "cpu:1"])
    monkeypatch.setattr(
        strategy.extended,
        "register_parameter",
        lambda p: nn.Parameter(p.detach().double(), requires_grad=p.requires_grad),
    )
    model = nn.Linear(2, 2)
    weight = model.weight
    with strategy.scope():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert model.weight is weight and opt.param_groups[0]["params"][0] is weight
    assert weight.dtype == torch.float64 and weight.requires_grad
