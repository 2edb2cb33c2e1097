"""`strategyjob run` end to end: real processes running tiny Python scripts."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from strategyjob import cli
from strategyjob.jobspec import load_manifest_file
from strategyjob.launcher import local_replica_limit
from strategyjob.launcher._plan import ignored_template_fields

from tests.support.processes import default_interrupts
from tests.support.terminal import run_in_terminal

SDK = Path(__file__).resolve().parents[2] / "sdk"
pytestmark = pytest.mark.timeout(90)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SDK), env.get("PYTHONPATH")) if p)
    env.pop("TF_CONFIG", None)
    return env


def write_job(
    directory: Path,
    scripts: dict[str, tuple[int, str]],
    strategy: str = "MultiWorkerMirroredStrategy",
    name: str = "demo",
    restart_policy: str | None = None,
    **spec_extra,
) -> Path:
    """A manifest whose replica type ``t`` runs ``python t.py`` with the given source."""
    replica_specs = {}
    for replica_type, (replicas, source) in scripts.items():
        (directory / f"{replica_type}.py").write_text(textwrap.dedent(source))
        spec = {
            "replicas": replicas,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "strategyjob", "command": ["python", f"{replica_type}.py"]}
                    ]
                }
            },
        }
        if restart_policy:
            spec["restartPolicy"] = restart_policy
        replica_specs[replica_type] = spec
    manifest = {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name},
        "spec": {"strategy": strategy, "replicaSpecs": replica_specs, **spec_extra},
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def run_cli(manifest: Path, *extra: str, cwd: Path | None = None, timeout: float = 60, env=None):
    return subprocess.run(
        [sys.executable, "-m", "strategyjob", "run", str(manifest), *extra],
        capture_output=True,
        text=True,
        env=cli_env() if env is None else env,
        cwd=cwd,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (no psutil needed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# A replica that records its pid and a grandchild's pid, then waits to be stopped.
LINGERING = """
    import os, subprocess, sys, time
    role = os.environ["STRATEGYJOB_REPLICA_TYPE"] + "-" + os.environ["STRATEGYJOB_REPLICA_INDEX"]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(f"{role}.pids.tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(f"{role}.pids.tmp", f"{role}.pids")
    print("waiting", flush=True)
    time.sleep(300)
"""


def recorded_pids(directory: Path, roles: list[str]) -> list[int]:
    return [int(p) for role in roles for p in (directory / f"{role}.pids").read_text().split()]


def test_success_streams_prefixed_output_and_injects_the_environment(tmp_path):
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                2,
                """
                import json, os
                config = json.loads(os.environ["TF_CONFIG"])
                print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])
                print("task", config["task"]["type"], config["task"]["index"])
                print("cluster", ",".join(config["cluster"]["worker"]))
                print("master", os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
                print("cwd", os.getcwd())
                """,
            )
        },
    )
    result = run_cli(manifest, cwd="/")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "[worker-0] rank 0 of 2" in lines
    assert "[worker-1] rank 1 of 2" in lines
    assert "[worker-1] task worker 1" in lines
    clusters = {line.split()[-1] for line in lines if " cluster " in line}
    (cluster,) = clusters  # both replicas see the same cluster
    addresses = cluster.split(",")
    assert [a.split(":")[0] for a in addresses] == ["127.0.0.1", "127.0.0.1"]
    assert f"[worker-1] master 127.0.0.1 {addresses[0].split(':')[1]}" in lines
    assert f"[worker-0] cwd {tmp_path.resolve()}" in lines
    assert lines[-1].startswith("strategyjob: job demo succeeded in ")
    assert "(worker-0 succeeded; 2 of 2 replicas exited 0)" in lines[-1]
    port0, port1 = (a.split(":")[1] for a in addresses)
    assert lines[0] == (
        "strategyjob: job demo [MultiWorkerMirroredStrategy] starting "
        f"worker-0 (127.0.0.1:{port0}), worker-1 (127.0.0.1:{port1})"
    )
    assert "\x1b[K" not in result.stdout  # no live status line when not a terminal
    assert result.stderr == ""


def test_failing_worker_stops_the_others_and_is_reported_first(tmp_path):
    manifest = write_job(
        tmp_path,
        {
            "chief": (1, LINGERING),
            "worker": (
                2,
                """
                import os, sys, time
                if os.environ["STRATEGYJOB_REPLICA_INDEX"] == "1":
                    while not os.path.exists("chief-0.pids"):
                        time.sleep(0.02)
                    print("worker 1 fails", flush=True)
                    sys.exit(3)
                time.sleep(300)
                """,
            ),
        },
    )
    started = time.monotonic()
    result = run_cli(manifest, "--grace-period", "5")
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "[worker-1] worker 1 fails" in lines
    failed = [line for line in lines if line.startswith("strategyjob: job demo failed after ")]
    assert len(failed) == 1 and failed[0].endswith(": worker-1 exited with code 3: worker 1 fails")
    assert lines.index(failed[0]) < lines.index("strategyjob:   stopped: chief-0, worker-0")
    for pid in recorded_pids(tmp_path, ["chief-0"]):
        wait_until(lambda pid=pid: not alive(pid), 10, f"pid {pid} to be gone")


def run_timed(manifest: Path, *extra: str, timeout: float = 60) -> list[tuple[float, str]]:
    """Run ``strategyjob run`` and return its output lines with when each arrived."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "strategyjob", "run", str(manifest), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(),
    )
    # Past the timeout SIGTERM: the launcher stops its replicas, so none is left behind.
    watchdog = threading.Timer(timeout, launcher.terminate)
    watchdog.start()
    try:
        assert launcher.stdout is not None
        lines = [(time.monotonic(), line.rstrip("\n")) for line in launcher.stdout]
        launcher.wait(30)
    finally:
        watchdog.cancel()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 128 + signal.SIGTERM, f"timed out after {timeout}s: {lines}"
    return lines


