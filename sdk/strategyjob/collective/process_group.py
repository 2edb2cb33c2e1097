"""``torch.distributed`` process group of a multi-worker cluster, with bounded collectives.

One process per TF_CONFIG task (chief and workers). The rendezvous follows TensorFlow's roles:
the collective leader (chief, else worker 0) hosts the ``TCPStore``, rank = ``id_in_cluster``,
world size = ``worker_count``; ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` in the
environment take precedence. CPU tensors use gloo, CUDA tensors NCCL.

Why the extra machinery: a gloo collective whose peer died either fails with a bare socket
error or blocks until gloo's timeout. Every collective here is launched asynchronously and
waited for in short slices; between slices the peers' liveness listeners are probed (a TCP
connect: refused means the process is gone), so a dead peer ends the step with
``UnavailableError("cluster check alive failed, /job:worker/replica:0/task:1 is down")``
(TensorFlow's message) and a stuck one with ``DeadlineExceededError`` after
``CommunicationOptions.timeout_seconds`` (without it, after the job's stuck-peer bound,
``collective.stuck``) naming the peers that did not arrive — never a hang.
While waiting (in the rendezvous or a slow collective) a task says every few seconds whom it
waits for (``collective.waiting``).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import ctypes
import datetime
import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from strategyjob import _names, errors
from strategyjob.collective import _torch_internals, stuck, waiting
from strategyjob.collective.options import CommunicationImplementation, CommunicationOptions
from strategyjob.collective.result_buffers import MIN_POOLED_BYTES, ResultBuffers

__all__ = [
    "ClusterMembership",
    "CollectiveGroup",
    "current_group",
    "get_group",
    "membership_from_cluster",
]

#: Collective (and gloo) timeout when ``timeout_seconds`` is None (torch's default).
DEFAULT_TIMEOUT_SECONDS = 1800.0
#: Environment variable setting the rendezvous timeout (seconds); default
#: :data:`waiting.DEFAULT_RENDEZVOUS_SECONDS`.
ENV_RENDEZVOUS_TIMEOUT = _names.ENV_RENDEZVOUS_TIMEOUT
#: Slice of a collective wait between two liveness checks.
_POLL_SECONDS = 1.0
#: Interval of the rendezvous' polls, which is how soon Ctrl-C (SIGINT) stops it.
_RENDEZVOUS_POLL_SECONDS = 0.1
#: How often a task started ahead of a re-forming looks whether the earlier attempt's leader left.
_LEADER_OF_EARLIER_RUN_POLL_SECONDS = 0.5
#: A peer whose liveness listener does not answer for this long (its process frozen, its node
#: or pod gone: connections time out or find no route) counts as down, as a refused connection
#: (its process exited) does at once. TensorFlow's collective health check gives up after about
#: as long. A peer that answers but never joins a collective (stuck, or running other code) is
#: caught by ``CommunicationOptions.timeout_seconds``, else by the job's stuck-peer bound
#: (``collective.stuck``; 30 minutes until the job has some history).
UNRESPONSIVE_PEER_SECONDS = 30.0
#: Environment variable overriding :data:`UNRESPONSIVE_PEER_SECONDS`.
ENV_UNRESPONSIVE_PEER_SECONDS = _names.ENV_UNRESPONSIVE_PEER_SECONDS
#: How long a failed collective keeps probing before it gives up naming the dead peer.
_DIAGNOSE_SECONDS = 3.0
_PROBE_TIMEOUT_SECONDS = 2.0
_KEY_PREFIX = "strategyjob/"
#: The attempt (``STRATEGYJOB_RESTART_ATTEMPT``) of the leader that serves a rendezvous store. A
#: task of a later attempt (started ahead of a re-forming at a new size, while the group it will
#: replace still trains) never joins the earlier attempt's store: it waits until that leader is
#: gone and its own attempt's leader serves.
_ATTEMPT_KEY = f"{_KEY_PREFIX}attempt"
#: Store keys of a stuck-peer verdict: the first worker to reach one publishes it, the other
#: waiting workers raise the same one (acknowledging it) rather than find the publisher
#: gone a moment later and blame it.
_VERDICT_KEY = f"{_KEY_PREFIX}stuck/verdict"
_VERDICT_ACK_KEY = f"{_KEY_PREFIX}stuck/acks"
#: How long the publisher of a verdict waits for the other waiting workers to take it up.
_VERDICT_ACK_SECONDS = 5.0
#: CPU tensors from this size on are all-reduced out of place by a ring of gloo sends and
#: receives (no copy of the input). Its reduce-scatter half moves segments of about
#: ``_RING_SEGMENT_BYTES`` so that summing one segment overlaps receiving the next; each
#: segment costs Python and gloo bookkeeping that competes with the transfer for the CPU, so
#: 1 MiB beat 384 KiB at 4 to 25 MB on a 2-core VM, and the all-gather half (no sums) sends
#: each chunk whole (bench/README.md).
_RING_MIN_BYTES = 4 << 20
_RING_SEGMENT_BYTES = 1 << 20
#: The tag of the ring's all-gather messages, which overlap the reduce-scatter's (tag 0).
_GATHER_TAG = 1
#: Memory of large results, reused once the caller has dropped them (one pool per process).
_result_buffers = ResultBuffers()
#: At exit, how long to wait for backend threads to let go of the last collectives' tensors.
_EXIT_DRAIN_SECONDS = 5.0


@dataclass(frozen=True)
class ClusterMembership:
    """Who this process is in the collective group and where the rendezvous is."""

    rank: int
    world_size: int
    task_names: tuple[str, ...]  # by rank, e.g. "/job:worker/replica:0/task:1"
    master_addr: str
    master_port: int
    host: str  # this task's host as its peers reach it

    def task_name(self, rank: int) -> str:
        if 0 <= rank < len(self.task_names):
            return self.task_names[rank]
        return f"rank {rank}"


def _task_name(task_type: str, task_id: int) -> str:
    return f"/job:{task_type}/replica:0/task:{task_id}"


def membership_from_cluster(
    cluster: Mapping[str, Sequence[str] | Mapping[int, str]],
    task_type: str,
    task_id: int,
    environ: Mapping[str, str] | None = None,
) -> ClusterMembership:
    """Rank, world size and rendezvous address of ``(task_type, task_id)`` in ``cluster``.

    ``cluster`` maps job names to addresses (a list, or ``{index: address}`` for sparse jobs);
    only ``chief`` and ``worker`` take part in collectives. The caller has validated the
    cluster (``multi_worker_util.validate_cluster_spec``).
    """
    environ = os.environ if environ is None else environ

    def addresses(job: str) -> list[tuple[int, str]]:
        tasks = cluster.get(job) or []
        if isinstance(tasks, Mapping):
            return sorted((int(i), a) for i, a in tasks.items())
        return list(enumerate(tasks))

    members = [("chief", i, a) for i, a in addresses("chief")]
    members += [("worker", i, a) for i, a in addresses("worker")]
    names = tuple(_task_name(t, i) for t, i, _ in members)
    own = _task_name(task_type, task_id)
    if own not in names:
        raise ValueError(
            f"Task {own} does not take part in collectives: only 'chief' and 'worker' tasks of "
            "the cluster do. Run MultiWorkerMirroredStrategy only in chief and worker tasks."
        )
    rank = names.index(own)
    leader_address = members[0][2]
    own_address = members[rank][2]
    master_addr, master_port = _split_address(leader_address)

    if environ.get(_names.ENV_MASTER_ADDR):
        master_addr = environ[_names.ENV_MASTER_ADDR]
    if environ.get(_names.ENV_MASTER_PORT):
        master_port = int(environ[_names.ENV_MASTER_PORT])
    world_size = int(environ.get(_names.ENV_WORLD_SIZE) or len(members))
    rank = int(environ.get(_names.ENV_RANK) or rank)
    if not 0 <= rank < world_size:
        raise ValueError(
            f"RANK={rank} is outside WORLD_SIZE={world_size}. Fix the RANK/WORLD_SIZE environment "
            "variables or unset them to derive both from TF_CONFIG."
        )
    if len(names) != world_size:  # WORLD_SIZE overrides the cluster: names are unknown
        names = tuple(f"rank {r}" for r in range(world_size))
    return ClusterMembership(
        rank=rank,
        world_size=world_size,
        task_names=names,
        master_addr=master_addr,
        master_port=master_port,
        host=_split_address(own_address)[0],
    )


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(
            f"Cluster address {address!r} is not 'host:port'. Give every task of TF_CONFIG's "
            "cluster a 'host:port' address."
        )
    return host.strip("[]"), int(port)


def _timeout_seconds(options: CommunicationOptions) -> float:
    return float(options.timeout_seconds) if options.timeout_seconds else DEFAULT_TIMEOUT_SECONDS


def _stuck_policy(
    options: CommunicationOptions, policy: stuck.StuckPolicy | None
) -> stuck.StuckPolicy | None:
    """The stuck-peer policy of collectives run with ``options``: none when the user bounds
    them with ``timeout_seconds``."""
    return None if options.timeout_seconds else policy


def _rendezvous_seconds() -> float:
    """Not ``timeout_seconds``, which bounds collectives (as in TensorFlow): the rendezvous
    waits for pods to be scheduled and started, which takes as long as it takes."""
    return waiting.positive_seconds(ENV_RENDEZVOUS_TIMEOUT, waiting.DEFAULT_RENDEZVOUS_SECONDS)


def _own_attempt() -> int | None:
    """This process's attempt of the job (None when the launcher does not say, as a hand-written
    TF_CONFIG does not: every leader is then taken)."""
    try:
        return int(os.environ.get(_names.ENV_RESTART_ATTEMPT, ""))
    except ValueError:
        return None


def _leader_attempt(store: dist.Store) -> int | None:
    """The attempt the leader of ``store`` belongs to (None: it does not say, or not yet: a leader
    sets it as soon as its store serves, and one of an earlier attempt set it long ago)."""
    if not store.check([_ATTEMPT_KEY]):
        return None
    try:
        return int(store.get(_ATTEMPT_KEY).decode())
    except ValueError:
        return None


class _LeftOverTask(RuntimeError):
    """This process belongs to an earlier attempt of the job than its collective leader."""


def _say(line: str) -> None:
    print(f"strategyjob: {line}", file=sys.stderr, flush=True)


def _is_poll_timeout(error: BaseException) -> bool:
    """``Work.wait(timeout)`` raises this when the slice ends, the collective still running."""
    return "Operation timed out!" in str(error)


class _LivenessListener:
    """A listening socket whose only job is to answer: peers connect to learn we are alive.

    A daemon thread blocked in ``accept()`` (no CPU while idle) sends one byte to each
    connection: a dead process's socket refuses connections at once, and a frozen one (whose
    kernel still completes the connection) never sends the byte, which is how peers tell.
    The byte is followed by what the process is doing (:class:`waiting.Activity`), which a
    peer waiting in a collective reads to name those that are not in it.
    """

    def __init__(self) -> None:
        #: (the collective this process waits in, "" for none; since when, monotonic)
        self.doing: tuple[str, float] = ("", time.monotonic())
        #: Collectives completed, and the longest time outside collectives between two of
        #: them (before the first one it was starting up, which says nothing of its steps).
        self.completed = 0
        self.longest = 0.0
        self.left_at = self.doing[1]  # when the last collective completed
        if socket.has_dualstack_ipv6():
            self._sock = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._sock = socket.create_server(("", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, name="strategyjob-liveness", daemon=True).start()

    def entered(self, what: str, now: float) -> None:
        """This process waits in collective ``what`` from ``now`` on."""
        collective, since = self.doing
        if not collective and self.completed and now - since > self.longest:
            self.longest = now - since
        self.doing = (what, now)

    def left(self, now: float) -> None:
        """A collective completed at ``now``; this process is in none."""
        self.entered("", now)
        self.completed += 1
        self.left_at = now

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            collective, since = self.doing
            activity = waiting.Activity(collective, time.monotonic() - since, self.longest)
            with contextlib.suppress(OSError), conn:
                conn.sendall(_ALIVE + activity.encode())


class _InFlight:
    """The tensors of collectives that a backend thread runs (gloo's worker threads), kept in
    Python until that thread has let go of them.

    Why: gloo's worker drops its reference to a finished collective a moment after ``wait()``
    returns, on a loaded machine milliseconds later. Were that the last reference to a tensor
    whose Python object is already gone, torch (which keeps a tensor's Python object alive
    while C++ still holds the tensor) has that thread take the GIL to free the object. Once the
    interpreter is finalising, CPython ends a thread that asks for the GIL with
    ``pthread_exit``, whose unwinding through a noexcept destructor is ``std::terminate``: a
    finished worker dies with "terminate called without an active exception" (exit 134).

    So the backend only ever sees an alias (``detach()``: the same memory, a tensor object of
    its own) that nothing but this pool and the collective's work reference. Its use count
    says when the work is gone; the alias is then dropped here, on a Python thread, and
    :meth:`drain` waits for the last ones before the interpreter finalises.
    """

    def __init__(self) -> None:
        self._held: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def hand(self, tensor: torch.Tensor) -> torch.Tensor:
        """The alias of ``tensor`` to give the backend."""
        alias = tensor.detach()
        with self._lock:
            self._release_done()
            self._held.append(alias)
        return alias

    def release_done(self) -> None:
        """Drop the aliases no work references any more (their memory can be reused)."""
        with self._lock:
            self._release_done()

    def _release_done(self) -> None:
        if self._held:
            self._held = [t for t in self._held if t._use_count() > 1]  # type: ignore[attr-defined]

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every alias is released; True if all were.

        Polled: nothing signals a backend thread letting go of a work. A work the program
        still holds keeps its alias until the work is freed, so this can end on the timeout
        (harmless then: such a work is freed by the main thread)."""
        deadline = time.monotonic() + timeout
        while True:
            self.release_done()
            if not self._held:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)


