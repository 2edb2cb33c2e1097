"""One TPUStrategy process (a TF_CONFIG worker task = one device): ``tpu_worker.py model L``.

Builds ``N / L`` replicas of ``L`` logical devices, trains a layer split across each replica's
logical devices next to the unsplit reference on one device, exercises the annotations (every
mix of them: ``logical_cases.py``) and the base Strategy API, and prints ``RESULT {json}``.
``tpu_worker.py mixed_radix L`` runs only the mixes (for L = 6, whose mesh is (2, 3)).
"""

from __future__ import annotations

import copy
import json
import sys
import time

import logical_cases
import numpy as np
import torch
import torch.distributed as dist
from strategyjob import get_replica_context
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.strategies.tpu import TPUStrategy, TPUStrategyV1
from strategyjob.tpu.experimental import DeviceAssignment, initialize_tpu_system
from torch.distributed.tensor import DTensor

FEATURES, HIDDEN, GLOBAL_BATCH, STEPS = 8, 6, 8, 2


def _tolist(t: torch.Tensor) -> list:
    return t.detach().cpu().tolist()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a.detach(), b.detach(), atol=1e-5, rtol=1e-5))


def _error(fn) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def validation_errors(strategy: TPUStrategy, topology, cores: int) -> dict:
    """TF's messages, and its check order (rank, then divisibility, then product)."""
    t = torch.zeros(3, 8)
    split = strategy.experimental_split_to_logical_devices
    errors = {
        "rank": _error(lambda: split(t, [1, 1, cores])),
        "rank_before_others": _error(lambda: split(t, [2, 3, 5])),
        "divisible": _error(lambda: split(t, [1, 3])),
        "divisible_before_product": _error(lambda: split(t, [2, 3])),
        "product": _error(lambda: split(t, [3, 1])),
        "assign_high": _error(lambda: strategy.experimental_assign_to_logical_device(t, cores)),
        "assign_negative": _error(lambda: strategy.experimental_assign_to_logical_device(t, -1)),
        "partial_assignment": _error(
            lambda: TPUStrategyV1(
                device_assignment=DeviceAssignment.build(
                    topology, computation_shape=[1, 1, 1, cores], num_replicas=1
                )
            )
        )
        if topology.num_tasks > cores
        else None,
    }
    spmd = TPUStrategy(
        experimental_device_assignment=strategy.extended.experimental_device_assignment,
        experimental_spmd_xla_partitioning=True,
    )
    errors["spmd_assign"] = _error(lambda: spmd.experimental_assign_to_logical_device(t, 0))
    errors["spmd_split_ok"] = (
        _error(lambda: spmd.experimental_split_to_logical_devices(t, [1, cores])) is None
    )
    return errors


def local_mode() -> dict:
    """No TF_CONFIG: this process's device is the only replica, with one logical device."""
    strategy = TPUStrategy()
    x = torch.arange(6.0).reshape(2, 3)

    def fn(x: torch.Tensor):
        split = strategy.experimental_split_to_logical_devices(x, [1, 1])
        return split * 2, strategy.experimental_assign_to_logical_device(x, 0)

    doubled, assigned = strategy.run(fn, args=(x,))
    copied = copy.deepcopy(strategy)
    copied_result = copied.run(
        lambda x: copied.experimental_split_to_logical_devices(x, [1, 1]), args=(x,)
    )
    t = torch.zeros(4)
    return {
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "num_cores_per_replica": strategy.extended.num_cores_per_replica,
        "doubled": _tolist(strategy.experimental_local_results(doubled)[0]),
        "assigned": _tolist(strategy.experimental_local_results(assigned)[0]),
        "reduce": _tolist(strategy.reduce("SUM", doubled, axis=None)),
        "product": _error(lambda: strategy.experimental_split_to_logical_devices(t, [2])),
        "v1_numpy_dataset": len(TPUStrategyV1().experimental_make_numpy_dataset(np.ones([10]))),
        "deepcopy_shares_mesh": copied.extended.device_mesh is strategy.extended.device_mesh,
        "deepcopy_runs": _close(copied.experimental_local_results(copied_result)[0], x),
        "assign": _error(lambda: strategy.experimental_assign_to_logical_device(t, 1)),
    }


def mixes(strategy: TPUStrategy, replica: int) -> dict:
    """Every mix of annotated operands against the unsplit computation (logical_cases.py)."""
    started = time.perf_counter()
    result = {
        "mixes": logical_cases.run_cases(strategy, replica),
        "shared_weight": logical_cases.shared_weight(strategy, replica),
        "autograd_grad": logical_cases.autograd_grad(strategy, replica),
        "meshes": strategy.experimental_local_results(logical_cases.meshes(strategy))[0],
    }
    result["mixes_seconds"] = round(time.perf_counter() - started, 2)
    return result