def when(lines: list[tuple[float, str]], text: str) -> float:
    return next(t for t, line in lines if line.startswith(text))


# ParameterServerStrategy's coordinator: waits for ever (the ps is what ends).
COORDINATOR = """
    import os, time
    open("chief-ready", "w").close()
    time.sleep(300)
"""


def test_a_ps_exiting_0_is_reported_at_once_and_restarted_per_policy(tmp_path):
    """A ps that exits with 0 while the job runs is its failure, the moment it happens: the
    launcher names it, restarts the job per OnFailure and fails it at backoffLimit, instead
    of waiting for the chief's timeout."""
    manifest = write_job(
        tmp_path,
        {
            "chief": (1, COORDINATOR),
            "worker": (1, "import time; time.sleep(300)\n"),
            "ps": (
                1,
                """
                import os, time
                while not os.path.exists("chief-ready"):
                    time.sleep(0.02)
                os.remove("chief-ready")
                print("ps done", flush=True)
                """,
            ),
        },
        strategy="ParameterServerStrategy",
        restart_policy="OnFailure",
        runPolicy={"backoffLimit": 1},
    )
    started = time.monotonic()
    lines = run_timed(manifest, "--grace-period", "5")
    took = time.monotonic() - started
    text = [line for _, line in lines]
    early = "ps-0 exited with code 0 while the job ran (a ps serves until the job ends)"
    assert f"strategyjob: {early}; restarting the whole job (restart 1 of 1)" in text, text
    assert text[-2].startswith("strategyjob: job demo failed after ")
    assert text[-2].endswith(f": {early}; backoff limit of 1 restarts reached")
    assert text[-1] == "strategyjob:   stopped: chief-0, worker-0"
    reported = when(lines, f"strategyjob: {early}") - when(lines, "[ps-0] ps done")
    print(f"ps exit reported after {reported:.2f}s, job failed after {took:.1f}s")
    assert reported < 2.5
    assert took < 20


def test_the_summary_quotes_the_culprits_error_line(tmp_path):
    """Worker 1 raises; worker 0's long follow-on traceback comes after it: the summary
    still names worker 1 and quotes its error."""
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                2,
                """
                import os, signal, sys, time
                if os.environ["RANK"] == "1":
                    while not os.path.exists("worker-0-ready"):
                        time.sleep(0.02)
                    raise ValueError("bad batch")
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a rank blocked in gloo
                open("worker-0-ready", "w").close()
                time.sleep(1)
                def deep(n):
                    if n == 0:
                        raise RuntimeError("peer worker-1 is gone")
                    deep(n - 1)
                deep(40)
                """,
            )
        },
    )
    result = run_cli(manifest, "--grace-period", "10")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "[worker-1] ValueError: bad batch" in lines
    assert lines.index("[worker-1] ValueError: bad batch") < lines.index(
        "[worker-0] RuntimeError: peer worker-1 is gone"
    )
    failed = next(line for line in lines if line.startswith("strategyjob: job demo failed"))
    assert failed.endswith(": worker-1 exited with code 1: ValueError: bad batch")
    assert lines[-1] == "strategyjob:   stopped: worker-0"


