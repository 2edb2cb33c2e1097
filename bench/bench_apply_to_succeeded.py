"""From ``kubectl apply`` to ``Succeeded`` on a real-node kind cluster, against ``strategyjob run``.

Measures the wall time of the same training both ways, alternating which side goes first:

* kind: ``kubectl apply`` of ``examples/digits_mwms/k8s.yaml`` (2 workers,
  MultiWorkerMirroredStrategy) into a fresh namespace, until the StrategyJob's
  ``status.state`` is ``Succeeded`` (polled every 0.25 s); the namespace is deleted after;
* local: ``python -m strategyjob run`` of ``examples/digits_mwms/job.yaml`` on this machine,
  until it exits.

Both get the same ``EPOCHS`` (``--epochs``, default the manifests' 8) and ``OMP_NUM_THREADS=1``
per process. The checkpoint hostPath of the kind job goes under ``/var/strategyjob-shared/
<namespace>``, which every node of a ``tools/kind`` cluster mounts from one host directory.

Where the kind time goes: the same polls note when both pods were first seen created,
scheduled, past their init container, running their training container, and exited (so each
to within a poll); the workers' log lines, read afterwards with the kubelet's timestamps, give
when both were in sync (imports, rendezvous) and when worker 0 saved its checkpoint (the end of
training). The local side is split the same way from the arrival times of its output lines.

The cluster: ``--kubeconfig FILE`` of one with the operator chart installed and the worker
image loaded (the e2e suite's, a dev cluster's); without it, the benchmark makes its own with
tools/kind (create, build and load the images, ``helm install``; timed and printed; up to 32 GB
of disk and 5 - 10 minutes) and deletes it at the end.

    PYTHONPATH=sdk:operator python bench/bench_apply_to_succeeded.py \\
        [--kubeconfig FILE] [--repeat 3] [--epochs 8]

The last line is ``apply->Succeeded: kind=…s strategyjob_run=…s ratio=… (kind / strategyjob
run)`` with the medians of the repetitions.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the shared test support: control-plane binaries, launcher runs
from tests.support.control_plane import find_binaries  # noqa: E402
from tests.support.processes import start_strategyjob_run, stop_strategyjob_run  # noqa: E402

EXAMPLE = ROOT / "examples" / "digits_mwms"
GROUP, VERSION, PLURAL = "strategyjob.dev", "v1alpha1", "strategyjobs"
JOB_LABEL = "strategyjob.dev/job-name"
KIND_SHARED_PATH = "/var/strategyjob-shared"  # every tools/kind node mounts this
RELEASE, RELEASE_NS = "strategyjob-operator", "strategyjob-system"
MIN_FREE_GB = 40  # loading the worker image into a 2-node cluster peaks at about 32 GB
IN_SYNC = re.compile(r"worker-\d+: \d+ replicas in sync")
SAVED = re.compile(r"worker-0: saved checkpoint")
POLL = 0.25


# --- the two manifests -----------------------------------------------------------------------
def training_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == "strategyjob")


def set_env(container: dict[str, Any], values: dict[str, str]) -> None:
    env = [e for e in container.get("env", []) if e["name"] not in values]
    container["env"] = env + [{"name": k, "value": v} for k, v in values.items()]


def kind_manifest(epochs: int, checkpoints: str, image: str | None) -> dict[str, Any]:
    """k8s.yaml with ``epochs``, its checkpoint hostPath at ``checkpoints`` and (when given)
    ``image`` for every container."""
    manifest = yaml.safe_load((EXAMPLE / "k8s.yaml").read_text())
    for spec in manifest["spec"]["replicaSpecs"].values():
        pod = spec["template"]["spec"]
        set_env(training_container(pod), {"EPOCHS": str(epochs), "OMP_NUM_THREADS": "1"})
        for container in pod.get("initContainers", []) + pod["containers"]:
            container["image"] = image or container["image"]
        for volume in pod.get("volumes", []):
            if volume["name"] == "checkpoints":
                volume["hostPath"]["path"] = checkpoints
    return manifest


def local_manifest(epochs: int, workdir: Path) -> dict[str, Any]:
    """job.yaml with ``epochs`` (train.py by its absolute path, the checkpoints under
    ``workdir``)."""
    manifest = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    for spec in manifest["spec"]["replicaSpecs"].values():
        container = training_container(spec["template"]["spec"])
        container["command"] = ["python", str(EXAMPLE / "train.py")]
        set_env(
            container,
            {
                "EPOCHS": str(epochs),
                "OMP_NUM_THREADS": "1",
                "CHECKPOINT_DIR": f"{workdir}/checkpoints/$(STRATEGYJOB_JOB_NAME)",
            },
        )
    return manifest


# --- strategyjob run -------------------------------------------------------------------------
def run_local(epochs: int, timeout: float) -> dict[str, float]:
    """One ``strategyjob run``: total seconds and its phases, from when its lines arrived."""
    with tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        manifest = local_manifest(epochs, Path(tmp))
        marks: dict[str, float] = {}
        in_sync: list[float] = []
        tail: collections.deque[str] = collections.deque(maxlen=20)
        start = time.monotonic()
        proc = start_strategyjob_run(
            manifest, Path(tmp), cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        # Past the deadline it is stopped, which ends the read loop below.
        watchdog = threading.Timer(timeout, stop_strategyjob_run, (proc,))
        watchdog.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                now = time.monotonic() - start
                tail.append(line.rstrip())
                if IN_SYNC.search(line):
                    in_sync.append(now)
                elif SAVED.search(line):
                    marks["saved"] = now
            code = proc.wait(timeout=60)
        finally:
            watchdog.cancel()
            stop_strategyjob_run(proc)
        total = time.monotonic() - start
        if code != 0:
            why = f"killed after {timeout:.0f}s" if total >= timeout else f"exited {code}"
            raise RuntimeError(f"strategyjob run {why}:\n" + "\n".join(tail))
        if in_sync:
            marks["in sync"] = max(in_sync)  # the last worker's
        marks["total"] = total
        return marks


# --- the cluster -----------------------------------------------------------------------------
class Kube:
    """kubectl and the Python client on one kubeconfig."""

    def __init__(self, kubeconfig: Path, bin_dir: Path) -> None:
        from kubernetes import client, config

        self.kubeconfig, self.bin_dir = kubeconfig, bin_dir
        api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]  # the gist
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {last}")
        return proc.stdout


def log_marks(log: str, t0: float) -> dict[str, float]:
    """Seconds after ``t0`` (epoch) of a worker's in-sync line and saved checkpoint, from the
    kubelet's timestamps of its log lines (``kubectl logs --timestamps``, nanoseconds)."""
    marks: dict[str, float] = {}
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        at = datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp() - t0
        if IN_SYNC.search(text):
            marks["in sync"] = at
        elif SAVED.search(text):
            marks["saved"] = at
    return marks


