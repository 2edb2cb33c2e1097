"""StrategyJob changes nothing process-wide in torch outside a strategy's scope.

A user who runs another training library in the same process must meet torch as torch made
it: ``Optimizer.zero_grad``, ``Module.zero_grad`` and torch's global hook registries are
touched only while some strategy's ``scope()`` is entered (``run`` enters it), and restored
when the last scope is left."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import torch

from tests.support.processes import child_env

# Run in a fresh interpreter: what counts is the state after ``import strategyjob``, with no
# other test having used a strategy in this process.
_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    def snapshot():
        return {
            "Optimizer.zero_grad": id(torch.optim.Optimizer.__dict__["zero_grad"]),
            "Optimizer.add_param_group": id(torch.optim.Optimizer.__dict__["add_param_group"]),
            "Module.zero_grad": id(torch.nn.Module.__dict__["zero_grad"]),
            "Module.__setstate__": id(torch.nn.Module.__dict__["__setstate__"]),
            "parameter hooks": len(m._global_parameter_registration_hooks),
            "module hooks": len(m._global_module_registration_hooks),
            "optimizer pre hooks": len(o._global_optimizer_pre_hooks),
            "optimizer post hooks": len(o._global_optimizer_post_hooks),
        }

    states = {"torch": snapshot()}
    import strategyjob as sj
    states["import"] = snapshot()
    strategies = [
        sj.MirroredStrategy(["cpu:0", "cpu:1"]),
        sj.OneDeviceStrategy("cpu:0"),
        sj.experimental.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    ]
    states["created"] = snapshot()
    inside = []
    for strategy in strategies:
        with strategy.scope():
            model = torch.nn.Linear(4, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            inside.append(snapshot())
        x = torch.randn(8, 4)
        dataset = strategy.experimental_distribute_dataset([(x, x.sum(1).long() % 2)] * 3)

        def step_fn(xb, yb):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()

        for batch in dataset:
            strategy.run(step_fn, args=batch)
        model.zero_grad()  # outside scope: torch's own
    states["trained"] = snapshot()
    print(json.dumps({"states": states, "inside": inside}))
    """
)


def test_torch_is_as_torch_made_it_outside_every_scope():
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    states = result["states"]
    for moment in ("import", "created", "trained"):
        assert states[moment] == states["torch"], f"torch changed after {moment}"
    for inside in result["inside"]:  # in scope the hooks are there (so the test sees them)
        assert inside["parameter hooks"] == states["torch"]["parameter hooks"] + 1
        assert inside["Optimizer.zero_grad"] != states["torch"]["Optimizer.zero_grad"]


def test_hooks_stay_while_any_scope_holds_them():
    from strategyjob.collective import grad_sync

    original = torch.optim.Optimizer.__dict__["zero_grad"]
    entered, leave = threading.Event(), threading.Event()

    def other_thread() -> None:
        grad_sync.scope_entered()
        entered.set()
        leave.wait(30)
        grad_sync.scope_exited()

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert entered.wait(30)
        grad_sync.scope_entered()
        grad_sync.scope_exited()  # this thread's scope ends; the other's still holds them
        assert torch.optim.Optimizer.__dict__["zero_grad"] is not original
    finally:
        leave.set()
        thread.join(30)
    assert torch.optim.Optimizer.__dict__["zero_grad"] is original
    grad_sync.scope_exited()  # one exit too many changes nothing
    assert torch.optim.Optimizer.__dict__["zero_grad"] is original


def test_a_wrapper_installed_over_ours_is_left_in_place():
    """Another library that wraps ``zero_grad`` while a scope is entered keeps its wrapper
    when the scope ends (restoring torch's would silently drop theirs)."""
    from strategyjob.collective import grad_sync

    original = torch.nn.Module.__dict__["zero_grad"]
    grad_sync.scope_entered()
    ours = torch.nn.Module.__dict__["zero_grad"]

    def theirs(self, set_to_none: bool = True) -> None:
        ours(self, set_to_none)

    torch.nn.Module.zero_grad = theirs
    try:
        grad_sync.scope_exited()
        assert torch.nn.Module.__dict__["zero_grad"] is theirs
    finally:
        torch.nn.Module.zero_grad = original