@pytest.mark.parametrize("policy", ["OnFailure", "Never"])
def test_a_failed_evaluator_restarts_alone_or_is_given_up_and_the_job_goes_on(tmp_path, policy):
    """As the operator: an evaluator's failure never restarts nor fails the job."""
    manifest = write_job(
        tmp_path,
        {
            "chief": (
                1,
                """
                import os, time
                with open("chief-starts", "a") as f:
                    f.write("x")
                while not os.path.exists("evaluator-done"):
                    time.sleep(0.02)
                print("chief done")
                """,
            ),
            "evaluator": (
                1,
                """
                import os, time
                with open("evaluator-starts", "a") as f:
                    f.write("x")
                if os.path.getsize("evaluator-starts") == 1:
                    open("evaluator-failing", "w").close()
                    raise ValueError("no checkpoint yet")
                open("evaluator-done", "w").close()
                time.sleep(300)
                """,
            ),
        },
        restart_policy=policy,
        runPolicy={"backoffLimit": 1},
    )
    if policy == "Never":  # the chief ends once the evaluator was given up
        (tmp_path / "chief.py").write_text(
            (tmp_path / "chief.py").read_text().replace("evaluator-done", "evaluator-failing")
        )
    result = run_cli(manifest, "--grace-period", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    failed = "strategyjob: evaluator-0 exited with code 1: ValueError: no checkpoint yet"
    if policy == "OnFailure":
        assert (
            f"{failed}; restarting evaluator-0 alone (an evaluator never fails the job: restart "
            "1 of 1, not counted against the job's backoffLimit)" in lines
        )
        assert (tmp_path / "evaluator-starts").read_text() == "xx"
    else:
        assert (
            f"{failed}; restartPolicy Never does not retry it. The job goes on without it "
            "(an evaluator never fails the job)." in lines
        )
    assert (tmp_path / "chief-starts").read_text() == "x"  # the job was not restarted
    assert lines[-1].startswith("strategyjob: job demo succeeded in ")
    assert "restarting the whole job" not in result.stdout


def test_replica_killed_by_a_signal_is_described(tmp_path):
    manifest = write_job(
        tmp_path, {"worker": (1, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")}
    )
    result = run_cli(manifest)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1].endswith(
        ": worker-0 was killed by SIGKILL (exit code 137)"
    )


def test_replica_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    manifest = write_job(
        tmp_path,
        {
            "chief": (
                1,
                """
                import signal, time
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                open("ready", "w").close()
                time.sleep(300)
                """,
            ),
            "worker": (
                1,
                """
                import os, sys, time
                while not os.path.exists("ready"):
                    time.sleep(0.02)
                sys.exit(4)
                """,
            ),
        },
    )
    started = time.monotonic()
    result = run_cli(manifest, "--grace-period", "1")
    assert time.monotonic() - started < 20
    assert result.returncode == 1
    assert "strategyjob:   stopped: chief-0" in result.stdout.splitlines()


def test_a_stopped_replica_gets_its_sigterm_at_once_not_after_the_grace_period(tmp_path):
    """A frozen (SIGSTOP) replica is continued after its SIGTERM, so it handles it (here:
    exits 143 at once) instead of sitting out the grace period until the SIGKILL."""
    manifest = write_job(
        tmp_path,
        {
            "chief": (
                1,
                """
                import os, signal, sys
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
                open("ready", "w").close()
                os.kill(os.getpid(), signal.SIGSTOP)
                """,
            ),
            "worker": (
                1,
                """
                import os, sys, time
                while not os.path.exists("ready"):
                    time.sleep(0.02)
                time.sleep(0.2)  # the chief has stopped itself
                sys.exit(4)
                """,
            ),
        },
    )
    started = time.monotonic()
    result = run_cli(manifest, "--grace-period", "30")
    assert time.monotonic() - started < 15, result.stdout
    assert result.returncode == 1
    assert "strategyjob:   stopped: chief-0" in result.stdout.splitlines(), result.stdout


def test_success_stops_the_ps_and_evaluator(tmp_path):
    manifest = write_job(
        tmp_path,
        {
            "chief": (
                1,
                """
                import os, time
                roles = ("ps-0", "evaluator-0", "worker-0")
                while not all(os.path.exists(f"{role}.pids") for role in roles):
                    time.sleep(0.02)
                print("coordinator done")
                """,
            ),
            "worker": (1, LINGERING),  # a ParameterServerStrategy worker serves until stopped
            "ps": (1, LINGERING),
            "evaluator": (1, LINGERING),
        },
        strategy="ParameterServerStrategy",
    )
    result = run_cli(manifest, "--grace-period", "5")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.splitlines()[-1]
    assert "chief-0 succeeded" in summary and "stopped evaluator-0, ps-0, worker-0" in summary
    for pid in recorded_pids(tmp_path, ["ps-0", "evaluator-0", "worker-0"]):
        wait_until(lambda pid=pid: not alive(pid), 10, f"pid {pid} to be gone")


@pytest.mark.signal_timing
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_interrupt_leaves_no_process_behind(tmp_path, signum):
    """Ctrl-C, kill, and a dropped SSH session (SIGHUP) all stop every replica and its
    children, and remove the launcher's temporary directory."""
    manifest = write_job(tmp_path, {"chief": (1, LINGERING), "worker": (2, LINGERING)})
    temp = tmp_path / "tmp"
    temp.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "strategyjob", "run", str(manifest), "--grace-period", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**cli_env(), "TMPDIR": str(temp)},
        preexec_fn=default_interrupts,  # as from a terminal, even when the suite runs in nohup
    )
    roles = ["chief-0", "worker-0", "worker-1"]
    try:
        wait_until(lambda: all((tmp_path / f"{r}.pids").exists() for r in roles), 30, "replicas")
        pids = recorded_pids(tmp_path, roles)
        assert all(alive(pid) for pid in pids)
        # the run's progress directory, and its control directory (strategyjob scale --local)
        progress, runs = sorted(temp.iterdir())
        assert progress.name.startswith("strategyjob-demo-"), progress
        assert [p.name for p in runs.iterdir()] == ["demo"] and runs.name == "strategyjob-runs"
        launcher.send_signal(signum)
        output, _ = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signum
    assert f"strategyjob: received {signal.Signals(signum).name}, stopping every replica" in output
    assert "strategyjob: job demo interrupted after" in output
    assert "stopped chief-0, worker-0, worker-1" in output
    for pid in pids:
        wait_until(lambda pid=pid: not alive(pid), 10, f"pid {pid} to be gone")
    assert list(temp.iterdir()) == []