def mixed_radix(cores: int) -> dict:
    """One replica of ``cores`` logical devices: only the mixes of annotations."""
    resolver = TFConfigClusterResolver()
    topology = initialize_tpu_system(resolver)
    assignment = DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, cores], num_replicas=topology.num_tasks // cores
    )
    strategy = TPUStrategy(resolver, experimental_device_assignment=assignment)
    return {"rank": dist.get_rank(), **mixes(strategy, strategy.extended.topology.worker_index)}


def main(cores: int) -> dict:
    resolver = TFConfigClusterResolver()
    topology = initialize_tpu_system(resolver)
    n = topology.num_tasks
    assignment = DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, cores], num_replicas=n // cores
    )
    strategy = TPUStrategy(resolver, experimental_device_assignment=assignment)
    ext = strategy.extended
    rank = dist.get_rank()
    replicas = strategy.num_replicas_in_sync
    replica, core = ext._worker_index, ext.logical_device_id
    out: dict = {
        "rank": rank,
        "replica": replica,
        "core": core,
        "num_replicas_in_sync": replicas,
        "num_cores_per_replica": ext.num_cores_per_replica,
        "mesh": ext.device_mesh.mesh.tolist(),
        "mesh_dims": list(ext.device_mesh.mesh_dim_names),
    }

    # --- the model: initial values differ per process until the scope broadcasts them -----
    torch.manual_seed(1000 + rank)
    with strategy.scope():
        layer = torch.nn.Linear(FEATURES, HIDDEN)
        head = torch.nn.Linear(HIDDEN, 1)
        opt = torch.optim.SGD([*layer.parameters(), *head.parameters()], lr=0.1)
    ref_layer = torch.nn.Linear(FEATURES, HIDDEN)
    ref_head = torch.nn.Linear(HIDDEN, 1)
    ref_layer.load_state_dict(layer.state_dict())
    ref_head.load_state_dict(head.state_dict())
    ref_opt = torch.optim.SGD([*ref_layer.parameters(), *ref_head.parameters()], lr=0.1)

    torch.manual_seed(7)
    xs = [torch.randn(GLOBAL_BATCH, FEATURES) for _ in range(STEPS)]
    ys = [torch.randn(GLOBAL_BATCH, 1) for _ in range(STEPS)]
    per = GLOBAL_BATCH // replicas
    placements: dict = {}

    def step(x: torch.Tensor, y: torch.Tensor):
        opt.zero_grad()
        x_split = strategy.experimental_split_to_logical_devices(x, [1, cores])
        w_split = strategy.experimental_split_to_logical_devices(layer.weight, [1, cores])
        partial = torch.matmul(x_split, w_split.t())  # each core: its slice of the features
        h = strategy.experimental_replicate_to_logical_devices(partial)
        pred = head(torch.tanh(h + layer.bias))  # plain parameters compose with DTensors
        loss = ((pred - y) ** 2).mean()
        loss.backward()
        opt.step()
        placements.update(
            x_split=[str(p) for p in x_split.placements],
            x_local=_tolist(x_split.to_local()),
            partial=[str(p) for p in partial.placements],
            h=[str(p) for p in h.placements],
            loss_is_dtensor=isinstance(loss, DTensor),
        )
        return loss, pred

    checks = {"pred": [], "loss": [], "weight_grad": [], "bias_grad": [], "head_grad": []}
    for i in range(STEPS):
        x_r = strategy.experimental_distribute_values_from_function(
            lambda ctx, i=i: xs[i][ctx.replica_id_in_sync_group * per :][:per]
        )
        y_r = strategy.experimental_distribute_values_from_function(
            lambda ctx, i=i: ys[i][ctx.replica_id_in_sync_group * per :][:per]
        )
        loss, pred = strategy.run(step, args=(x_r, y_r))
        mean_loss = strategy.reduce("MEAN", loss, axis=None)

        ref_opt.zero_grad()
        ref_pred = ref_head(torch.tanh(ref_layer(xs[i])))
        ref_loss = ((ref_pred - ys[i]) ** 2).mean()
        ref_loss.backward()
        checks["pred"].append(
            _close(strategy.experimental_local_results(pred)[0], ref_pred[replica * per :][:per])
        )
        checks["loss"].append(_close(mean_loss, ref_loss))
        checks["weight_grad"].append(_close(layer.weight.grad, ref_layer.weight.grad))
        checks["bias_grad"].append(_close(layer.bias.grad, ref_layer.bias.grad))
        checks["head_grad"].append(_close(head.weight.grad, ref_head.weight.grad))
        ref_opt.step()
    out["checks"] = checks
    out["params_equal_reference"] = _close(layer.weight, ref_layer.weight) and _close(
        head.weight, ref_head.weight
    )
    out["placements"] = placements
    out["x_expected_local"] = _tolist(
        xs[-1][replica * per :][:per][:, core * FEATURES // cores :][:, : FEATURES // cores]
    )

    # --- annotations: placement, logical value and gradients ---------------------------------
    torch.manual_seed(3)
    v = torch.randn(4, FEATURES, requires_grad=True)

    def annotate(v: torch.Tensor) -> dict:
        split = strategy.experimental_split_to_logical_devices(v, [1, cores])
        (split * split).sum().backward()
        rep = strategy.experimental_replicate_to_logical_devices(v.detach())
        assigned = strategy.experimental_assign_to_logical_device(v.detach() * 2, cores - 1)
        info = {
            "split_full_equal": _close(split.full_tensor(), v),
            "rep_placements": [str(p) for p in rep.placements],
            "rep_local_equal": _close(rep.to_local(), v),
            "assigned_mesh": assigned.device_mesh.mesh.tolist(),
            "assigned_local_numel": assigned.to_local().numel(),
            "assigned_local_equal": assigned.to_local().numel() > 0
            and _close(assigned.to_local(), v * 2),
        }
        return info, assigned

    info, assigned_value = strategy.run(annotate, args=(v,))
    out["annotate"] = info
    out["split_grad_whole"] = _close(v.grad, 2 * v)

    w = torch.randn(5, 2, requires_grad=True)

    def replicate_square(w: torch.Tensor) -> torch.Tensor:
        rep = strategy.experimental_replicate_to_logical_devices(w)
        return (rep * rep).sum()

    strategy.experimental_local_results(strategy.run(replicate_square, args=(w,)))[0].backward()
    out["replicate_grad_whole"] = _close(w.grad, 2 * w)
    out["assigned_logical_value"] = _close(
        strategy.experimental_local_results(assigned_value)[0], v * 2
    )

    # gradient through an assignment reaches every core's tensor whole
    u = torch.randn(3, requires_grad=True)

    def through_assign(u: torch.Tensor) -> torch.Tensor:
        return strategy.experimental_assign_to_logical_device(u * 3.0, 0)

    value = strategy.experimental_local_results(strategy.run(through_assign, args=(u,)))[0]
    value.sum().backward()
    out["assign_grad_whole"] = _close(u.grad, torch.full((3,), 3.0))

    if cores == 4:  # a 2-D split: [1, 2, 2, 1] -> core 2a + b holds H block a x W block b
        image = torch.arange(2 * 4 * 4 * 3, dtype=torch.float32).reshape(2, 4, 4, 3)

        def split_2d(image: torch.Tensor) -> dict:
            tiles = strategy.experimental_split_to_logical_devices(image, [1, 2, 2, 1])
            a, b = divmod(core, 2)
            return {
                "placements": [str(p) for p in tiles.placements],
                "tile_equal": _close(
                    tiles.to_local(), image[:, 2 * a : 2 * a + 2, 2 * b : 2 * b + 2]
                ),
                "full_equal": _close(tiles.full_tensor(), image),
                "loss": (tiles * tiles).sum(),
            }

        image.requires_grad_(True)
        split_info = strategy.experimental_local_results(strategy.run(split_2d, args=(image,)))[0]
        split_info.pop("loss").backward()
        split_info["grad_whole"] = _close(image.grad, 2 * image)
        out["split_2d"] = split_info

    out.update(mixes(strategy, replica))
    out["errors"] = validation_errors(strategy, topology, cores)

    # --- the base Strategy API across replicas ----------------------------------------------
    ids = strategy.experimental_distribute_values_from_function(
        lambda ctx: torch.tensor([float(ctx.replica_id_in_sync_group)])
    )
    out["local_results"] = [_tolist(t) for t in strategy.experimental_local_results(ids)]
    out["gather"] = _tolist(strategy.gather(ids, axis=0))
    out["reduce_sum"] = _tolist(strategy.reduce("SUM", ids, axis=None))

    def in_replica() -> tuple:
        ctx = get_replica_context()
        total = ctx.all_reduce("SUM", torch.tensor(1.0))
        gathered = ctx.all_gather(torch.tensor([float(ctx.replica_id_in_sync_group)]), axis=0)
        return int(ctx.replica_id_in_sync_group), total, gathered

    rid, total, gathered = strategy.run(in_replica)
    out["replica_id_in_sync_group"] = rid
    out["all_reduce"] = _tolist(strategy.experimental_local_results(total)[0])
    out["all_gather"] = _tolist(strategy.experimental_local_results(gathered)[0])
    batches = [torch.arange(16.0).reshape(8, 2), torch.arange(16.0, 32.0).reshape(8, 2)]
    dataset = strategy.experimental_distribute_dataset(batches)
    out["dataset"] = [
        [_tolist(t) for t in strategy.experimental_local_results(element)] for element in dataset
    ]

    def dataset_fn(ctx) -> list:
        info = [ctx.input_pipeline_id, ctx.num_input_pipelines, ctx.num_replicas_in_sync]
        return [torch.tensor([float(v) for v in info])]

    from_function = strategy.distribute_datasets_from_function(dataset_fn)
    out["from_function"] = [
        _tolist(strategy.experimental_local_results(element)[0]) for element in from_function
    ]
    return out


if __name__ == "__main__":
    if sys.argv[1] == "local":
        result = local_mode()
    elif sys.argv[1] == "mixed_radix":
        result = mixed_radix(int(sys.argv[2]))
    else:
        result = main(int(sys.argv[2]))
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()
