"""Operator benchmark on the local control plane (not a timed test).

Measures, with the operator running as it does in a cluster (its own process):
  1. one StrategyJob with 1000 workers: seconds from creating it until all 1000 pods and
     the Service exist;
  2. 100 StrategyJobs with 8 workers each: seconds until all 800 pods and 100 Services exist;
  3. the operator's peak resident memory while it holds 1000 StrategyJobs.

With ``--resync``, it measures instead what the periodic resync costs (each active job
passed over every ``STRATEGYJOB_RESYNC_SECONDS``, default 60, to notice what no watch event
reported): N idle running jobs of 2 workers (``--idle-jobs``, default 1000), their pods set
Running, then over a window of two periods the operator's passes, the API calls they make
(the API server's own request counters: GETs of StrategyJobs, LISTs of pods, writes of
StrategyJobs and pods) and the operator's CPU time, per minute, and its memory. Then, beside
them, one job of 1000 workers: the operator's CPU while all its pods turn Running (the bench
writes their status as kubelets would) and, once it runs, what its resyncs add. With
``--baseline-src DIR`` (a checkout of an earlier commit, e.g. ``git worktree add``), that
checkout's operator runs the same first, in namespaces of its own, and the last line is
baseline / this tree for each figure.

With ``--tfjob-operator PATH`` (Kubeflow's training-operator v1 binary, built outside this
repository as bench/README.md shows), the same run first times TFJob on the same control
plane: one TFJob with 1000 workers and 100 TFJobs with 8 workers, each until all its pods and
its Services (one per replica) exist, with the training-operator's default client rate limits.
It then stops the training-operator, deletes its namespaces and runs (1)-(3); the last line is
the measured ratio. Without it, the last line compares (1) with TFJob's client-rate bound: its
default 20 requests/s needs at least 1000 / 20 = 50 s for 1000 pods (100 s counting its
Service per pod).

With ``--served-tfjobs``, it measures instead what serving TFJobs costs this operator (started
with ``STRATEGYJOB_SERVE_TFJOBS=true``): one TFJob of 1000 workers until its 1000 pods and 1000
per-replica Services exist, against the same job as a StrategyJob (1000 pods, one Service), in
alternating rounds (``--rounds``, default 2) on one control plane; the last line is the median
ratio TFJob / StrategyJob, and TFJob through Kubeflow's training-operator as recorded on this
control plane (bench/README.md) / TFJob through this operator.

    K8S_BIN_DIR=... PYTHONPATH=sdk:operator python bench/bench_operator.py [--quick]
        [--tfjob-operator PATH [--tfjob-crd PATH] [--tfjob-timeout S] [--tfjob-skip-many]]
    ... python bench/bench_operator.py --resync [--idle-jobs N] [--resync-seconds S]
        [--baseline-src DIR]
    ... python bench/bench_operator.py --served-tfjobs [--rounds N]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the control plane is test tooling: tests/support

from tests.support import control_plane as cp_mod  # noqa: E402

TFJOB_QPS = 20
SJOB_SELECTOR = "strategyjob.dev/job-name"

# Kubeflow's training-operator v1 (TFJob). Its defaults, which this benchmark keeps:
# --kube-api-qps 20, --kube-api-burst 30, --controller-threads 1, no gang scheduler.
TF_SELECTOR = "training.kubeflow.org/job-name"
TF_OPERATOR_NS = "kubeflow"  # where its webhook-certificate Secret lives (MY_POD_NAMESPACE)
TF_SECRET = "training-operator-webhook-cert"  # its --webhook-secret-name default
# Hard-coded in training-operator's pkg/cert: in a cluster the Secret above is mounted here.
TF_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
TF_BUILD_HINT = "build it as bench/README.md ('TFJob side by side') shows"
#: training-operator v1.9.4's 1000-worker TFJob on this control plane (bench/README.md, runs of
#: 2026-11-22: 100.29 s and 100.99 s; client-rate bound, so load does not move it).
TF_RECORDED_ONE_JOB_S = 100.3


class Api:
    """Minimal synchronous client for the benchmark's own calls."""

    def __init__(self, cp) -> None:
        self.server, self.token = cp.server, cp.token
        self.ctx = ssl.create_default_context(cafile=str(cp.ca_path))

    def call(
        self,
        method: str,
        path: str,
        body=None,
        accept="application/json",
        content_type="application/json",
    ):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": content_type,
                "Accept": accept,
            },
        )
        with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
            raw = r.read()
            return raw.decode() if accept == "text/plain" else json.loads(raw)

    def count(self, namespace: str, plural: str, selector: str) -> int:
        """Objects matching ``selector``, fetching metadata only (cheap while polling)."""
        accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        path = f"/api/v1/namespaces/{namespace}/{plural}?labelSelector={selector}"
        return len(self.call("GET", path, accept=accept).get("items") or [])


