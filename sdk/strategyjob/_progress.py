"""``strategyjob.report(step=..., total_steps=None, **metrics)``: training progress that
reaches the StrategyJob's ``status.progress`` (and ``strategyjob run``'s status line).

Torch-free. Only the job's leader publishes (the chief, else worker 0: the replica
``STRATEGYJOB_REPLICA_TYPE`` / ``STRATEGYJOB_REPLICA_INDEX`` name); every other process
returns at once. Where the numbers go:

* under ``strategyjob run``: one JSON line appended to ``STRATEGYJOB_PROGRESS_FILE``;
* in a cluster: the annotation ``strategyjob.dev/progress`` (JSON) of the leader's own pod
  (``STRATEGYJOB_POD_NAME``), merge-patched with the pod's ServiceAccount token. The
  operator gives each job a ServiceAccount whose Role allows ``get`` and ``patch`` on that
  one pod only, and copies the annotation into ``status.progress``.

At most one write per ``STRATEGYJOB_PROGRESS_INTERVAL`` seconds (default 10 in a cluster,
0.5 locally), by a background thread: ``report()`` itself never waits for the network, and
only the newest report is sent. The last report is written at exit (waiting at most 5
seconds for it). Failures and bad arguments never reach the training loop: the first of
each is logged as a warning, later ones are silent.

For tests, ``STRATEGYJOB_KUBE_API`` (e.g. ``https://127.0.0.1:6443``) and
``STRATEGYJOB_SERVICEACCOUNT_DIR`` (``token``, ``ca.crt``) replace the in-cluster API address
and ``/var/run/secrets/kubernetes.io/serviceaccount``.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from strategyjob import _history, _names

logger = logging.getLogger("strategyjob")

ANNOTATION = _names.ANNOTATION_PROGRESS
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ENV_INTERVAL = _names.ENV_PROGRESS_INTERVAL
ENV_KUBE_API = _names.ENV_KUBE_API
ENV_SERVICEACCOUNT_DIR = _names.ENV_SERVICEACCOUNT_DIR
_HTTP_TIMEOUT = 5.0
#: How long the exit of a process waits for its last report to be written.
_EXIT_FLUSH_SECONDS = 5.0
_MAX_INTERVAL = 24 * 3600.0
#: The most reports one write carries for the history (more between two writes, 0.5 s apart
#: locally, are thinned): only a loop reporting 20,000 times a second loses points.
_POINTS_PER_WRITE = 10_000


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_leader(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is the job's leader: the chief, else worker 0 when the job
    has no chief (read from ``TF_CONFIG``'s cluster)."""
    replica_type = env.get(_names.ENV_REPLICA_TYPE)
    if replica_type == "chief":
        return env.get(_names.ENV_REPLICA_INDEX, "0") == "0"
    if replica_type != "worker" or env.get(_names.ENV_REPLICA_INDEX, "0") != "0":
        return False
    try:
        cluster = json.loads(env.get(_names.ENV_TF_CONFIG) or "{}").get("cluster") or {}
    except (ValueError, AttributeError):
        cluster = {}
    return not cluster.get("chief")


_INT64_MAX = 2**63 - 1  # status.progress.step and totalSteps are int64 in the CRD


def _shown(value: Any) -> str:
    """``repr(value)``, short, whatever ``value`` is."""
    try:
        text = repr(value)
    except Exception:
        text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _count(value: Any, least: int) -> int:
    """``value`` as a whole number from ``least`` to 2**63 - 1 (floats are truncated,
    tensors and numpy scalars read through ``item()``); ``ValueError`` otherwise."""
    number = value
    if hasattr(value, "item") and callable(value.item):
        try:
            number = value.item()
        except Exception:
            pass
    if isinstance(number, float) and math.isfinite(number):
        number = int(number)
    if isinstance(number, int) and not isinstance(number, bool) and least <= number <= _INT64_MAX:
        return number
    raise ValueError(f"a whole number from {least} to 2**63 - 1, got {_shown(value)}")