_in_flight = _InFlight()


def _keep_until_exit(objects: Sequence[Any]) -> None:
    """Never free ``objects``, not even in interpreter finalisation: the OS reclaims them.

    Why: a process group whose collective still waits on a lost peer cannot be destroyed
    (its destructor joins the backend thread blocked in that collective, gloo's or NCCL's);
    finalisation's garbage collection would otherwise hang there ("Garbage-collecting", no
    Python frame) long after the error was printed. An extra reference is the only way to
    stop finalisation freeing an object."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


_ALIVE = b"\x01"


def _probe(address: tuple[str, int]) -> bool | None:
    """True: the peer answers; False: refused (its process is gone); None: no answer (frozen,
    unreachable, its name gone from DNS)."""
    try:
        with socket.create_connection(address, timeout=_PROBE_TIMEOUT_SECONDS) as sock:
            return sock.recv(1) == _ALIVE
    except ConnectionRefusedError:
        return False
    except OSError:  # socket.timeout included
        return None


def _activity(address: tuple[str, int]) -> waiting.Activity | None:
    """What the peer listening at ``address`` says it is doing; None if it does not say."""
    data = b""
    try:
        with socket.create_connection(address, timeout=_PROBE_TIMEOUT_SECONDS) as sock:
            while chunk := sock.recv(256):
                data += chunk
    except OSError:
        return None
    return waiting.Activity.decode(data[1:]) if data[:1] == _ALIVE else None


def _reachable(address: tuple[str, int], timeout: float) -> bool:
    """Whether something accepts connections at ``address`` (its name may not resolve yet)."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return True
    except OSError:
        return False


