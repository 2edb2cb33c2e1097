"""Child processes of tests and benchmarks: their environment, and runs that leave nothing
behind (each in a session of its own, killed whole past its deadline or when the caller
stops early)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

#: The repository's SDK, first on a child's PYTHONPATH (the code under test, not an install).
SDK = Path(__file__).resolve().parents[2] / "sdk"
#: What a cluster (or an outer launcher) sets; a child that is not one of its replicas drops it.
CLUSTER_ENV = ("TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


#: The signals a test sends to a child to interrupt it.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_interrupts() -> None:
    """``preexec_fn`` of a child that a test interrupts: it starts with the default handling
    of :data:`INTERRUPTS`, whatever the test run inherited (a run under ``nohup`` ignores
    SIGHUP, a background job of a non-interactive shell ignores SIGINT, and an ignored signal
    stays ignored across exec: Python then installs no handler of its own for it)."""
    for sig in INTERRUPTS:
        signal.signal(sig, signal.SIG_DFL)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without a cluster's variables, with the SDK first on
    PYTHONPATH and one compute thread (several processes share few cores), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SDK), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def stop(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` if it still runs, with its whole session when it leads one (its
    children too), and reap it."""
    if proc.poll() is None:
        try:
            if os.getsid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
    proc.wait()


class Outcome(NamedTuple):
    returncode: int | None
    output: str
    timed_out: bool


def run_in_session(
    argv: Sequence[str], env: Mapping[str, str], timeout: float, cwd: Path | None = None
) -> Outcome:
    """Run ``argv`` (in ``cwd``) in a session of its own, stdout and stderr together; past
    ``timeout`` the session is killed whole (its forked workers too) and ``timed_out`` is set."""
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        output, _ = proc.communicate()
        return Outcome(None, output, True)
    finally:
        stop(proc)
    return Outcome(proc.returncode, output, False)


def result_line(output: str, prefix: str = "RESULT ") -> dict[str, Any] | None:
    """The JSON of the last line of ``output`` that starts with ``prefix``; None if none."""
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    return json.loads(lines[-1][len(prefix) :]) if lines else None


def start_strategyjob_run(
    manifest: Mapping[str, Any], directory: Path, **popen: Any
) -> subprocess.Popen[Any]:
    """Write ``manifest`` to ``directory/job.yaml`` and start ``strategyjob run`` on it in a
    session of its own (:func:`stop_strategyjob_run` ends it with its replicas), CPU only;
    ``popen``: where its output goes."""
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(dict(manifest), sort_keys=False))
    argv = [sys.executable, "-m", "strategyjob", "run", str(path), "--no-status"]
    env = child_env(CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(argv, env=env, start_new_session=True, **popen)


def stop_strategyjob_run(proc: subprocess.Popen[Any], grace: float = 30) -> None:
    """End a ``strategyjob run`` that may still run: SIGTERM first, so that it stops its
    replicas, each in a session of its own that killing its session would not reach; past
    ``grace`` seconds, its session is killed."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    stop(proc)


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (Linux ``/proc``): how a test sees that a
    process has reached a server socket it opens, without a line it prints."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
