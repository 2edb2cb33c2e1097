"""Pure helpers for pod logs: whole lines out of a byte stream, and several replicas'
timestamped logs merged into one chronological stream."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple


class LogLine(NamedTuple):
    """One line of one replica's log. ``error`` lines say why a replica has no log
    (e.g. its pod is still Pending) instead of carrying its output."""

    replica: str
    text: str
    error: bool = False


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines (without their newline) from a stream cut at arbitrary bytes; a
    last line without a newline is yielded when the stream ends."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def timestamp_key(stamp: str) -> str | None:
    """A sort key for the RFC 3339 timestamp the kubelet puts before each line with
    ``timestamps=true`` (``2026-01-02T03:04:05.1234Z``: the fraction has no trailing
    zeros, so plain string order is wrong); None when it is not one."""
    if len(stamp) < 20 or stamp[4] != "-" or stamp[10] != "T" or not stamp.endswith("Z"):
        return None
    seconds, _, fraction = stamp[:-1].partition(".")
    if not fraction.isdigit() and fraction:
        return None
    return f"{seconds}.{fraction:0<9}"


def merge_by_time(logs: Sequence[tuple[str, str]]) -> list[LogLine]:
    """Interleave ``(replica, timestamped log text)`` pairs by the lines' timestamps,
    stripping them. A line without a timestamp keeps the time of the line before it."""

    def keyed(replica: str, text: str) -> Iterator[tuple[str, int, LogLine]]:
        last = ""
        for number, line in enumerate(text.splitlines()):
            stamp, _, rest = line.partition(" ")
            key = timestamp_key(stamp)
            if key is None:
                key, rest = last, line
            last = key
            yield key, number, LogLine(replica, rest)

    streams = [keyed(replica, text) for replica, text in logs]
    return [line for _, _, line in heapq.merge(*streams, key=lambda item: item[:2])]
