"""The launcher's loop (``_JobRun``) driven by a scripted supervisor and a fake clock.

No process starts and nothing sleeps: each ``wait`` of the loop advances the fake clock by
its timeout and plays the next step of a script (replicas exiting, a signal arriving), so
the restart, failure, success and interrupt paths run in milliseconds and always the same
way. The real supervisor and real processes are proven end to end in
``test_launcher_run.py``.
"""

from __future__ import annotations

import io
import re
import signal
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from strategyjob.jobspec import ENV_RESTART_ATTEMPT, load_manifest
from strategyjob.launcher import Console, ProcessSupervisor, ReplicaExit, ReplicaLaunch, RunOptions
from strategyjob.launcher._runner import _JobRun

from tests.support import manifests

pytestmark = pytest.mark.timeout(30)

#: The most waits a script may take: a loop that never ends fails instead of hanging.
MAX_WAITS = 10_000
SIGNAL = "signal"  # a script step's key for a signal sent to the launcher


class FakeSupervisor(ProcessSupervisor):
    """Plays ``script``: one step per :meth:`wait`, each ``{"worker-1": 3}`` (those replicas
    exit with those return codes, in that order) or ``{SIGNAL: signum}`` (the launcher
    receives ``signum``); ``{}`` lets the time pass. Stopped replicas exit with -SIGTERM,
    or -SIGKILL after :meth:`kill_all`. Every call is logged in ``log``."""

    def __init__(
        self, script: Iterable[Mapping[str, int]], signals_during_stop: Iterable[int] = ()
    ) -> None:
        self.script = deque(script)
        self.signals_during_stop = list(signals_during_stop)
        self.now = 100.0
        self.waits = 0
        self.log: list[str] = []
        self.launches: dict[tuple[str, int], ReplicaLaunch] = {}
        self._running: dict[tuple[str, int], ReplicaLaunch] = {}
        self._exits: dict[tuple[str, int], ReplicaExit] = {}
        self._sequence = 0

    def clock(self) -> float:
        return self.now

    def _exit(self, key: tuple[str, int], returncode: int) -> None:
        del self._running[key]
        self._sequence += 1
        self._exits[key] = ReplicaExit(returncode, self._sequence)

    def start(self, launch: ReplicaLaunch) -> None:
        assert launch.key not in self._running, f"{launch.name} started twice"
        self._exits.pop(launch.key, None)
        self._running[launch.key] = launch
        self.launches[launch.key] = launch
        self.log.append(f"start {launch.name} attempt {launch.env[ENV_RESTART_ATTEMPT]}")

    def exits(self) -> dict[tuple[str, int], ReplicaExit]:
        return dict(self._exits)

    def running(self) -> list[tuple[str, int]]:
        return list(self._running)

    def wait(self, timeout: float) -> None:
        self.waits += 1
        assert self.waits < MAX_WAITS, f"the loop is still waiting after {MAX_WAITS} waits"
        assert timeout > 0, f"wait({timeout})"
        self.now += timeout
        step = self.script.popleft() if self.script else {}
        for name, value in step.items():
            if name == SIGNAL:
                _raise(value)
                continue
            replica_type, _, index = name.rpartition("-")
            key = (replica_type, int(index))
            assert key in self._running, f"the script ends {name}, which is not running"
            self._exit(key, value)

    def wake(self) -> None:
        self.log.append("wake")

    def stop(
        self, keys: Iterable[tuple[str, int]] | None = None, grace: float = 10.0
    ) -> set[tuple[str, int]]:
        stopping = sorted(k for k in self._running if keys is None or k in set(keys))
        self.log.append(f"stop {_names(stopping) or 'nothing'} grace {grace:g}")
        while self.signals_during_stop:
            _raise(self.signals_during_stop.pop(0))
        for key in stopping:
            if key in self._running:
                self._exit(key, -signal.SIGTERM)
        return set(stopping)

    def kill_all(self) -> None:
        self.log.append("kill_all")
        for key in sorted(self._running):
            self._exit(key, -signal.SIGKILL)

    def forget(self, keys=None) -> None:
        assert not self._running, "forget() with replicas still running"
        self.log.append("forget")
        self._exits.clear()