def observe(pods: list[Any], replicas: int, now: float, marks: dict[str, float]) -> None:
    """Note in ``marks`` when (``now``) all ``replicas`` pods first were created, scheduled,
    past their init container, running their training container, and exited."""
    if len(pods) < replicas:
        return
    inits = [s for p in pods for s in p.status.init_container_statuses or []]
    training = [
        s for p in pods for s in p.status.container_statuses or [] if s.name == "strategyjob"
    ]
    started = len(training) == replicas and all(
        s.state.running or s.state.terminated for s in training
    )
    reached = {
        "pod created": True,
        "scheduled": all(p.spec.node_name for p in pods),
        "init done": started or (bool(inits) and all(s.state.terminated for s in inits)),
        "started": started,
        "exited": started and all(s.state.terminated for s in training),
    }
    for key, done in reached.items():
        if done:
            marks.setdefault(key, now)


def check_pulls(pods: list[Any]) -> None:
    """Fail at once (one line) when a pod cannot get its image: the cluster lacks it."""
    for pod in pods:
        statuses = (pod.status.init_container_statuses or []) + (
            pod.status.container_statuses or []
        )
        for status in statuses:
            waiting = status.state.waiting
            if waiting and waiting.reason in ("ErrImageNeverPull", "ImagePullBackOff"):
                raise RuntimeError(
                    f"pod {pod.metadata.name}: {waiting.reason} for {status.image}: load the "
                    "worker image into the cluster (tools/kind/load.sh) or pass --worker-image"
                )


