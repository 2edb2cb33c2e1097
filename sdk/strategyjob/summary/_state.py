"""What ``tf.summary`` keeps per process: the default writer, the default step and whether
summaries are recorded (``record_if``).

TensorFlow keeps these per thread and copies them into a MirroredStrategy's replica threads;
here they are one state per process, so replica threads see the caller's writer and step as
they do under TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

#: ``record_if``'s condition: a bool, or a callable giving one each time a summary is made.
Condition = bool | Callable[[], Any]


class DefaultWriter(Protocol):
    """What the summary ops ask of the default writer (``_writer.SummaryWriter``), declared
    here so that this state sits under the writer that sets it."""

    def write(self, tag: str, value: Any, step: int) -> bool: ...

    def flush(self) -> None: ...


@dataclass
class _State:
    writer: DefaultWriter | None = None
    step: Any = None
    recording: list[Condition] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)


STATE = _State()


def reset_for_tests() -> None:
    """Forget the default writer, step and conditions (between tests)."""
    STATE.writer = None
    STATE.step = None
    STATE.recording.clear()
