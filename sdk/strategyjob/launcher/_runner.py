"""``strategyjob run``: run a StrategyJob as local processes until it succeeds or fails."""

from __future__ import annotations

import math
import secrets
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from strategyjob._history import MetricHistory
from strategyjob._names import ENV_CLUSTER_FILE
from strategyjob.jobspec import (
    ENV_PROGRESS_FILE,
    ENV_TOKEN,
    OPTIONAL_REPLICA_TYPES,
    REFORMED_STRATEGIES,
    RESIZABLE_STRATEGIES,
    TRAINING_REPLICA_TYPES,
    ManifestError,
    StrategyJob,
    TFJob,
    cluster_spec,
    is_tfjob,
    load_manifest,
    local_tfjob,
    read_manifest_file,
    serves_until_stopped,
    tfjob_replica_env,
    with_generated_name,
)
from strategyjob.launcher import _resize
from strategyjob.launcher._control import ResizeInbox, ResizeRequest
from strategyjob.launcher._decision import (
    Decision,
    Failure,
    Phase,
    ReplicaKey,
    decide,
    replica_name,
)
from strategyjob.launcher._output import Console, ProgressFile, format_elapsed, format_report
from strategyjob.launcher._plan import (
    LOCAL_HOST,
    ReplicaEnv,
    ReplicaLaunch,
    build_launches,
    check_runnable,
    free_ports,
    ignored_template_fields,
    local_cluster,
    reserve_open_files,
)
from strategyjob.launcher._supervisor import LocalProcessSupervisor, ProcessSupervisor

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
_STATUS_REFRESH_SECONDS = 0.5
_PREFIX = "strategyjob:"
#: What stops the job: Ctrl-C, kill, and a hang-up. The replicas run in sessions of their
#: own (so Ctrl-C reaches only the launcher), so nothing but the launcher stops them.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


#: Seconds between SIGTERM and SIGKILL when neither ``--grace-period`` nor a pod template's
#: ``terminationGracePeriodSeconds`` says.
DEFAULT_GRACE_PERIOD = 10.0


@dataclass(frozen=True)
class RunOptions:
    """How the launcher stops things. ``grace_period``: seconds between SIGTERM and
    SIGKILL (None: the largest ``terminationGracePeriodSeconds`` of the job's pod
    templates, as the kubelet gives each pod its own, else 10). ``finish_timeout``: after
    success, how long the other chief/worker replicas may take to finish on their own
    before they are stopped. ``metrics_file``: where to write the history of the metrics
    the job reported (``strategyjob.report``) when it ends (None: not kept). ``curves``:
    draw those metrics' curves above the live status line, and once more when the job ends
    (``strategyjob run --curves``)."""

    grace_period: float | None = None
    finish_timeout: float = 30.0
    live_status: bool | None = None  # None: when stdout is a TTY
    metrics_file: str | Path | None = None
    curves: bool = False

    def __post_init__(self) -> None:
        # A negative or NaN duration would be taken as 0 further down (SIGKILL at once), and
        # an infinite one would wait for ever: refused here, as ``--grace-period`` is.
        for name in ("grace_period", "finish_timeout"):
            value = getattr(self, name)
            if value is None and name == "grace_period":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0 <= value < math.inf)
            ):
                raise ValueError(
                    f"RunOptions({name}={value!r}): must be a number of seconds, 0 or more; e.g. 10"
                )


class _ResizeFailed(Exception):
    """A local resize that could not be done (the job runs on as it was)."""


#: How long a resize waits for a new worker's server to listen.
_LISTEN_SECONDS = 60.0


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def run_file(path: str | Path, options: RunOptions | None = None, out: TextIO | None = None) -> int:
    """Validate the manifest at ``path``, a StrategyJob or a Kubeflow TFJob (raising
    ``ManifestError``/``LaunchError`` before anything starts), then run it. Returns the
    process exit code. A TFJob's ``tensorflow`` containers run, with ``TF_CONFIG`` as
    training-operator writes it but on 127.0.0.1."""
    # A name the API server would generate (``kubectl create`` of a ``generateName`` manifest)
    document = with_generated_name(read_manifest_file(path))
    try:
        tfjob = local_tfjob(document) if is_tfjob(document) else None
        job = tfjob.job if tfjob is not None else load_manifest(document)
    except ManifestError as e:
        raise ManifestError([f"{path}: {p}" for p in e.problems], str(path)) from None
    check_runnable(job)
    if tfjob is None:
        return run_job(job, Path(path).resolve().parent, options, out)
    return run_job(
        job,
        Path(path).resolve().parent,
        options,
        out,
        env_of=tfjob_env(tfjob),
        optional_types=tfjob.optional_types,
    )