def job(name: str, workers: int) -> dict:
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {
                    "replicas": workers,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "strategyjob", "image": "train", "command": ["train"]}
                            ]
                        }
                    },
                }
            },
        },
    }


def tfjob(name: str, workers: int) -> dict:
    """The TFJob equivalent of :func:`job`: the same minimal pod template, in the container
    TFJob treats as the training container (``tensorflow``)."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "Never",
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "tensorflow", "image": "train", "command": ["train"]}
                            ]
                        }
                    },
                }
            }
        },
    }


def create_namespace(api: Api, ns: str) -> None:
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})


def create_jobs(api: Api, ns: str, jobs: list[dict]) -> None:
    for j in jobs:
        api.call("POST", f"/apis/strategyjob.dev/v1alpha1/namespaces/{ns}/strategyjobs", j)


def create_tfjobs(api: Api, ns: str, jobs: list[dict]) -> None:
    for j in jobs:
        api.call("POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs", j)


def poll_children(
    api: Api,
    ns: str,
    selector: str,
    pods: int,
    services: int,
    deadline: float,
    interval: float = 0.1,
) -> bool:
    """Whether ``pods`` pods and ``services`` Services matching ``selector`` exist in ``ns``
    before ``deadline`` (``time.monotonic()``)."""
    while True:
        if (
            api.count(ns, "pods", selector) >= pods
            and api.count(ns, "services", selector) >= services
        ):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def wait_children(api: Api, ns: str, pods: int, services: int, timeout: float) -> None:
    if not poll_children(api, ns, SJOB_SELECTOR, pods, services, time.monotonic() + timeout):
        raise TimeoutError(f"{pods} pods / {services} services not created in {timeout:.0f}s")


def delete_namespaces(api: Api, names: list[str], timeout: float) -> bool:
    """Delete ``names`` and wait until they are gone; whether they went within ``timeout``."""
    for ns in names:
        api.call("DELETE", f"/api/v1/namespaces/{ns}")
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending and time.monotonic() < deadline:
        try:
            api.call("GET", f"/api/v1/namespaces/{pending[0]}")
            time.sleep(0.5)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
            pending.pop(0)
    return not pending


def wait_established(cp, crd: str, timeout: float = 60.0) -> None:
    """``kubectl wait`` for the CRD, retried: right after creation its status may not have
    conditions yet, and kubectl then fails instead of waiting."""
    deadline = time.monotonic() + timeout
    while True:
        proc = cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}", check=False)
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"crd/{crd} not established: {proc.stderr.strip()}")
        time.sleep(0.5)


def _status_mib(pid: int, field: str) -> float:
    """A memory figure of ``/proc/PID/status`` (kB there), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib(pid: int) -> float:
    return _status_mib(pid, "VmHWM")


def rss_mib(pid: int) -> float:
    return _status_mib(pid, "VmRSS")


