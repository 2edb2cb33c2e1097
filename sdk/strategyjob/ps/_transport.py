"""gRPC clients of the parameter servers and workers, shared by everything in one process.

The cluster (a ``ClusterSpec``) is configured once per process: by the strategy on the
coordinator, by ``Server`` on a worker. Calls carry ``STRATEGYJOB_TOKEN`` (when set) in their
metadata; a dead ps surfaces as ``UnavailableError`` naming its task.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import grpc
import torch

from strategyjob import errors
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._wire import CHANNEL_OPTIONS, from_proto

__all__ = [
    "TOKEN_ENV",
    "PermissionDeniedError",
    "configure",
    "ps_device",
    "run_ps_ops",
]

TOKEN_ENV = "STRATEGYJOB_TOKEN"
TOKEN_METADATA = "strategyjob-token"
# How long a coordinator waits for a ps that is not up yet (they start concurrently).
CONNECT_TIMEOUT_ENV = "STRATEGYJOB_PS_CONNECT_TIMEOUT"


PermissionDeniedError = errors.PermissionDeniedError  # where the transport raises it


def ps_device(task: int) -> str:
    return f"/job:ps/replica:0/task:{task}/device:CPU:0"


def metadata() -> tuple[tuple[str, str], ...]:
    token = os.environ.get(TOKEN_ENV)
    return ((TOKEN_METADATA, token),) if token else ()


_lock = threading.Lock()
_cluster: dict[str, list[str]] = {}
_channels: dict[str, grpc.Channel] = {}


def configure(cluster: dict[str, list[str]]) -> None:
    """Remember the cluster's addresses (``{job: [host:port, ...]}``)."""
    with _lock:
        _cluster.clear()
        _cluster.update({job: list(tasks) for job, tasks in cluster.items()})


def address(job: str, task: int) -> str:
    try:
        return _cluster[job][task]
    except (KeyError, IndexError):
        raise ValueError(
            f"No address for /job:{job}/task:{task}: the cluster of this process is "
            f"{_cluster or 'not configured'}. Create the ParameterServerStrategy (coordinator) or "
            "start the Server (worker) before using parameter-server variables."
        ) from None


def channel(addr: str) -> grpc.Channel:
    with _lock:
        ch = _channels.get(addr)
        if ch is None:
            ch = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
            _channels[addr] = ch
        return ch


def close_channels() -> None:
    with _lock:
        channels = list(_channels.values())
        _channels.clear()
    for ch in channels:
        ch.close()


def unary(addr: str, method: str, request_cls: Any, response_cls: Any) -> Any:
    return channel(addr).unary_unary(
        method,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


def raise_for_rpc_error(exc: grpc.RpcError, what: str) -> None:
    """Translate a gRPC failure into the error TensorFlow would raise."""
    code, details = exc.code(), exc.details()
    if code == grpc.StatusCode.UNAUTHENTICATED or code == grpc.StatusCode.PERMISSION_DENIED:
        raise PermissionDeniedError(f"{what} refused the call: {details}") from None
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        raise ValueError(details) from None
    if code == grpc.StatusCode.NOT_FOUND:
        raise errors.OpError(f"{what}: {details}") from None
    raise errors.UnavailableError(
        f"{what} is unavailable ({code.name}: {details}). GRPC error information from remote "
        f"target {what}"
    ) from None


def run_ps_ops(task: int, ops: list[pb.VarOp], *, wait: bool = False) -> list[torch.Tensor]:
    """Run ``ops`` on ps ``task`` in one call; the tensors they return, in order.

    ``wait`` (used by the coordinator while the cluster starts) waits for the ps to come up,
    at most ``STRATEGYJOB_PS_CONNECT_TIMEOUT`` seconds (default 120); otherwise a ps that is
    down fails at once with ``UnavailableError``.
    """
    stub = unary(
        address("ps", task), "/strategyjob.ps.ParameterServer/Run", pb.VarOps, pb.VarResults
    )
    timeout = float(os.environ.get(CONNECT_TIMEOUT_ENV, "120")) if wait else None
    try:
        reply = stub(pb.VarOps(ops=ops), metadata=metadata(), wait_for_ready=wait, timeout=timeout)
    except grpc.RpcError as exc:
        raise_for_rpc_error(exc, f"/job:ps/replica:0/task:{task}")
    return [from_proto(t) for t in reply.values]