def tfjob_env(tfjob: TFJob) -> ReplicaEnv:
    """The injected environment of a TFJob's local replica: ``tfjob_replica_env`` with the
    launcher's addresses."""

    def env_of(t: str, i: int, cluster: Mapping[str, list[str]], attempt: int) -> dict[str, str]:
        return tfjob_replica_env(tfjob, t, i, attempt, cluster)

    return env_of


def run_job(
    job: StrategyJob,
    workdir: str | Path,
    options: RunOptions | None = None,
    out: TextIO | None = None,
    *,
    env_of: ReplicaEnv | None = None,
    optional_types: tuple[str, ...] = OPTIONAL_REPLICA_TYPES,
) -> int:
    """Run ``job`` with one local process per replica in ``workdir``; returns 0 if it
    succeeded, 1 if it failed, ``128 + signal`` if interrupted by SIGINT, SIGTERM or
    SIGHUP. ``env_of``: each replica's injected environment (default ``replica_env``);
    ``optional_types``: the replica types whose failure never fails the job
    (:attr:`TFJob.optional_types` for a TFJob)."""
    options = options or RunOptions()
    out = out or sys.stdout
    live = options.live_status if options.live_status is not None else out.isatty()
    reserve_open_files(len(job.replicas()))
    console = Console(out, live_status=live)
    return _JobRun(
        job, Path(workdir), options, console, env_of=env_of, optional_types=optional_types
    ).run()


def grace_period_of(job: StrategyJob, override: float | None = None) -> float:
    """Seconds a stopped replica gets to finish (e.g. to save a preemption checkpoint)
    before SIGKILL: ``override``, else the largest ``spec.terminationGracePeriodSeconds``
    of the job's pod templates, else :data:`DEFAULT_GRACE_PERIOD`."""
    if override is not None:
        return float(override)
    periods = []
    for spec in job.replica_specs.values():
        value = (spec.template.get("spec") or {}).get("terminationGracePeriodSeconds")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            periods.append(float(value))
    return max(periods) if periods else DEFAULT_GRACE_PERIOD


