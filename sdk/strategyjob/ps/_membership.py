"""Which workers a ``ClusterCoordinator`` schedules onto, as a job is resized while it trains.

A membership is ``{worker index: address}`` (TensorFlow's sparse ``ClusterSpec`` form, so that
removing worker 1 of 0..3 keeps 0, 2 and 3 where they are). ``change`` decides, from the
membership the coordinator runs with and the one its transport now reports, which workers join
and which leave; the coordinator does the I/O (threads, connections). A task whose address
changed is a different worker (its process and state are elsewhere): it leaves and joins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Change", "change", "workers_of"]


@dataclass(frozen=True)
class Change:
    """Worker indices that join (``added``) and leave (``removed``), each ascending."""

    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


def change(old: Mapping[int, str], new: Mapping[int, str]) -> Change:
    """What turns membership ``old`` into ``new``."""
    return Change(
        added=tuple(sorted(i for i, a in new.items() if old.get(i) != a)),
        removed=tuple(sorted(i for i, a in old.items() if new.get(i) != a)),
    )


def workers_of(cluster: object) -> dict[int, str]:
    """The ``worker`` tasks of ``cluster`` (TF_CONFIG's ``cluster`` object: a list of addresses,
    or ``{index: address}`` for sparse indices); ``ValueError`` saying what is wrong."""
    if not isinstance(cluster, dict):
        raise ValueError(f"expected a JSON object like TF_CONFIG's 'cluster', got {cluster!r}")
    tasks = cluster.get("worker")
    if isinstance(tasks, list):
        indexed: dict[object, object] = dict(enumerate(tasks))
    elif isinstance(tasks, dict):
        indexed = dict(tasks)
    else:
        raise ValueError(
            "its 'worker' must be a list of host:port or an object {index: host:port}, got "
            f"{tasks!r}"
        )
    workers: dict[int, str] = {}
    for index, address in indexed.items():
        try:
            number = int(str(index))
        except ValueError:
            number = -1
        if number < 0:
            raise ValueError(f"worker index {index!r} is not a non-negative integer")
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"worker {number}'s address {address!r} is not host:port")
        workers[number] = address
    if not workers:
        raise ValueError("it names no worker (a job keeps at least one)")
    return workers