def _unresponsive_seconds() -> float:
    return waiting.positive_seconds(ENV_UNRESPONSIVE_PEER_SECONDS, UNRESPONSIVE_PEER_SECONDS)


def down_peers(
    probes: dict[int, bool | None], silent_since: dict[int, float], now: float, grace: float
) -> list[int]:
    """Ranks to take as down, given this round's ``probes``: a refused one at once, one that has
    not answered for ``grace`` seconds (``silent_since``, updated here, remembers since when)."""
    down = []
    for rank, answer in sorted(probes.items()):
        if answer is None:
            if now - silent_since.setdefault(rank, now) >= grace:
                down.append(rank)
            continue
        silent_since.pop(rank, None)
        if answer is False:
            down.append(rank)
    return down


class CollectiveGroup:
    """The default ``torch.distributed`` group of the cluster's workers, with bounded waits
    (or, through :meth:`over`, a sub-group of it).

    Collectives are issued by one thread at a time in the same order on every worker (the
    strategy guarantees it); ``all_reduce_async`` + ``wait`` serve the gradient buckets.
    """

    def __init__(self, membership: ClusterMembership, options: CommunicationOptions) -> None:
        self.membership = membership
        self.options = options
        self.rank = membership.rank
        self.world_size = membership.world_size
        self._timeout = _timeout_seconds(options)
        self._poll = datetime.timedelta(seconds=min(_POLL_SECONDS, self._timeout / 4))
        self._state: dict[str, Any] = {"broken": None, "silent_since": {}}  # shared by views
        self._dist_group: Any = None  # the torch group of the collectives (None: default)
        self._gather_order: list[int] | None = None  # group ranks in worker order (None: same)
        self._unresponsive = _unresponsive_seconds()
        self._stuck_policy = stuck.policy_from_env()  # refused here, before the rendezvous
        self._stuck = _stuck_policy(options, self._stuck_policy)
        self._report_seconds = waiting.positive_seconds(
            waiting.ENV_WAITING_REPORT_SECONDS, waiting.DEFAULT_REPORT_SECONDS
        )
        self._peers: dict[int, tuple[str, int]] = {}
        self._listener = _LivenessListener()
        try:
            self._rendezvous()
        except BaseException:
            self._listener.close()
            raise

    # ----------------------------------------------------------------- set-up
    def _rendezvous(self) -> None:
        m = self.membership
        seconds = _rendezvous_seconds()
        timeout = datetime.timedelta(seconds=seconds)
        deadline = time.monotonic() + seconds
        reporter = waiting.Reporter(self._report_seconds, time.monotonic())
        if dist.is_initialized():
            if dist.get_world_size() != m.world_size or dist.get_rank() != m.rank:
                raise RuntimeError(
                    f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}, but the cluster makes this task rank {m.rank} of "
                    f"{m.world_size}. Initialise it consistently with TF_CONFIG or not at all."
                )
            store = dist.distributed_c10d._get_default_store()
        else:
            try:
                store = self._join_store(seconds, reporter)
                store.set_timeout(timeout)
            except _LeftOverTask:
                raise  # says it all
            except (RuntimeError, OSError) as e:  # DistNetworkError / DistStoreError
                if m.rank == 0 and "EADDRINUSE" in str(e):
                    raise RuntimeError(
                        f"{m.task_name(0)} leads the collective rendezvous at its TF_CONFIG "
                        f"address {m.master_addr}:{m.master_port}, but another process already "
                        "listens on that port. Stop that process, or give this task a free "
                        "port in TF_CONFIG's cluster."
                    ) from e
                raise RuntimeError(
                    f"Timeout waiting for the cluster, timeout is {seconds:g} seconds: "
                    f"{m.task_name(m.rank)} could not reach the collective leader "
                    f"{m.task_name(0)} at {m.master_addr}:{m.master_port} ({e})."
                ) from e
        # Liveness addresses double as the rendezvous barrier that names absent tasks.
        store.set(f"{_KEY_PREFIX}alive/{m.rank}", f"{m.host}:{self._listener.port}")
        keys = [f"{_KEY_PREFIX}alive/{r}" for r in range(m.world_size)]
        self._await_peers(store, keys, deadline, reporter, seconds)
        for r, key in enumerate(keys):
            if r != m.rank:
                self._peers[r] = _split_address(store.get(key).decode())
        self._owns_pg = not dist.is_initialized()
        if self._owns_pg:
            dist.init_process_group(
                backend=self._backend(),
                store=dist.PrefixStore(f"{_KEY_PREFIX}pg", store),
                rank=m.rank,
                world_size=m.world_size,
                timeout=datetime.timedelta(seconds=self._timeout),
            )
        atexit.register(self._shutdown)  # whoever created the process group
        self._store = store
        self._pg = dist.distributed_c10d._get_default_group()
        self._sum_options = dist.AllreduceOptions()  # reduceOp defaults to SUM

    def _join_store(self, seconds: float, reporter: waiting.Reporter) -> dist.TCPStore:
        """The rendezvous store: the leader serves it (saying which attempt it belongs to); the
        others connect to it, unless it is an earlier attempt's leader still training (this task
        was started ahead of a re-forming): then they wait, without a deadline, until it is
        gone, saying so every few seconds, and the rendezvous' own timeout starts after."""
        m, attempt = self.membership, _own_attempt()
        start = time.monotonic()
        while True:
            deadline = time.monotonic() + seconds
            if m.rank != 0:
                self._await_leader(deadline, reporter, seconds)
            store = dist.TCPStore(
                m.master_addr,
                m.master_port,
                m.world_size,
                is_master=m.rank == 0,
                timeout=datetime.timedelta(seconds=max(1.0, deadline - time.monotonic())),
                wait_for_workers=False,
            )
            if m.rank == 0:
                if attempt is not None:
                    store.set(_ATTEMPT_KEY, str(attempt))
                return store
            try:
                theirs = _leader_attempt(store)
            except (RuntimeError, OSError):  # that leader went away meanwhile: look again
                continue
            if attempt is None or theirs is None or theirs == attempt:
                return store
            del store  # disconnects
            if theirs > attempt:
                raise _LeftOverTask(
                    f"{m.task_name(m.rank)} belongs to attempt {attempt} of this job "
                    f"({_names.ENV_RESTART_ATTEMPT}), but its collective leader {m.task_name(0)} "
                    f"at {m.master_addr}:{m.master_port} to attempt {theirs}: this process is "
                    "left over from an earlier attempt. Stop it; the job's current attempt has "
                    "its own."
                )
            now = time.monotonic()
            if reporter.due(now):
                _say(
                    f"{m.task_name(m.rank)} (attempt {attempt}) waiting for the collective "
                    f"leader {m.task_name(0)} of attempt {theirs} to stop: the job re-forms, "
                    f"and this task was started ahead ({now - start:.0f} s so far)."
                )
            time.sleep(_LEADER_OF_EARLIER_RUN_POLL_SECONDS)

    def _await_leader(self, deadline: float, reporter: waiting.Reporter, seconds: float) -> None:
        """Wait until the leader's rendezvous port accepts connections, saying so every few
        seconds; past ``deadline``, return and let the store's own connect fail. Polled with
        plain sockets: the store's connect logs a C++ trace per failed try."""
        m = self.membership
        start = time.monotonic()
        while not _reachable((m.master_addr, m.master_port), _PROBE_TIMEOUT_SECONDS):
            now = time.monotonic()
            if now >= deadline:
                return
            if reporter.due(now):
                own = m.task_name(m.rank)
                _say(waiting.rendezvous_line(own, [m.task_name(0)], now - start, seconds))
            time.sleep(min(_RENDEZVOUS_POLL_SECONDS, max(0.0, deadline - now)))

    def _await_peers(
        self,
        store: dist.Store,
        keys: list[str],
        deadline: float,
        reporter: waiting.Reporter,
        seconds: float,
    ) -> None:
        """Wait until every task has set its key in ``store``, saying every few seconds
        which have not; past ``deadline``, raise TensorFlow's timeout naming them. Polled
        with ``check``: a ``wait`` that times out logs two C++ warnings each time."""
        m = self.membership
        start = time.monotonic()
        while True:
            try:
                if store.check(keys):
                    return
                cause: BaseException | None = None
            except (RuntimeError, OSError) as e:  # the leader's store is gone
                cause = e
            now = time.monotonic()
            ended = cause is not None or now >= deadline
            if ended or reporter.due(now):
                missing = [m.task_name(r) for r, k in enumerate(keys) if not _has_key(store, k)]
                if ended:
                    raise RuntimeError(
                        f"Timeout waiting for the cluster, timeout is {seconds:g} seconds; "
                        f"not joined: {', '.join(missing) or 'unknown'}."
                    ) from cause
                if missing:
                    own = m.task_name(m.rank)
                    _say(waiting.rendezvous_line(own, missing, now - start, seconds))
            time.sleep(min(_RENDEZVOUS_POLL_SECONDS, max(0.0, deadline - now)))

    def _shutdown(self) -> None:
        """At exit, while the interpreter is still whole: wait until the backend's threads
        have let go of this process's collectives (:class:`_InFlight`), then destroy the
        process group if this group created it (a broken one is left alone: its pending work
        could block the exit until the timeout).

        Destroying the group does not stop gloo's threads while anything else references it
        (``torch.distributed.nn.functional``, which an optimizer's first use imports, keeps
        the default group in its functions' default arguments; a DDP module keeps its own):
        they run on into interpreter finalisation, hence the drain.

        A broken group's backend threads may be blocked for good (on a frozen peer, for
        gloo's 30-minute timeout), and the groups' destructors join them: its groups are
        kept from destruction instead (:func:`_keep_until_exit`), so the process exits at
        once with the exit status Python gives it."""
        # Collect garbage while the interpreter is whole: a cycle holding a finished
        # collective's work (a DTensor's functional collective, say) left to finalisation's
        # collection gets its tensors released by a gloo thread that cannot take the GIL
        # any more, and the process aborts ("terminate called without an active exception").
        gc.collect()
        broken = self._state["broken"] is not None
        _in_flight.drain(0.0 if broken else _EXIT_DRAIN_SECONDS)  # broken: work never ends
        if broken:
            _keep_until_exit(_torch_internals.process_groups())
        elif self._owns_pg and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._pg = self._store = None  # type: ignore[assignment]  # closed: never used again
        self._listener.close()

    def _backend(self) -> str:
        if (
            torch.cuda.is_available()
            and self.options.implementation != CommunicationImplementation.RING
        ):
            return "cpu:gloo,cuda:nccl"
        return "gloo"

    def task_name(self, rank: int) -> str:
        return self.membership.task_name(rank)

    def with_options(self, options: CommunicationOptions) -> CollectiveGroup:
        """A view of this group whose waits use ``options`` (timeout, pack size)."""
        view = copy.copy(self)
        view.options = options
        view._timeout = _timeout_seconds(options)
        view._poll = datetime.timedelta(seconds=min(_POLL_SECONDS, view._timeout / 4))
        view._stuck = _stuck_policy(options, self._stuck_policy)
        return view

    def over(self, sub_group: Any, workers: Sequence[int] | None = None) -> CollectiveGroup:
        """A view of this group whose collectives run across the torch process group
        ``sub_group`` (ranks and world size are the sub-group's; liveness, error diagnosis,
        options and the broken state stay the cluster's). ``workers``: the sub-group's
        members (ranks in the cluster) in worker order, the order of :meth:`all_gather`'s
        result (torch numbers a group's members in ascending rank order).

        A view rather than a ``group=`` argument on every method: the gradient buckets'
        launches stay a direct call on the process group (TPUStrategy's replica dimension)."""
        view = copy.copy(self)
        view._pg = sub_group
        view._dist_group = sub_group
        view.rank = sub_group.rank()
        view.world_size = sub_group.size()
        if workers is not None:
            if len(workers) != view.world_size:
                raise ValueError(
                    f"workers names {len(workers)} processes but the sub-group has "
                    f"{view.world_size}: pass the sub-group's members in worker order."
                )
            view._gather_order = gather_order(workers)
        return view

    # --------------------------------------------------------------- liveness
    def dead_peers(self, patience: float = 0.0) -> list[int]:
        """Ranks whose liveness listener refuses connections, or has not answered for
        :data:`UNRESPONSIVE_PEER_SECONDS`; probing up to ``patience`` seconds."""
        deadline = time.monotonic() + patience
        while True:
            probes = {r: _probe(address) for r, address in self._peers.items()}
            dead = down_peers(
                probes, self._state["silent_since"], time.monotonic(), self._unresponsive
            )
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)  # give a dying peer's sockets time to close before probing again

    def lost_peer_error(self, what: str, waited: float = 0.0) -> errors.OpError | None:
        """For a wait that :meth:`wait` cannot slice, ``waited`` seconds into it: the error
        that ends it as a sliced wait would end (the group is then broken) — the peers found
        down, a stuck peer past the job's bound (``collective.stuck``) or past
        ``CommunicationOptions.timeout_seconds`` — or None while none of these holds."""
        dead = self.dead_peers()
        if dead:
            return self._fail(self._unavailable(dead, what))
        verdict = self._stuck_verdict(what)
        if verdict is None and waited >= self._timeout:
            verdict = self._deadline(what)
        return None if verdict is None else self._fail(verdict)

    @contextlib.contextmanager
    def unsliced_wait(self, what: str) -> Iterator[None]:
        """Around a wait that :meth:`wait` cannot slice (DTensor's): peers probing this
        process learn that it waits in ``what``, as during a sliced wait, so that a peer that
        never comes is the one named."""
        self._listener.entered(what, time.monotonic())
        try:
            yield
        finally:
            if self._state["broken"] is None:
                self._listener.left(time.monotonic())

    def _unavailable(self, dead: list[int], what: str, cause: str = "") -> errors.UnavailableError:
        names = ", ".join(self.task_name(r) for r in dead)
        message = f"cluster check alive failed, {names} is down"
        message += f" (during {what}{': ' + cause if cause else ''})."
        return errors.UnavailableError(message)

    def _fail(self, error: errors.OpError) -> errors.OpError:
        self._state["broken"] = error
        return error

    def _diagnose(self, cause: BaseException, what: str) -> errors.OpError:
        text = str(cause).strip().splitlines()[-1] if str(cause).strip() else repr(cause)
        dead = self.dead_peers(patience=_DIAGNOSE_SECONDS)
        if dead:
            return self._fail(self._unavailable(dead, what, text))
        if "timed out" in text.lower() or "timeout" in text.lower():
            return self._fail(self._deadline(what))
        return self._fail(
            errors.UnavailableError(
                f"Collective {what} failed and the cluster is in an unknown state: {text}. "
                "All peers still accept connections; check their logs."
            )
        )

    def _deadline(self, what: str) -> errors.DeadlineExceededError:
        """``CommunicationOptions.timeout_seconds`` ran out: the verdict naming the peers
        that did not arrive, shared with the other waiting workers as a stuck-peer verdict is
        (:meth:`_publish_verdict`), so that none of them blames this one for leaving."""
        activities = self._activities()
        absent = waiting.not_arrived(activities, what)
        if absent:
            peers = ", ".join(f"{name} ({a.describe()})" for name, a in absent.items())
            who = f"Not arrived: {peers}. A peer that is alive but not in it is stuck or"
        else:
            who = "Every peer is alive, so one is stuck or"
        message = (
            f"Collective {what} did not complete within {self._timeout:g} seconds "
            f"(CommunicationOptions.timeout_seconds). {who} running different code (all "
            "workers must issue the same collectives in the same order)."
        )
        # Through the store only while its host answers (itself, or a live listener): a frozen
        # host would hold the call for the store's timeout, the rendezvous's.
        host = self.task_name(0)
        if self.membership.rank != 0 and activities.get(host) is None:
            return errors.DeadlineExceededError(message)
        waiters = sum(a is not None and a.collective == what for a in activities.values())
        return errors.DeadlineExceededError(self._publish_verdict(message, waiters))

    def _not_arrived(self, what: str) -> dict[str, waiting.Activity]:
        """The peers of this group's collectives that say they are not waiting in ``what``."""
        return waiting.not_arrived(self._activities(), what)

    def _activities(self) -> dict[str, waiting.Activity | None]:
        """What each peer of this group's collectives says it is doing, by task name."""
        members: Iterable[int] = self._peers.keys()
        if self._dist_group is not None:  # a sub-group: only its members take part
            members = set(dist.get_process_group_ranks(self._dist_group)) & set(members)
        return {self.task_name(r): _activity(self._peers[r]) for r in sorted(members)}

    def _stuck_verdict(self, what: str) -> errors.DeadlineExceededError | None:
        """The stuck-peer verdict on collective ``what`` (``collective.stuck``), if one is
        reached, by this worker or (published in the store) by another one."""
        policy = self._stuck
        if policy is None or self._listener.completed < policy.min_collectives:
            return None
        # The peers left the last collective when this worker did: none has been outside
        # collectives for the floor yet (no probe, no store call on an ordinary slow wait).
        if time.monotonic() - self._listener.left_at < policy.floor:
            return None
        published = self._published_verdict()
        if published is not None:
            return errors.DeadlineExceededError(published)
        activities = self._activities()
        said = [a for a in activities.values() if a is not None]
        longest = max([self._listener.longest] + [a.longest for a in said])
        bound = policy.bound(self._listener.completed, longest)
        if bound is None:
            return None
        found = stuck.culprits(waiting.not_arrived(activities, what), bound)
        if not found:
            return None
        message = stuck.verdict(what, found, bound, policy, longest)
        waiters = sum(a.collective == what for a in said)
        return errors.DeadlineExceededError(self._publish_verdict(message, waiters))

    def _published_verdict(self) -> str | None:
        """The verdict another worker published (acknowledged), if any."""
        with contextlib.suppress(RuntimeError, OSError):
            if self._store.check([_VERDICT_KEY]):
                self._store.add(_VERDICT_ACK_KEY, 1)
                return self._store.get(_VERDICT_KEY).decode().partition("\n")[2]
        return None

    def _publish_verdict(self, message: str, waiters: int) -> str:
        """Publish ``message`` unless another worker's verdict came first (that one is
        taken up and returned), and wait until the ``waiters`` other waiting workers have
        taken it up: were this process gone before they looked, they would blame it."""
        try:
            mine = f"{self.membership.rank}\n{message}"  # two may word it alike
            published = self._store.compare_set(_VERDICT_KEY, "", mine).decode()
            if published != mine:  # another worker decided at the same moment
                self._store.add(_VERDICT_ACK_KEY, 1)
                return published.partition("\n")[2]
            deadline = time.monotonic() + _VERDICT_ACK_SECONDS
            while self._store.add(_VERDICT_ACK_KEY, 0) < waiters and time.monotonic() < deadline:
                time.sleep(0.05)
        except (RuntimeError, OSError):  # the store's host is gone: say it all the same
            pass
        return message

    def check(self) -> None:
        """Raise the error that broke the group, if any: later collectives would hang."""
        broken = self._state["broken"]
        if broken is not None:
            raise type(broken)(broken.message)

    # ------------------------------------------------------------ collectives
    def wait(self, work: dist.Work, what: str) -> None:
        """Wait for ``work`` in slices, checking peers' liveness between slices.

        Work already done is only collected: a sliced (timed) wait costs tens of µs more
        than a plain one, paid per gradient bucket and per segment of a large all-reduce."""
        if work.is_completed():
            try:
                work.wait()  # returns at once; raises the work's error, if any
            except RuntimeError as e:
                raise self._diagnose(e, what) from e
            self._listener.left(time.monotonic())
            return
        start = time.monotonic()
        self._listener.entered(what, start)  # what peers probing us learn (_not_arrived)
        reporter = waiting.Reporter(self._report_seconds, start)
        try:
            while True:
                try:
                    work.wait(self._poll)
                    self._listener.left(time.monotonic())
                    return
                except RuntimeError as e:
                    if not _is_poll_timeout(e):
                        raise self._diagnose(e, what) from e
                verdict = self._stuck_verdict(what)
                if verdict is not None:
                    raise self._fail(verdict)
                dead = self.dead_peers()
                if dead:
                    raise self._fail(self._unavailable(dead, what))
                now = time.monotonic()
                if now - start >= self._timeout:
                    raise self._fail(self._deadline(what))
                if reporter.due(now) and (absent := self._not_arrived(what)):
                    own = self.task_name(self.membership.rank)
                    _say(waiting.collective_line(own, what, now - start, absent))
        except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, or a signal handler's exit
            if isinstance(e.__context__, RuntimeError) and _is_poll_timeout(e.__context__):
                e.__suppress_context__ = True  # a slice's end, not a cause worth showing
            if not work.is_completed():  # a backend thread still runs it: the group is spent
                self._fail(
                    errors.CancelledError(
                        f"Collective {what} was interrupted; a backend thread still runs it, "
                        "so this process cannot run collectives any more. Restart it."
                    )
                )
            raise
        finally:
            if self._state["broken"] is None:  # a failed one stays what peers learn of us
                self._listener.doing = ("", time.monotonic())

    def _launch(self, what: str, fn, *args, **kwargs) -> dist.Work:
        """Start a ``torch.distributed`` collective asynchronously, on aliases of its tensors
        (:class:`_InFlight`)."""
        args = tuple(_hand_over(a) for a in args)
        return self._start(what, fn, *args, async_op=True, **kwargs)

    def _start(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dist.Work:
        """``fn(*args, **kwargs)`` unless the group is broken; an error starting it says what
        is known of the peers."""
        self.check()
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            raise self._diagnose(e, what) from e

    def all_reduce_async(self, flat: torch.Tensor) -> dist.Work:
        """Launch a SUM all-reduce of ``flat`` in place; finish it with :meth:`wait`.

        Calls the process group directly: the gradient buckets launch it from backward hooks,
        where ``dist.all_reduce``'s argument checks would cost as much as the launch itself.
        """
        alias = _in_flight.hand(flat)  # gloo's worker thread runs it (_InFlight)
        return self._start("all-reduce", self._pg.allreduce, [alias], self._sum_options)

    def all_reduce(self, tensors: Sequence[torch.Tensor], reduce_op: str) -> list[torch.Tensor]:
        """``reduce_op`` ("sum" or "mean") of each tensor across workers; new tensors.

        Tensors are packed by dtype and device into flat buffers of about ``bytes_per_pack``
        (all in one when 0), one collective per pack.
        """
        if not tensors:
            return []
        if len(tensors) == 1 and _is_small(tensors[0]):
            # One small tensor (the loss, every step): its clone is the result buffer, and the
            # packing below would cost a fifth of the collective itself.
            total = tensors[0].detach().clone(memory_format=torch.contiguous_format)
            self.wait(self.all_reduce_async(total), "all-reduce")
            if reduce_op == "mean":
                self._divide_in_place(total)
            return [total]
        results: list[torch.Tensor | None] = [None] * len(tensors)
        for indices in _packs(tensors, self.options.bytes_per_pack):
            parts = [tensors[i] for i in indices]
            wire_dtype = torch.int32 if parts[0].dtype == torch.bool else parts[0].dtype
            if len(parts) == 1 and self._rings(parts[0], wire_dtype):
                flat = self._ring_all_reduce(parts[0].detach().reshape(-1))
            else:
                if len(parts) == 1:  # one copy, no concatenation
                    flat = _result_buffer(parts[0], wire_dtype)
                    flat.view(parts[0].shape).copy_(parts[0].detach())
                else:
                    flat = torch.cat([p.detach().reshape(-1).to(wire_dtype) for p in parts])
                self.wait(self.all_reduce_async(flat), "all-reduce")
            if reduce_op == "mean":  # flat is this call's own buffer
                self._divide_in_place(flat)
            offset = 0
            for i, p in zip(indices, parts):
                n = p.numel()
                results[i] = flat[offset : offset + n].view(p.shape).to(p.dtype)
                offset += n
        return results  # type: ignore[return-value]

    def _divide_in_place(self, total: torch.Tensor) -> None:
        if total.is_floating_point() or total.is_complex():
            total.div_(self.world_size)
        else:
            total.floor_divide_(self.world_size)

    def _rings(self, tensor: torch.Tensor, wire_dtype: torch.dtype) -> bool:
        return (
            tensor.device.type == "cpu"
            and tensor.dtype == wire_dtype
            and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() >= _RING_MIN_BYTES
            and tensor.numel() >= self.world_size
            and self.world_size > 1  # alone, the ring has no step: the result would stay empty
        )

    def _ring_all_reduce(self, source: torch.Tensor) -> torch.Tensor:
        """SUM of ``source`` (flat, CPU) over all workers into a new tensor; ``source`` is
        only read.

        Why not ``dist.all_reduce`` on a copy: gloo reduces in place, and the copy plus the
        fresh memory's page faults cost a third of a 25 MB all-reduce. This is gloo's own ring
        (reduce-scatter, then all-gather; n - 1 steps each, one chunk per step to the next
        rank) with the partial sums written straight into the result. The last reduce-scatter
        step completes the chunk this rank owns, which is what the all-gather's first step
        sends: each of its segments goes on as soon as it is summed, so the two phases overlap
        instead of the all-gather waiting for the last sum.
        """
        n, rank = self.world_size, self.rank
        result = _pooled_empty(source.numel(), source.dtype)
        inputs, outputs = source.tensor_split(n), result.tensor_split(n)
        after, before = (rank + 1) % n, (rank - 1) % n
        for step in range(n - 1):  # reduce-scatter: rank r ends up owning chunk r + 1
            sent = (rank - step) % n
            received = (rank - step - 1) % n
            self._exchange(
                inputs[sent] if step == 0 else outputs[sent],
                outputs[received],
                after,
                before,
                add=inputs[received],
                gather_into=outputs[rank] if step == n - 2 else None,
            )
        for step in range(1, n - 1):  # the rest of the all-gather: forward what arrived
            self._exchange(
                outputs[(rank + 1 - step) % n], outputs[(rank - step) % n], after, before
            )
        return result

    def _exchange(
        self,
        send: torch.Tensor,
        recv: torch.Tensor,
        dst: int,
        src: int,
        add: torch.Tensor | None = None,
        gather_into: torch.Tensor | None = None,
    ) -> None:
        """Send ``send`` to ``dst`` while receiving ``recv`` from ``src`` (``recv += add``).

        With ``add``, segment by segment so that each segment's sum overlaps the next one's
        transfer; without, in one message (nothing to overlap, fewer calls). With
        ``gather_into`` (the last reduce-scatter step), each summed segment of ``recv`` is sent
        on to ``dst`` at once, and ``src``'s summed segments arrive in ``gather_into``."""
        cut = _segments if add is not None else _whole
        sends = [self._start("all-reduce", self._pg.send, [part], dst, 0) for part in cut(send)]
        parts = cut(recv)  # the sender cuts this chunk the same way
        receives = [self._start("all-reduce", self._pg.recv, [part], src, 0) for part in parts]
        gathered = [
            self._start("all-reduce", self._pg.recv, [part], src, _GATHER_TAG)
            for part in (cut(gather_into) if gather_into is not None else ())
        ]
        adds = cut(add) if add is not None else [None] * len(parts)
        for work, part, addend in zip(receives, parts, adds):
            self.wait(work, "all-reduce")
            if addend is not None:
                part.add_(addend)
            if gather_into is not None:
                sends.append(self._start("all-reduce", self._pg.send, [part], dst, _GATHER_TAG))
        for work in gathered:
            self.wait(work, "all-reduce")
        self.wait(sends[-1], "all-reduce")  # gloo completes a pair's sends in order
        for work in sends[:-1]:
            self.wait(work, "all-reduce")

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """Concatenate every worker's ``tensor`` along ``axis`` in rank order; the size along
        ``axis`` may differ between workers."""
        tensor = tensor.detach()
        axis = axis % tensor.dim()
        sizes = torch.zeros(self.world_size, dtype=torch.int64, device=tensor.device)
        sizes[self.rank] = tensor.shape[axis]
        self.wait(self.all_reduce_async(sizes), "all-gather")
        sizes_list = [int(s) for s in sizes.tolist()]
        largest = max(sizes_list)
        padded = tensor
        if tensor.shape[axis] < largest:
            pad_shape = list(tensor.shape)
            pad_shape[axis] = largest - tensor.shape[axis]
            padded = torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=axis)
        padded = padded.contiguous()
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        work = self._launch("all-gather", dist.all_gather, gathered, padded, group=self._dist_group)
        self.wait(work, "all-gather")
        parts = [g.narrow(axis, 0, n) for g, n in zip(gathered, sizes_list)]
        if self._gather_order is not None:  # group ranks -> worker order
            parts = [parts[g] for g in self._gather_order]
        return torch.cat(parts, dim=axis)

    def broadcast(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` in place with rank ``src``'s values (one pack per dtype);
        ``src`` is a rank of the cluster (the default group), also in a view :meth:`over` a
        sub-group."""
        for indices in _packs(tensors, 0):
            parts = [tensors[i] for i in indices]
            flat = torch.cat([p.detach().reshape(-1) for p in parts])
            work = self._launch("broadcast", dist.broadcast, flat, src, group=self._dist_group)
            self.wait(work, "broadcast")
            if self.membership.rank != src:
                offset = 0
                for p in parts:
                    n = p.numel()
                    with torch.no_grad():
                        p.copy_(flat[offset : offset + n].view(p.shape))
                    offset += n

    def any(self, flag: bool) -> bool:
        """True if ``flag`` is true on any worker."""
        return self.any_async(flag)()

    def any_async(self, flag: bool) -> Callable[[], bool]:
        """Start agreeing whether ``flag`` is true on any worker; call the result for the
        answer (it waits, bounded by the timeout, and raises the collective's error)."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        work = self.all_reduce_async(value)

        def answer() -> bool:
            self.wait(work, "all-reduce")
            return bool(value.item())

        return answer

    def barrier(self) -> None:
        self.any(False)

    def gather_ints(self, value: int) -> list[int]:
        """Every worker's ``value``, in rank order: one small all-reduce (each worker fills its
        own slot of a zeroed vector)."""
        slots = torch.zeros(self.world_size, dtype=torch.int64)
        slots[self.rank] = value
        self.wait(self.all_reduce_async(slots), "all-gather")
        return [int(v) for v in slots.tolist()]

    def least_count(self, count: int | None) -> int:
        """The smallest of every worker's ``count``; 0 if any worker's is None (unknown)."""
        counts = self.gather_ints(-1 if count is None else count)
        return max(min(counts), 0)


def gather_order(workers: Sequence[int]) -> list[int] | None:
    """For a group whose members are ``workers`` (cluster ranks, in worker order): the group
    rank of each worker, in worker order, which reorders a gather's parts (torch numbers a
    group's members by ascending cluster rank); None when the two orders agree."""
    by_rank = sorted(int(w) for w in workers)
    order = [by_rank.index(int(w)) for w in workers]
    return None if order == list(range(len(order))) else order


def _has_key(store: dist.Store, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except (RuntimeError, OSError):
        return False


def _is_small(tensor: torch.Tensor) -> bool:
    """A dense tensor gloo and NCCL reduce as it is (not bool), below the pooled sizes."""
    return (
        tensor.layout == torch.strided
        and tensor.dtype != torch.bool
        and tensor.numel() * tensor.element_size() < MIN_POOLED_BYTES
    )


def _result_buffer(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised flat tensor for ``like``'s result, on ``like``'s device (CPU ones from
    the reusable pool): a CUDA tensor's result must stay on its GPU, reduced by NCCL."""
    if like.device.type == "cpu":
        return _pooled_empty(like.numel(), dtype)
    return torch.empty(like.numel(), dtype=dtype, device=like.device)


def _pooled_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Pooled result memory; aliases of finished collectives are dropped first, or memory the
    caller has already let go of would still look taken."""
    _in_flight.release_done()
    return _result_buffers.empty(numel, dtype)


def _hand_over(arg: Any) -> Any:
    """``arg`` with each tensor (alone or in a list) replaced by its :class:`_InFlight` alias."""
    if isinstance(arg, torch.Tensor):
        return _in_flight.hand(arg)
    if isinstance(arg, list) and arg and all(isinstance(t, torch.Tensor) for t in arg):
        return [_in_flight.hand(t) for t in arg]
    return arg


def _segments(chunk: torch.Tensor) -> tuple[torch.Tensor, ...]:
    count = -(-chunk.numel() * chunk.element_size() // _RING_SEGMENT_BYTES)
    return chunk.tensor_split(max(1, count))


def _whole(chunk: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (chunk,)


def _packs(tensors: Sequence[torch.Tensor], bytes_per_pack: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (dtype, device), each group cut into packs of about
    ``bytes_per_pack`` bytes (one pack per group when 0)."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    packs: list[list[int]] = []
    for indices in groups.values():
        current: list[int] = []
        size = 0
        for i in indices:
            current.append(i)
            size += tensors[i].numel() * tensors[i].element_size()
            if bytes_per_pack and size >= bytes_per_pack:
                packs.append(current)
                current, size = [], 0
        if current:
            packs.append(current)
    return packs


_group: CollectiveGroup | None = None
_group_lock = threading.Lock()


def current_group() -> CollectiveGroup | None:
    """The collective group this process joined (:func:`get_group`), else None: how
    checkpoints and preemption agree between workers when no strategy is at hand."""
    return _group


def get_group(membership: ClusterMembership, options: CommunicationOptions) -> CollectiveGroup:
    """The process's collective group, created (with its rendezvous) on first use.

    A process joins one cluster: later strategies with the same membership share the group
    (the first strategy's timeout applies to the process group; each strategy's own
    ``timeout_seconds`` still bounds its waits)."""
    global _group
    with _group_lock:
        if _group is None:
            _group = CollectiveGroup(membership, options)
            return _group
        if (_group.membership.rank, _group.membership.world_size) != (
            membership.rank,
            membership.world_size,
        ):
            raise RuntimeError(
                f"This process already joined the cluster as {_group.task_name(_group.rank)} "
                f"(rank {_group.rank} of {_group.world_size}); a process can take part in one "
                "cluster only."
            )
        return _group.with_options(options)
