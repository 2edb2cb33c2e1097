"""Input options and enums: ``InputOptions``, ``InputReplicationMode``, ``AutoShardPolicy``.

Mirrors ``tf.distribute.InputOptions`` / ``tf.distribute.InputReplicationMode`` and
``tf.data.experimental.AutoShardPolicy`` (semantics §4.3, §4.5), names and messages included.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "SHARD_HINT",
    "AutoShardPolicy",
    "InputOptions",
    "InputReplicationMode",
    "validate_function_options",
]

SHARD_HINT = -1
"""Placeholder for ``shard(num_shards, index)`` that ``AutoShardPolicy.HINT`` replaces with
``(num_workers, worker_index)`` (TF's ``tf.data.experimental.SHARD_HINT``)."""


class AutoShardPolicy(enum.IntEnum):
    """How ``experimental_distribute_dataset`` shards its input across workers.

    OFF: every worker reads everything. AUTO: FILE if the input declares its files, else DATA.
    FILE: worker ``w`` reads files ``w, w+W, …``. DATA: every worker reads everything and keeps
    its own share of each global batch. HINT: only ``shard(SHARD_HINT, SHARD_HINT)`` placeholders
    are replaced by ``shard(W, w)``.
    """

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


class InputReplicationMode(enum.Enum):
    """Whether ``distribute_datasets_from_function`` builds one dataset per worker or replica."""

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


class InputOptions(
    NamedTuple(
        "InputOptions",
        [
            ("experimental_fetch_to_device", bool),
            ("experimental_replication_mode", InputReplicationMode),
            ("experimental_place_dataset_on_device", bool),
            ("experimental_per_replica_buffer_size", int),
        ],
    )
):
    """Options for distributed input (``tf.distribute.InputOptions``).

    ``experimental_fetch_to_device`` (default True) moves every replica's batch to that replica's
    device; False leaves it on the host CPU. ``experimental_per_replica_buffer_size`` is accepted
    for compatibility.
    """

    def __new__(
        cls,
        experimental_fetch_to_device: bool | None = None,
        experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER,
        experimental_place_dataset_on_device: bool = False,
        experimental_per_replica_buffer_size: int = 1,
    ) -> InputOptions:
        if experimental_fetch_to_device is None:
            experimental_fetch_to_device = True
        try:
            experimental_replication_mode = InputReplicationMode(experimental_replication_mode)
        except ValueError:
            raise ValueError(
                "experimental_replication_mode must be InputReplicationMode.PER_WORKER or "
                f"InputReplicationMode.PER_REPLICA, got {experimental_replication_mode!r}"
            ) from None
        return super().__new__(
            cls,
            experimental_fetch_to_device,
            experimental_replication_mode,
            experimental_place_dataset_on_device,
            experimental_per_replica_buffer_size,
        )


def validate_function_options(options: InputOptions | None) -> None:
    """The checks TF makes in ``distribute_datasets_from_function`` (input_util.py)."""
    if options is None:
        return
    per_replica = options.experimental_replication_mode == InputReplicationMode.PER_REPLICA
    if options.experimental_place_dataset_on_device and not per_replica:
        raise ValueError(
            "When `experimental_place_dataset_on_device` is set for dataset placement, you must "
            "also specify `PER_REPLICA` for the replication mode"
        )
    if (
        per_replica
        and options.experimental_fetch_to_device
        and options.experimental_place_dataset_on_device
    ):
        raise ValueError(
            "`experimental_place_dataset_on_device` can not be set to True when "
            "experimental_fetch_to_device is True and replication mode is set to `PER_REPLICA`"
        )
