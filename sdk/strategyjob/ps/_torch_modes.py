"""The private torch APIs the parameter-server worker needs, in one place.

``ps._remote.PullOnUse`` is a ``TorchFunctionMode`` that must (1) let its own bookkeeping run
without being intercepted by itself and (2) step off torch's mode stack in the middle of a
closure, as soon as no parameter is pending, so the rest of the step runs at full speed.
torch has no public API for either (``TorchFunctionMode`` only offers ``with mode:``, whose
exit happens where the ``with`` block ends). Each name below is used only here, with why;
``tests/unit/ps/test_torch_modes.py`` fails when a torch release removes or changes one.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["disable_torch_function", "pop_mode_if_on_top"]


def disable_torch_function() -> Any:
    """A context in which no torch-function mode (nor subclass override) intercepts calls.

    ``torch._C.DisableTorchFunction``: the public ``torch._C.DisableTorchFunctionSubclass``
    disables subclass overrides only, not modes, and ``torch.overrides`` exposes no way to
    run code past the active modes.
    """
    return torch._C.DisableTorchFunction()


def pop_mode_if_on_top(mode: Any) -> bool:
    """Take ``mode`` off torch's torch-function mode stack if it is the innermost mode there
    (True), else leave the stack alone (False).

    ``torch._C._len_torch_function_stack`` / ``_get_function_stack_at`` /
    ``_pop_torch_function_stack``: the stack is only reachable through these (``with mode:``
    is the public way, and its exit cannot be moved earlier than the end of the block).
    """
    depth = torch._C._len_torch_function_stack()
    if depth and torch._C._get_function_stack_at(depth - 1) is mode:
        torch._C._pop_torch_function_stack()
        return True
    return False
