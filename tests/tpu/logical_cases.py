"""Every mix of annotated operands of one replica, against the unsplit computation.

Run by ``tpu_worker.py`` inside its cluster (one process per logical device): each case
annotates two operands (split with every partition shape of ``L`` logical devices, replicated,
assigned to the first or last logical device, unannotated, or a chain of annotations), applies
an operation in ``strategy.run``, takes the gradient of a weighted sum there (as a training step
does) and compares the value ``run`` returns and both operands' gradients with the same
computation on plain tensors. Every replica uses its own values.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Annotate = Callable[[torch.Tensor], torch.Tensor]


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    """A plain tensor (gradients reach unannotated tensors whole) equal to ``b``."""
    if type(a) is not torch.Tensor or a.shape != b.shape:
        return False
    return bool(torch.allclose(a, b, atol=1e-4, rtol=1e-4))


def _matrix_annotations(strategy, cores: int) -> dict[str, Annotate]:
    split = strategy.experimental_split_to_logical_devices
    assign = strategy.experimental_assign_to_logical_device
    rep = strategy.experimental_replicate_to_logical_devices
    shapes = {2: ([2, 1], [1, 2]), 4: ([4, 1], [1, 4], [2, 2])}[cores]
    out: dict[str, Annotate] = {f"split{list(s)}": (lambda t, s=s: split(t, s)) for s in shapes}
    out.update(
        rep=rep,
        assign0=lambda t: assign(t, 0),
        **{f"assign{cores - 1}": lambda t: assign(t, cores - 1)},
        plain=lambda t: t,
    )
    return out


def _chain_annotations(strategy, cores: int) -> dict[str, Annotate]:
    """Annotations of annotated tensors (TF lets one annotate any tensor again)."""
    split = strategy.experimental_split_to_logical_devices
    assign = strategy.experimental_assign_to_logical_device
    rep = strategy.experimental_replicate_to_logical_devices
    rows, cols = ([cores, 1], [1, cores])
    grid = [2, 2] if cores == 4 else rows
    return {
        "rep(split)": lambda t: rep(split(t, grid)),
        "split(split)": lambda t: split(split(t, rows), cols),
        "split(assign)": lambda t: split(assign(t, cores - 1), grid),
        "assign(split)": lambda t: assign(split(t, cols), 1),
        "rep(assign)": lambda t: rep(assign(t, 1)),
        "assign(assign)": lambda t: assign(assign(t, 0), cores - 1),
        "split(rep*2)/2": lambda t: split(rep(t) * 2.0, cols) / 2.0,
    }


def _vector_annotations(strategy, cores: int) -> dict[str, Annotate]:
    split = strategy.experimental_split_to_logical_devices
    return {
        f"split[{cores}]": lambda t: split(t, [cores]),
        "rep": strategy.experimental_replicate_to_logical_devices,
        "assign0": lambda t: strategy.experimental_assign_to_logical_device(t, 0),
        "plain": lambda t: t,
    }


# op name -> (operation, shape of a, shape of b)
MATRIX_OPS: dict[str, tuple[Callable, tuple[int, ...], tuple[int, ...]]] = {
    "matmul": (lambda a, b: a @ b, (4, 8), (8, 12)),
    "matmul_t": (lambda a, b: torch.matmul(a, b.t()), (4, 8), (12, 8)),
    "add": (lambda a, b: a + b, (4, 8), (4, 8)),
    "mul": (lambda a, b: a * b, (4, 8), (4, 8)),
    "tanh_chain": (lambda a, b: torch.tanh(a @ b) * a + b, (8, 8), (8, 8)),
}
VECTOR_OPS: dict[str, tuple[Callable, tuple[int, ...], tuple[int, ...]]] = {
    "matvec": (lambda a, v: torch.mv(a, v), (4, 8), (8,)),
    "bias": (lambda a, v: a + v, (4, 8), (8,)),
}


def _mixed_radix_cases(strategy) -> list[tuple[str, Annotate, Annotate, tuple]]:
    """L = 6: the replica's mesh is (2, 3), so a [3, 2] split gets a mesh of its own."""
    split = strategy.experimental_split_to_logical_devices
    assign = strategy.experimental_assign_to_logical_device
    rep = strategy.experimental_replicate_to_logical_devices
    operands: dict[str, Annotate] = {
        f"split{s}": (lambda t, s=s: split(t, s)) for s in ([3, 2], [2, 3], [6, 1], [1, 6])
    }
    operands.update(rep=rep, assign0=lambda t: assign(t, 0), plain=lambda t: t)
    operands.update(
        {
            "assign5": lambda t: assign(t, 5),
            "rep(split[3, 2])": lambda t: rep(split(t, [3, 2])),
            "split[2, 3](split[3, 2])": lambda t: split(split(t, [3, 2]), [2, 3]),
            "split[3, 2](split[2, 3])": lambda t: split(split(t, [2, 3]), [3, 2]),
            "split[3, 2](assign)": lambda t: split(assign(t, 4), [3, 2]),
            "assign(split[3, 2])": lambda t: assign(split(t, [3, 2]), 2),
        }
    )
    ops = {name: (MATRIX_OPS[name][0], (12, 12), (12, 12)) for name in ("matmul", "add")}
    return [
        (f"{op_name}({a_name},{b_name})", a_fn, b_fn, op)
        for op_name, op in ops.items()
        for a_name, a_fn in operands.items()
        for b_name, b_fn in operands.items()
        if a_name != "plain" or b_name != "plain"
    ]