def test_under_nohup_a_hang_up_is_ignored(tmp_path):
    """``nohup strategyjob run``: SIGHUP stays ignored; the job still stops on SIGTERM."""
    manifest = write_job(tmp_path, {"worker": (1, LINGERING)})
    launcher = subprocess.Popen(
        ["nohup", sys.executable, "-m", "strategyjob", "run", str(manifest), "--grace-period", "5"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(),
    )
    try:
        wait_until(lambda: (tmp_path / "worker-0.pids").exists(), 30, "the replica")
        pids = recorded_pids(tmp_path, ["worker-0"])
        launcher.send_signal(signal.SIGHUP)  # discarded by the kernel: SIG_IGN
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGTERM, output
    assert "received SIGTERM" in output and "SIGHUP" not in output
    for pid in pids:
        wait_until(lambda pid=pid: not alive(pid), 10, f"pid {pid} to be gone")


def test_whole_job_restart_on_failure(tmp_path):
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                2,
                """
                import os, sys, time
                # each replica counts its own starts: a shared marker would race between them
                starts = f"starts-{os.environ['RANK']}"
                with open(starts, "a") as f:
                    f.write("x")
                first = os.path.getsize(starts) == 1
                attempt = os.environ["STRATEGYJOB_RESTART_ATTEMPT"]
                print("attempt", "first" if first else "restart", attempt, flush=True)
                if first:
                    if os.environ["RANK"] == "1":
                        # fail once worker 0 has counted its start: stopped before that, it
                        # would take its restart for its first attempt and sleep
                        deadline = time.monotonic() + 30
                        while not os.path.exists("starts-0") and time.monotonic() < deadline:
                            time.sleep(0.05)
                        sys.exit(1)
                    time.sleep(300)  # worker 0 is stopped by the restart
                """,
            )
        },
        restart_policy="OnFailure",
        runPolicy={"backoffLimit": 1},
    )
    result = run_cli(manifest)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert (
        "strategyjob: worker-1 exited with code 1; restarting the whole job (restart 1 of 1)"
        in lines
    )
    assert "[worker-1] attempt first 0" in lines and "[worker-0] attempt first 0" in lines
    assert "[worker-1] attempt restart 1" in lines
    assert "[worker-0] attempt restart 1" in lines  # the whole job, not only the failed replica
    assert "; 1 restarts)" in lines[-1]