def run_kind(
    kube: Kube, epochs: int, image: str | None, timeout: float
) -> tuple[dict[str, float], list[str]]:
    """One job in a fresh namespace: seconds from ``kubectl apply`` to ``Succeeded`` seen, and
    when its pods got where (seconds after the apply, as polled every ``POLL`` seconds; the
    in-sync and saved lines from the log's timestamps); and its pods' nodes. The namespace is
    deleted after."""
    ns = f"bench-apply-{uuid.uuid4().hex[:6]}"
    manifest = kind_manifest(epochs, f"{KIND_SHARED_PATH}/{ns}", image)
    name = manifest["metadata"]["name"]
    replicas = sum(s["replicas"] for s in manifest["spec"]["replicaSpecs"].values())
    selector = f"{JOB_LABEL}={name}"
    kube.kubectl("create", "namespace", ns)
    try:
        marks: dict[str, float] = {}
        t0 = time.time()
        start = time.monotonic()
        kube.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        marks["applied"] = time.monotonic() - start
        while True:
            now = time.monotonic() - start
            job = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            pods = kube.core.list_namespaced_pod(ns, label_selector=selector).items
            observe(pods, replicas, now, marks)
            state = (job.get("status") or {}).get("state")
            if state == "Succeeded":
                marks["total"] = time.monotonic() - start
                break
            if state == "Failed" or now > timeout:
                raise RuntimeError(f"job {ns}/{name} is {state} after {now:.0f}s: {job}")
            check_pulls(pods)
            time.sleep(POLL)
        per_pod = [
            log_marks(
                kube.core.read_namespaced_pod_log(
                    pod.metadata.name, ns, container="strategyjob", timestamps=True
                )
                or "",
                t0,
            )
            for pod in pods
        ]
        if all("in sync" in m for m in per_pod):
            marks["in sync"] = max(m["in sync"] for m in per_pod)  # the last worker's
        saved = [m["saved"] for m in per_pod if "saved" in m]  # worker-0's
        if saved:
            marks["saved"] = saved[0]
        return marks, sorted(pod.spec.node_name or "?" for pod in pods)
    finally:
        try:
            kube.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", timeout=200)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"  (namespace {ns} not deleted in time: {e})", flush=True)
        shared = kube.kubeconfig.parent / "shared" / ns  # tools/kind's host side of it
        shutil.rmtree(shared, ignore_errors=True)


class OwnCluster:
    """A tools/kind cluster made for this run (and deleted by :meth:`delete`)."""

    def __init__(self, name: str, bin_dir: Path) -> None:
        self.name, self.bin_dir = name, bin_dir
        self.timings: dict[str, float] = {}

    def _step(self, what: str, argv: list[str], timeout: float) -> str:
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed ({' '.join(argv)} exited {proc.returncode})")
        self.timings[what] = time.monotonic() - start
        print(f"setup: {what} {self.timings[what]:.1f}s", flush=True)
        return proc.stdout

    def create(self) -> tuple[Path, str]:
        """Make the cluster, load the images, install the chart: (kubeconfig, worker image)."""
        out = self._step(
            "cluster create", ["bash", "tools/kind/cluster.sh", "create", self.name, "1"], 900
        )
        kubeconfig = Path(out.strip().splitlines()[-1])
        out = self._step("images build", ["bash", "tools/images/build.sh"], 3600)
        operator_image, worker_image = out.strip().splitlines()[-2:]
        self._step(
            "images load",
            ["bash", "tools/kind/load.sh", self.name, operator_image, worker_image],
            1800,
        )
        repository, tag = operator_image.rsplit(":", 1)
        self._step(
            "chart Ready",
            [
                str(self.bin_dir / "helm"), "install", RELEASE, "helm/strategyjob-operator",
                "--kubeconfig", str(kubeconfig), "--namespace", RELEASE_NS, "--create-namespace",
                "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                "--set", "image.pullPolicy=Never", "--wait", "--timeout", "5m",
            ],
            400,
        )  # fmt: skip
        return kubeconfig, worker_image

    def delete(self) -> None:
        subprocess.run(
            ["bash", "tools/kind/cluster.sh", "delete", self.name], cwd=ROOT, timeout=300
        )


# --- report ----------------------------------------------------------------------------------
KIND_PHASES = [
    ("kubectl apply (until it returned)", None, "applied"),
    ("applied -> pods created", "applied", "pod created"),
    ("pods created -> scheduled", "pod created", "scheduled"),
    ("scheduled -> init container done", "scheduled", "init done"),
    ("init done -> training containers started", "init done", "started"),
    ("started -> both workers in sync (imports, rendezvous)", "started", "in sync"),
    ("in sync -> checkpoint saved (training)", "in sync", "saved"),
    ("saved -> containers exited", "saved", "exited"),
    ("exited -> Succeeded seen", "exited", "total"),
]
LOCAL_PHASES = [
    ("start -> both workers in sync (launch, imports, rendezvous)", None, "in sync"),
    ("in sync -> checkpoint saved (training)", "in sync", "saved"),
    ("saved -> strategyjob run exited", "saved", "total"),
]