def stop_process(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class TrainingOperator:
    """Kubeflow's training-operator v1 as a local process, serving TFJob only.

    It has no switch to turn off its webhook certificate management: at start it fills the
    Secret ``kubeflow/training-operator-webhook-cert`` with a CA and a serving certificate,
    then waits (about 17 minutes at most, then exits) until the certificate appears in
    ``/tmp/k8s-webhook-server/serving-certs``, where a cluster mounts that Secret, before it
    registers its controllers. This class plays the kubelet: it creates the empty Secret, waits
    for the operator to fill it and writes the two files there. No
    ValidatingWebhookConfiguration is installed, so the API server never calls its webhook
    (the operator only logs that it found none to inject the CA into). Everything else is the
    binary's default, client rate limits included.
    """

    def __init__(self, binary: Path, cp, api: Api) -> None:
        self.binary, self.cp, self.api = binary, cp, api
        self.proc: subprocess.Popen | None = None
        self.log_path = cp.dir / "training-operator.log"
        self._written: list[Path] = []
        self._made_dirs: list[Path] = []

    def start(self, timeout: float = 180.0) -> None:
        if (TF_CERT_DIR / "tls.crt").exists():
            raise RuntimeError(
                f"{TF_CERT_DIR}/tls.crt already exists: another training-operator may be using "
                "it (the path is hard-coded in it); remove it if it is stale"
            )
        create_namespace(self.api, TF_OPERATOR_NS)
        self.api.call(
            "POST",
            f"/api/v1/namespaces/{TF_OPERATOR_NS}/secrets",
            {"metadata": {"name": TF_SECRET}},
        )
        free = cp_mod.free_port
        probe = free()
        argv = [
            str(self.binary),
            f"--kubeconfig={self.cp.kubeconfig}",
            "--enable-scheme=tfjob",
            f"--metrics-bind-address=127.0.0.1:{free()}",
            f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--webhook-server-port={free()}",
            "--leader-elect=false",
        ]
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cp.kubeconfig),
            "MY_POD_NAMESPACE": TF_OPERATOR_NS,
        }
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        secret = f"/api/v1/namespaces/{TF_OPERATOR_NS}/secrets/{TF_SECRET}"
        while True:
            self._check_alive(deadline, "fill its webhook-certificate Secret")
            data = self.api.call("GET", secret).get("data") or {}
            if "tls.crt" in data and "tls.key" in data:
                break
            time.sleep(0.2)
        self._mount(data)
        ready = urllib.request.Request(f"http://127.0.0.1:{probe}/readyz")
        while True:
            self._check_alive(deadline, "become ready")
            try:
                with urllib.request.urlopen(ready, timeout=2) as r:
                    is_ready = r.status == 200
            except OSError:
                is_ready = False
            if is_ready and b"Starting workers" in self.log_path.read_bytes():
                return
            time.sleep(0.3)

    def _check_alive(self, deadline: float, what: str) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"training-operator exited with {self.proc.returncode}; log: {self.log_path}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"training-operator did not {what} in time; log: {self.log_path}")

    def _mount(self, data: dict) -> None:
        for d in (TF_CERT_DIR.parent, TF_CERT_DIR):
            if not d.exists():
                d.mkdir()
                self._made_dirs.append(d)
        for key in ("tls.crt", "tls.key"):
            path = TF_CERT_DIR / key
            path.write_bytes(base64.b64decode(data[key]))
            self._written.append(path)

    def stop(self) -> None:
        stop_process(self.proc)
        for path in self._written:
            path.unlink(missing_ok=True)
        for d in reversed(self._made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass


def time_tfjobs(
    api: Api, ns: str, jobs: list[dict], pods: int, services: int, timeout: float
) -> tuple[float, bool]:
    """Seconds from creating ``jobs`` until their pods and Services exist (at most
    ``timeout``), and whether they all did."""
    create_namespace(api, ns)
    start = time.monotonic()
    create_tfjobs(api, ns, jobs)
    done = poll_children(api, ns, TF_SELECTOR, pods, services, start + timeout, interval=0.5)
    return time.monotonic() - start, done


def run_tfjob(api: Api, cp, binary: Path, crd: Path, timeout: float, many: bool) -> dict:
    """TFJob's figures on this control plane; the namespaces it used are deleted afterwards."""
    proc = cp.kubectl("create", "-f", str(crd), check=False)  # too big for client-side apply
    if proc.returncode != 0:
        raise RuntimeError(f"cannot install {crd}: {proc.stderr.strip()}")
    wait_established(cp, "tfjobs.kubeflow.org")
    op = TrainingOperator(binary, cp, api)
    results: dict = {}
    namespaces = [TF_OPERATOR_NS]
    try:
        op.start()
        print(
            f"training-operator {binary} running (--enable-scheme=tfjob, default client rate "
            "limits: --kube-api-qps 20 --kube-api-burst 30, --controller-threads 1)"
        )
        cases = [("one", "tf-one", [tfjob("big", 1000)], 1000, "1 TFJob x 1000 workers")]
        if many:
            jobs = [tfjob(f"j{i}", 8) for i in range(100)]
            cases.append(("many", "tf-many", jobs, 800, "100 TFJobs x 8 workers"))
        for key, ns, jobs, pods, label in cases:
            namespaces.append(ns)
            # TFJob v1 creates one Service per replica, named like its pod
            seconds, done = time_tfjobs(api, ns, jobs, pods, pods, timeout)
            n_pods = api.count(ns, "pods", TF_SELECTOR)
            n_svc = api.count(ns, "services", TF_SELECTOR)
            results[key] = (seconds, done)
            if done:
                print(
                    f"{label}: all {n_pods} pods and {n_svc} services exist after {seconds:.2f} s"
                )
            else:
                print(
                    f"{label}: only {n_pods}/{pods} pods and {n_svc}/{pods} services after "
                    f"{seconds:.0f} s (stopped waiting; the time is a lower bound)"
                )
                break  # the operator is still busy with this case; the next would queue behind it
        held = sum(len(case[2]) for case in cases[: len(results)])
        rss = peak_rss_mib(op.proc.pid)
        print(f"training-operator peak RSS while holding {held} TFJobs: {rss:.0f} MiB")
    finally:
        op.stop()
    t0 = time.monotonic()
    gone = delete_namespaces(api, namespaces, timeout=300)
    state = "deleted" if gone else "still deleting (continuing anyway)"
    print(
        f"TFJob namespaces {state} after {time.monotonic() - t0:.0f} s; training-operator stopped"
    )
    return results


def start_operator(cp, log_name: str, **extra_env: str) -> subprocess.Popen:
    """This tree's operator as its own process, watching every namespace."""
    env = {
        **os.environ,
        "KUBECONFIG": str(cp.kubeconfig),
        "PYTHONPATH": f"{ROOT / 'sdk'}{os.pathsep}{ROOT / 'operator'}",
        "STRATEGYJOB_METRICS_PORT": "0",
        **extra_env,
    }
    log = open(cp.dir / log_name, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "strategyjob_operator", "-A", "--standalone"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    time.sleep(2)  # let kopf list and start watching before the clock starts
    return proc


def run_served_tfjobs(api: Api, cp, rounds: int) -> int:
    """One 1000-worker TFJob and the same StrategyJob through this operator, alternating."""
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    wait_established(cp, "strategyjobs.strategyjob.dev")
    wait_established(cp, "tfjobs.kubeflow.org")
    op = start_operator(cp, "operator.log", STRATEGYJOB_SERVE_TFJOBS="true")
    times: dict[str, list[float]] = {"strategyjob": [], "tfjob": []}
    try:
        for r in range(rounds):
            order = ("strategyjob", "tfjob") if r % 2 == 0 else ("tfjob", "strategyjob")
            for kind in order:
                ns = f"{kind}-{r}"
                create_namespace(api, ns)
                t0 = time.perf_counter()
                if kind == "tfjob":
                    create_tfjobs(api, ns, [tfjob("big", 1000)])
                    done = poll_children(api, ns, TF_SELECTOR, 1000, 1000, time.monotonic() + 600)
                else:
                    create_jobs(api, ns, [job("big", 1000)])
                    done = poll_children(api, ns, SJOB_SELECTOR, 1000, 1, time.monotonic() + 600)
                seconds = time.perf_counter() - t0
                if not done:
                    raise TimeoutError(f"{kind} round {r}: children not created in 600 s")
                times[kind].append(seconds)
                services = 1000 if kind == "tfjob" else 1
                load = os.getloadavg()[0]
                print(
                    f"round {r} {kind} x 1000 workers: 1000 pods and {services} Service(s) "
                    f"after {seconds:.2f} s (load {load:.1f})"
                )
                delete_namespaces(api, [ns], timeout=300)
        print(f"operator peak RSS: {peak_rss_mib(op.pid):.0f} MiB")
    finally:
        stop_process(op)
    ratios = [t / s for t, s in zip(times["tfjob"], times["strategyjob"])]
    tf_median = statistics.median(times["tfjob"])
    print(
        f"1 job x 1000 workers: strategyjob={statistics.median(times['strategyjob']):.2f}s "
        f"tfjob_served={tf_median:.2f}s ratio={statistics.median(ratios):.2f} "
        f"(tfjob/strategyjob, aim <= 1.2); training-operator (recorded) "
        f"{TF_RECORDED_ONE_JOB_S:.1f}s / served {tf_median:.2f}s = "
        f"{TF_RECORDED_ONE_JOB_S / tf_median:.1f}x faster"
    )
    return 0


def fmt_ratio(name: str, ours: float, theirs: tuple[float, bool] | None) -> str:
    if theirs is None:
        return f"{name}: strategyjob={ours:.2f}s tfjob=not-run"
    seconds, done = theirs
    cmp = "=" if done else ">="
    return (
        f"{name}: strategyjob={ours:.2f}s tfjob{cmp}{seconds:.2f}s "
        f"ratio{cmp}{seconds / ours:.1f} (tfjob/strategyjob)"
    )


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def apiserver_requests(api: Api) -> dict[str, float]:
    """The API server's request counters that the operator's passes move: GETs of
    StrategyJobs, LISTs of pods, and the writes a pass could make (StrategyJob status,
    pod creations and deletions)."""
    out = {"get_jobs": 0.0, "list_pods": 0.0, "writes": 0.0}
    for line in api.call("GET", "/metrics", accept="text/plain").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        verb = labels.split('verb="', 1)[1].split('"', 1)[0]
        resource = (
            labels.split('resource="', 1)[1].split('"', 1)[0] if "resource=" in labels else ""
        )
        if verb == "GET" and resource == "strategyjobs":
            out["get_jobs"] += float(value)
        elif verb == "LIST" and resource == "pods":
            out["list_pods"] += float(value)
        elif (resource == "strategyjobs" and verb in ("PATCH", "PUT", "POST", "DELETE")) or (
            resource == "pods" and verb in ("POST", "DELETE")
        ):
            out["writes"] += float(value)  # not the scheduler's status patches and Events
    return out


def operator_passes(port: int) -> tuple[float, float]:
    """(all reconcile passes, passes no event started) from the operator's metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    passes = timed = 0.0
    for line in text.splitlines():
        if line.startswith("strategyjob_operator_reconcile_duration_seconds_count "):
            passes = float(line.split()[1])
        elif line.startswith("strategyjob_operator_timed_passes_total{"):
            timed += float(line.rsplit(" ", 1)[1])
    return passes, timed


def set_running(api: Api, ns: str, names: list[str]) -> None:
    """Play the kubelet: every pod Running, its training container started."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "strategyjob",
                    "ready": True,
                    "restartCount": 0,
                    "image": "train",
                    "imageID": "",
                    "state": {"running": {"startedAt": now}},
                }
            ],
        }
    }
    for name in names:
        api.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}/status",
            status,
            content_type="application/merge-patch+json",
        )


