"""Device names: TF-style strings, torch-style strings and ``torch.device`` to one logical device.

TensorFlow lets one CPU be split into logical devices ``CPU:0``, ``CPU:1``…, which is how
multi-replica behaviour is tested on CPU-only machines. torch places every CPU tensor on the
one ``cpu`` device, so a :class:`LogicalDevice` keeps the index that torch drops:
``"cpu:0"`` and ``"cpu:1"`` are distinct replicas although both compute on ``torch.device("cpu")``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import torch

_TORCH_TYPE = {"CPU": "cpu", "GPU": "cuda", "CUDA": "cuda"}
_TF_TYPE = {"cpu": "CPU", "cuda": "GPU"}

# "/job:worker/replica:0/task:1/device:GPU:0", "/device:CPU:1", "/cpu:0", "/job:localhost"
_TF_PART = re.compile(r"^(job|replica|task|device):?(.*)$")
_SHORT = re.compile(r"^([A-Za-z_]+)(?::(\d+))?$")


@dataclass(frozen=True)
class LogicalDevice:
    """One replica's device: a torch device type plus the logical index and its host."""

    device_type: str  # torch spelling: "cpu", "cuda", …
    index: int = 0
    job: str = "localhost"
    replica: int = 0
    task: int = 0

    @property
    def torch_device(self) -> torch.device:
        """The device to place tensors on; CPU keeps its logical index (torch ignores it)."""
        return torch.device(self.device_type, self.index)

    @property
    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    @property
    def host(self) -> tuple[str, int, int]:
        """``(job, replica, task)``: devices with the same host live in one process."""
        return (self.job, self.replica, self.task)

    @property
    def host_cpu(self) -> LogicalDevice:
        """The CPU of this device's host (TF's input host for a strategy)."""
        return LogicalDevice("cpu", 0, self.job, self.replica, self.task)

    @property
    def name(self) -> str:
        """TF's fully qualified name, e.g. ``/job:localhost/replica:0/task:0/device:CPU:1``."""
        kind = _TF_TYPE.get(self.device_type, self.device_type.upper())
        return f"/job:{self.job}/replica:{self.replica}/task:{self.task}/device:{kind}:{self.index}"

    def __str__(self) -> str:
        return self.name


def _bad(device: Any, why: str) -> ValueError:
    return ValueError(
        f"Cannot interpret {device!r} as a device: {why}. Use a torch.device, 'cpu:N', "
        "'cuda:N' or a TensorFlow name such as '/job:localhost/replica:0/task:0/device:CPU:N'."
    )


def _parse_type_index(text: str, original: Any) -> tuple[str, int]:
    match = _SHORT.match(text)
    if not match:
        raise _bad(original, f"{text!r} is not TYPE or TYPE:INDEX")
    kind, index = match.group(1), int(match.group(2) or 0)
    torch_type = _TORCH_TYPE.get(kind.upper(), kind.lower())
    try:
        torch.device(torch_type)
    except RuntimeError as err:
        raise _bad(original, f"unknown device type {kind!r}") from err
    return torch_type, index


def canonicalize(device: str | torch.device | LogicalDevice) -> LogicalDevice:
    """Parse any accepted device spelling into a :class:`LogicalDevice`.

    Accepts ``torch.device("cuda", 1)``, ``"cpu"``, ``"cpu:1"``, ``"GPU:0"``, ``"/cpu:0"``,
    ``"/device:CPU:1"`` and ``"/job:worker/replica:0/task:1/device:GPU:0"``.
    """
    if isinstance(device, LogicalDevice):
        return device
    if isinstance(device, torch.device):
        return LogicalDevice(device.type, device.index or 0)
    if not isinstance(device, str):
        raise _bad(device, f"expected a string or torch.device, got {type(device).__name__}")
    return _parse_name(device)