def _metric(value: Any) -> float | int | str:
    """A JSON-safe metric: numbers stay numbers (tensors and numpy scalars via ``item()``),
    anything else (and NaN / infinity) becomes its string."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except Exception:
            return str(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def make_record(
    step: Any, total_steps: Any, metrics: dict[str, Any], problems: list[str] | None = None
) -> dict[str, Any]:
    """What one report publishes: ``step``, ``totalSteps``, ``metrics`` and ``time``.

    A bad ``step`` raises ``ValueError`` (there is nothing to publish without it); a bad
    ``total_steps`` or metric is left out and described in ``problems``."""
    try:
        record: dict[str, Any] = {"step": _count(step, 0)}
    except ValueError as e:
        raise ValueError(f"step must be {e}") from None
    problems = [] if problems is None else problems
    if total_steps is not None:
        try:
            record["totalSteps"] = _count(total_steps, 1)
        except ValueError as e:
            problems.append(f"total_steps must be None or {e}; it is left out")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = _metric(value)
        except Exception as e:
            problems.append(f"metric {key} cannot be read ({type(e).__name__}); it is left out")
    if out:
        record["metrics"] = out
    record["time"] = now_rfc3339()
    return record


class _FileSink:
    """``strategyjob run``: one JSON line per write, read by the launcher's status line and
    folded into the job's metric history (each line carries the reports since the last)."""

    keeps_points = True

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


class _PodAnnotationSink:
    """In a cluster: merge-patch the annotation of this pod with its own token. Each write
    carries the reports since the last (thinned to ``points_per_write``: the annotation is
    part of the pod object every watcher of pods receives), which the operator folds into the
    job's metric history (``<job>-strategyjob-metrics``). Room left is filled with the newest
    points already written (``resends_points``): an annotation the operator never saw (it
    was restarted or upgraded meanwhile) leaves no gap in the history when the next one
    comes, and folding a point again changes nothing."""

    keeps_points = True
    resends_points = True
    #: About 6 KB of JSON for a few metrics: at the default 10 s interval, a job reporting 10
    #: times a second has its older reports of a write thinned (the history thins them too).
    points_per_write = 100

    def __init__(self, api: str, sa_dir: str, namespace: str, pod: str) -> None:
        self.url = f"{api.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{pod}"
        self.sa_dir = sa_dir
        self._ssl: ssl.SSLContext | None = None

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ca = os.path.join(self.sa_dir, "ca.crt")
            self._ssl = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        return self._ssl

    def write(self, record: dict[str, Any]) -> None:
        # The token is re-read each time: kubelet rotates projected tokens.
        with open(os.path.join(self.sa_dir, "token"), encoding="utf-8") as f:
            token = f.read().strip()
        value = json.dumps(record, separators=(",", ":"))
        body = json.dumps({"metadata": {"annotations": {ANNOTATION: value}}}).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="PATCH",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
            },
        )
        context = self._context() if self.url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT, context=context) as r:
                r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except (ValueError, AttributeError):
                pass
            raise RuntimeError(f"PATCH {self.url} failed with HTTP {e.code}: {detail}") from None