def phases(marks: dict[str, float], table: list[tuple[str, str | None, str]]) -> dict[str, float]:
    out = {}
    for label, begin, end in table:
        if end in marks and (begin is None or begin in marks):
            out[label] = marks[end] - (marks[begin] if begin else 0.0)
    return out


def print_phases(title: str, runs: list[dict[str, float]], table) -> None:
    print(title)
    split = [phases(m, table) for m in runs]
    for label, _, _ in table:
        values = [p[label] for p in split if label in p]
        if values:
            each = ", ".join(f"{v:5.1f}" for v in values)
            print(f"  {label:58s} median {statistics.median(values):5.1f}s  ({each})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, help="a cluster with the chart installed")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each side")
    parser.add_argument("--epochs", type=int, default=8, help="EPOCHS of both runs")
    parser.add_argument("--worker-image", help="the jobs' image (default: the manifest's)")
    parser.add_argument("--cluster-name", default="sj-bench-apply", help="the cluster it makes")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run at most")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.epochs < 1:
        parser.error("--repeat and --epochs must be at least 1")
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        parser.error(f"--kubeconfig {args.kubeconfig}: no such file")

    # SIGTERM ends it like Ctrl-C: through the finally clauses that stop what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bin_dir, why = find_binaries()
    if bin_dir is None:
        print(f"no kubectl and helm: {why}", file=sys.stderr)
        return 2
    own: OwnCluster | None = None
    try:
        if args.kubeconfig is None:
            free_gb = shutil.disk_usage("/").free / 2**30
            if free_gb < MIN_FREE_GB:
                print(
                    f"only {free_gb:.0f} GB free on /, a kind cluster with the worker image "
                    f"needs about 30 GB (this refuses below {MIN_FREE_GB}): free some, or pass "
                    "--kubeconfig of an existing cluster",
                    file=sys.stderr,
                )
                return 2
            own = OwnCluster(args.cluster_name, bin_dir)
            kubeconfig, image = own.create()
            image = args.worker_image or image
        else:
            kubeconfig, image = args.kubeconfig, args.worker_image
        kube = Kube(kubeconfig, bin_dir)
        try:
            kube.kubectl("get", "crd", f"{PLURAL}.{GROUP}")
        except RuntimeError as e:
            print(
                f"{kubeconfig}: cannot find the StrategyJob CRD ({e}): install the chart "
                "helm/strategyjob-operator first (README: End-to-end tests)",
                file=sys.stderr,
            )
            return 2
        print(
            f"cluster {kubeconfig}; {args.epochs} epochs, 2 workers, OMP_NUM_THREADS=1; "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start",
            flush=True,
        )
        kind_runs: list[dict[str, float]] = []
        local_runs: list[dict[str, float]] = []
        for i in range(args.repeat):
            order = ["local", "kind"] if i % 2 == 0 else ["kind", "local"]
            for side in order:
                load = os.getloadavg()[0]
                where = ""
                if side == "kind":
                    marks, nodes = run_kind(kube, args.epochs, image, args.timeout)
                    kind_runs.append(marks)
                    where = f", pods on {' + '.join(nodes)}"
                else:
                    marks = run_local(args.epochs, args.timeout)
                    local_runs.append(marks)
                training = marks.get("saved", math.nan) - marks.get("in sync", math.nan)
                print(
                    f"run {i + 1} {side:5s}: {marks['total']:6.1f}s  "
                    f"(training {training:.1f}s, load {load:.1f}{where})",
                    flush=True,
                )
        print_phases("kind, seconds after the apply:", kind_runs, KIND_PHASES)
        print_phases("strategyjob run, seconds:", local_runs, LOCAL_PHASES)
        kind = statistics.median(m["total"] for m in kind_runs)
        local = statistics.median(m["total"] for m in local_runs)
        print(f"load {os.getloadavg()[0]:.1f} at the end")
        print(
            f"apply->Succeeded: kind={kind:.1f}s strategyjob_run={local:.1f}s "
            f"ratio={kind / local:.2f} (kind / strategyjob run, medians of {args.repeat})"
        )
        return 0
    finally:
        if own is not None:
            own.delete()


if __name__ == "__main__":
    sys.exit(main())
