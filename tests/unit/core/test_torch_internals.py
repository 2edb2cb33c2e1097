"""The private torch APIs gradient synchronisation uses (``collective/_torch_internals.py``)
still behave as it relies on: a torch release that changes one fails here, by name."""

from __future__ import annotations

import torch
import torch.distributed as dist
from strategyjob.collective import _torch_internals as internals


def test_storage_uses_counts_the_views_of_a_buffer():
    assert internals.CAN_COUNT_STORAGE_USES
    flat = torch.zeros(8)
    alone = internals.storage_uses(flat)
    view = flat[2:4]
    assert internals.storage_uses(flat) == alone + 1
    del view
    assert internals.storage_uses(flat) == alone


def test_each_backward_pass_has_its_own_id_and_callbacks_run_after_every_gradient():
    seen: list[tuple[int, str]] = []
    ended: list[int] = []
    weights = [torch.ones(3, requires_grad=True) for _ in range(2)]

    def on_grad(param: torch.Tensor) -> None:
        task = internals.current_backward_pass()
        seen.append((task, "grad"))
        if len(seen) % 2 == 1:  # once per pass, from inside it
            internals.run_when_backward_ends(lambda: ended.append(len(seen)))

    for w in weights:
        w.register_post_accumulate_grad_hook(on_grad)
    for _ in range(2):
        sum((w * w).sum() for w in weights).backward()
    assert internals.current_backward_pass() == -1  # outside any pass
    tasks = [task for task, _ in seen]
    assert len(tasks) == 4 and tasks[0] == tasks[1] and tasks[2] == tasks[3]
    assert tasks[0] != tasks[2]
    assert ended == [2, 4]  # each pass's callback ran after both of its gradients


def test_process_groups_lists_the_default_group_and_its_sub_groups(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        sub = dist.new_group([0])
        groups = internals.process_groups()
        assert dist.group.WORLD in groups and sub in groups
    finally:
        dist.destroy_process_group()
    assert internals.process_groups() == []
