"""Reusable CPU memory for large collective results.

Why: ``ReplicaContext.all_reduce`` must return a new tensor (TensorFlow's semantics; the input
stays untouched). A fresh 25 MB tensor costs some 6,000 page faults, 2 to 5 ms on a 2-core VM,
a quarter of the all-reduce itself. The memory of a result handed to the caller is used again
only once every tensor viewing it is gone: each buffer is a ``bytearray`` that the result's
storage holds a buffer export of, so the bytearray's reference count says whether any tensor
still sees it.
"""

from __future__ import annotations

import sys
import threading

import torch

__all__ = ["MIN_POOLED_BYTES", "ResultBuffers"]

#: Smaller results are cheap to allocate; pooling them would only hold memory.
MIN_POOLED_BYTES = 1 << 20
#: ``sys.getrefcount(self._buffers[i])`` of a buffer no tensor sees: the pool's list and
#: getrefcount's own argument.
_FREE_REFCOUNT = 2


class ResultBuffers:
    """A few reusable buffers, at most ``max_bytes`` in all (the least recently used free one
    goes first when a new size needs room)."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self._max_bytes = max_bytes
        self._buffers: list[bytearray] = []  # least recently used first
        self._lock = threading.Lock()

    def empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised 1-D CPU tensor, on memory already touched when one is free."""
        nbytes = numel * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES:
            return torch.empty(numel, dtype=dtype)
        with self._lock:
            buffer = self._take_free(nbytes)
            if buffer is None:
                buffer = self._make_room_for(nbytes)
            if buffer is None:
                return torch.empty(numel, dtype=dtype)
            self._buffers.append(buffer)
            return torch.frombuffer(buffer, dtype=dtype, count=numel)

    def _is_free(self, i: int) -> bool:
        return sys.getrefcount(self._buffers[i]) == _FREE_REFCOUNT

    def _take_free(self, nbytes: int) -> bytearray | None:
        for i in range(len(self._buffers)):
            if len(self._buffers[i]) == nbytes and self._is_free(i):
                return self._buffers.pop(i)
        return None

    def _make_room_for(self, nbytes: int) -> bytearray | None:
        if nbytes > self._max_bytes:
            return None
        held = sum(len(b) for b in self._buffers)
        i = 0
        while held + nbytes > self._max_bytes and i < len(self._buffers):
            if self._is_free(i):
                held -= len(self._buffers.pop(i))
            else:
                i += 1
        if held + nbytes > self._max_bytes:
            return None
        return bytearray(nbytes)
