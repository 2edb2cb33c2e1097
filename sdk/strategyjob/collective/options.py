"""``CommunicationOptions`` and ``CommunicationImplementation``: how collectives run.

Mirrors ``tf.distribute.experimental.CommunicationOptions`` (TensorFlow's ``collective_util``):
the same constructor, validation messages and ``merge`` rule. Torch-free.
"""

from __future__ import annotations

import copy
import enum

__all__ = ["CollectiveCommunication", "CommunicationImplementation", "CommunicationOptions"]


class CommunicationImplementation(enum.Enum):
    """Cross-device communication implementation.

    * ``AUTO``: chosen by StrategyJob: gloo for CPU tensors, NCCL for CUDA tensors.
    * ``RING``: TensorFlow's ring algorithms; here gloo (ring all-reduce over TCP), the CPU path.
    * ``NCCL``: NCCL for CUDA tensors (CPU tensors still use gloo, as NCCL cannot carry them).
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


#: TensorFlow's deprecated alias, kept so ported code runs.
CollectiveCommunication = CommunicationImplementation


class CommunicationOptions:
    """Options for cross-device communications such as all-reduce.

    Args:
      bytes_per_pack: a non-negative integer. Collectives of many tensors are split into
        packs of about this many bytes, each sent as one collective (gradient buckets use it
        as their size). 0 means the default: 25 MB buckets, like DistributedDataParallel.
      timeout_seconds: a float or None. Every collective that takes longer raises
        ``strategyjob.errors.DeadlineExceededError`` (a dead peer raises
        ``strategyjob.errors.UnavailableError`` as soon as it is detected). None: no timeout.
      implementation: a ``CommunicationImplementation`` or its name, case-insensitive.

    Example::

        options = strategyjob.experimental.CommunicationOptions(
            bytes_per_pack=50 * 1024 * 1024,
            timeout_seconds=120.0,
            implementation=strategyjob.experimental.CommunicationImplementation.RING)
    """

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
    ) -> None:
        if bytes_per_pack < 0:
            raise ValueError(f"Argument `bytes_per_pack` must be >=0, Received {bytes_per_pack}.")
        if isinstance(implementation, str):
            implementation = CommunicationImplementation(implementation.upper())
        if not isinstance(implementation, CommunicationImplementation):
            raise ValueError(
                "Argument `implementation` must be instance of "
                "`tf.distribute.experimental.CommunicationImplementation`."
            )
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = implementation

    def merge(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """A copy of ``self`` with the non-default fields of ``options`` taking precedence."""
        merged = copy.deepcopy(self)
        if options is None:
            return merged
        if options.bytes_per_pack != 0:
            merged.bytes_per_pack = options.bytes_per_pack
        if options.timeout_seconds is not None:
            merged.timeout_seconds = options.timeout_seconds
        if options.implementation != CommunicationImplementation.AUTO:
            merged.implementation = options.implementation
        return merged

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommunicationOptions):
            return NotImplemented
        return (self.bytes_per_pack, self.timeout_seconds, self.implementation) == (
            other.bytes_per_pack,
            other.timeout_seconds,
            other.implementation,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like TensorFlow's

    def __repr__(self) -> str:
        return (
            f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, "
            f"timeout_seconds={self.timeout_seconds}, implementation={self.implementation})"
        )
