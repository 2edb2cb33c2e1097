"""Tensors and Python objects on the wire.

Tensors travel as raw bytes plus dtype and shape (the ``Tensor`` message), never pickled.
Functions and other Python objects are cloudpickled by value; every tensor inside them is
swapped for a reference into a side list of ``Tensor`` messages (pickle's persistent ids), and
objects that stand for state on a parameter server (variables, module parameters, optimizers)
reduce to small handles, so shipping a model ships its structure, not its weights.

The calls to a parameter server (every step's reads, row gathers and gradients) use framed
messages (``pack`` / ``unpack``): the ``Tensor`` messages carry dtype and shape only, and the
bytes of all tensors follow one another in the message's ``raw`` field, written first so that
they sit at a fixed, aligned place. The sender copies each tensor once (into the message), the
receiver reads them in place (``torch.frombuffer``), with no protobuf copies in between.
"""

from __future__ import annotations

import io
import math
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import torch

from strategyjob.ps import strategyjob_ps_pb2 as pb

__all__ = [
    "dumps",
    "from_proto",
    "loads",
    "pack",
    "pack_state",
    "to_proto",
    "unpack",
    "unpack_state",
]

# 1 GiB: a 100k x 64 float table (25.6 MB) and its gradients pass in one message.
MAX_MESSAGE_BYTES = 1 << 30
# A peer is declared lost KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS (30 s) after it last
# answered at most.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 20_000
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
    # Dead-peer detection: a peer that does not answer a ping within KEEPALIVE_TIMEOUT_MS (a
    # frozen or vanished process, a lost node: its kernel may still hold the connection) ends
    # the calls on that connection with UNAVAILABLE. Both ends ping every KEEPALIVE_TIME_MS
    # while calls are open (idle streams kept for the next step included) and accept each
    # other's pings at that rate.
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),  # (which recent gRPCs use instead)
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
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


# ---------------------------------------------------------------------------------------------
# framed messages: tensors' bytes in the message's `raw` field, read in place

_RAW_FIELD = 2048  # see VarOps in strategyjob_ps.proto


def _varint(value: int, width: int) -> bytes:
    """``value`` as a protobuf varint of exactly ``width`` bytes (padded, still valid)."""
    if value >> (7 * width):
        raise ValueError(f"{value} does not fit a {width}-byte varint")
    return bytes((value >> (7 * i)) & 0x7F | (0x80 if i < width - 1 else 0) for i in range(width))


_RAW_KEY = _varint((_RAW_FIELD << 3) | 2, 3)  # field 2048, length-delimited: 3 bytes
_PREFIX = 8  # the key and a 5-byte length
_PAD = [bytes(n) for n in range(8)]
_ITEMSIZE = {name: torch.empty(0, dtype=d).element_size() for name, d in _DTYPES.items()}
_DTYPE_NAMES = {d: name for name, d in _DTYPES.items()}

with warnings.catch_warnings():
    # Tensors are read in place from the (immutable) bytes of a received message; torch
    # warns once per process that such a buffer is not writable. They are only read, or
    # belong to the caller alone (the message is not shared), so silence that warning.
    warnings.simplefilter("ignore")
    torch.frombuffer(bytes(8), dtype=torch.uint8)


def tensor_meta(tensor: torch.Tensor) -> pb.Tensor:
    """The ``Tensor`` message of ``tensor`` without its data (which goes to ``raw``)."""
    try:
        name = _DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise TypeError(
            f"Tensors of dtype {tensor.dtype} cannot be sent to a parameter server; supported: "
            f"{', '.join(_DTYPES)}"
        ) from None
    return pb.Tensor(dtype=name, shape=tensor.shape)


def _buffer(tensor: torch.Tensor) -> Any:
    """``tensor``'s bytes as a buffer (no copy when it is a dense CPU tensor)."""
    try:
        array = tensor.numpy()  # the common case, in one call
        if array.flags.c_contiguous:
            return array
    except (RuntimeError, TypeError):  # requires grad, not on the CPU, conj bit, bfloat16...
        pass
    t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


def pack(header: bytes, tensors: list[torch.Tensor]) -> bytes:
    """A framed message: ``raw`` (the tensors' bytes, each padded to 8) first, then
    ``header`` (the message's other fields, serialized, its ``Tensor``s without data)."""
    parts: list[Any] = [b""]
    size = 0
    for tensor in tensors:
        buf = _buffer(tensor)
        nbytes = buf.nbytes
        if nbytes:
            parts.append(buf)
            pad = -nbytes % 8
            if pad:
                parts.append(_PAD[pad])
            size += nbytes + pad
    parts[0] = _RAW_KEY + _varint(size, 5)
    parts.append(header)
    return b"".join(parts)


class Unpacked:
    """A framed message read back: ``message`` (the header) and its tensors, in order."""

    __slots__ = ("_data", "_pos", "message")

    def __init__(self, data: bytes, message_cls: Any) -> None:
        if data[:3] == _RAW_KEY:
            size = 0
            for i, byte in enumerate(data[3:_PREFIX]):
                size |= (byte & 0x7F) << (7 * i)
            self.message = message_cls.FromString(data[_PREFIX + size :])
            self._data, self._pos = data, _PREFIX
        else:  # a message from another encoder: `raw` anywhere (or absent)
            self.message = message_cls.FromString(data)
            self._data, self._pos = self.message.raw, 0

    def tensor(self, meta: pb.Tensor) -> torch.Tensor:
        """The next tensor, described by ``meta`` (a view of the message's bytes)."""
        if meta.data:
            return from_proto(meta)
        name = meta.dtype
        shape = meta.shape
        count = math.prod(shape)
        if not count:
            return torch.empty(tuple(shape), dtype=_DTYPES[name])
        nbytes = count * _ITEMSIZE[name]
        pos = self._pos
        self._pos = pos + nbytes + (-nbytes % 8)
        flat = torch.frombuffer(self._data, dtype=_DTYPES[name], count=count, offset=pos)
        if flat.data_ptr() % 8:  # not where a tensor of this dtype may start
            flat = flat.clone()
        return flat if len(shape) == 1 else flat.view(tuple(shape))


def unpack(data: bytes, message_cls: Any) -> Unpacked:
    return Unpacked(data, message_cls)


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
    buffer, tensors = io.BytesIO(), list[pb.Tensor]()
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


# ---------------------------------------------------------------------------------------------
# an optimizer's per-variable state (momentum buffers, Adam's moments and step)


def pack_state(state: dict[str, Any]) -> torch.Tensor:
    """``state`` (tensors, numbers, None) as one uint8 tensor: its keys and value kinds vary
    with the optimizer, so it travels as ``torch.save`` bytes, read back with
    ``weights_only=True`` (tensors and plain containers only, never arbitrary objects)."""
    buffer = io.BytesIO()
    torch.save(
        {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in state.items()}, buffer
    )
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def unpack_state(packed: torch.Tensor) -> dict[str, Any]:
    """The inverse of :func:`pack_state`."""
    state = torch.load(io.BytesIO(packed.numpy().tobytes()), weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"optimizer state must be a dict, got {type(state).__name__}")
    return state
