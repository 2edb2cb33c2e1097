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
0.5 locally); the last report is always written at exit. Failures never reach the training
loop: the first one is logged as a warning, later ones are silent.

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
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger("strategyjob")

ANNOTATION = "strategyjob.dev/progress"
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ENV_INTERVAL = "STRATEGYJOB_PROGRESS_INTERVAL"
ENV_KUBE_API = "STRATEGYJOB_KUBE_API"
ENV_SERVICEACCOUNT_DIR = "STRATEGYJOB_SERVICEACCOUNT_DIR"
# Same names as strategyjob.jobspec (not imported: report() must stay cheap to import).
_ENV_REPLICA_TYPE = "STRATEGYJOB_REPLICA_TYPE"
_ENV_REPLICA_INDEX = "STRATEGYJOB_REPLICA_INDEX"
_ENV_POD_NAME = "STRATEGYJOB_POD_NAME"
_ENV_NAMESPACE = "STRATEGYJOB_NAMESPACE"
_ENV_PROGRESS_FILE = "STRATEGYJOB_PROGRESS_FILE"
_HTTP_TIMEOUT = 5.0


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_leader(env: Any = os.environ) -> bool:
    """Whether this process is the job's leader: the chief, else worker 0 when the job
    has no chief (read from ``TF_CONFIG``'s cluster)."""
    replica_type = env.get(_ENV_REPLICA_TYPE)
    if replica_type == "chief":
        return env.get(_ENV_REPLICA_INDEX, "0") == "0"
    if replica_type != "worker" or env.get(_ENV_REPLICA_INDEX, "0") != "0":
        return False
    try:
        cluster = json.loads(env.get("TF_CONFIG") or "{}").get("cluster") or {}
    except (ValueError, AttributeError):
        cluster = {}
    return not cluster.get("chief")


def _metric(value: Any) -> float | int | str:
    """A JSON-safe metric: numbers stay numbers (tensors and numpy scalars via ``item()``),
    anything else (and NaN / infinity) becomes its string."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return str(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def make_record(step: int, total_steps: int | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """What one report publishes: ``step``, ``totalSteps``, ``metrics`` and ``time``."""
    record: dict[str, Any] = {"step": int(step)}
    if total_steps is not None:
        record["totalSteps"] = int(total_steps)
    if metrics:
        record["metrics"] = {str(k): _metric(v) for k, v in metrics.items()}
    record["time"] = now_rfc3339()
    return record


class _FileSink:
    """``strategyjob run``: one JSON line per write, read by the launcher's status line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


class _PodAnnotationSink:
    """In a cluster: merge-patch the annotation of this pod with its own token."""

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
    path = env.get(_ENV_PROGRESS_FILE)
    if path:
        return _FileSink(path)
    pod = env.get(_ENV_POD_NAME)
    api = env.get(ENV_KUBE_API)
    if not api and env.get("KUBERNETES_SERVICE_HOST"):
        host = env["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        api = f"https://{host}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
    sa_dir = env.get(ENV_SERVICEACCOUNT_DIR) or SERVICEACCOUNT_DIR
    if not (pod and api and os.path.exists(os.path.join(sa_dir, "token"))):
        return None
    namespace = env.get(_ENV_NAMESPACE)
    if not namespace:
        try:
            with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as f:
                namespace = f.read().strip()
        except OSError:
            return None
    return _PodAnnotationSink(api, sa_dir, namespace, pod)


class Reporter:
    """Rate-limited publishing of the latest record to one sink; never raises."""

    def __init__(self, sink: Any, interval: float, clock: Any = time.monotonic) -> None:
        self.sink = sink
        self.interval = interval
        self.clock = clock
        self.pending: dict[str, Any] | None = None
        self.last_write: float | None = None
        self.warned = False
        self._lock = threading.Lock()

    def report(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.pending = record
            now = self.clock()
            if self.last_write is None or now - self.last_write >= self.interval:
                self._flush_locked(now)

    def flush(self) -> None:
        with self._lock:
            if self.pending is not None:
                self._flush_locked(self.clock())

    def _flush_locked(self, now: float) -> None:
        record, self.pending = self.pending, None
        self.last_write = now
        try:
            self.sink.write(record)
        except Exception as e:  # progress must never stop training
            if not self.warned:
                self.warned = True
                logger.warning(
                    "strategyjob.report could not publish progress (%s); training goes on, "
                    "later failures are not logged.",
                    e,
                )


_STATE: dict[str, Any] = {}
_STATE_LOCK = threading.Lock()


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
                    try:
                        interval = float(os.environ.get(ENV_INTERVAL, default))
                    except ValueError:
                        interval = default
                    reporter = Reporter(sink, interval)
                    atexit.register(reporter.flush)
            _STATE["reporter"] = reporter
        return _STATE["reporter"]


def _reset() -> None:
    with _STATE_LOCK:
        reporter = _STATE.pop("reporter", None)
    if reporter is not None:
        atexit.unregister(reporter.flush)


def report(step: int, total_steps: int | None = None, **metrics: Any) -> None:
    """Report training progress: the current ``step``, optionally ``total_steps`` and
    metrics (numbers or strings, e.g. ``loss=0.31``).

    Call it from the training loop on every replica; only the job's leader publishes,
    at most once per interval (the last report is written at exit), so it is cheap to call
    every step. It never raises into the training loop.
    """
    reporter = _reporter()
    if reporter is None:
        return
    try:
        record = make_record(step, total_steps, metrics)
    except (TypeError, ValueError) as e:
        if not reporter.warned:
            reporter.warned = True
            logger.warning("strategyjob.report ignored a report it cannot encode: %s", e)
        return
    reporter.report(record)