@functools.lru_cache(maxsize=1024)
def _parse_name(device: str) -> LogicalDevice:
    """A device name parsed once: the names a job uses are few, and a step reads them often
    (a variable's ``device``); the result is immutable, a refused name raises each time."""
    text = device.strip()
    if not text:
        raise _bad(device, "the name is empty")
    if not text.startswith("/"):
        kind, index = _parse_type_index(text, device)
        return LogicalDevice(kind, index)
    job, replica, task = "localhost", 0, 0
    kind, index = "cpu", 0
    for part in text.strip("/").split("/"):
        match = _TF_PART.match(part)
        field, value = (match.group(1), match.group(2)) if match else (None, part)
        try:
            if field == "job":
                job = value
            elif field == "replica":
                replica = int(value)
            elif field == "task":
                task = int(value)
            else:  # "device:CPU:1" or the short "/cpu:0"
                kind, index = _parse_type_index(value, device)
        except ValueError as err:
            if isinstance(err.args[0], str) and err.args[0].startswith("Cannot interpret"):
                raise
            raise _bad(device, f"{part!r} has a non-integer index") from err
    return LogicalDevice(kind, index, job, replica, task)


def local_device_count(device_type: str) -> int | None:
    """How many ``device_type`` devices (torch's spelling) this process sees; None for the
    CPU, whose logical devices are unbounded, and for a type torch cannot count."""
    if device_type == "cpu":
        return None
    if device_type == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    module = getattr(torch, device_type, None)
    count = getattr(module, "device_count", None)
    return int(count()) if callable(count) else None


def require_local(device: LogicalDevice) -> LogicalDevice:
    """``device``, if this process has it. TensorFlow fails with ``<name> unknown device.``
    only when the first tensor is placed there (a batch, deep in ``strategy.run``); the same
    words, with what the machine has, come here when the strategy is made."""
    count = local_device_count(device.device_type)
    if count is None or device.index < count:
        return device
    kind = _TF_TYPE.get(device.device_type, device.device_type.upper())
    seen = (
        f"no {kind}"
        if count == 0
        else f"{count} {kind}{'s' if count > 1 else ''} ({kind}:0 to {kind}:{count - 1})"
    )
    raise RuntimeError(
        f"{device.name} unknown device. This process sees {seen}: name one it has, e.g. "
        "'/cpu:0', or pass no devices to use every local GPU (the CPU when there is none)."
    )


def all_local_devices() -> tuple[LogicalDevice, ...]:
    """All local GPUs, else the CPU: the default device list of MirroredStrategy."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return tuple(LogicalDevice("cuda", i) for i in range(torch.cuda.device_count()))
    return (LogicalDevice("cpu", 0),)


def device_of(value: Any) -> torch.device | None:
    """The torch device a tensor (or tensor-like with ``.device``) lives on, else None."""
    device = getattr(value, "device", None)
    return device if isinstance(device, torch.device) else None


def to_device(tensor: torch.Tensor, device: torch.device | LogicalDevice | str) -> torch.Tensor:
    """``tensor`` on ``device`` without a copy when it is already there.

    ``tensor.to(torch.device("cpu", 1))`` copies a CPU tensor (torch compares the index);
    logical CPU devices all compute on torch's one CPU, so they count as the same place.
    """
    target = canonicalize(device).torch_device if not isinstance(device, torch.device) else device
    if target.type == "cpu":
        return tensor if tensor.device.type == "cpu" else tensor.to("cpu")
    if tensor.device.type == target.type and tensor.device.index == target.index:
        return tensor
    return tensor.to(target)


@dataclass(frozen=True)
class Topology:
    """Where a strategy's replicas run, as the modules around it may read it (input sharding,
    variable components, gradient buckets, replica contexts): one value instead of the
    strategy's own bookkeeping, so a strategy can keep that however it likes."""

    #: One torch device per local replica (CPU devices keep their logical index).
    local_devices: tuple[torch.device, ...]
    #: Input pipelines and gradient contributions between processes (TPUStrategy: replicas).
    num_workers: int
    #: This process's place among them.
    worker_index: int
    num_replicas_in_sync: int

    def global_replica_id(self, local_id: int) -> int:
        """The ``replica_id_in_sync_group`` of this worker's ``local_id``-th replica."""
        return self.worker_index * len(self.local_devices) + local_id