def test_pod_template_fields_only_a_cluster_applies_are_named_once(tmp_path):
    """A cluster manifest run locally: its volume, workingDir, init and sidecar containers are
    not applied, so a path in them is this machine's (the cluster example wrote /checkpoints
    on the host). One warning names them, not one per restart."""
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                1,
                """
                import os, sys
                first = not os.path.exists("started")
                open("started", "a").close()
                print("cwd", os.getcwd(), flush=True)
                sys.exit(1 if first else 0)
                """,
            )
        },
        restart_policy="OnFailure",
        runPolicy={"backoffLimit": 1},
    )
    data = yaml.safe_load(manifest.read_text())
    pod_spec = data["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    pod_spec["containers"][0].update(
        workingDir="/opt/app", volumeMounts=[{"name": "data", "mountPath": "/checkpoints"}]
    )
    pod_spec["containers"].append({"name": "logs", "image": "busybox"})
    pod_spec["initContainers"] = [{"name": "prepare", "image": "busybox"}]
    pod_spec["volumes"] = [{"name": "data", "hostPath": {"path": "/tmp/data"}}]
    pod_spec["nodeSelector"] = {"disk": "ssd"}  # where a pod runs: nothing a replica sees
    manifest.write_text(yaml.safe_dump(data))
    result = run_cli(manifest)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if "warning" in line]
    assert warnings == [
        "strategyjob: warning: strategyjob run ignores what only a cluster applies in the pod "
        "templates of worker: volumes, initContainers, other containers (logs), workingDir, "
        f"volumeMounts; every replica runs in {tmp_path.resolve()}, with this machine's files, "
        "user and resources"
    ]
    assert result.stdout.count(f"[worker-0] cwd {tmp_path.resolve()}") == 2  # and a restart


def test_a_manifest_for_this_machine_gets_no_such_warning():
    examples = Path(__file__).parents[2] / "examples"
    assert ignored_template_fields(load_manifest_file(examples / "digits_mwms/job.yaml")) == (
        [],
        [],
    )
    cluster = load_manifest_file(examples / "digits_mwms/k8s.yaml")
    assert ignored_template_fields(cluster) == (
        ["volumes", "initContainers", "workingDir", "volumeMounts"],
        ["worker"],
    )


def test_backoff_limit_exhausted_fails(tmp_path):
    manifest = write_job(
        tmp_path,
        {"worker": (1, "import sys; sys.exit(137)\n")},
        restart_policy="ExitCode",
        runPolicy={"backoffLimit": 2},
    )
    result = run_cli(manifest)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert sum("restarting the whole job" in line for line in lines) == 2
    assert lines[-1].endswith(
        ": worker-0 exited with code 137; backoff limit of 2 restarts reached"
    )


def test_exit_code_policy_does_not_retry_permanent_errors(tmp_path):
    manifest = write_job(
        tmp_path, {"worker": (1, "import sys; sys.exit(2)\n")}, restart_policy="ExitCode"
    )
    result = run_cli(manifest)
    assert result.returncode == 1
    assert "restarting" not in result.stdout


def test_active_deadline_fails_the_job(tmp_path):
    manifest = write_job(
        tmp_path,
        {"worker": (1, "import time; time.sleep(300)\n")},
        runPolicy={"activeDeadlineSeconds": 1},
    )
    result = run_cli(manifest, "--grace-period", "2")
    assert result.returncode == 1
    assert "the job ran longer than activeDeadlineSeconds (1s)" in result.stdout


