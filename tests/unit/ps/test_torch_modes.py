"""The private torch APIs of the ps worker (``ps._torch_modes``): these fail when a torch
release removes or changes one of them, before ``PullOnUse`` silently would."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from strategyjob.ps import _torch_modes
from torch.overrides import TorchFunctionMode

PRIVATE_NAMES = [
    "DisableTorchFunction",
    "_len_torch_function_stack",
    "_get_function_stack_at",
    "_pop_torch_function_stack",
]


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", PRIVATE_NAMES)
def test_the_private_names_still_exist(name):
    assert hasattr(torch._C, name), f"torch {torch.__version__} has no torch._C.{name}"


def test_disable_torch_function_hides_the_active_mode():
    recorder = _Recorder()
    with recorder:
        torch.add(torch.ones(1), 1)
        with _torch_modes.disable_torch_function():
            torch.add(torch.ones(1), 1)
    assert recorder.calls.count(torch.add) == 1


def test_a_mode_on_top_is_popped_and_one_below_is_left():
    outer, inner = _Recorder(), _Recorder()
    depth = torch._C._len_torch_function_stack()
    outer.__enter__()
    try:
        inner.__enter__()
        assert not _torch_modes.pop_mode_if_on_top(outer)  # not on top: left alone
        assert torch._C._len_torch_function_stack() == depth + 2
        assert _torch_modes.pop_mode_if_on_top(inner)
        assert torch._C._len_torch_function_stack() == depth + 1
        torch.add(torch.ones(1), 1)
        assert torch.add not in inner.calls and torch.add in outer.calls
    finally:
        outer.__exit__(None, None, None)
    assert torch._C._len_torch_function_stack() == depth
    assert not _torch_modes.pop_mode_if_on_top(outer)  # an empty stack: nothing to pop