def _sink_from_env(env: Any = os.environ) -> Any:
    """Where this process reports: the launcher's file, the pod's annotation, or nowhere."""
    path = env.get(_names.ENV_PROGRESS_FILE)
    if path:
        return _FileSink(path)
    pod = env.get(_names.ENV_POD_NAME)
    api = env.get(ENV_KUBE_API)
    if not api and env.get("KUBERNETES_SERVICE_HOST"):
        host = env["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        api = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
    sa_dir = env.get(ENV_SERVICEACCOUNT_DIR) or SERVICEACCOUNT_DIR
    if not (pod and api and os.path.exists(os.path.join(sa_dir, "token"))):
        return None
    namespace = env.get(_names.ENV_NAMESPACE)
    if not namespace:
        try:
            with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as f:
                namespace = f.read().strip()
        except OSError:
            return None
    return _PodAnnotationSink(api, sa_dir, namespace, pod)


class Reporter:
    """Publishes the newest record to one sink from a background thread, at most once per
    ``interval`` seconds; never raises.

    :meth:`report` only hands a record over, so a slow or silent API server never slows a
    training step; records handed over while another is being written are coalesced (only
    the newest is sent). :meth:`flush` (run at exit) sends what is pending at once and
    waits for it, but only for a bounded time.
    """

    def __init__(self, sink: Any, interval: float) -> None:
        self.sink = sink
        # NaN or negative: no rate limit; infinite: as good as "only at exit".
        self.interval = min(interval, _MAX_INTERVAL) if interval >= 0 else 0.0
        self.pending: dict[str, Any] | None = None
        # The reports since the last write, ``[step, metrics]`` each, when the sink keeps a
        # history: written with the newest, so none is lost to the rate limit (bounded).
        self.keeps_points = bool(getattr(sink, "keeps_points", False))
        self.points_limit = int(getattr(sink, "points_per_write", _POINTS_PER_WRITE))
        self.points: list[list[Any]] = []
        # The points of the last write, sent again with the next where there is room.
        self.resends = bool(getattr(sink, "resends_points", False))
        self.sent: list[list[Any]] = []
        # Where this process writes summaries (strategyjob.summary): their common directory
        # rides on every record from then on, for `strategyjob tensorboard` and the launcher.
        self.logdirs: set[str] = set()
        self.last_write: float | None = None
        self.warned = False  # publishing failed
        self.warned_input = False  # a report had bad arguments
        self._writing = False
        self._hurry = False  # after flush(): no more waiting for the interval
        self._stopped = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def report(self, record: dict[str, Any]) -> None:
        """Hand ``record`` to the publishing thread (replacing an unsent one); no I/O."""
        with self._cond:
            self.pending = record
            if self.keeps_points:
                self.points.append([record["step"], record.get("metrics", {})])
                if len(self.points) > self.points_limit:
                    self.points = _history.thin(self.points, self.points_limit)
            if self._thread is None and not self._stopped:
                thread = threading.Thread(
                    target=self._publish, name="strategyjob-progress", daemon=True
                )
                thread.start()  # raises at interpreter shutdown: nothing to wait for then
                self._thread = thread
            self._cond.notify_all()

    def add_logdir(self, path: str) -> None:
        """Record a directory summaries are written to (no I/O: the next write carries it)."""
        with self._cond:
            self.logdirs.add(os.path.abspath(path))

    def flush(self, timeout: float = _EXIT_FLUSH_SECONDS) -> bool:
        """Send the pending record now and wait until nothing is pending or being written,
        at most ``timeout`` seconds. Returns whether everything was written (or failed)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            while self._thread is not None and (self.pending is not None or self._writing):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            self._hurry = False  # all sent: the interval applies again
            return self.pending is None

    def close(self, timeout: float = _EXIT_FLUSH_SECONDS) -> None:
        """:meth:`flush`, then end the publishing thread (``timeout`` bounds both)."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> dict[str, Any] | None:
        """The record to write next, once the interval allows; None when stopped."""
        with self._cond:
            while True:
                if self.pending is not None:
                    wait = 0.0
                    if self.last_write is not None and not self._hurry:
                        wait = self.last_write + self.interval - time.monotonic()
                    if wait <= 0:
                        record, self.pending = self.pending, None
                        if self.points:
                            record = {**record, "points": self._with_resent(self.points)}
                            self.points = []
                        if self.logdirs:
                            record = {**record, "logdir": _common_logdir(self.logdirs)}
                        self._writing = True
                        return record
                    self._cond.wait(wait)
                elif self._stopped:
                    return None
                else:
                    self._cond.wait()

    def _with_resent(self, points: list[list[Any]]) -> list[list[Any]]:
        """``points`` after as many of the last write's newest as fit ``points_limit``,
        when the sink asks for them (called with the lock held)."""
        if not self.resends:
            return points
        room = self.points_limit - len(points)
        carried = (self.sent[-room:] if room > 0 else []) + points
        self.sent = carried
        return carried

    def _publish(self) -> None:
        while (record := self._next()) is not None:
            try:
                self.sink.write(record)
            except Exception as e:  # progress must never stop training
                if not self.warned:
                    self.warned = True
                    logger.warning(
                        "strategyjob.report could not publish progress (%s); training goes "
                        "on, later failures are not logged.",
                        e,
                    )
            finally:
                with self._cond:
                    self._writing = False
                    self.last_write = time.monotonic()
                    self._cond.notify_all()


_STATE: dict[str, Reporter | None] = {}
_STATE_LOCK = threading.Lock()


def _interval(default: float) -> float:
    try:
        interval = float(os.environ.get(ENV_INTERVAL, default))
    except ValueError:
        return default
    return interval if interval >= 0 else default


def _reporter() -> Reporter | None:
    """This process's reporter, built on the first call (None: not the leader, or nowhere
    to report); tests may reset it with :func:`_reset`."""
    with _STATE_LOCK:
        if "reporter" not in _STATE:
            reporter = None
            if is_leader():
                sink = _sink_from_env()
                if sink is not None:
                    default = 0.5 if isinstance(sink, _FileSink) else 10.0
                    reporter = Reporter(sink, _interval(default))
                    atexit.register(reporter.flush)
            _STATE["reporter"] = reporter
        return _STATE["reporter"]


def _reset(timeout: float = 1.0) -> None:
    """Forget this process's reporter (tests): its thread ends within ``timeout``."""
    with _STATE_LOCK:
        reporter = _STATE.pop("reporter", None)
    if reporter is not None:
        atexit.unregister(reporter.flush)
        reporter.close(timeout)


def _forget_after_fork() -> None:
    """In a forked child the publishing thread does not exist (and a lock may be held by
    a thread that is gone): start afresh, as a new process would."""
    global _STATE_LOCK
    _STATE_LOCK = threading.Lock()
    reporter = _STATE.pop("reporter", None)
    if reporter is not None:
        atexit.unregister(reporter.flush)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def report(step: int, total_steps: int | None = None, **metrics: Any) -> None:
    """Report training progress: the current ``step``, optionally ``total_steps`` and
    metrics (numbers or strings, e.g. ``loss=0.31``).

    Call it from the training loop on every replica; only the job's leader publishes, from
    a background thread, at most once per interval (the last report is sent at exit), so
    it is cheap to call every step and never waits for the network. It never raises into
    the training loop: a report with a bad ``step`` is dropped and a bad ``total_steps``
    left out, with one warning per process.
    """
    try:
        reporter = _reporter()
        if reporter is None:
            return
        problems: list[str] = []
        try:
            record: dict[str, Any] | None = make_record(step, total_steps, metrics, problems)
        except ValueError as e:
            record, problems = None, [f"{e}; the report is dropped"]
        if problems and not reporter.warned_input:
            reporter.warned_input = True
            logger.warning(
                "strategyjob.report: %s. Later bad reports are not logged.", "; ".join(problems)
            )
        if record is not None:
            reporter.report(record)
    except Exception:  # never into the training loop, whatever happens
        logger.debug("strategyjob.report failed", exc_info=True)


def _common_logdir(dirs: set[str]) -> str:
    """The directory above every summary directory (TensorBoard's ``--logdir``: ``logs/train``
    and ``logs/validation`` give ``logs``); the first of them when only ``/`` is above all."""
    ordered = sorted(dirs)
    common = os.path.commonpath(ordered)
    return common if common != os.path.dirname(common) else ordered[0]


def announce_logdir(path: str) -> None:
    """Say that this process writes summaries under ``path``: its reports carry the
    directory from then on (``status.progress.logdir`` in a cluster, the closing lines of
    ``strategyjob run``), so that ``strategyjob tensorboard NAME`` finds them. Only the
    leader reports; a job that never calls :func:`report` announces nothing (give
    ``strategyjob tensorboard --logdir`` then)."""
    try:
        reporter = _reporter()
        if reporter is not None:
            reporter.add_logdir(path)
    except Exception:  # never into the training loop
        logger.debug("strategyjob: announcing the logdir failed", exc_info=True)
