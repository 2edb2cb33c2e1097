"""``strategyjob.Server``: the gRPC server of a ps or worker task (``tf.distribute.Server``).

A ps task holds variables and applies updates to them (the optimizer's rule runs here, rows
only for sparse gradients). A worker task runs the closures the coordinator ships to it and
holds its per-worker resources (datasets, iterators). Every task answers ``GetStatus`` with an
incarnation id, so the coordinator can tell a restarted task from one that never went away.
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import ipaddress
import json
import os
import re
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent import futures
from typing import Any

import cloudpickle
import grpc
import torch
from google.protobuf.message import DecodeError

from strategyjob import _names, errors
from strategyjob._variables import scatter_
from strategyjob.cluster_resolver import ClusterSpec
from strategyjob.cluster_resolver.multi_worker_util import normalize_cluster_spec
from strategyjob.ps import _direct, _remote, _transport, _wire
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._wire import CHANNEL_OPTIONS, dumps, loads

# The benchmarks' "traffic" request (framed or not), recognised without decoding it.
_TRAFFIC_OP = pb.VarOps(ops=[pb.VarOp(op="traffic")]).SerializeToString()
_TRAFFIC_REQUESTS = (_TRAFFIC_OP, _wire.pack(_TRAFFIC_OP, []))

__all__ = ["Server"]

_RUN_CLOSURE_STREAM = "/strategyjob.ps.Worker/RunClosureStream"


# ---------------------------------------------------------------------------------------------
# parameter-server state


class OptimizerError(Exception):
    """An update the ps cannot run because of the optimizer it names (a class it cannot import,
    hyperparameters or an update rule that fail): the user's to fix, so the step is not
    retried (the client gets ``FAILED_PRECONDITION``, raised as ``ValueError``)."""


# Update ids a ps remembers (the most recent ones): a retried step comes back within a few of
# its peers' steps, long before this many updates later; ~10 MB at most.
APPLIED_UPDATES_KEPT = 1 << 16


class AppliedUpdates:
    """The ids of the updates a ps applied recently (at most ``capacity``, oldest forgotten
    first), so that a retried step's updates are applied once.

    ``begin(id)`` is True when the caller is to apply the update (then ``end(id, applied)``),
    False when it was applied already. A request with an id that is being applied by another
    call (a retry that overtook its first attempt) waits for that call to end.
    """

    def __init__(self, capacity: int = APPLIED_UPDATES_KEPT) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._cond = threading.Condition()
        self._applied: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._applying: set[str] = set()

    def __len__(self) -> int:
        with self._cond:
            return len(self._applied)

    def __contains__(self, update_id: str) -> bool:
        with self._cond:
            return update_id in self._applied

    def begin(self, update_id: str) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: update_id not in self._applying)
            if update_id in self._applied:
                self._applied.move_to_end(update_id)
                return False
            self._applying.add(update_id)
            return True

    def end(self, update_id: str, applied: bool) -> None:
        """The update ``begin`` let through ended: ``applied`` (remember it) or failed (a
        retry may apply it)."""
        with self._cond:
            self._applying.discard(update_id)
            if applied:
                self._applied[update_id] = None
                while len(self._applied) > self._capacity:
                    self._applied.popitem(last=False)
            self._cond.notify_all()


class Store:
    """The variables of one ps task, each with its lock and its optimizers' state: a ps
    process's (``Server``), or an in-process ps of ``_inmemory.InMemoryTransport``."""

    def __init__(self, name: str = "this parameter server") -> None:
        self.name = name
        self.updates = AppliedUpdates()
        self._lock = threading.Lock()
        self._vars: dict[str, torch.Tensor] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._optimizers: dict[tuple[str, str], torch.optim.Optimizer] = {}
        self._specs: dict[str, dict] = {}  # parsed optimizer JSON, by its text

    def _get(self, key: str) -> tuple[torch.Tensor, threading.Lock]:
        try:
            return self._vars[key], self._locks[key]
        except KeyError:
            raise KeyError(f"Variable {key!r} is not on this parameter server") from None

    def run(self, request: bytes) -> bytes:
        """Run a framed ``VarOps`` request; the framed ``VarResults`` reply. A request whose
        ``update_id`` was applied already (a retried step's) has its updates skipped: its reads
        run, and an update asked to read back returns the variable's current value."""
        message = _wire.unpack(request, pb.VarOps)
        # Every optimizer named must be usable before anything is applied: a request that
        # fails for its optimizer changes nothing.
        for op in message.message.ops:
            if op.optimizer:
                self._spec(op.optimizer)
        update_id = message.message.update_id
        apply = self.updates.begin(update_id) if update_id else True
        applied = False
        try:
            out = []
            with torch.no_grad():
                for op in message.message.ops:
                    value = message.tensor(op.value) if op.HasField("value") else None
                    indices = message.tensor(op.indices) if op.HasField("indices") else None
                    result = self._run_one(op, value, indices, apply)
                    if result is not None:
                        out.append(result)
            applied = True
        finally:
            if update_id and apply:
                self.updates.end(update_id, applied)
        return _transport.encode_results(out)

    def _run_one(
        self, op: pb.VarOp, value: Any, indices: Any, apply: bool = True
    ) -> torch.Tensor | None:
        kind = op.op
        if not apply and kind not in _transport.READ_OPS:  # applied by an earlier attempt
            if kind in ("create", "delete") or not op.read_back:
                return None
            var, lock = self._get(op.name)
            with lock:
                return var.clone()
        if kind == "create":
            # `value` is a view of the request's bytes: the variable gets its own copy.
            param = torch.nn.Parameter(
                value.clone(memory_format=torch.contiguous_format),
                requires_grad=value.is_floating_point(),
            )
            with self._lock:
                self._vars[op.name] = param
                self._locks[op.name] = threading.Lock()
                for k in [k for k in self._optimizers if k[1] == op.name]:
                    del self._optimizers[k]
            return None
        if kind == "delete":
            with self._lock:
                self._vars.pop(op.name, None)
                self._locks.pop(op.name, None)
            return None
        var, lock = self._get(op.name)
        with lock:  # (grad mode is off: results are plain tensors)
            if kind == "read":
                return var.clone()
            if kind == "gather":
                return var.index_select(0, indices)
            if kind == "read_slots":
                return _wire.pack_state(self._slots(op, var))
            if kind in ("assign", "assign_add", "assign_sub"):
                updates: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
                    "assign": var.copy_,
                    "assign_add": var.add_,
                    "assign_sub": var.sub_,
                }
                updates[kind](value)
            elif kind.startswith("scatter_"):
                scatter_(var, kind, indices, value)
            elif kind == "apply_dense":
                self._apply(op, var, value, None)
            elif kind == "apply_sparse":
                self._apply(op, var, value, indices)
            elif kind == "write_slots":
                self._set_slots(op, var, _wire.unpack_state(value))
            else:
                raise ValueError(f"Unknown variable operation {kind!r}")
            return var.clone() if op.read_back else None

    def _optimizer_error(self, cls_path: Any, what: str, exc: BaseException) -> OptimizerError:
        hint = (
            "install its package in the image of the ps tasks"
            if what == "import"
            else "check its hyperparameters; its update rule must work on CPU tensors"
        )
        return OptimizerError(
            f"{self.name} cannot {what} the optimizer {cls_path!r} "
            f"({type(exc).__name__}: {exc}). The ps runs the optimizer's update rule: {hint}."
        )

    def _optimizer_class(self, cls_path: Any) -> Any:
        try:
            module, _, qualname = cls_path.partition(":")
            cls: Any = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        except Exception as exc:  # ImportError, AttributeError, ...
            raise self._optimizer_error(cls_path, "import", exc) from None
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise OptimizerError(
                f"{self.name} cannot use the optimizer {cls_path!r}: it is not a subclass of "
                "torch.optim.Optimizer"
            )
        return cls

    def _optimizer(self, spec: dict, key: str, var: torch.Tensor) -> torch.optim.Optimizer:
        opt = self._optimizers.get((spec["key"], key))
        if opt is None:
            try:
                opt = spec["class"]([var], **spec["hparams"])
            except Exception as exc:
                raise self._optimizer_error(spec["cls"], "create", exc) from None
            self._optimizers[(spec["key"], key)] = opt
        else:
            opt.param_groups[0].update(spec["hparams"])
        return opt

    def _spec(self, text: str) -> dict:
        spec = self._specs.get(text)
        if spec is None:
            try:
                spec = json.loads(text)
                hp = spec["hparams"]
                if not (isinstance(hp, dict) and isinstance(spec["cls"], str) and "key" in spec):
                    raise TypeError("'hparams' must be an object, 'cls' a string, 'key' given")
                if (
                    spec["cls"] == "torch.optim.sgd:SGD"
                    and not hp.get("momentum")
                    and not hp.get("weight_decay")
                ):
                    # SGD without momentum or weight decay is ``var -= lr * grad``.
                    spec["sgd_alpha"] = (1.0 if hp.get("maximize") else -1.0) * float(hp["lr"])
            except (ValueError, KeyError, TypeError) as exc:
                raise OptimizerError(
                    f"{self.name} got a malformed optimizer description ({exc!r}); it is "
                    'JSON: {"key": ..., "cls": "module:Class", "hparams": {"lr": ..., ...}}'
                ) from None
            spec["class"] = self._optimizer_class(spec["cls"])
            if len(self._specs) > 1024:
                self._specs.clear()
            self._specs[text] = spec
        return spec

    def _slots(self, op: pb.VarOp, var: torch.Tensor) -> dict[str, Any]:
        """The state the optimizer of ``op`` keeps for ``var`` (empty before its first step)."""
        opt = self._optimizers.get((self._spec(op.optimizer)["key"], op.name))
        return dict(opt.state.get(var, {})) if opt is not None else {}

    def _set_slots(self, op: pb.VarOp, var: torch.Tensor, state: dict[str, Any]) -> None:
        """Replace that state (a restored checkpoint's): the next step goes on from it."""
        spec = self._spec(op.optimizer)
        if spec.get("sgd_alpha") is not None:
            return  # plain SGD keeps no state
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != var.shape:
                raise ValueError(
                    f"The optimizer state {k!r} of {op.name} has shape {list(v.shape)}, the "
                    f"variable {list(var.shape)}: restore the checkpoint into the same model."
                )
        opt = self._optimizer(spec, op.name, var)
        opt.state[var] = {
            k: v.to(var.dtype).clone() if isinstance(v, torch.Tensor) and v.dim() > 0 else v
            for k, v in state.items()
        }

    def _apply(self, op: pb.VarOp, var: torch.Tensor, grad: torch.Tensor, rows: Any) -> None:
        spec = self._spec(op.optimizer)
        alpha = spec.get("sgd_alpha")
        if grad.dtype != var.dtype:
            grad = grad.to(var.dtype)
        if alpha is not None:
            # Plain SGD, applied directly: only the touched rows for a sparse gradient.
            if rows is None:
                var.add_(grad, alpha=alpha)
            elif var.dim() == 2 and grad.dim() == 2:
                # One pass over the rows (index_add_ loops over them one by one); repeated
                # rows add up.
                var.scatter_add_(0, rows.unsqueeze(1).expand_as(grad), grad * alpha)
            else:
                var.index_add_(0, rows, grad, alpha=alpha)
            return
        if rows is not None:
            dense = torch.zeros_like(var)
            dense.index_add_(0, rows, grad)
            grad = dense
        opt = self._optimizer(spec, op.name, var)
        var.grad = grad.clone() if rows is None else grad  # `grad` may view the request
        try:
            with torch.enable_grad():
                opt.step()
        except Exception as exc:  # the optimizer's own code (a user's class, say)
            raise self._optimizer_error(spec["cls"], "apply", exc) from None
        finally:
            var.grad = None