def _cases(strategy, cores: int) -> list[tuple[str, Annotate, Annotate, tuple]]:
    if cores == 6:
        return _mixed_radix_cases(strategy)
    matrix = _matrix_annotations(strategy, cores)
    cases = []
    for op_name, op in MATRIX_OPS.items():
        for a_name, a_fn in matrix.items():
            for b_name, b_fn in matrix.items():
                if a_name != "plain" or b_name != "plain":
                    cases.append((f"{op_name}({a_name},{b_name})", a_fn, b_fn, op))
    for op_name in ("matmul", "add"):
        for a_name, a_fn in _chain_annotations(strategy, cores).items():
            for b_name in ("rep", "plain", "assign0", next(iter(matrix))):
                op = MATRIX_OPS[op_name]
                cases.append((f"{op_name}({a_name},{b_name})", a_fn, matrix[b_name], op))
    for op_name, op in VECTOR_OPS.items():
        for a_name, a_fn in matrix.items():
            for v_name, v_fn in _vector_annotations(strategy, cores).items():
                if a_name != "plain" or v_name != "plain":
                    cases.append((f"{op_name}({a_name},{v_name})", a_fn, v_fn, op))
    return cases


def _training_step(
    op: Callable, annotate_a: Annotate, annotate_b: Annotate, weight: torch.Tensor
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The replica function: annotate, compute, and backward through a weighted sum."""

    def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = op(annotate_a(a), annotate_b(b))
        (out * weight).sum().backward()
        return out

    return step


def run_cases(strategy, replica: int) -> dict[str, str]:
    """Each case's failures ("" when the value and both gradients equal the reference)."""
    cores = strategy.extended.num_cores_per_replica
    results: dict[str, str] = {}
    for index, (name, annotate_a, annotate_b, (op, shape_a, shape_b)) in enumerate(
        _cases(strategy, cores)
    ):
        generator = torch.Generator().manual_seed(1000 * replica + index)
        a = torch.randn(shape_a, generator=generator, requires_grad=True)
        b = torch.randn(shape_b, generator=generator, requires_grad=True)
        reference = op(a, b)
        weight = torch.randn(reference.shape, generator=generator)
        ref_a, ref_b = torch.autograd.grad((reference * weight).sum(), (a, b))
        step = _training_step(op, annotate_a, annotate_b, weight)
        try:
            value = strategy.experimental_local_results(strategy.run(step, args=(a, b)))[0]
        except Exception as e:  # reported per case
            results[name] = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        failures = [
            what
            for what, ok in (
                ("value", _close(value.detach(), reference.detach())),
                ("grad_a", _close(a.grad, ref_a)),
                ("grad_b", _close(b.grad, ref_b)),
            )
            if not ok
        ]
        results[name] = ",".join(failures)
    return results


def shared_weight(strategy, replica: int) -> str:
    """One plain weight used by an assigned operand and by a split one: its gradient arrives
    from two meshes and must be the sum (failures, "" when none)."""
    cores = strategy.extended.num_cores_per_replica
    generator = torch.Generator().manual_seed(77 + replica)
    x = torch.randn(4, 12, generator=generator)
    z = torch.randn(4, 12, generator=generator)
    w = torch.randn(12, 6, generator=generator, requires_grad=True)
    ref_w = w.detach().clone().requires_grad_(True)
    reference = torch.tanh(x @ ref_w) + z @ ref_w
    reference.sum().backward()

    def step(w: torch.Tensor) -> torch.Tensor:
        first = torch.tanh(strategy.experimental_assign_to_logical_device(x, cores - 1) @ w)
        second = strategy.experimental_split_to_logical_devices(z, [1, cores]) @ w
        out = first + second
        out.sum().backward()
        return out

    try:
        value = strategy.experimental_local_results(strategy.run(step, args=(w,)))[0]
    except Exception as e:  # reported
        return f"{type(e).__name__}: {str(e)[:300]}"
    failures = []
    if not _close(value.detach(), reference.detach()):
        failures.append("value")
    if not _close(w.grad, ref_w.grad):
        failures.append("grad")
    return ",".join(failures)


def autograd_grad(strategy, replica: int) -> str:
    """``torch.autograd.grad`` inside ``run`` on a plain tensor used with a split one (a
    GradientTape's ``gradient``): the tensor must stay the graph's own (failures)."""
    cores = strategy.extended.num_cores_per_replica
    generator = torch.Generator().manual_seed(91 + replica)
    x = torch.randn(4, 12, generator=generator)
    w = torch.randn(12, 3, generator=generator, requires_grad=True)
    (reference,) = torch.autograd.grad(torch.tanh(x @ w).sum(), [w])

    def step(w: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(strategy.experimental_split_to_logical_devices(x, [1, cores]) @ w)
        (grad,) = torch.autograd.grad(out.sum(), [w])
        return grad

    try:
        grad = strategy.experimental_local_results(strategy.run(step, args=(w,)))[0]
    except Exception as e:  # reported
        return f"{type(e).__name__}: {str(e)[:300]}"
    return "" if _close(grad, reference) else "grad"


def meshes(strategy) -> dict:
    """The meshes and placements of each annotation of one replica."""
    cores = strategy.extended.num_cores_per_replica
    split = strategy.experimental_split_to_logical_devices
    shapes = [[cores, 1], [1, cores]] + ([[2, 2]] if cores == 4 else [])

    def fn() -> dict:
        t = torch.zeros(12, 12)
        tensors = {str(s): split(t, s) for s in shapes}
        tensors["rep"] = strategy.experimental_replicate_to_logical_devices(t)
        mesh = tensors["rep"].device_mesh
        return {
            "one_mesh": all(v.device_mesh == mesh for v in tensors.values()),
            "mesh_shape": list(mesh.shape),
            "placements": {k: [str(p) for p in v.placements] for k, v in tensors.items()},
        }

    return strategy.run(fn)
