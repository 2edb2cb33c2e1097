"""The fault matrix of ParameterServerStrategy under `strategyjob run`: real processes (a chief
coordinating, `strategyjob.server` workers and ps over gRPC), faults sent from outside (SIGSTOP,
SIGKILL) mid-training. Each test asserts the bound, who is named, and that no replica is left
(docs/guide/faults.md)."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest

from tests.launcher.test_launcher_run import alive, cli_env, wait_until, write_job
from tests.support.launch import Launch

pytestmark = pytest.mark.timeout(150)

PS0 = "/job:ps/replica:0/task:0"

# A worker or ps: records its pid (per attempt of the job), then serves as
# `python -m strategyjob.server` does.
SERVER = """
import os, sys
from strategyjob import server
role = os.environ["STRATEGYJOB_REPLICA_TYPE"] + "-" + os.environ["STRATEGYJOB_REPLICA_INDEX"]
name = f"{role}.{os.environ['STRATEGYJOB_RESTART_ATTEMPT']}.pid"
with open(name + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(name + ".tmp", name)
sys.exit(server.main())
"""

# The coordinator: rounds of four steps on the workers, each round joined and printed, until
# ROUNDS; CHIEF_FAULT (kill, exit) ends its first attempt after round 3. STALL_AFTER=n: after
# round n one step sleeps 2 s ("slow"), after round n+1 a step on worker STUCK_WORKER (1)
# blocks ("stuck-1").
CHIEF = """
import os, signal, sys, time
import strategyjob
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.experimental.coordinator import ClusterCoordinator

strategy = strategyjob.experimental.ParameterServerStrategy(TFConfigClusterResolver())
coordinator = ClusterCoordinator(strategy)
with strategy.scope():
    v = strategyjob.Variable(0.0, name="v")
first = os.environ["STRATEGYJOB_RESTART_ATTEMPT"] == "0"
fault = os.environ.get("CHIEF_FAULT") if first else None
step_seconds = float(os.environ.get("STEP_SECONDS", "0"))
stall_after = int(os.environ.get("STALL_AFTER", "0"))


def stall():
    from strategyjob.experimental.coordinator import get_current_worker_index

    worker = get_current_worker_index()
    for marker, seconds in (("slow", 2.0), (f"stuck-{worker}", 300.0)):
        try:
            os.remove(marker)  # the one step that removes it stalls
        except FileNotFoundError:
            continue
        time.sleep(seconds)


def step():
    time.sleep(step_seconds)
    stall()
    return v.assign_add(1.0)


for n in range(1, int(os.environ.get("ROUNDS", "100000")) + 1):
    for _ in range(4):
        coordinator.schedule(step)
    coordinator.join()
    print("ROUND", n, flush=True)
    if n == 3 and fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if n == 3 and fault == "exit":
        sys.exit(3)
    if stall_after and n in (stall_after, stall_after + 1):
        stuck = "stuck-" + os.environ.get("STUCK_WORKER", "1")
        open("slow" if n == stall_after else stuck, "w").close()
    time.sleep(0.05)
print("trained", float(v.read_value()), flush=True)
"""


def ps_job(directory: Path, workers: int = 1, policy: str = "Never", backoff: int = 0) -> Path:
    return write_job(
        directory,
        {"chief": (1, CHIEF), "worker": (workers, SERVER), "ps": (1, SERVER)},
        strategy="ParameterServerStrategy",
        restart_policy=policy,
        runPolicy={"backoffLimit": backoff},
    )


def pid_of(directory: Path, role: str, attempt: int = 0) -> int:
    return int((directory / f"{role}.{attempt}.pid").read_text())


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        wait_until(lambda pid=pid: not alive(pid), 10, f"pid {pid} to be gone")


def test_a_frozen_ps_fails_the_chief_naming_it_and_the_job_per_policy(tmp_path):
    """The ps is stopped (SIGSTOP) mid-training: the workers' calls to it end at their
    deadline (STRATEGYJOB_PS_TIMEOUT, 2 s here; without it gRPC's keepalive, 30 s), the
    coordinator retries three times, then the chief's join raises UnavailableError naming the
    ps; restartPolicy Never fails the job, and the frozen ps is stopped too."""
    manifest = ps_job(tmp_path)
    launch = Launch(manifest, cli_env() | {"STRATEGYJOB_PS_TIMEOUT": "2"}, "--grace-period", "5")
    try:
        launch.wait_line("[chief-0] ROUND 3", 90)
        ps, worker = pid_of(tmp_path, "ps-0"), pid_of(tmp_path, "worker-0")
        freeze(ps)
        frozen_at = time.monotonic()
        assert launch.finish(90) == 1, launch.transcript
        failed = launch.wait_line("strategyjob: job demo failed after ", 1) - frozen_at
    finally:
        launch.stop()
    text = launch.text
    summary = next(line for line in text if line.startswith("strategyjob: job demo failed"))
    assert ": chief-0 exited with code 1: strategyjob.errors.UnavailableError: " in summary
    assert f"Parameter server {PS0} is unavailable" in summary, summary
    assert text[-1] == "strategyjob:   stopped: ps-0, worker-0", text
    assert_gone([ps, worker])
    print(f"ps frozen to job failed: {failed:.1f} s; {summary}")
    assert failed < 30


@pytest.mark.parametrize("fault", ["kill", "exit"])
def test_a_chief_that_dies_restarts_the_whole_job_per_policy(tmp_path, fault):
    """The chief is killed (or exits 3) after three rounds: the launcher names it at once,
    stops the ps and the worker, and restarts the whole job, whose second attempt trains."""
    manifest = ps_job(tmp_path, policy="OnFailure", backoff=1)
    env = cli_env() | {"CHIEF_FAULT": fault, "ROUNDS": "5"}
    launch = Launch(manifest, env, "--grace-period", "5")
    try:
        assert launch.finish(120) == 0, launch.transcript
    finally:
        launch.stop()
    text = launch.text
    culprit = (
        "chief-0 was killed by SIGKILL (exit code 137)"
        if fault == "kill"
        else "chief-0 exited with code 3"
    )
    restarting = f"strategyjob: {culprit}; restarting the whole job (restart 1 of 1)"
    assert restarting in text, text
    died = launch.wait_line("[chief-0] ROUND 3", 1)
    reported = launch.wait_line(restarting, 1) - died
    assert_gone([pid_of(tmp_path, "ps-0", 0), pid_of(tmp_path, "worker-0", 0)])
    assert "[chief-0] trained 20.0" in text  # the second attempt: 5 rounds of 4 steps
    assert text[-1].startswith("strategyjob: job demo succeeded in "), text
    print(f"chief {fault}: restart reported {reported:.2f} s after its last round")
    assert reported < 5


def test_a_frozen_worker_has_its_steps_run_by_the_others_and_the_job_goes_on(tmp_path):
    """Worker 1 is stopped (SIGSTOP) mid-training: gRPC's keepalive (30 s) ends the step it
    held, which the coordinator runs on worker 0; training goes on, the job succeeds and the
    frozen worker is stopped with the others."""
    manifest = ps_job(tmp_path, workers=2)
    env = cli_env() | {"ROUNDS": "8", "STEP_SECONDS": "0.2"}  # each worker gets steps
    launch = Launch(manifest, env, "--grace-period", "5")
    try:
        launch.wait_line("[chief-0] ROUND 3", 90)
        frozen = pid_of(tmp_path, "worker-1")
        freeze(frozen)
        frozen_at = time.monotonic()
        assert launch.finish(120) == 0, launch.transcript
    finally:
        launch.stop()
    text = launch.text
    assert "[chief-0] trained 32.0" in text, text  # every step ran once
    rounds = [t for t, line in launch.lines if line.startswith("[chief-0] ROUND ")]
    stalled = max(b - a for a, b in itertools.pairwise(rounds))
    assert text[-1].startswith("strategyjob: job demo succeeded in "), text
    assert "stopped ps-0, worker-0, worker-1" in text[-1], text[-1]
    assert_gone([frozen])
    done = time.monotonic() - frozen_at
    print(f"worker frozen: longest round {stalled:.1f} s, job done {done:.1f} s later")
    assert 20 < stalled < 45  # the round with the frozen worker's step waited for it


NEVER_SERVES = "import time\ntime.sleep(300)\n"


def test_a_ps_that_never_starts_fails_the_chief_naming_it(tmp_path):
    """The chief's first variable waits for the ps STRATEGYJOB_PS_CONNECT_TIMEOUT seconds (4
    here; 120 by default), then fails naming it."""
    manifest = write_job(
        tmp_path,
        {"chief": (1, CHIEF), "worker": (1, SERVER), "ps": (1, NEVER_SERVES)},
        strategy="ParameterServerStrategy",
        restart_policy="Never",
    )
    env = cli_env() | {"STRATEGYJOB_PS_CONNECT_TIMEOUT": "4"}
    launch = Launch(manifest, env, "--grace-period", "5")
    try:
        assert launch.finish(90) == 1, launch.transcript
    finally:
        launch.stop()
    summary = launch.text[-2]
    assert ": chief-0 exited with code 1: strategyjob.errors.UnavailableError: " in summary
    assert f"{PS0} is unavailable (DEADLINE_EXCEEDED: no answer within 4 s of waiting" in summary
    assert (
        "[chief-0] strategyjob.errors.UnavailableError: "
        + (
            f"{PS0} is unavailable (DEADLINE_EXCEEDED: no answer within 4 s of waiting for it to "
            "start, STRATEGYJOB_PS_CONNECT_TIMEOUT; check that it runs and listens there (its "
            f"log)). GRPC error information from remote target {PS0}"
        )
        in launch.text
    ), launch.text
    took = launch.wait_line(summary, 1) - launch.lines[0][0]
    print(f"ps never starts: {summary}, {took:.1f} s after the start")
    assert took < 45


def test_a_worker_that_never_joins_leaves_the_steps_to_the_others(tmp_path):
    """Worker 1 never serves: the coordinator runs every step on worker 0 (as TensorFlow's, it
    connects to workers lazily) and the job succeeds; worker 1 is stopped with the others."""
    manifest = write_job(
        tmp_path,
        {"chief": (1, CHIEF), "worker": (2, SERVER), "ps": (1, SERVER)},
        strategy="ParameterServerStrategy",
        restart_policy="Never",
    )
    (tmp_path / "worker.py").write_text(
        "import os, runpy, time\n"
        "if os.environ['STRATEGYJOB_REPLICA_INDEX'] == '1':\n"
        "    time.sleep(300)\n"
        "runpy.run_path('server.py', run_name='__main__')\n"
    )
    (tmp_path / "server.py").write_text(SERVER)
    launch = Launch(manifest, cli_env() | {"ROUNDS": "5"}, "--grace-period", "5")
    try:
        assert launch.finish(90) == 0, launch.transcript
    finally:
        launch.stop()
    assert "[chief-0] trained 20.0" in launch.text, launch.text
    assert "stopped ps-0, worker-0, worker-1" in launch.text[-1], launch.text[-1]


def stall_env(**extra: str) -> dict[str, str]:
    """CHIEF's slow step after round 6, its stuck one after round 7; a stuck-peer bound of 4 s
    (the floor; the factor 1, so that the slow step's 2 s do not raise it)."""
    return (
        cli_env()
        | {
            "ROUNDS": "10",
            "STALL_AFTER": "6",
            "STEP_SECONDS": "0.05",
            "STRATEGYJOB_STUCK_PEER_SECONDS": "4",
            "STRATEGYJOB_STUCK_PEER_FACTOR": "1",
            "STRATEGYJOB_WAITING_REPORT_SECONDS": "1",
        }
        | extra
    )


def test_a_worker_stuck_in_a_closure_is_taken_out_and_the_job_goes_on(tmp_path):
    """After 24 steps (the bound's history), one step sleeps 2 s: under the bound (6 s, the
    floor, three times the slow step so that a loaded machine does not take it out; the factor
    1), it is waited for. The next round, worker 1 blocks in its step (alive: its server
    answers): the coordinator names it while it waits, takes it out at the bound and runs the
    step on worker 0; every step runs once, the job succeeds, worker 1 is stopped."""
    manifest = ps_job(tmp_path, workers=2)
    launch = Launch(manifest, stall_env(STRATEGYJOB_STUCK_PEER_SECONDS="6"), "--grace-period", "5")
    try:
        assert launch.finish(120) == 0, launch.transcript
    finally:
        launch.stop()
    text = launch.text
    assert "[chief-0] trained 40.0" in text, text  # every step ran once
    stuck = pid_of(tmp_path, "worker-1")
    taken = [line for line in text if "strategyjob: coordinator takes " in line]
    assert len(taken) == 1, text  # the slow step was not taken out
    assert taken[0].startswith(
        "[chief-0] strategyjob: coordinator takes /job:worker/replica:0/task:1 out: closure step "
        "ran 6."
    ), taken
    assert "longer than this job's stuck-peer bound of 6 s (the larger of " in taken[0]
    waiting = (
        "s for closure step on /job:worker/replica:0/task:1 (the longest completed one took 2."
    )
    assert any(
        line.startswith("[chief-0] strategyjob: coordinator waiting ") and waiting in line
        for line in text
    ), text
    rounds = dict((line, t) for t, line in launch.lines if line.startswith("[chief-0] ROUND "))
    slow = rounds["[chief-0] ROUND 7"] - rounds["[chief-0] ROUND 6"]
    stalled = rounds["[chief-0] ROUND 8"] - rounds["[chief-0] ROUND 7"]
    assert text[-1].startswith("strategyjob: job demo succeeded in "), text
    assert "stopped ps-0, worker-0, worker-1" in text[-1], text[-1]
    assert_gone([stuck])
    said = [line for line in text if "strategyjob: coordinator " in line]
    print(f"slow round {slow:.1f} s; stuck round {stalled:.1f} s:", *said, sep="\n")
    assert 1.9 < slow < 6
    assert 6 <= stalled < 12


def test_a_stuck_closure_with_no_other_worker_fails_the_job_naming_it(tmp_path):
    """The only worker blocks in its step: the coordinator's join raises DeadlineExceededError
    naming the worker, the closure, how long it ran and how to raise the bound, at the bound;
    the summary quotes it."""
    manifest = ps_job(tmp_path, workers=1)
    launch = Launch(manifest, stall_env(STUCK_WORKER="0"), "--grace-period", "5")
    try:
        assert launch.finish(120) == 1, launch.transcript
    finally:
        launch.stop()
    text = launch.text
    summary = next(line for line in text if line.startswith("strategyjob: job demo failed"))
    assert (
        ": chief-0 exited with code 1: strategyjob.errors.DeadlineExceededError: Closure step on "
        "/job:worker/replica:0/task:0 did not complete: it ran 4." in summary
    ), summary
    error = next(line for line in text if "DeadlineExceededError: Closure step" in line)
    assert "longer than this job's stuck-peer bound of 4 s" in error, error
    assert "no other worker is left to run it" in error
    assert "raise STRATEGYJOB_STUCK_PEER_SECONDS" in error
    failed = launch.wait_line(summary, 1) - launch.wait_line("[chief-0] ROUND 7", 1)
    assert text[-1] == "strategyjob:   stopped: ps-0, worker-0", text
    assert_gone([pid_of(tmp_path, "worker-0")])
    print(f"stuck closure, one worker: the job failed {failed:.1f} s after round 7; {summary}")
    assert 4 <= failed < 15
