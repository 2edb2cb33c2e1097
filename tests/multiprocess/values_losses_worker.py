"""One MultiWorkerMirroredStrategy task (TF_CONFIG set by the test): Python values and nests
through every reduce / gather / all_reduce path, and ``strategyjob.nn`` losses in training.

``python values_losses_worker.py`` prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import strategyjob as sj
import torch
import torch.nn.functional as F

torch.set_num_threads(1)

GB, L2, LR = 4, 0.05, 0.5


def _listed(value):
    """JSON-friendly: tensors as lists, with their dtype name for the checks that need it."""
    if isinstance(value, torch.Tensor):
        return {"value": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    return value


def values(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    i = strategy.extended.topology.worker_index

    def replica_fn() -> dict:
        ctx = sj.get_replica_context()
        rid = int(ctx.replica_id_in_sync_group)
        return {
            "float": ctx.all_reduce("SUM", 1.0),
            "int": ctx.all_reduce("SUM", 2),
            "np_scalar": ctx.all_reduce("SUM", np.float32(1.5)),
            "np_array": ctx.all_reduce("SUM", np.array([1.0, 2.0])),
            "nest": ctx.all_reduce("SUM", {"a": 1.0, "b": [2, np.int64(rid)]}),
            "int_mean": ctx.all_reduce("MEAN", rid + 1),
            "gather": ctx.all_gather(np.array([rid]), 0),
            "gather_nest": ctx.all_gather({"x": [np.full((1, 2), rid + 0.5)]}, 0),
        }

    out = {"replica": _listed(strategy.run(replica_fn))}
    out["reduce_sum_float"] = _listed(strategy.reduce("SUM", 1.0, axis=None))
    out["reduce_mean_int"] = _listed(strategy.reduce("MEAN", 3, axis=None))
    out["reduce_sum_axis"] = _listed(strategy.reduce("SUM", [1.0, 2.0], axis=0))
    out["reduce_mean_axis_ints"] = _listed(strategy.reduce("MEAN", [1, 2], axis=0))
    per_replica_ints = strategy.run(lambda: torch.tensor([i + 1]))
    out["reduce_mean_per_replica_ints"] = _listed(strategy.reduce("MEAN", per_replica_ints, None))

    nest = strategy.experimental_distribute_values_from_function(
        lambda ctx: {
            "a": torch.tensor([float(ctx.replica_id_in_sync_group)]),
            "b": [torch.full((ctx.replica_id_in_sync_group + 1, 2), 1.0)],
        }
    )
    out["gather_nest"] = _listed(strategy.gather(nest, axis=0))
    same_shapes = strategy.experimental_distribute_values_from_function(
        lambda ctx: {
            "a": torch.tensor([1.0]),
            "n": [torch.tensor(ctx.replica_id_in_sync_group + 1)],
        }
    )
    out["reduce_nest_sum"] = _listed(strategy.reduce("SUM", same_shapes, axis=None))
    out["reduce_nest_mean_axis"] = _listed(strategy.reduce("MEAN", nest, axis=0))
    out["local_results_nest"] = len(strategy.experimental_local_results(nest))
    return out


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 5, dtype=torch.float64),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 2, dtype=torch.float64),
    )


def _per_example(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none")


def _l2(model):
    return L2 * sum((p**2).sum() for p in model.parameters())


def _split(n: int, parts: int) -> list[int]:
    """TF's split of a global batch: the first replicas get one more."""
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def train(strategy: sj.MultiWorkerMirroredStrategy, n: int, explicit_gb: bool) -> float:
    """MWMS training with a ported TF loss vs one process doing TF's math on the global batch;
    returns the largest parameter difference."""
    workers, i = strategy.extended.topology.num_workers, strategy.extended.topology.worker_index
    rng = np.random.default_rng(n)
    x = torch.from_numpy(rng.normal(size=(n, 3)))
    y = torch.from_numpy(rng.integers(0, 2, size=n))
    w = torch.from_numpy(rng.uniform(0.5, 2.0, size=n))
    with strategy.scope():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(xb, yb, wb):
        opt.zero_grad()
        loss = sj.nn.compute_average_loss(
            _per_example(model, xb, yb),
            sample_weight=wb,
            global_batch_size=GB if explicit_gb else None,
        )
        (loss + sj.nn.scale_regularization_loss(_l2(model))).backward()
        opt.step()

    reference = _model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    for start in range(0, n, GB):
        stop = min(start + GB, n)
        sizes = _split(stop - start, workers)
        bounds = [start + sum(sizes[:r]) for r in range(workers + 1)]
        mine = slice(bounds[i], bounds[i + 1])
        strategy.run(step, args=(x[mine], y[mine], w[mine]))
        # TF's math: the gradients of every replica's TF loss, summed
        ref_opt.zero_grad()
        total = 0.0
        for r in range(workers):
            part = slice(bounds[r], bounds[r + 1])
            weighted = (_per_example(reference, x[part], y[part]) * w[part]).sum()
            size = GB if explicit_gb else sizes[r] * workers
            total = total + (weighted / size if size else weighted * 0) + _l2(reference) / workers
        total.backward()
        ref_opt.step()
    return max(
        (p.detach() - q.detach()).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters())
    )


def main() -> dict:
    options = sj.experimental.CommunicationOptions(timeout_seconds=60)
    strategy = sj.MultiWorkerMirroredStrategy(communication_options=options)
    out = values(strategy)
    out["train"] = {
        f"{n}_{'gb' if explicit else 'default'}": train(strategy, n, explicit)
        for n in (11, 9)  # last global batch 3 (split 2 + 1) and 1 (1 + an empty replica)
        for explicit in (True, False)
    }
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
    sys.stdout.flush()
    os._exit(0)