# What ``Store.run`` raises for a request it refuses (the caller's mistake or its optimizer's).
PS_REQUEST_ERRORS = (
    KeyError,
    OptimizerError,
    ValueError,
    RuntimeError,
    TypeError,
    IndexError,
    DecodeError,
)


def ps_status(exc: BaseException) -> _direct.Status:
    """The status a ps answers a request with when ``Store.run`` raised ``exc`` (one of
    ``PS_REQUEST_ERRORS``); ``_transport.raise_for_status`` turns it into TF's error."""
    if isinstance(exc, KeyError):
        return _direct.Status(grpc.StatusCode.NOT_FOUND, str(exc.args[0]))
    if isinstance(exc, OptimizerError):
        return _direct.Status(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    return _direct.Status(grpc.StatusCode.INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------------------------
# worker state


def _ps_task_of(exc: BaseException | None) -> str | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, errors.UnavailableError):
            match = re.search(r"/job:ps/replica:0/task:\d+", str(exc))
            if match:
                return match.group(0)
        exc = exc.__cause__ or exc.__context__
    return None


def _error_result(kind: str, exc: BaseException) -> pb.ClosureResult:
    try:
        blob = cloudpickle.dumps(exc)
    except Exception:
        blob = b""
    message = f"{type(exc).__name__}: {exc}"
    if kind == "user":
        message += "\n" + "".join(traceback.format_exception(exc)[-6:])
    return pb.ClosureResult(error_kind=kind, error_message=message, error=blob)


class WorkerService:
    """A worker task's closure runner: a worker process's (``Server``), or an in-process worker
    of ``_inmemory.InMemoryTransport``. Closures run as worker ``task_index``."""

    def __init__(self) -> None:
        self._functions: dict[str, tuple[Any, list]] = {}
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()  # closures run one at a time, in arrival order
        self.task_index = 0

    def _function(self, request: pb.Closure, state: _remote.WorkerState) -> Any:
        with self._lock:
            cached = self._functions.get(request.function_digest)
        if cached is None and request.function:
            touched: list = []
            fn = loads(request.function, request.function_tensors, state.loader(touched))
            cached = (fn, touched)
            with self._lock:
                self._functions[request.function_digest] = cached
        return cached

    def run_closure(self, request: pb.Closure, context: Any) -> pb.ClosureResult:
        with self._run_lock:
            return self._run_closure(request)

    def run_closure_stream(self, requests: Any, context: Any) -> Any:
        for request in requests:
            yield self.run_closure(request, context)

    def _run_closure(self, request: pb.Closure) -> pb.ClosureResult:
        state = _remote.worker_state()
        try:
            cached = self._function(request, state)
            if cached is None:
                return pb.ClosureResult(error_kind="missing_function")
            fn, fn_refs = cached
            touched: list = []
            args, kwargs = loads(request.payload, request.tensors, state.loader(touched))
            from strategyjob.ps import coordinator

            state.begin(fn_refs + touched)
            try:
                with (
                    coordinator.worker_index_scope(self.task_index),
                    _transport.step_scope(request.step_id),
                    _remote.PullOnUse(state),
                ):
                    result = fn(*args, **kwargs)
            finally:
                state.end()
            payload, tensors = dumps(result)
            return pb.ClosureResult(payload=payload, tensors=tensors)
        except _remote.MissingResource as exc:
            return pb.ClosureResult(error_kind="missing_resource", error_message=str(exc))
        except BaseException as exc:
            ps_task = _ps_task_of(exc)
            if ps_task is not None:
                result = _error_result("ps_unavailable", exc)
                result.ps_task = ps_task
                return result
            return _error_result("user", exc)

    def create_resource(self, request: pb.Closure, context: Any) -> pb.ClosureResult:
        with self._run_lock:
            return self._create_resource(request)

    def _create_resource(self, request: pb.Closure) -> pb.ClosureResult:
        state = _remote.worker_state()
        try:
            creator = loads(request.payload, request.tensors, state.loader([]))
            state.resources[request.resource_id] = creator()
            return pb.ClosureResult()
        except _remote.MissingResource as exc:
            return pb.ClosureResult(error_kind="missing_resource", error_message=str(exc))
        except BaseException as exc:
            return _error_result("input", exc)


# ---------------------------------------------------------------------------------------------
# the server


_NO_TOKEN_MESSAGE = (
    f"the call lacks this job's token: set {_transport.TOKEN_ENV} to the job's token in the "
    "caller's environment"
)


class _TokenInterceptor(grpc.ServerInterceptor):
    """Refuses a call without the job's token from its metadata alone: the refusal is a
    handler for a stream of requests that reads none of them, so a request's body (up to
    ``MAX_MESSAGE_BYTES``) is never read into memory, whatever kind of call the client made."""

    def __init__(self, token: str) -> None:
        self._digest = hashlib.sha256(token.encode()).digest()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        given = dict(details.invocation_metadata or ()).get(_transport.TOKEN_METADATA, "")
        if hashlib.sha256(given.encode()).digest() == self._digest:
            return continuation(details)

        def deny(requests: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, _NO_TOKEN_MESSAGE)

        # (grpc reads a unary call's request before calling its handler, a streaming one's
        # only when the handler asks for it.)
        return grpc.stream_stream_rpc_method_handler(deny)


# How long a server waits for its own address to resolve to this machine (in a pod, the name
# of the job's headless Service may appear a moment after the container starts).
BIND_WAIT_SECONDS = 60.0
# Calls served at once per server (default: twice its threads; more are refused with
# RESOURCE_EXHAUSTED, not queued).
MAX_CALLS_ENV = _names.ENV_MAX_CONCURRENT_CALLS


def split_address(address: Any, what: str) -> tuple[str, int]:
    """``(host, port)`` of a ``host:port`` (``[v6]:port``) address; ValueError naming ``what``
    otherwise."""
    host, sep, port = str(address).rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (isinstance(address, str) and sep and host and port.isdigit() and int(port) < 65536):
        raise ValueError(f"The address of {what} must be 'host:port', got {address!r}")
    return host, int(port)


def _grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _local_ips(host: str) -> tuple[list[str], list[str]]:
    """The addresses ``host`` resolves to that belong to this machine, and all of them."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return [], []
    found = list(dict.fromkeys(str(info[4][0]) for info in infos))
    local = []
    for ip in found:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((ip, 0))
            except OSError:  # EADDRNOTAVAIL: another machine's
                continue
        local.append(ip)
    return local, found


def listen_addresses(address: str, what: str, bind_address: str | None = None) -> list[str]:
    """Where the server of task ``what`` (at ``address``) listens: the addresses of its own
    host that are this machine's (polled for up to ``BIND_WAIT_SECONDS``), or
    ``bind_address`` (``"0.0.0.0"`` / ``"::"``: every interface) when given."""
    host, port = split_address(address, what)
    if bind_address:
        return [_grpc_address(bind_address.removeprefix("[").removesuffix("]"), port)]
    try:
        ipaddress.ip_address(host)
        wait = 0.0  # a literal: it is this machine's or not
    except ValueError:
        wait = BIND_WAIT_SECONDS
    deadline = time.monotonic() + wait
    while True:
        local, found = _local_ips(host)
        if local:
            return [_grpc_address(ip, port) for ip in local]
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"Cannot listen on the address of {what}, {address}: {host!r} "
                + (f"resolves to {', '.join(found)}, not" if found else "does not resolve to")
                + " an address of this machine"
                + (f" (waited {wait:g} s)" if wait else "")
                + ". Give this task an address of its own in the cluster spec, or listen on "
                "every interface: `python -m strategyjob.server --bind 0.0.0.0` (Server(..., "
                "bind_address='0.0.0.0'))."
            )
        time.sleep(0.5)


def _max_calls(threads: int) -> int:
    value = os.environ.get(MAX_CALLS_ENV)
    if not value:
        return 2 * threads
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{MAX_CALLS_ENV} must be a positive integer, got {value!r}")
    return int(value)


def _handler(fn: Any, request_cls: Any, response_cls: Any) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=request_cls.FromString,
        response_serializer=response_cls.SerializeToString,
    )


class Server:
    """An in-process server for one task of the cluster (``tf.distribute.Server``).

    ``Server(cluster_spec, job_name, task_index, start=True)`` listens on its own address in
    ``cluster_spec`` (``bind_address="0.0.0.0"`` or ``"::"``: on every interface instead);
    ``join()`` blocks until it stops. Calls must carry ``STRATEGYJOB_TOKEN`` when that variable
    is set in the server's environment; ``STRATEGYJOB_MAX_CONCURRENT_CALLS`` bounds the calls
    served at once.
    """

    def __init__(
        self,
        server_or_cluster_def: Any,
        job_name: str | None = None,
        task_index: int | None = None,
        protocol: str | None = None,
        config: Any = None,
        start: bool = True,
        *,
        bind_address: str | None = None,
    ) -> None:
        cluster = normalize_cluster_spec(server_or_cluster_def)
        if job_name is None:
            jobs = cluster.jobs
            if len(jobs) != 1:
                raise ValueError(
                    f"`job_name` must be given when the cluster has several jobs: {sorted(jobs)}"
                )
            job_name = jobs[0]
        if task_index is None:
            task_index = 0
        if protocol not in (None, "grpc"):
            raise ValueError(f"Unsupported protocol {protocol!r}: only 'grpc' is supported.")
        self._cluster: ClusterSpec = cluster
        self._job_name = job_name
        self._task_index = int(task_index)
        address = cluster.task_address(job_name, self._task_index)
        self._address = address
        what = f"/job:{job_name}/task:{self._task_index}"
        listen = listen_addresses(address, what, bind_address)
        _transport.configure({job: cluster.job_tasks(job) for job in cluster.jobs})
        self._incarnation = uuid.uuid4().hex
        self._store = Store(f"/job:{job_name}/replica:0/task:{self._task_index}")
        self._traffic = [0, 0, 0]
        self._count_traffic = False
        self._traffic_lock = threading.Lock()
        self._worker = WorkerService()
        self._worker.task_index = self._task_index
        token = os.environ.get(_transport.TOKEN_ENV)
        interceptors = [_TokenInterceptor(token)] if token else []
        # A thread per call being served, RunStream calls (a few per client process, open
        # for long) included where ``_direct`` does not serve them; threads start only when
        # needed.
        tasks = sum(len(cluster.job_tasks(job)) for job in cluster.jobs)
        threads = 32 + 4 * tasks
        self._max_calls = _max_calls(threads)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix=f"{job_name}{task_index}"
            ),
            options=CHANNEL_OPTIONS,
            interceptors=interceptors,
            maximum_concurrent_rpcs=self._max_calls,
        )
        status = _handler(self._status, pb.Ping, pb.Status)
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "strategyjob.ps.ParameterServer",
                    {
                        # Framed messages (see _wire.pack): bytes in and out, as they are.
                        "Run": grpc.unary_unary_rpc_method_handler(self._run_ps),
                        "RunStream": grpc.stream_stream_rpc_method_handler(self._run_ps_stream),
                        "GetStatus": status,
                    },
                ),
                grpc.method_handlers_generic_handler(
                    "strategyjob.ps.Worker",
                    {
                        "RunClosure": _handler(
                            self._worker.run_closure, pb.Closure, pb.ClosureResult
                        ),
                        "RunClosureStream": grpc.stream_stream_rpc_method_handler(
                            self._worker.run_closure_stream,
                            request_deserializer=pb.Closure.FromString,
                            response_serializer=pb.ClosureResult.SerializeToString,
                        ),
                        "CreateResource": _handler(
                            self._worker.create_resource, pb.Closure, pb.ClosureResult
                        ),
                        "GetStatus": status,
                    },
                ),
            )
        )
        # The streams of every step, served on their own threads (``_direct``); grpc's
        # handlers above serve them where that is not available.
        self._direct = self._direct_streams(token)
        for target in listen:
            try:
                added = self._server.add_insecure_port(target)
            except RuntimeError:  # (grpc releases that raise instead of returning 0)
                added = 0
            if added == 0:
                raise RuntimeError(
                    f"Cannot listen on {target} for {what} ({address}): is another process "
                    "using that port?"
                )
        self._started = False
        if start:
            self.start()

    @property
    def target(self) -> str:
        """``grpc://host:port`` of this server."""
        return f"grpc://{self._address}"

    @property
    def server_def(self) -> dict[str, Any]:
        return {
            "cluster": self._cluster.as_dict(),
            "job_name": self._job_name,
            "task_index": self._task_index,
            "protocol": "grpc",
        }

    def _direct_streams(self, token: str | None) -> _direct.DirectStreams | None:
        if not _direct.SERVER_SUPPORTED:
            return None
        try:
            return _direct.DirectStreams(
                self._server,
                {
                    _transport.RUN_STREAM_METHOD: self._reply_ps,
                    _RUN_CLOSURE_STREAM: self._reply_closure,
                },
                _direct.token_check(token, _NO_TOKEN_MESSAGE),
                name=f"{self._job_name}{self._task_index}",
                max_calls=self._max_calls,
            )
        except (AttributeError, TypeError):  # grpc's private layer is not what _direct expects
            return None

    def start(self) -> None:
        if not self._started:
            self._server.start()
            if self._direct is not None:
                self._direct.start()
            self._started = True

    def join(self) -> None:
        """Block until the server stops."""
        self._server.wait_for_termination()

    def stop(self, grace: float | None = None) -> None:
        self._server.stop(grace).wait()

    def _status(self, request: pb.Ping, context: Any) -> pb.Status:
        return pb.Status(
            job_name=self._job_name, task_index=self._task_index, incarnation=self._incarnation
        )

    def _run_ps_stream(self, requests: Any, context: Any) -> Any:
        for request in requests:
            yield self._run_ps(request, context)  # an error ends the call with its status

    def _run_ps(self, request: bytes, context: Any) -> bytes:  # type: ignore[return]  # abort raises
        try:
            return self._reply_ps(request)
        except _direct.Status as status:
            context.abort(status.code, status.details)

    def _reply_closure(self, request: bytes) -> bytes:
        try:
            closure = pb.Closure.FromString(request)
        except DecodeError:
            raise _direct.Status(
                grpc.StatusCode.INTERNAL, "Exception deserializing request!"
            ) from None
        return self._worker.run_closure(closure, None).SerializeToString()

    def _reply_ps(self, request: bytes) -> bytes:
        """The reply to a framed ``VarOps`` request; ``_direct.Status`` for a failed one."""
        if request in _TRAFFIC_REQUESTS:
            # Bytes received/sent and calls served since the previous "traffic" call (for
            # benchmarks; counting starts with the first one), then reset.
            self._count_traffic = True
            with self._traffic_lock:
                counts, self._traffic = self._traffic, [0, 0, 0]
            return _transport.encode_results([torch.tensor(counts, dtype=torch.int64)])
        try:
            reply = self._store.run(request)
            if self._count_traffic:
                with self._traffic_lock:
                    self._traffic[0] += len(request)
                    self._traffic[1] += len(reply)
                    self._traffic[2] += 1
            return reply
        except PS_REQUEST_ERRORS as exc:
            raise ps_status(exc) from None
