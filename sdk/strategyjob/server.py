"""``python -m strategyjob.server``: serve this task of a ParameterServerStrategy cluster.

Reads ``TF_CONFIG`` (cluster and own task) and runs a :class:`strategyjob.Server` for it until
stopped (SIGTERM, also as a container's first process), so the worker and ps replicas of a
StrategyJob need nothing but this command.

Closed by default: a server runs the code its callers ship, so it refuses to start without
``STRATEGYJOB_TOKEN`` (the operator and ``strategyjob run`` set it; every call must carry it)
unless ``--insecure`` asks for a server anyone who reaches it may use, and it listens on its
own address from ``TF_CONFIG`` only (``--bind 0.0.0.0``: on every interface).

The process is tuned for serving: torch computes on one thread (unless ``OMP_NUM_THREADS``
says otherwise), gRPC polls its sockets from the threads that wait for them (unless
``GRPC_EXPERIMENTS`` is set, see ``_GRPC_EXPERIMENTS``) and glibc's malloc keeps the memory of
every step's buffers for the next step (unless ``MALLOC_*_`` variables are set, see
``_tune_malloc``).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys

from strategyjob import _names

__all__ = ["main"]  # and `Server`, loaded lazily


def __getattr__(name: str):  # lazy: importing this module must not start anything
    if name == "Server":
        from strategyjob.ps.server import Server

        return Server
    raise AttributeError(name)


# gRPC's EventEngine (its default client and listener I/O since 1.6x) hands every read and
# write to threads of its own, and the waiting Python thread is woken afterwards; without it
# the thread that waits for a reply polls the socket itself. For a ps or worker task, which
# makes and serves small synchronous calls all the time, that saves thread hand-offs: about
# 5 % less CPU per step on bench/bench_ps.py, 10-25 % per call in isolation. Set
# GRPC_EXPERIMENTS (even to "") to keep gRPC's defaults.
_GRPC_EXPERIMENTS = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints,"
    "-event_engine_callback_cq"
)


# glibc's malloc hands blocks above its mmap threshold, and free memory at the top of a heap
# above its trim threshold, back to the system, so the buffers of each step (rows, gradients
# and messages of up to a few MB) were mapped and faulted in anew every step: 40 - 80 page
# faults per step on a worker of bench/bench_ps.py, ~4 % of the CPU of a step in all (and a
# received message of 600 kB took twice as long to read). A serving process keeps
# them: blocks up to 32 MiB (glibc's largest threshold) come from the heap, and up to 128 MiB
# of free heap is kept. The MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ variables win.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MALLOC_SETTINGS = (
    (_M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", 32 << 20),
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 128 << 20),
)


def _tune_malloc() -> None:
    """The malloc settings above, where the C library is glibc (others lack ``mallopt``)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    for param, env, value in _MALLOC_SETTINGS:
        if env not in os.environ:
            mallopt(param, value)


def _tune_process() -> None:
    """Before gRPC and torch start: the settings above."""
    if "grpc" not in sys.modules and "GRPC_EXPERIMENTS" not in os.environ:
        os.environ["GRPC_EXPERIMENTS"] = _GRPC_EXPERIMENTS
    _tune_malloc()
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        # Handlers run on several threads at once; intra-op threads on top of them would
        # oversubscribe the cores (the ops of a step are small).
        torch.set_num_threads(1)


_TOKEN_ENV = _names.ENV_TOKEN  # read as strategyjob.ps._transport reads it (not imported yet)
_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host:port"], "ps": ["host:port"]}, '
    '"task": {"type": "worker", "index": 0}}'
)

log = logging.getLogger("strategyjob.server")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m strategyjob.server",
        description="Serve the worker or ps task that TF_CONFIG names.",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help=f"serve without {_TOKEN_ENV}: anyone who reaches the port can run code here",
    )
    parser.add_argument(
        "--bind",
        metavar="HOST",
        help="listen on HOST (0.0.0.0 or ::: every interface) instead of this task's own "
        "address in TF_CONFIG",
    )
    return parser


def _fail(message: str) -> int:
    print(f"strategyjob.server: {message}", file=sys.stderr)
    return 2


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped (SIGTERM: exit 143); 2 (after one line on stderr) for a bad
    configuration."""
    args = _parser().parse_args(argv)
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s")
    _tune_process()
    from strategyjob.cluster_resolver import TFConfigClusterResolver
    from strategyjob.ps import _transport
    from strategyjob.ps.server import Server, split_address
    from strategyjob.strategies import base  # noqa: F401  (the functions it runs may ask for it)

    try:
        resolver = TFConfigClusterResolver()
        cluster = resolver.cluster_spec()
        job, index = resolver.task_type, resolver.task_id
        if not cluster.jobs or job is None or index is None:
            return _fail(
                f"TF_CONFIG must name the cluster and this task, e.g. {_TF_CONFIG_EXAMPLE}"
            )
        address = cluster.task_address(job, index)
        split_address(address, f"/job:{job}/task:{index}")
    except Exception as exc:  # whatever TF_CONFIG holds: one line, not a traceback
        line = _first_line(exc)
        if _names.ENV_TF_CONFIG not in line:
            line = f"bad TF_CONFIG: {line.rstrip('.')}. Expected e.g. {_TF_CONFIG_EXAMPLE}"
        return _fail(line)
    try:
        _transport.timeout()  # a bad STRATEGYJOB_PS_TIMEOUT fails here, not at the first call
    except ValueError as exc:
        return _fail(str(exc))
    if not os.environ.get(_TOKEN_ENV):
        if not args.insecure:
            return _fail(
                f"{_TOKEN_ENV} is not set: set it to the job's token (the operator and "
                "`strategyjob run` do), or pass --insecure to serve without one"
            )
        log.warning(
            "serving /job:%s/task:%s WITHOUT a token (--insecure): anyone who can reach %s "
            "can run code in this process",
            job,
            index,
            args.bind or address,
        )
    try:
        server = Server(cluster, job_name=job, task_index=index, start=True, bind_address=args.bind)
    except (ValueError, RuntimeError) as exc:
        return _fail(_first_line(exc))
    print(
        f"strategyjob.server: {server.target} serving /job:{resolver.task_type}/task:"
        f"{resolver.task_id}",
        flush=True,
    )
    # A container's first process ignores a signal it has no handler for: without this, every
    # ps and worker pod sat out its whole grace period (60 s) each time its job restarted or
    # ended. SIGTERM stops serving at once; the exit status says which signal, as a shell's.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        server.join()
    finally:
        server.stop(0)
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