def wait_state(api: Api, ns: str, jobs: int, timeout: float) -> None:
    """Until the status of all ``jobs`` jobs of ``ns`` says Running."""
    deadline = time.monotonic() + timeout
    path = f"/apis/strategyjob.dev/v1alpha1/namespaces/{ns}/strategyjobs"
    while True:
        items = api.call("GET", path)["items"]
        running = sum(1 for j in items if (j.get("status") or {}).get("state") == "Running")
        if running == jobs:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {running} of {jobs} jobs of {ns} Running after {timeout} s")
        time.sleep(1)


def run_resync(api: Api, cp, jobs: int, period: float, src: Path, tag: str) -> dict[str, float]:
    """The operator of ``src`` (a checkout's root) holding ``jobs`` idle running 2-worker jobs
    and one running 1000-worker job: what the periodic resync costs (see the docstring), the
    CPU the big job's pods all turning Running costs, and the operator's memory."""
    port = cp_mod.free_port()
    idle, big = f"idle-{tag}", f"big-{tag}"
    env = {
        **os.environ,
        "KUBECONFIG": str(cp.kubeconfig),
        "PYTHONPATH": f"{src / 'sdk'}{os.pathsep}{src / 'operator'}",
        "STRATEGYJOB_METRICS_PORT": str(port),
        "STRATEGYJOB_RESYNC_SECONDS": f"{period:g}",
        "OMP_NUM_THREADS": "1",
    }
    for ns in (idle, big):
        create_namespace(api, ns)
    log = open(cp.dir / f"operator-{tag}.log", "wb")
    op = subprocess.Popen(
        [sys.executable, "-m", "strategyjob_operator", "--standalone", "-n", idle, "-n", big],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        create_jobs(api, idle, [job(f"i{i}", 2) for i in range(jobs)])
        wait_children(api, idle, 2 * jobs, jobs, timeout=1200)
        pods = api.call("GET", f"/api/v1/namespaces/{idle}/pods?labelSelector={SJOB_SELECTOR}")
        set_running(api, idle, [p["metadata"]["name"] for p in pods["items"]])
        wait_state(api, idle, jobs, 600)
        # settle: the passes the Running pods woke, then at least one resync of every job
        time.sleep(period * 1.2)
        window = 2 * period
        passes0, timed0 = operator_passes(port)
        cpu0, req0, t0 = cpu_seconds(op.pid), apiserver_requests(api), time.monotonic()
        time.sleep(window)
        passes1, timed1 = operator_passes(port)
        cpu1, req1 = cpu_seconds(op.pid), apiserver_requests(api)
        minutes = (time.monotonic() - t0) / 60
        per_min = {k: (req1[k] - req0[k]) / minutes for k in req0}
        cpu = (cpu1 - cpu0) / minutes
        timed = (timed1 - timed0) / minutes
        held_rss = rss_mib(op.pid)
        print(
            f"[{tag}] {jobs} idle running jobs x 2 workers, resync every {period:g} s "
            f"(window {window:g} s): {(passes1 - passes0) / minutes:.0f} passes/min "
            f"({timed:.0f} resyncs/min); API calls/min: {per_min['get_jobs']:.0f} GET "
            f"StrategyJob + {per_min['list_pods']:.0f} LIST pods, {per_min['writes']:.0f} writes; "
            f"operator CPU {cpu:.1f} s/min ({100 * cpu / 60:.1f}% of one core), "
            f"{1000 * (cpu1 - cpu0) / max(passes1 - passes0, 1):.1f} ms per pass; "
            f"RSS {held_rss:.0f} MiB",
            flush=True,
        )

        create_jobs(api, big, [job("big", 1000)])
        wait_children(api, big, 1000, 1, timeout=600)
        time.sleep(5)  # the passes the pods' creation woke
        passes0, _ = operator_passes(port)
        cpu0, t0 = cpu_seconds(op.pid), time.monotonic()
        pods = api.call("GET", f"/api/v1/namespaces/{big}/pods?labelSelector={SJOB_SELECTOR}")
        set_running(api, big, [p["metadata"]["name"] for p in pods["items"]])
        wait_state(api, big, 1, 600)
        burst_cpu, burst_s = cpu_seconds(op.pid) - cpu0, time.monotonic() - t0
        burst_passes = operator_passes(port)[0] - passes0
        print(
            f"[{tag}] 1 job x 1000 workers, every pod turned Running: the job Running after "
            f"{burst_s:.1f} s, {burst_passes:.0f} passes, operator CPU {burst_cpu:.1f} s "
            f"({1000 * burst_cpu / max(burst_passes, 1):.0f} ms per pass); operator peak RSS "
            f"{peak_rss_mib(op.pid):.0f} MiB, now {rss_mib(op.pid):.0f} MiB",
            flush=True,
        )
        time.sleep(period * 1.2)  # settle, then the resyncs with the big job held too
        cpu0, t0 = cpu_seconds(op.pid), time.monotonic()
        time.sleep(window)
        held_cpu = (cpu_seconds(op.pid) - cpu0) / ((time.monotonic() - t0) / 60)
        print(
            f"[{tag}] holding both ({jobs} x 2 and 1 x 1000 workers, all Running): operator CPU "
            f"{held_cpu:.1f} s/min, of which the big job's resyncs {held_cpu - cpu:.1f}; "
            f"RSS {rss_mib(op.pid):.0f} MiB",
            flush=True,
        )
        return {
            "cpu_per_min": cpu,
            "burst_cpu": burst_cpu,
            "big_cpu_per_min": held_cpu - cpu,
            "rss": peak_rss_mib(op.pid),
        }
    finally:
        stop_process(op)
        log.close()


def check_tfjob_args(args) -> str | None:
    """Why the TFJob side cannot run, or None."""
    binary = args.tfjob_operator
    if not binary.is_file():
        return f"--tfjob-operator {binary}: no such file; {TF_BUILD_HINT}"
    if not os.access(binary, os.X_OK):
        return f"--tfjob-operator {binary}: not executable"
    if not args.tfjob_crd.is_file():
        return (
            f"--tfjob-crd {args.tfjob_crd}: no such file; copy manifests/base/crds/"
            f"kubeflow.org_tfjobs.yaml from the training-operator module ({TF_BUILD_HINT})"
        )
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1000-job memory run")
    env_op = os.environ.get("TFJOB_OPERATOR")
    parser.add_argument(
        "--tfjob-operator",
        type=Path,
        default=Path(env_op) if env_op else None,
        metavar="PATH",
        help="Kubeflow training-operator v1 binary: also time TFJob in the same run "
        "(default: $TFJOB_OPERATOR)",
    )
    parser.add_argument(
        "--tfjob-crd",
        type=Path,
        default=None,
        metavar="PATH",
        help="the TFJob CRD (kubeflow.org_tfjobs.yaml; default: $TFJOB_CRD, else next to "
        "the binary)",
    )
    parser.add_argument(
        "--tfjob-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait for each TFJob case before reporting a lower bound (300)",
    )
    parser.add_argument(
        "--tfjob-skip-many", action="store_true", help="TFJob: only the 1000-worker job"
    )
    parser.add_argument(
        "--resync", action="store_true", help="measure only what the periodic resync costs"
    )
    parser.add_argument(
        "--served-tfjobs",
        action="store_true",
        help="measure only a 1000-worker TFJob served by this operator against the same "
        "StrategyJob",
    )
    parser.add_argument("--rounds", type=int, default=2, metavar="N", help="(2)")
    parser.add_argument("--idle-jobs", type=int, default=1000, metavar="N", help="(1000)")
    parser.add_argument(
        "--resync-seconds", type=float, default=60.0, metavar="S", help="resync period (60)"
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        metavar="DIR",
        help="with --resync: first run the operator of this checkout (e.g. a git worktree of "
        "an earlier commit), then this tree's; the last line is baseline/this",
    )
    args = parser.parse_args()
    if args.served_tfjobs or args.resync:
        bin_dir, why = cp_mod.find_binaries()
        if bin_dir is None:
            print(f"cannot run: {why}", file=sys.stderr)
            return 2
        cp = cp_mod.ControlPlane(bin_dir).start()
        try:
            if args.served_tfjobs:
                return run_served_tfjobs(Api(cp), cp, args.rounds)
            cp.kubectl("apply", "-f", str(ROOT / "crds"))
            wait_established(cp, "strategyjobs.strategyjob.dev")
            api = Api(cp)
            base = None
            if args.baseline_src is not None:
                base = run_resync(
                    api, cp, args.idle_jobs, args.resync_seconds, args.baseline_src, "base"
                )
            ours = run_resync(api, cp, args.idle_jobs, args.resync_seconds, ROOT, "this")
            if base is not None:
                print(
                    f"baseline/this: resync CPU {base['cpu_per_min'] / ours['cpu_per_min']:.2f}, "
                    f"1000 pods Running CPU {base['burst_cpu'] / ours['burst_cpu']:.2f}, "
                    f"the 1000-worker job's resync CPU "
                    f"{base['big_cpu_per_min'] / ours['big_cpu_per_min']:.2f}, "
                    f"peak RSS {base['rss'] / ours['rss']:.2f}"
                )
            return 0
        finally:
            cp.stop()
    if args.tfjob_operator is not None:
        if args.tfjob_crd is None:
            env_crd = os.environ.get("TFJOB_CRD")
            args.tfjob_crd = (
                Path(env_crd)
                if env_crd
                else args.tfjob_operator.parent / "kubeflow.org_tfjobs.yaml"
            )
        why = check_tfjob_args(args)
        if why:
            print(f"cannot run: {why}", file=sys.stderr)
            return 2
    bin_dir, why = cp_mod.find_binaries()
    if bin_dir is None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    cp = cp_mod.ControlPlane(bin_dir).start()
    op = None
    try:
        api = Api(cp)
        tf = None
        if args.tfjob_operator is not None:
            tf = run_tfjob(
                api,
                cp,
                args.tfjob_operator.resolve(),
                args.tfjob_crd,
                args.tfjob_timeout,
                many=not args.tfjob_skip_many,
            )
        cp.kubectl("apply", "-f", str(ROOT / "crds"))
        wait_established(cp, "strategyjobs.strategyjob.dev")
        op = start_operator(cp, "operator.log")

        create_namespace(api, "one")
        t0 = time.perf_counter()
        create_jobs(api, "one", [job("big", 1000)])
        wait_children(api, "one", 1000, 1, timeout=600)
        one_job = time.perf_counter() - t0
        print(f"1 job x 1000 workers: all pods and the service exist after {one_job:.2f} s")

        create_namespace(api, "many")
        t0 = time.perf_counter()
        create_jobs(api, "many", [job(f"j{i}", 8) for i in range(100)])
        wait_children(api, "many", 800, 100, timeout=600)
        many = time.perf_counter() - t0
        print(f"100 jobs x 8 workers: all 800 pods and 100 services exist after {many:.2f} s")

        if not args.quick:
            create_namespace(api, "hold")
            create_jobs(api, "hold", [job(f"h{i}", 1) for i in range(900)])
            wait_children(api, "hold", 900, 900, timeout=900)
            time.sleep(5)  # let the passes triggered by the last pods settle
            held = 1 + 100 + 900
            print(f"operator peak RSS while holding {held} jobs: {peak_rss_mib(op.pid):.0f} MiB")
        else:
            print(f"operator peak RSS while holding 101 jobs: {peak_rss_mib(op.pid):.0f} MiB")

        bound = 1000 / TFJOB_QPS
        if tf is None:
            print(
                f"TFJob client-rate bound for 1000 pods at {TFJOB_QPS} QPS: >= {bound:.0f} s "
                f"(>= {2 * bound:.0f} s with its Service per pod); StrategyJob is "
                f"{bound / one_job:.1f}x faster than that bound (pass --tfjob-operator to "
                "measure TFJob)"
            )
            return 0
        print(f"TFJob client-rate bound at {TFJOB_QPS} QPS: >= {2 * bound:.0f} s for 1000 pods")
        if "many" in tf or not args.tfjob_skip_many:
            print(fmt_ratio("100 jobs x 8 workers", many, tf.get("many")))
        print(fmt_ratio("1 job x 1000 workers", one_job, tf["one"]))
        return 0
    finally:
        stop_process(op)
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
