"""One MultiWorkerMirroredStrategy task training modules that reach ``scope()`` without being
built there (started with TF_CONFIG set by ``test_mwms_parameters_reaching_scope.py``).

Every worker seeds its modules differently (the chief like the one-process reference): the
chief's values must win and every worker must end with the reference's weights. Prints one
``RESULT {json}`` line: per route, the largest difference from the reference and a digest of
the trained weights' bytes; and the error an optimizer over parameters of no strategy gets.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import sys

import strategyjob as sj
import torch
import torch.nn.functional as F
from torch import nn

torch.set_num_threads(1)
STEPS, PER_WORKER = 4, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return self._modules["head"](out) if "head" in self._modules else out


def make_opt(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def seeded(seed: int, build):
    torch.manual_seed(seed)
    return build()


def main() -> dict:
    options = sj.experimental.CommunicationOptions(timeout_seconds=30.0)
    strategy = sj.MultiWorkerMirroredStrategy(communication_options=options)
    w, i = strategy.extended.topology.num_workers, strategy.extended.topology.worker_index
    g = torch.Generator().manual_seed(7)
    x = torch.randn(PER_WORKER * w, 6, generator=g)
    y = torch.randint(0, 4, (PER_WORKER * w,), generator=g)
    shard = slice(i * PER_WORKER, (i + 1) * PER_WORKER)

    def mine(seed: int) -> int:
        """The chief draws like the reference, every other worker differently."""
        return seed if i == 0 else 1000 * (i + 1) + seed

    def later_parts(seed: int) -> tuple[nn.Module, nn.Parameter]:
        torch.manual_seed(seed)
        return nn.Linear(4, 4), nn.Parameter(torch.randn(4))

    def train(
        model, opt, xb, yb, run=None, add_later_seed=None, scope=contextlib.nullcontext
    ) -> list[torch.Tensor]:
        extra: list[nn.Parameter] = []

        def step_fn(xs: torch.Tensor, ys: torch.Tensor) -> None:
            opt.zero_grad()
            out = model(xs)
            F.cross_entropy(out + extra[0] if extra else out, ys).backward()
            opt.step()

        for k in range(STEPS):
            if add_later_seed is not None and k == 2:  # built and attached in scope, later
                with scope():
                    model.head, parameter = later_parts(add_later_seed)
                    opt.add_param_group({"params": model.head.parameters()})
                    opt.add_param_group({"params": [parameter]})
                extra.append(parameter)
            (run or (lambda fn, args: fn(*args)))(step_fn, (xb, yb))
        return [p.detach().clone() for p in [*model.parameters(), *extra]]

    def reference(add_later: bool = False) -> list[torch.Tensor]:
        model = seeded(0, Net)
        return train(model, make_opt(model.parameters()), x, y, None, 5 if add_later else None)

    def distributed(model, opt, add_later: bool = False) -> list[torch.Tensor]:
        def run(fn, args):
            strategy.run(fn, args=args)

        later = mine(5) if add_later else None
        return train(model, opt, x[shard], y[shard], run, later, strategy.scope)

    def deepcopy_in_scope():
        base = seeded(mine(0), Net)
        with strategy.scope():
            model = copy.deepcopy(base)
            opt = make_opt(model.parameters())
        return model, opt

    def deepcopy_in_scope_optimizer_outside():
        base = seeded(mine(0), Net)
        with strategy.scope():
            model = copy.deepcopy(base)
        return model, make_opt(model.parameters())

    def built_outside_optimizer_in_scope():
        model = seeded(mine(0), Net)
        with strategy.scope():
            opt = make_opt(model.parameters())
        return model, opt

    def torch_load_in_scope():
        saved = io.BytesIO()
        torch.save(seeded(mine(0), Net), saved)  # every worker its own file
        saved.seek(0)
        with strategy.scope():
            model = torch.load(saved, weights_only=False)
        return model, make_opt(model.parameters())

    def built_in_scope():  # the control: how modules are meant to be built
        with strategy.scope():
            model = seeded(mine(0), Net)
            opt = make_opt(model.parameters())
        return model, opt

    routes = {
        "deepcopy_in_scope": (deepcopy_in_scope, False),
        "deepcopy_in_scope_optimizer_outside": (deepcopy_in_scope_optimizer_outside, False),
        "built_outside_optimizer_in_scope": (built_outside_optimizer_in_scope, False),
        "torch_load_in_scope": (torch_load_in_scope, False),
        "parameters_added_later": (built_in_scope, True),
    }
    out: dict = {"worker_index": i, "routes": {}}
    for name, (route, add_later) in routes.items():
        trained = distributed(*route(), add_later=add_later)
        expected = reference(add_later)
        out["routes"][name] = {
            "count": len(trained),
            "max_abs_diff": max((p - q).abs().max().item() for p, q in zip(trained, expected)),
            "digest": hashlib.sha256(b"".join(p.numpy().tobytes() for p in trained)).hexdigest(),
        }

    model = seeded(mine(0), Net)  # module and optimizer outside any scope
    opt = make_opt(model.parameters())
    try:
        distributed(model, opt)
        out["outside_error"] = None
    except ValueError as e:
        out["outside_error"] = str(e)
    return out


if __name__ == "__main__":
    result = main()
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)