def _names(keys: Iterable[tuple[str, int]]) -> str:
    return ",".join(f"{t}-{i}" for t, i in keys)


def _raise(signum: int) -> None:
    """Deliver ``signum`` to this process now: ``raise_signal`` runs the Python handler
    before it returns. Refused where the launcher's handler cannot be installed, so that a
    stray signal never ends the test run."""
    assert threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signum)
    assert handler is signal.SIG_IGN or callable(handler), f"no handler for {signum}"
    signal.raise_signal(signum)


@pytest.fixture(autouse=True)
def _default_hang_up() -> Iterator[None]:
    """SIGHUP as in a terminal (even when the tests run under nohup), restored after."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


def make_job(
    counts: Mapping[str, int],
    strategy: str = "MultiWorkerMirroredStrategy",
    restart_policy: str = "Never",
    **spec_extra: Any,
):
    """Job ``demo`` with ``counts`` replicas per type, every type ``restart_policy``;
    ``spec_extra``: ``runPolicy`` / ``successPolicy`` as in a manifest."""
    obj = manifests.manifest(
        counts,
        name="demo",
        namespace=None,
        strategy=strategy,
        policy=restart_policy,
        containers=[{"name": "strategyjob", "command": ["python", "train.py"]}],
        success_policy=spec_extra.pop("successPolicy", ""),
        run_policy=spec_extra.pop("runPolicy", None),
    )
    assert not spec_extra, f"make_job cannot set {sorted(spec_extra)}"
    return load_manifest(obj)


@dataclass
class Result:
    code: int
    lines: list[str]
    log: list[str]
    seconds: float
    progress_dir: str


def run(job, supervisor: FakeSupervisor, tmp_path: Path, **options: Any) -> Result:
    out = io.StringIO()
    console = Console(out, live_status=False)
    options.setdefault("grace_period", 5)
    job_run = _JobRun(
        job, tmp_path, RunOptions(**options), console, supervisor, clock=supervisor.clock
    )
    code = job_run.run()
    return Result(
        code, out.getvalue().splitlines(), supervisor.log, job_run._seconds(), job_run.progress_dir
    )


def starts(*names: str, attempt: int = 0) -> list[str]:
    return [f"start {name} attempt {attempt}" for name in names]


@dataclass(frozen=True)
class Case:
    """A job, what its replicas do (the script), and what the loop must do about it."""

    counts: Mapping[str, int]
    script: list[Mapping[str, int]]
    code: int
    summary: str  # the one line that says how the job ended
    log: list[str]
    strategy: str = "MultiWorkerMirroredStrategy"
    restart_policy: str = "Never"
    spec: Mapping[str, Any] = field(default_factory=dict)
    lines: tuple[str, ...] = ()  # also printed, anywhere


W2 = {"worker": 2}
PS = {"chief": 1, "worker": 2, "ps": 1}
PS_NAMES = ("chief-0", "worker-0", "worker-1", "ps-0")

CASES = {
    # -- restart policies ------------------------------------------------------------------------
    "never-fails-at-the-first-failure": Case(
        W2,
        [{}, {"worker-1": 3}],
        1,
        "strategyjob: job demo failed after 1.0s: worker-1 exited with code 3",
        [*starts("worker-0", "worker-1"), "stop worker-0 grace 5", "stop nothing grace 5"],
        lines=("strategyjob:   stopped: worker-0",),
    ),
    "never-does-not-retry-a-preemption": Case(
        W2,
        [{"worker-1": 143}],
        1,
        "strategyjob: job demo failed after 0.5s: worker-1 exited with code 143",
        [*starts("worker-0", "worker-1"), "stop worker-0 grace 5", "stop nothing grace 5"],
    ),
    "on-failure-restarts-the-whole-collective-job": Case(
        W2,
        [{"worker-1": 1}, {"worker-0": 0, "worker-1": 0}],
        0,
        "strategyjob: job demo succeeded in 1.0s (worker-0 succeeded; 2 of 2 replicas "
        "exited 0; 1 restarts)",
        [
            *starts("worker-0", "worker-1"),
            "stop worker-0 grace 5",
            "forget",
            *starts("worker-0", "worker-1", attempt=1),
            "stop nothing grace 5",
            "stop nothing grace 5",
        ],
        restart_policy="OnFailure",
        spec={"runPolicy": {"backoffLimit": 1}},
        lines=(
            "strategyjob: worker-1 exited with code 1; restarting the whole job (restart 1 of 1)",
        ),
    ),
    "always-restarts-a-failure": Case(
        {"worker": 1},
        [{"worker-0": 2}, {"worker-0": 0}],
        0,
        "strategyjob: job demo succeeded in 1.0s (worker-0 succeeded; 1 of 1 replicas "
        "exited 0; 1 restarts)",
        [
            *starts("worker-0"),
            "stop nothing grace 5",
            "forget",
            *starts("worker-0", attempt=1),
            "stop nothing grace 5",
            "stop nothing grace 5",
        ],
        restart_policy="Always",
    ),
    "exit-code-does-not-retry-a-permanent-error": Case(
        W2,
        [{"worker-0": 2}],
        1,
        "strategyjob: job demo failed after 0.5s: worker-0 exited with code 2",
        [*starts("worker-0", "worker-1"), "stop worker-1 grace 5", "stop nothing grace 5"],
        restart_policy="ExitCode",
    ),
    "exit-code-retries-a-killed-replica": Case(
        W2,
        [{"worker-1": -9}, {"worker-0": 0}],
        0,
        "strategyjob: job demo succeeded in 31.0s (worker-0 succeeded; 1 of 2 replicas "
        "exited 0; stopped worker-1; 1 restarts)",
        [
            *starts("worker-0", "worker-1"),
            "stop worker-0 grace 5",
            "forget",
            *starts("worker-0", "worker-1", attempt=1),
            "stop worker-1 grace 5",
            "stop nothing grace 5",
        ],
        restart_policy="ExitCode",
        lines=(
            "strategyjob: worker-1 was killed by SIGKILL (exit code 137); restarting the whole "
            "job (restart 1 of 6)",
        ),
    ),
    # A preemption (exit 143 after a checkpoint) is retried, and it counts as a restart.
    "exit-code-retries-a-preemption-and-counts-it": Case(
        W2,
        [{"worker-1": 143}, {"worker-0": 0, "worker-1": 0}],
        0,
        "strategyjob: job demo succeeded in 1.0s (worker-0 succeeded; 2 of 2 replicas "
        "exited 0; 1 restarts)",
        [
            *starts("worker-0", "worker-1"),
            "stop worker-0 grace 5",
            "forget",
            *starts("worker-0", "worker-1", attempt=1),
            "stop nothing grace 5",
            "stop nothing grace 5",
        ],
        restart_policy="ExitCode",
        spec={"runPolicy": {"backoffLimit": 3}},
        lines=(
            "strategyjob: worker-1 exited with code 143; restarting the whole job (restart 1 of 3)",
        ),
    ),
    "a-preemption-beyond-the-backoff-limit-fails": Case(
        W2,
        [{"worker-1": 143}],
        1,
        "strategyjob: job demo failed after 0.5s: worker-1 exited with code 143; backoff "
        "limit of 0 restarts reached",
        [*starts("worker-0", "worker-1"), "stop worker-0 grace 5", "stop nothing grace 5"],
        restart_policy="ExitCode",
        spec={"runPolicy": {"backoffLimit": 0}},
    ),
    # -- backoff limit ---------------------------------------------------------------------------
    "backoff-limit-reached-fails": Case(
        {"worker": 1},
        [{"worker-0": 137}, {"worker-0": 137}, {"worker-0": 137}],
        1,
        "strategyjob: job demo failed after 1.5s: worker-0 exited with code 137; backoff "
        "limit of 2 restarts reached",
        [
            *starts("worker-0"),
            "stop nothing grace 5",
            "forget",
            *starts("worker-0", attempt=1),
            "stop nothing grace 5",
            "forget",
            *starts("worker-0", attempt=2),
            "stop nothing grace 5",
            "stop nothing grace 5",
        ],
        restart_policy="ExitCode",
        spec={"runPolicy": {"backoffLimit": 2}},
        lines=(
            "strategyjob: worker-0 exited with code 137; restarting the whole job (restart 1 of 2)",
            "strategyjob: worker-0 exited with code 137; restarting the whole job (restart 2 of 2)",
        ),
    ),
    "failures-are-reported-in-the-order-they-happened": Case(
        {"worker": 3},
        [{"worker-2": 4, "worker-0": -15}],
        1,
        "strategyjob: job demo failed after 0.5s: worker-2 exited with code 4",
        [
            *starts("worker-0", "worker-1", "worker-2"),
            "stop worker-1 grace 5",
            "stop nothing grace 5",
        ],
        lines=(
            "strategyjob:   then: worker-0 was killed by SIGTERM (exit code 143)",
            "strategyjob:   stopped: worker-1",
        ),
    ),
    # -- ParameterServerStrategy: a failed worker restarts alone ---------------------------------
    "ps-strategy-restarts-a-failed-worker-alone": Case(
        PS,
        [{"worker-1": -9}, {}, {"chief-0": 0}],
        0,
        "strategyjob: job demo succeeded in 1.5s (chief-0 succeeded; 1 of 4 replicas exited "
        "0; stopped ps-0, worker-0, worker-1; 1 restarts)",
        [
            *starts(*PS_NAMES),
            "start worker-1 attempt 0",  # the same launch again, no stop, no forget
            "stop ps-0,worker-0,worker-1 grace 5",
            "stop nothing grace 5",
        ],
        strategy="ParameterServerStrategy",
        restart_policy="ExitCode",
        lines=(
            "strategyjob: worker-1 was killed by SIGKILL (exit code 137); restarting worker-1 "
            "(restart 1 of 6)",
        ),
    ),
    "ps-strategy-restarts-the-whole-job-for-a-failed-ps": Case(
        PS,
        [{"ps-0": 137}, {"chief-0": 0}],
        0,
        "strategyjob: job demo succeeded in 1.0s (chief-0 succeeded; 1 of 4 replicas exited "
        "0; stopped ps-0, worker-0, worker-1; 1 restarts)",
        [
            *starts(*PS_NAMES),
            "stop chief-0,worker-0,worker-1 grace 5",
            "forget",
            *starts(*PS_NAMES, attempt=1),
            "stop ps-0,worker-0,worker-1 grace 5",
            "stop nothing grace 5",
        ],
        strategy="ParameterServerStrategy",
        restart_policy="ExitCode",
        lines=(
            "strategyjob: ps-0 exited with code 137; restarting the whole job (restart 1 of 6)",
        ),
    ),
    # -- success -----------------------------------------------------------------------------
    "the-leader-succeeds-and-the-others-get-the-finish-window": Case(
        {"chief": 1, "worker": 2},
        [{"chief-0": 0}, {}, {"worker-0": 0}, {"worker-1": 0}],
        0,
        "strategyjob: job demo succeeded in 2.0s (chief-0 succeeded; 3 of 3 replicas exited 0)",
        [
            *starts("chief-0", "worker-0", "worker-1"),
            "stop nothing grace 5",
            "stop nothing grace 5",
        ],
    ),
    "a-worker-still-running-after-the-finish-window-is-stopped": Case(
        W2,
        [{"worker-0": 0}],
        0,
        "strategyjob: job demo succeeded in 30.5s (worker-0 succeeded; 1 of 2 replicas exited "
        "0; stopped worker-1)",
        [*starts("worker-0", "worker-1"), "stop worker-1 grace 5", "stop nothing grace 5"],
    ),
    "a-failure-after-success-is-shown-but-the-job-succeeded": Case(
        W2,
        [{"worker-0": 0}, {"worker-1": 7}],
        0,
        "strategyjob: job demo succeeded in 1.0s (worker-0 succeeded; 1 of 2 replicas exited 0)",
        [*starts("worker-0", "worker-1"), "stop nothing grace 5", "stop nothing grace 5"],
        lines=("strategyjob:   after success: worker-1 exited with code 7",),
    ),
    "a-worker-succeeding-alone-does-not-end-the-job": Case(
        W2,
        [{"worker-1": 0}, {}, {}, {"worker-0": 0}],
        0,
        "strategyjob: job demo succeeded in 2.0s (worker-0 succeeded; 2 of 2 replicas exited 0)",
        [*starts("worker-0", "worker-1"), "stop nothing grace 5", "stop nothing grace 5"],
    ),
    "all-workers-policy-waits-for-every-chief-and-worker": Case(
        {"chief": 1, "worker": 2, "evaluator": 1},
        [{"chief-0": 0}, {"worker-0": 0}, {}, {"worker-1": 0}],
        0,
        "strategyjob: job demo succeeded in 2.0s (chief-0, worker-0, worker-1 succeeded; 3 of "
        "4 replicas exited 0; stopped evaluator-0)",
        [
            *starts("chief-0", "worker-0", "worker-1", "evaluator-0"),
            "stop evaluator-0 grace 5",
            "stop nothing grace 5",
        ],
        spec={"successPolicy": "AllWorkers"},
    ),
    # -- deadline ----------------------------------------------------------------------------
    "active-deadline-fails-the-job": Case(
        {"worker": 1},
        [],
        1,
        "strategyjob: job demo failed after 2.0s: the job ran longer than "
        "activeDeadlineSeconds (2s)",
        [*starts("worker-0"), "stop worker-0 grace 5", "stop nothing grace 5"],
        spec={"runPolicy": {"activeDeadlineSeconds": 2}},
        lines=("strategyjob:   stopped: worker-0",),
    ),
    # -- signals: the launcher stops every replica and exits 128 + signal ------------------------
    **{
        f"{sig.name}-stops-every-replica": Case(
            W2,
            [{}, {SIGNAL: sig}],
            128 + sig,
            "strategyjob: job demo interrupted after 1.0s; stopped worker-0, worker-1",
            [
                *starts("worker-0", "worker-1"),
                "wake",
                "stop worker-0,worker-1 grace 5",
                "stop nothing grace 5",
            ],
            lines=(f"strategyjob: received {sig.name}, stopping every replica",),
        )
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    },
    "a-signal-during-a-restart-stops-the-new-attempt": Case(
        W2,
        [{"worker-1": 1}, {SIGNAL: signal.SIGTERM}],
        128 + signal.SIGTERM,
        "strategyjob: job demo interrupted after 1.0s; stopped worker-0, worker-1",
        [
            *starts("worker-0", "worker-1"),
            "stop worker-0 grace 5",
            "forget",
            *starts("worker-0", "worker-1", attempt=1),
            "wake",
            "stop worker-0,worker-1 grace 5",
            "stop nothing grace 5",
        ],
        restart_policy="OnFailure",
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_the_loop(case: Case, tmp_path: Path) -> None:
    job = make_job(case.counts, case.strategy, case.restart_policy, **case.spec)
    supervisor = FakeSupervisor(case.script)
    result = run(job, supervisor, tmp_path)
    assert result.code == case.code, "\n".join(result.lines)
    ended = [line for line in result.lines if re.match(r"strategyjob: job demo (?!\[)", line)]
    assert ended == [case.summary], "\n".join(result.lines)
    for line in case.lines:
        assert line in result.lines, "\n".join(result.lines)
    assert result.log == case.log
    assert not supervisor.running()
    assert not Path(result.progress_dir).exists()


def test_the_whole_job_restart_gives_every_replica_the_next_attempt(tmp_path: Path) -> None:
    """What a restarted replica is started with: new addresses, the next restart attempt,
    the same job token."""
    supervisor = FakeSupervisor([{"worker-1": 1}, {"worker-0": 0, "worker-1": 0}])
    job = make_job(W2, restart_policy="OnFailure")
    result = run(job, supervisor, tmp_path)
    assert result.code == 0
    second = supervisor.launches  # the last launch of each replica
    assert {k: launch.env[ENV_RESTART_ATTEMPT] for k, launch in second.items()} == {
        ("worker", 0): "1",
        ("worker", 1): "1",
    }
    tokens = {launch.env["STRATEGYJOB_TOKEN"] for launch in second.values()}
    assert len(tokens) == 1


def test_a_second_interrupt_kills_without_the_grace_period(tmp_path: Path) -> None:
    supervisor = FakeSupervisor([{SIGNAL: signal.SIGINT}], signals_during_stop=[signal.SIGINT])
    result = run(make_job(W2), supervisor, tmp_path, grace_period=120)
    assert result.code == 128 + signal.SIGINT
    assert result.log == [
        *starts("worker-0", "worker-1"),
        "wake",
        "stop worker-0,worker-1 grace 120",
        "kill_all",  # the second SIGINT, while the first stop waits out its grace period
        "wake",
        "stop nothing grace 120",
    ]


def test_under_nohup_a_hang_up_is_ignored(tmp_path: Path) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    supervisor = FakeSupervisor([{SIGNAL: signal.SIGHUP}, {}, {SIGNAL: signal.SIGTERM}])
    result = run(make_job(W2), supervisor, tmp_path)
    assert result.code == 128 + signal.SIGTERM
    assert "strategyjob: received SIGTERM, stopping every replica" in result.lines
    assert not any("SIGHUP" in line for line in result.lines)
    assert result.seconds == 1.5


def test_the_signal_handlers_are_restored(tmp_path: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    run(make_job(W2), FakeSupervisor([{"worker-0": 0, "worker-1": 0}]), tmp_path)
    assert {s: signal.getsignal(s) for s in before} == before


def test_off_the_main_thread_no_handler_is_installed(tmp_path: Path) -> None:
    """Run from another thread (an embedding program), the loop leaves signals alone."""
    handlers: list[Any] = []

    class Probe(FakeSupervisor):
        def wait(self, timeout: float) -> None:
            handlers.append(signal.getsignal(signal.SIGTERM))
            super().wait(timeout)

    before = signal.getsignal(signal.SIGTERM)
    supervisor = Probe([{"worker-0": 0, "worker-1": 0}])
    results: list[Result] = []
    thread = threading.Thread(
        target=lambda: results.append(run(make_job(W2), supervisor, tmp_path))
    )
    thread.start()
    thread.join(20)
    assert not thread.is_alive()
    assert results[0].code == 0
    assert handlers == [before]


def test_suspend_is_ignored_with_a_notice(tmp_path: Path) -> None:
    job = make_job({"worker": 1}, runPolicy={"suspend": True})
    result = run(job, FakeSupervisor([{"worker-0": 0}]), tmp_path)
    assert result.code == 0
    assert result.lines[0] == (
        "strategyjob: spec.runPolicy.suspend is true; strategyjob run ignores it and runs the job"
    )


def test_the_grace_period_comes_from_the_pod_templates(tmp_path: Path) -> None:
    job = make_job({"worker": 1})
    spec = job.replica_specs["worker"]
    spec.template["spec"]["terminationGracePeriodSeconds"] = 42
    supervisor = FakeSupervisor([{SIGNAL: signal.SIGTERM}])
    run(job, supervisor, tmp_path, grace_period=None)
    assert "stop worker-0 grace 42" in supervisor.log
