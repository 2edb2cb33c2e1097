"""Tensors and Python objects on the wire.

Tensors travel as raw bytes plus dtype and shape (the ``Tensor`` message), never pickled.
Functions and other Python objects are cloudpickled by value; every tensor inside them is
swapped for a reference into a side list of ``Tensor`` messages (pickle's persistent ids), and
objects that stand for state on a parameter server (variables, module parameters, optimizers)
reduce to small handles, so shipping a model ships its structure, not its weights.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import torch

from strategyjob.ps import strategyjob_ps_pb2 as pb

__all__ = ["dumps", "from_proto", "loads", "to_proto"]

# 1 GiB: a 100k x 64 float table (25.6 MB) and its gradients pass in one message.
MAX_MESSAGE_BYTES = 1 << 30
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A restarted task is found again within a second, not after gRPC's default backoff
    # (which grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Big messages (rows, gradients) in few frames and without waiting for window updates.
    ("grpc.http2.lookahead_bytes", 16 << 20),
    ("grpc.http2.max_frame_size", 4 << 20),
    ("grpc.http2.bdp_probe", 0),
]

_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def to_proto(tensor: torch.Tensor) -> pb.Tensor:
    """A dense CPU copy of ``tensor`` as raw bytes."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    flat = t.reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return pb.Tensor(dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape), data=data)


def from_proto(message: pb.Tensor) -> torch.Tensor:
    dtype = _DTYPES[message.dtype]
    shape = tuple(message.shape)
    if not message.data:
        return torch.empty(shape, dtype=dtype)
    raw = np.frombuffer(message.data, dtype=np.uint8).copy()
    return torch.from_numpy(raw).view(dtype).reshape(shape)


# A hook maps an object to a persistent id (or None); the loader maps it back.
PersistentHook = Callable[[Any], Any]


_REDUCERS: list[tuple[type, Callable[[Any], Any]]] = []


def register_reducer(kind: type, reduce: Callable[[Any], Any]) -> None:
    """Ship instances of ``kind`` as ``reduce(obj)`` (a ``__reduce__`` tuple, or
    ``NotImplemented`` to pickle normally): how modules and optimizers become handles."""
    _REDUCERS.append((kind, reduce))


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, file: io.BytesIO, tensors: list, hook: PersistentHook | None) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors
        self._hook = hook

    def persistent_id(self, obj: Any) -> Any:
        if self._hook is not None:
            pid = self._hook(obj)
            if pid is not None:
                return pid
        if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter):
            self._tensors.append(to_proto(obj))
            return (
                "tensor",
                len(self._tensors) - 1,
                obj.requires_grad,
                isinstance(obj, torch.nn.Parameter),
            )
        return None

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, type):
            for kind, reduce in _REDUCERS:
                if isinstance(obj, kind):
                    result = reduce(obj)
                    if result is not NotImplemented:
                        return result
        return super().reducer_override(obj)


def dumps(obj: Any, hook: PersistentHook | None = None) -> tuple[bytes, list[pb.Tensor]]:
    """``obj`` as cloudpickle bytes plus the ``Tensor`` messages it refers to."""
    buffer, tensors = io.BytesIO(), []
    _Pickler(buffer, tensors, hook).dump(obj)
    return buffer.getvalue(), tensors


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, tensors: Any, loader: Callable[[Any], Any] | None) -> None:
        super().__init__(io.BytesIO(data))
        self._tensors = tensors
        self._loader = loader

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "tensor":
            _, index, requires_grad, is_param = pid
            tensor = from_proto(self._tensors[index])
            if is_param:
                return torch.nn.Parameter(tensor, requires_grad=requires_grad)
            return tensor.requires_grad_(requires_grad) if requires_grad else tensor
        if self._loader is None:
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
        return self._loader(pid)


def loads(data: bytes, tensors: Any, loader: Callable[[Any], Any] | None = None) -> Any:
    """Inverse of :func:`dumps`; ``loader`` resolves the ids a hook produced."""
    return _Unpickler(data, tensors, loader).load()