class _JobRun:
    """One run of a job: the loop that starts the replicas, asks :func:`decide` what next
    and restarts or stops. ``supervisor`` and ``clock`` are its only contact with the
    operating system (real processes and ``time.monotonic`` unless given), so the loop's
    rules are unit-tested with a scripted supervisor and a fake clock."""

    def __init__(
        self,
        job: StrategyJob,
        workdir: Path,
        options: RunOptions,
        console: Console,
        supervisor: ProcessSupervisor | None = None,
        clock: Callable[[], float] = time.monotonic,
        env_of: ReplicaEnv | None = None,
        optional_types: tuple[str, ...] = OPTIONAL_REPLICA_TYPES,
    ) -> None:
        self.job = job
        self.env_of = env_of
        self.workdir = workdir
        self.options = options
        self.grace = grace_period_of(job, options.grace_period)
        self.console = console
        self.supervisor = supervisor if supervisor is not None else LocalProcessSupervisor(console)
        self.clock = clock
        self.started = clock()
        self.restarts = 0
        self.resizes = 0  # re-formings at a new size (strategyjob scale --local)
        #: The replica types whose failure never fails the job (the evaluator; a TFJob's
        #: workers under ``enableDynamicWorker``).
        self.optional_types = optional_types
        self.optional_restarts = 0  # an evaluator's, not counted against backoffLimit
        self.given_up: set[ReplicaKey] = set()  # evaluators not restarted any more
        self.interrupt: int | None = None
        # What the launcher adds for the whole job, as the operator does in a cluster: a
        # fresh token (the ps servers refuse calls without it) and where the leader's
        # strategyjob.report writes (read back for the status line).
        self.progress_dir = tempfile.mkdtemp(prefix=f"strategyjob-{job.name}-")
        self.progress = ProgressFile(str(Path(self.progress_dir) / "progress.jsonl"))
        self.job_env = {
            ENV_TOKEN: secrets.token_urlsafe(32),
            ENV_PROGRESS_FILE: self.progress.path,
        }
        # A ParameterServerStrategy chief follows the workers in this file, which a local
        # resize (strategyjob scale --local) rewrites (a collective run, MultiWorkerMirroredStrategy
        # or TPUStrategy, is re-formed instead: :meth:`_reform`).
        self.cluster_file = Path(self.progress_dir) / "cluster.json"
        if job.strategy in RESIZABLE_STRATEGIES:
            self.job_env[ENV_CLUSTER_FILE] = str(self.cluster_file)
        self.cluster: dict[str, list[str]] = {}
        self.curves_of: object = None  # the report the live curves were drawn for
        self.live_curves: list[str] = []
        self.launches: dict[ReplicaKey, ReplicaLaunch] = {}
        self.inbox: ResizeInbox | None = None

    # -- top level ------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.inbox = ResizeInbox(self.job.name)
            code = self._run()
        finally:
            if self.inbox is not None:
                self.inbox.close()
            self.progress.poll()  # the last reports, flushed as the leader exited
            shutil.rmtree(self.progress_dir, ignore_errors=True)
            self._save_metrics()
        if self.options.curves:  # after a run that ended, not before an error's message
            self._say_curves()
        return code

    def _run(self) -> int:
        with self._signals_stop_the_job():
            try:
                return self._run_attempts()
            except _Interrupted as e:
                self.console.clear_status()
                self.say(f"received {signal.Signals(e.signum).name}, stopping every replica")
                stopped = self.supervisor.stop(grace=self.grace)
                self.say(
                    f"job {self.job.name} interrupted after {self.elapsed()}; "
                    f"stopped {_names(stopped) or 'nothing'}"
                )
                return 128 + e.signum
            finally:
                self.supervisor.stop(grace=self.grace)

    def _run_attempts(self) -> int:
        if self.job.run_policy.suspend:
            self.say("spec.runPolicy.suspend is true; strategyjob run ignores it and runs the job")
        fields, types = ignored_template_fields(self.job)
        if fields:
            self.say(
                f"warning: strategyjob run ignores what only a cluster applies in the pod "
                f"templates of {', '.join(types)}: {', '.join(fields)}; every replica runs in "
                f"{self.workdir}, with this machine's files, user and resources"
            )
        self.launches = self._start_all()
        while True:
            decision = self._wait_for_decision()
            if decision.phase is Phase.RUNNING:
                continue
            if decision.phase is Phase.SUCCEEDED:
                return self._finish_succeeded(decision)
            if decision.phase is Phase.FAILED:
                return self._finish_failed(decision)
            if decision.phase is Phase.GIVE_UP:
                self.given_up.update(decision.restart)
                self.say(
                    f"{decision.reason}. The job goes on without it "
                    f"({_never_fails(decision.restart)})."
                )
                continue
            if decision.phase is Phase.RESTART_OPTIONAL:
                self.optional_restarts += 1
                self.say(
                    f"{decision.reason}; restarting {_names(decision.restart)} alone "
                    f"({_never_fails(decision.restart)}: restart {self.optional_restarts} of "
                    f"{self.job.run_policy.backoff_limit}, not counted against the job's "
                    "backoffLimit)"
                )
                for key in decision.restart:
                    self.supervisor.start(self.launches[key])
                continue
            self.restarts += 1
            limit = self.job.run_policy.backoff_limit
            if decision.phase is Phase.RESTART_REPLICAS:
                self.say(
                    f"{decision.reason}; restarting {_names(decision.restart)} "
                    f"(restart {self.restarts} of {limit})"
                )
                for key in decision.restart:
                    self.supervisor.start(self.launches[key])
            else:
                self.say(
                    f"{decision.reason}; restarting the whole job "
                    f"(restart {self.restarts} of {limit})"
                )
                self.supervisor.stop(grace=self.grace)
                self.supervisor.forget()
                self.given_up.clear()  # the new run starts every replica
                self.launches = self._start_all()

    def _start_all(self) -> dict[ReplicaKey, ReplicaLaunch]:
        cluster = local_cluster(self.job)
        launches = build_launches(
            self.job,
            self.workdir,
            cluster,
            job_env=self.job_env,
            restart_attempt=self.restarts + self.resizes,
            env_of=self.env_of,
        )
        self.cluster = cluster
        if ENV_CLUSTER_FILE in self.job_env:
            self.cluster_file.write_text(cluster_spec(cluster), encoding="utf-8")
        addresses = ", ".join(
            f"{launch.name} ({cluster[launch.replica_type][launch.index]})" for launch in launches
        )
        self.say(f"job {self.job.name} [{self.job.strategy}] starting {addresses}")
        for launch in launches:
            self.supervisor.start(launch)
        return {launch.key: launch for launch in launches}

    def _wait_for_decision(self) -> Decision:
        while True:
            self._check_interrupt()
            decision = decide(
                self.job,
                self.supervisor.exits(),
                self.restarts,
                self._seconds(),
                optional_restarts=self.optional_restarts,
                given_up=self.given_up,
                optional_types=self.optional_types,
            )
            self._show_status()
            if decision.phase is not Phase.RUNNING:
                return decision
            self._serve_resize()
            self.supervisor.wait(_STATUS_REFRESH_SECONDS)

    # -- a local resize (strategyjob scale NAME --replicas N --local) ---------------------------
    def _serve_resize(self) -> None:
        request = self.inbox.take() if self.inbox is not None else None
        if request is None:
            return
        why = _resize.refusal(self.job, request.replicas, tfjob=self.env_of is not None)
        if why is not None:
            self._answer(request, False, f"resize to {request.replicas!r} workers refused: {why}")
            return
        assert isinstance(request.replicas, int)
        try:
            self._answer(request, True, self._resize(request.replicas))
        except _ResizeFailed as e:
            self._answer(request, False, str(e))

    def _answer(self, request: ResizeRequest, ok: bool, message: str) -> None:
        self.console.clear_status()
        self.say(message)
        if self.inbox is not None:
            self.inbox.answer(request, ok, message)

    def _resize(self, replicas: int) -> str:
        """Start the new workers (the chief is told once they listen) or tell the chief of
        the ones that go (then stop them); nothing else is touched."""
        before = self.job.num_replicas("worker")
        if replicas == before:
            return f"job {self.job.name} already runs {before} workers"
        job = _resize.with_workers(self.job, replicas)
        if job.strategy in REFORMED_STRATEGIES:
            return self._reform(job, before)
        workers = self.cluster["worker"]
        if replicas > before:
            added = [f"{LOCAL_HOST}:{port}" for port in free_ports(replicas - before)]
            cluster = {**self.cluster, "worker": [*workers, *added]}
            launches = build_launches(
                job,
                self.workdir,
                cluster,
                job_env=self.job_env,
                restart_attempt=self.restarts + self.resizes,
                env_of=self.env_of,
            )
            new = [x for x in launches if x.replica_type == "worker" and x.index >= before]
            for launch in new:
                self.supervisor.start(launch)
            self._wait_listening(new, cluster)
            self.launches.update({launch.key: launch for launch in new})
            what = "started " + ", ".join(f"{x.name} ({cluster['worker'][x.index]})" for x in new)
        else:
            cluster = {**self.cluster, "worker": workers[:replicas]}
        self.cluster_file.write_text(cluster_spec(cluster), encoding="utf-8")
        if replicas < before:  # the chief was told first: it sends them nothing more
            gone = [("worker", i) for i in range(replicas, before)]
            self.supervisor.stop(gone, grace=self.grace)
            self.supervisor.forget(gone)
            for key in gone:
                self.launches.pop(key, None)
            what = "stopped " + _names(gone)
        self.job, self.cluster = job, cluster
        return f"job {self.job.name}: workers {before} -> {replicas}; {what}"

    def _reform(self, job: StrategyJob, before: int) -> str:
        """A collective group cannot gain or lose a member: every replica stops (SIGTERM,
        the grace period: the preemption handler saves a checkpoint at the next step
        boundary) and the group starts at the new size, resuming from it. Not a restart
        (``backoffLimit``); the new processes are the next attempt."""
        self.say(
            f"job {job.name} re-forms with {job.num_replicas('worker')} workers (it ran "
            f"{before}): stopping every replica, each saving its checkpoint"
        )
        self.supervisor.stop(grace=self.grace)
        self.supervisor.forget()
        self.given_up.clear()
        self.resizes += 1
        self.job = job
        self.launches = self._start_all()
        return f"job {job.name}: workers {before} -> {job.num_replicas('worker')}; re-formed"

    def _wait_listening(self, launches: list[ReplicaLaunch], cluster: Mapping[str, Any]) -> None:
        """Until every new worker's server accepts connections (the chief gives a worker it
        cannot reach up); a worker that exits first, or stays silent 60 s, fails the resize
        and is stopped."""
        deadline = time.monotonic() + _LISTEN_SECONDS
        waiting = {x.key: cluster["worker"][x.index] for x in launches}
        while waiting:
            for key, address in list(waiting.items()):
                host, port = address.rsplit(":", 1)
                try:
                    socket.create_connection((host, int(port)), timeout=0.5).close()
                    del waiting[key]
                except OSError:
                    pass
            gone = [k for k in waiting if k in self.supervisor.exits()]
            late = waiting and time.monotonic() > deadline
            if gone or late:
                self.supervisor.stop([x.key for x in launches], grace=self.grace)
                self.supervisor.forget([x.key for x in launches])
                why = "exited" if gone else f"did not listen within {_LISTEN_SECONDS:.0f} s"
                raise _ResizeFailed(
                    f"resize of job {self.job.name} failed: {_names(gone or waiting)} {why}; "
                    "the job runs on with its workers"
                )
            if waiting:
                time.sleep(0.1)

    # -- endings --------------------------------------------------------------------------------
    def _finish_succeeded(self, decision: Decision) -> int:
        # Other workers usually finish within moments of the leader; give them time
        # to write their last output, then stop what is left (the evaluator, and what
        # serves until stopped: ps, and the workers of ParameterServerStrategy).
        training = [
            k
            for k in self.supervisor.running()
            if k[0] in TRAINING_REPLICA_TYPES and not serves_until_stopped(self.job, k[0])
        ]
        deadline = self.clock() + self.options.finish_timeout
        while training and self.clock() < deadline:
            self._check_interrupt()
            self.supervisor.wait(min(_STATUS_REFRESH_SECONDS, deadline - self.clock()))
            running = set(self.supervisor.running())
            training = [k for k in training if k in running]
        stopped = self.supervisor.stop(grace=self.grace)
        self.console.clear_status()
        exits = self.supervisor.exits()
        late_failures = [
            Failure(k, e).describe()
            for k, e in sorted(exits.items(), key=lambda item: item[1].sequence)
            if not e.succeeded and k not in stopped and k not in self.given_up
        ]
        succeeded = sum(1 for e in exits.values() if e.succeeded)
        summary = f"job {self.job.name} succeeded in {self.elapsed()} ({decision.reason}"
        summary += f"; {succeeded} of {len(exits)} replicas exited 0"
        if stopped:
            summary += f"; stopped {_names(stopped)}"
        if self.restarts:
            summary += f"; {self.restarts} restarts"
        self.say(summary + ")")
        self._say_progress()
        for failure in late_failures:
            self.say(f"  after success: {failure}")
        return 0

    def _finish_failed(self, decision: Decision) -> int:
        stopped = self.supervisor.stop(grace=self.grace)
        self.console.clear_status()
        self.say(f"job {self.job.name} failed after {self.elapsed()}: {decision.reason}")
        self._say_progress()
        for failure in decision.failures[1:]:
            self.say(f"  then: {failure.describe()}")
        if stopped:
            self.say(f"  stopped: {_names(stopped)}")
        return 1

    # -- helpers --------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.console.line(f"{_PREFIX} {text}")

    def _seconds(self) -> float:
        return self.clock() - self.started

    def elapsed(self) -> str:
        return format_elapsed(self._seconds())

    def _show_status(self) -> None:
        exits = self.supervisor.exits()
        running = len(self.supervisor.running())
        succeeded = sum(1 for e in exits.values() if e.succeeded)
        failed = len(exits) - succeeded
        restarts = f", restarts {self.restarts}" if self.restarts else ""
        report = format_report(self.progress.poll())
        self.console.status(
            f"{_PREFIX} {self.job.name} [{self.job.strategy}] running {running}, "
            f"succeeded {succeeded}, failed {failed}{restarts}, elapsed {self.elapsed()}"
            + (f", {report}" if report else ""),
            above=self._live_curves(),
        )

    def _live_curves(self) -> list[str]:
        """``--curves`` on a terminal: the curves above the status line (a blank line above
        them), drawn again only when a new report came, and as many as leave the screen
        ~8 rows for the replicas' lines."""
        if not (self.options.curves and self.console.live):
            return []
        if self.progress.last is not self.curves_of:
            self.curves_of = self.progress.last
            size = shutil.get_terminal_size()
            drawn = _drawn_curves(self.progress.history, size.columns, lines=size.lines - 10)
            self.live_curves = ["", *drawn.splitlines()] if drawn else []
        return self.live_curves

    def _say_curves(self) -> None:
        """``--curves``: the metrics' curves as plain lines once the job has ended, so that a
        log keeps them (piped, the only drawing) and the terminal too (the live block is gone).
        After the summary rather than before it: the summary stays right under the replicas'
        last lines, where a failure's cause is, and the curves end the output, as a log's
        reader finds them. No metric: one line saying so, not an empty frame."""
        self.console.clear_status()
        drawn = _drawn_curves(self.progress.history, shutil.get_terminal_size().columns)
        if not drawn:
            self.say("--curves: no metric was reported (strategyjob.report), no curve to draw")
            return
        self.console.line(drawn)

    def _say_progress(self) -> None:
        last = self.progress.poll()
        report = format_report(last)
        if report:
            self.say(f"  last progress report: {report}")
        logdir = (last or {}).get("logdir")
        if isinstance(logdir, str):  # strategyjob.summary's directory, announced in reports
            serve = f"strategyjob tensorboard --logdir {shlex.quote(logdir)}"
            self.say(f"  summaries in {logdir}; see them with {serve}")

    def _save_metrics(self) -> None:
        """Write the job's metric history where ``--metrics`` asked, and say so."""
        path = self.options.metrics_file
        if path is None:
            return
        history = self.progress.history
        try:
            Path(path).write_text(history.to_json() + "\n", encoding="utf-8")
        except OSError as e:
            self.say(f"could not write the metric history to {path}: {e.strerror or e}")
            return
        names = ", ".join(history.series()) or "no metric"
        self.say(
            f"metric history ({len(history)} points: {names}) in {path}; print it with "
            f"strategyjob metrics --file {path}"
        )

    def _check_interrupt(self) -> None:
        if self.interrupt is not None:
            raise _Interrupted(self.interrupt)

    @contextmanager
    def _signals_stop_the_job(self) -> Iterator[None]:
        """SIGINT, SIGTERM and SIGHUP (the terminal or SSH session went away) end the run
        through the normal stop path: no orphaned replica, no temporary directory left."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: object) -> None:
            if self.interrupt is None:
                self.interrupt = signum
            else:
                # A second Ctrl-C does not wait for the grace period.
                self.supervisor.kill_all()
            self.supervisor.wake()

        previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        for signum in _STOP_SIGNALS:
            if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                continue  # started under nohup: the user asked to outlive the terminal
            previous[signum] = signal.signal(signum, handler)
        try:
            yield
        finally:
            for number, old in previous.items():
                signal.signal(number, old)


def _drawn_curves(history: MetricHistory, columns: int, lines: int | None = None) -> str:
    """The history's curves as the terminal views draw them; "" when it has no point.
    Imported here: the cluster client that ``strategyjob.client`` loads (~50 ms) is not needed
    by a run without ``--curves``."""
    from strategyjob.client._curves import terminal_curves

    series = history.series()
    return terminal_curves(series, columns, lines) if series else ""


def _names(keys: Iterable[ReplicaKey]) -> str:
    return ", ".join(replica_name(k) for k in sorted(keys))


def _never_fails(keys: Iterable[ReplicaKey]) -> str:
    """Why the failure of replicas ``keys`` (of an optional type) does not fail the job."""
    if all(t == "evaluator" for t, _ in keys):
        return "an evaluator never fails the job"
    return "under enableDynamicWorker a worker never fails the TFJob"