def test_command_that_cannot_start_fails_with_127(tmp_path):
    manifest = write_job(tmp_path, {"worker": (1, "")})
    data = yaml.safe_load(manifest.read_text())
    data["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["command"] = [
        "./no-such-program"
    ]
    manifest.write_text(yaml.safe_dump(data))
    result = run_cli(manifest)
    assert result.returncode == 1
    assert "[worker-0] strategyjob: cannot start './no-such-program'" in result.stdout
    assert result.stdout.splitlines()[-1].endswith(": worker-0 exited with code 127")


# --- bad input: exit 2, one clear line, nothing started ---------------------------------------

MARKER_SCRIPT = "open('started', 'w').close()\n"


def test_missing_file(tmp_path):
    result = run_cli(tmp_path / "missing.yaml")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"strategyjob run: error: {tmp_path / 'missing.yaml'}: no such file. "
        "Check the path of the StrategyJob manifest.\n"
    )


def test_invalid_yaml(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("spec: [unclosed\n")
    result = run_cli(path)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"strategyjob run: error: {path}: invalid YAML at line 2")


@pytest.mark.parametrize(
    ("strategy", "counts", "expected"),
    [
        pytest.param(
            "NoSuchStrategy",
            {"worker": 1},
            'spec.strategy: unknown strategy (got "NoSuchStrategy"). Use one of: ',
            id="unknown-strategy",
        ),
        pytest.param(
            "MultiWorkerMirroredStrategy",
            {"worker": 2, "ps": 1},
            "spec.replicaSpecs.ps: MultiWorkerMirroredStrategy takes no ps replicas (got 1). "
            "Remove spec.replicaSpecs.ps, or use ParameterServerStrategy.",
            id="mwms-with-ps",
        ),
    ],
)
def test_invalid_manifest_starts_nothing(tmp_path, strategy, counts, expected):
    scripts = {t: (n, MARKER_SCRIPT) for t, n in counts.items()}
    manifest = write_job(tmp_path, scripts, strategy=strategy)
    result = run_cli(manifest)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"strategyjob run: error: {manifest}: {expected}")
    assert result.stdout == ""
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize("value", ["-5", "nan", "soon"])
def test_a_grace_period_that_is_not_a_duration_is_refused(tmp_path, value):
    """``--grace-period -5`` would be a SIGKILL at once, not the grace the user asked for."""
    manifest = write_job(tmp_path, {"worker": (1, MARKER_SCRIPT)})
    result = run_cli(manifest, "--grace-period", value)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"strategyjob run: error: argument --grace-period: must be a number of seconds, "
        f"0 or more (got {value!r}); e.g. 10"
    )
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize(
    "options",
    [
        {"grace_period": -5},
        {"grace_period": float("nan")},
        {"finish_timeout": float("inf")},
        {"grace_period": "10"},
        {"finish_timeout": True},
    ],
)
def test_run_options_through_the_python_api_are_checked_as_the_cli_checks_them(options):
    """``RunOptions(grace_period=-5)`` would be a SIGKILL at once: refused when it is made."""
    from strategyjob.launcher import RunOptions

    ((name, value),) = options.items()
    with pytest.raises(ValueError) as raised:
        RunOptions(**options)
    assert str(raised.value) == (
        f"RunOptions({name}={value!r}): must be a number of seconds, 0 or more; e.g. 10"
    )
    assert RunOptions(grace_period=0, finish_timeout=2.5).grace_period == 0


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(
            {"command": None, "comand": ["python", "worker.py"]},
            'comand: unknown field of a Kubernetes container (got "comand"). Did you mean '
            "command? Remove it or fix its name; kubectl explain pod.spec.containers lists the "
            "fields.",
            id="misspelt-field",
        ),
        pytest.param(
            # never pulled here, but a cluster's pods would wait in InvalidImageName
            {"image": "Trainer:latest"},
            "image: not an image the cluster can pull, its pods would wait in InvalidImageName "
            "(invalid reference format: repository name (library/Trainer) must be lowercase) "
            '(got "Trainer:latest"). Write [registry[:port]/]name[:tag][@sha256:digest], the '
            "name in lowercase, e.g. python:3.11.",
            id="invalid-image",
        ),
    ],
)
def test_a_container_the_cluster_would_refuse_is_refused_before_start(tmp_path, change, problem):
    manifest = write_job(tmp_path, {"worker": (1, MARKER_SCRIPT)})
    data = yaml.safe_load(manifest.read_text())
    container = data["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    for key, value in change.items():
        if value is None:
            del container[key]
        else:
            container[key] = value
    manifest.write_text(yaml.safe_dump(data))
    result = run_cli(manifest)
    assert result.returncode == 2
    assert result.stderr == (
        f"strategyjob run: error: {manifest}: spec.replicaSpecs.worker.template.spec."
        f"containers[0].{problem}\n"
    )
    assert not (tmp_path / "started").exists()


def test_container_without_command_is_refused_before_start(tmp_path):
    manifest = write_job(tmp_path, {"chief": (1, MARKER_SCRIPT), "worker": (1, MARKER_SCRIPT)})
    data = yaml.safe_load(manifest.read_text())
    del data["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["command"]
    manifest.write_text(yaml.safe_dump(data))
    result = run_cli(manifest)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "strategyjob run: error: spec.replicaSpecs.worker.template.spec.containers[0].command: "
        "strategyjob run needs a command"
    )
    assert not (tmp_path / "started").exists()


def nofile_limit(soft: int, hard: int):
    """A ``preexec_fn`` giving the launcher the open-file limits ``ulimit -Sn soft -Hn hard``."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("count", [None, 100_000], ids=["over-the-limit", "100000"])
def test_more_replicas_than_the_machine_can_start_are_refused_up_front(tmp_path, count):
    limit, why = local_replica_limit()  # the launcher inherits this process's limits
    manifest = write_job(tmp_path, {"worker": (count or limit + 1, MARKER_SCRIPT)})
    result = run_cli(manifest)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()  # one line, no traceback
    assert line.startswith("strategyjob run: error: "), line
    if count is None:
        assert line == (
            f"strategyjob run: error: spec.replicaSpecs: {limit + 1} replicas in all, more than "
            f"strategyjob run can start on this machine (at most {limit}: {why}). Use fewer "
            "replicas, or run the job on a cluster with strategyjob submit."
        )
    assert result.stdout == ""
    assert not (tmp_path / "started").exists()


def test_the_replica_limit_follows_the_open_file_limit_and_holds(tmp_path):
    """With ``ulimit -Hn 128``: 32 replicas at most ((128 - 64 reserved) / 2 files each);
    33 are refused naming the limit, 32 all run (the soft limit raised for them)."""
    script = """
        import resource
        print("nofile", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    """
    manifest = write_job(tmp_path, {"worker": (33, script)})
    refused = subprocess.run(
        [sys.executable, "-m", "strategyjob", "run", str(manifest)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        preexec_fn=nofile_limit(64, 128),
    )
    assert refused.returncode == 2
    assert refused.stderr == (
        "strategyjob run: error: spec.replicaSpecs: 33 replicas in all, more than strategyjob "
        "run can start on this machine (at most 32: each replica needs 2 open files and this "
        "process may open at most 128 (ulimit -Hn)). Use fewer replicas, or run the job on a "
        "cluster with strategyjob submit.\n"
    )
    manifest = write_job(tmp_path, {"worker": (32, script)})
    ran = subprocess.run(
        [sys.executable, "-m", "strategyjob", "run", str(manifest)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=80,
        preexec_fn=nofile_limit(64, 128),
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for index in range(32):
        assert f"[worker-{index}] nofile 128" in ran.stdout.splitlines(), ran.stdout


def test_cli_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["run"])
    assert info.value.code == 2


def test_live_status_line_on_a_terminal(tmp_path):
    manifest = write_job(
        tmp_path,
        {"worker": (1, "import time\nprint('tick', flush=True)\ntime.sleep(1.2)\nprint('tock')\n")},
    )
    code, screen = run_in_terminal(
        [sys.executable, "-m", "strategyjob", "run", str(manifest)], cli_env()
    )
    assert code == 0
    assert (
        "\r\x1b[Kstrategyjob: demo [MultiWorkerMirroredStrategy] running 1, succeeded 0" in screen
    )
    assert "[worker-0] tick" in screen and "[worker-0] tock" in screen
    assert "strategyjob: job demo succeeded in" in screen


def test_launcher_and_cli_import_no_torch():
    code = (
        "import sys\n"
        "import strategyjob.jobspec, strategyjob.cluster_resolver\n"
        "import strategyjob.launcher, strategyjob.cli\n"
        "bad = [m for m in ('torch', 'kopf', 'kubernetes') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=cli_env(), timeout=60)


def test_tf_config_in_the_launcher_environment_is_replaced(tmp_path):
    manifest = write_job(tmp_path, {"worker": (1, "import os\nprint(os.environ['TF_CONFIG'])\n")})
    env = cli_env()
    env["TF_CONFIG"] = '{"cluster": {"worker": ["elsewhere:1"]}}'
    result = subprocess.run(
        [sys.executable, "-m", "strategyjob", "run", str(manifest)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("[worker-0] ")]
    config = json.loads(line.removeprefix("[worker-0] "))
    assert config["task"] == {"index": 0, "type": "worker"}
    assert config["cluster"]["worker"][0].startswith("127.0.0.1:")


def test_second_interrupt_kills_without_waiting_for_the_grace_period(tmp_path):
    stubborn = LINGERING.replace(
        "import os, subprocess, sys, time",
        "import os, signal, subprocess, sys, time\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    )
    manifest = write_job(tmp_path, {"worker": (2, stubborn)})
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "strategyjob", "run", str(manifest), "--grace-period", "120"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
    roles = ["worker-0", "worker-1"]
    try:
        wait_until(lambda: all((tmp_path / f"{r}.pids").exists() for r in roles), 30, "replicas")
        pids = recorded_pids(tmp_path, roles)
        launcher.send_signal(signal.SIGINT)
        wait_until(lambda: "received SIGINT" in log.read_text(), 10, "the first SIGINT")
        started = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=30)
        assert time.monotonic() - started < 15
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130
    for pid in pids:
        wait_until(lambda pid=pid: not alive(pid), 10, f"pid {pid} to be gone")


def test_suspend_is_ignored_locally_with_a_notice(tmp_path):
    manifest = write_job(tmp_path, {"worker": (1, "print('ran')\n")}, runPolicy={"suspend": True})
    result = run_cli(manifest)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "strategyjob: spec.runPolicy.suspend is true; strategyjob run ignores it and runs the job"
    )
    assert "[worker-0] ran" in lines


def test_leaders_progress_reports_and_the_job_token(tmp_path):
    """Only the leader's strategyjob.report counts (worker-1's are ignored); the final
    output shows its last report, flushed at exit. Every replica gets the same fresh token."""
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                2,
                """
                import hashlib, os, strategyjob
                token = os.environ["STRATEGYJOB_TOKEN"]
                print("token", len(token) >= 32, hashlib.sha256(token.encode()).hexdigest())
                first = os.environ["STRATEGYJOB_REPLICA_INDEX"] == "0"
                for step in range(1, 5):
                    strategyjob.report(step if first else 99, total_steps=4, loss=1 / step)
                """,
            )
        },
    )
    results = [run_cli(manifest) for _ in range(2)]
    digests = []
    for result in results:
        assert result.returncode == 0, result.stdout + result.stderr
        tokens = {line.split()[-1] for line in result.stdout.splitlines() if " token True " in line}
        assert len(tokens) == 1, result.stdout  # the same token for both replicas
        digests.append(tokens.pop())
        assert "strategyjob:   last progress report: step 4/4 (100%) loss=0.25" in result.stdout
        assert "step 99" not in result.stdout
    assert digests[0] != digests[1]  # a new token per job


def test_progress_in_the_live_status_line(tmp_path):
    go = tmp_path / "go"
    manifest = write_job(
        tmp_path,
        {
            "worker": (
                1,
                f"""
                import os, time, strategyjob
                strategyjob.report(3, total_steps=4, loss=0.5)
                deadline = time.monotonic() + 30
                while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:
                    time.sleep(0.05)  # until the test has seen the status line
                """,
            )
        },
    )

    def seen(output: str) -> None:
        if "step 3/4 (75%) loss=0.5" in output:
            go.touch()

    try:
        code, screen = run_in_terminal(
            [sys.executable, "-m", "strategyjob", "run", str(manifest)], cli_env(), seen=seen
        )
    finally:
        go.touch()
    assert code == 0
    assert "running 1, succeeded 0, failed 0, elapsed " in screen
    status_lines = [s for s in screen.split("\r\x1b[K") if "step 3/4 (75%) loss=0.5" in s]
    assert any(
        s.startswith("strategyjob: demo [MultiWorkerMirroredStrategy]") for s in status_lines
    )
