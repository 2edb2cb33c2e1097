"""The operator on real kubelets: the chart installs it IN a kind cluster (``tests.support.kind``),
where it runs as a pod on the chart's ServiceAccount, and StrategyJobs run on the cluster's
two nodes. What the other integration tests only write into pod status by hand, a real
kubelet does here: a cross-node job that finds its peer through TF_CONFIG and the headless
Service, a SIGKILLed worker (exit 137) restarted, the kernel's OOM kill (``OOMKilled``), a pod
deleted with kubectl, an image that cannot be pulled (Stalled, no restart loop), and the
per-job NetworkPolicy enforced by kube-router.

Every job runs the operator image (it has Python; loaded into the nodes, never pulled), with
the operator's sources of this working tree copied over it, so what runs is what is checked
out. All jobs are created at once (the module fixture ``jobs``) and each test polls its own
with a deadline, so the module costs the slowest job's time, not the sum.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.control_plane import REPO_ROOT
from tests.support.kind import Cluster, poll, report, run

pytestmark = [pytest.mark.kind, pytest.mark.timeout(3000)]

#: tools/images/build.sh builds it; the sources of this tree are copied over it.
OPERATOR_IMAGE = os.environ.get("STRATEGYJOB_OPERATOR_IMAGE", "strategyjob-operator:0.1.0")
TEST_REPOSITORY = "strategyjob-local/operator-under-test"
CHART = REPO_ROOT / "helm" / "strategyjob-operator"
OPERATOR_NS = "strategyjob-system"
NS = "sj-kind"
#: A deadline for what a kubelet does in seconds (start, kill, restart), generous for a
#: shared 2-core machine.
DEADLINE = 240

# --- the programs the job containers run (python -c) ------------------------------------------

_TF_CONFIG = """
import json, os, socket, sys, time
cfg = json.loads(os.environ["TF_CONFIG"])
me = cfg["task"]["index"]
addresses = cfg["cluster"]["worker"]
port = int(addresses[me].rsplit(":", 1)[1])
"""

#: Each worker listens on its TF_CONFIG address, connects to the other worker's (a DNS name of
#: the job's headless Service), says hello, and exits 0 once it heard the other's hello.
PEERS = (
    _TF_CONFIG
    + """
server = socket.create_server(("", port))
host, peer_port = addresses[1 - me].rsplit(":", 1)
deadline = time.time() + 300
while True:
    try:
        out = socket.create_connection((host, int(peer_port)), timeout=5)
        break
    except OSError as e:
        if time.time() > deadline:
            sys.exit(f"worker-{me} cannot reach {host}:{peer_port}: {e}")
        time.sleep(1)
out.sendall(f"hello from worker-{me}".encode())
out.close()
server.settimeout(300)
conn, _ = server.accept()
print(conn.recv(100).decode(), "reached worker", me, flush=True)
"""
)

#: Serves every connection with "ok" until deleted.
SERVE = (
    _TF_CONFIG
    + """
server = socket.create_server(("", port))
while True:
    conn, _ = server.accept()
    conn.sendall(b"ok")
    conn.close()
"""
)

#: The first run kills itself with SIGKILL (exit 137); the restarted one exits 0. The pod
#: shares its process namespace so that python is not PID 1: the kernel drops a signal that
#: the PID 1 of a namespace sends itself unless it handles it (and SIGKILL cannot be handled).
SIGKILL_FIRST = """
import os
if os.environ["STRATEGYJOB_RESTART_ATTEMPT"] == "0":
    os.kill(os.getpid(), 9)
"""

#: 200 MB written (so really resident) under a 64 MiB limit: the kernel's OOM killer.
OVER_LIMIT = """
ballast = b"x" * (200 * 1024 * 1024)
print(len(ballast))
"""

#: The first run waits to be deleted; the restarted one exits 0.
WAIT_FIRST = """
import os, time
if os.environ["STRATEGYJOB_RESTART_ATTEMPT"] == "0":
    time.sleep(3600)
"""


def _job(
    name: str,
    script: str,
    *,
    workers: int = 1,
    restart_policy: str = "Never",
    image: str = "",
    pull: str = "Never",
    run_policy: dict[str, Any] | None = None,
    **pod_spec: Any,
) -> dict[str, Any]:
    """A MultiWorkerMirroredStrategy job whose workers run ``script`` with the operator
    image's python. Tolerates every taint: the control-plane node takes pods too."""
    container = {
        "name": "strategyjob",
        "image": image,
        "imagePullPolicy": pull,
        "command": ["python", "-c", textwrap.dedent(script)],
    }
    container.update(pod_spec.pop("container", {}))
    template = {
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            **pod_spec,
        }
    }
    spec: dict[str, Any] = {
        "strategy": "MultiWorkerMirroredStrategy",
        "replicaSpecs": {
            "worker": {"replicas": workers, "restartPolicy": restart_policy, "template": template}
        },
    }
    if run_policy:
        spec["runPolicy"] = run_policy
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def _spread(name: str) -> dict[str, Any]:
    """The job's pods on different nodes."""
    term = {
        "labelSelector": {"matchLabels": {"strategyjob.dev/job-name": name}},
        "topologyKey": "kubernetes.io/hostname",
    }
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


# --- the operator in the cluster ----------------------------------------------------------------


def _image_under_test() -> str:
    """The operator image with this tree's ``strategyjob_operator`` and ``strategyjob``
    sources in place of its own (built once per content: seconds, offline)."""
    if run(["docker", "image", "inspect", OPERATOR_IMAGE], 30, check=False).returncode != 0:
        pytest.skip(f"no image {OPERATOR_IMAGE}: build it with tools/images/build.sh")
    sources = {
        "strategyjob_operator": REPO_ROOT / "operator" / "strategyjob_operator",
        "strategyjob": REPO_ROOT / "sdk" / "strategyjob",
    }
    digest = hashlib.sha256(OPERATOR_IMAGE.encode())
    for package, root in sources.items():
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(f"{package}/{path.relative_to(root)}".encode())
                digest.update(path.read_bytes())
    image = f"{TEST_REPOSITORY}:{digest.hexdigest()[:12]}"
    if run(["docker", "image", "inspect", image], 30, check=False).returncode != 0:
        _build_image_under_test(image, sources)
    # Older builds of other sources are dropped (their layers but a few MB over the base).
    listed = run(["docker", "images", TEST_REPOSITORY, "--format", "{{.Repository}}:{{.Tag}}"], 30)
    stale = [x for x in listed.stdout.split() if x != image]
    if stale:
        run(["docker", "rmi", *stale], 60, check=False)
    return image


def _build_image_under_test(image: str, sources: dict[str, Path]) -> None:
    """``OPERATOR_IMAGE`` with ``sources`` (package name -> directory) replacing its own."""
    purelib = run(
        ["docker", "run", "--rm", "--entrypoint", "python", OPERATOR_IMAGE, "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        120,
    ).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory() as context:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for package, root in sources.items():
            shutil.copytree(root, Path(context) / package, ignore=ignore)
        lines = [f"FROM {OPERATOR_IMAGE}", "USER 0"]
        lines += [f"RUN rm -rf {purelib}/{p}" for p in sources]
        lines += [f"COPY {p} {purelib}/{p}" for p in sources]
        lines += ["USER 65532:65532"]
        (Path(context) / "Dockerfile").write_text("\n".join(lines) + "\n")
        env_build = ["env", "DOCKER_BUILDKIT=0", "docker", "build", "-q", "--force-rm"]
        run([*env_build, "-t", image, context], 300)


def _helm(cluster: Cluster, home: Path, *args: str, timeout: float = 120) -> str:
    helm = cluster.bin_dir / "helm"
    if not helm.is_file():
        found = shutil.which("helm")
        if found is None:
            pytest.skip(f"no helm in {cluster.bin_dir} nor on PATH")
        helm = Path(found)
    env = [
        "env",
        f"HELM_CONFIG_HOME={home / 'config'}",
        f"HELM_CACHE_HOME={home / 'cache'}",
        f"HELM_DATA_HOME={home / 'data'}",
        f"KUBECONFIG={cluster.kubeconfig}",
    ]
    return run([*env, str(helm), *args], timeout).stdout


@pytest.fixture(scope="module")
def operator(kind_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart installed with the image under test (one replica); yields the image."""
    cluster = kind_cluster
    began = time.monotonic()
    image = _image_under_test()
    report(f"operator image {image} ready in {time.monotonic() - began:.0f} s")
    report(f"operator image loaded into both nodes in {cluster.load(image):.0f} s")
    repository, tag = image.rsplit(":", 1)
    home = tmp_path_factory.mktemp("helm")
    began = time.monotonic()
    _helm(
        cluster, home, "install", "sjob", str(CHART), "--namespace", OPERATOR_NS,
        "--create-namespace", "--set", f"image.repository={repository}",
        "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
        "--set", "replicaCount=1", "--set", "peering.enabled=false",
        "--set", "operator.terminationGraceSeconds=5",
        "--wait", "--timeout", f"{DEADLINE}s",
        timeout=DEADLINE + 30,
    )  # fmt: skip
    cluster.kubectl(
        "-n", OPERATOR_NS, "wait", "--for=condition=Ready", "pod", "--all",
        f"--timeout={DEADLINE}s", timeout=DEADLINE + 30,
    )  # fmt: skip
    ready = time.monotonic() - began
    report(f"chart installed, operator pod Ready in {ready:.0f} s")
    try:
        yield image
    finally:
        # The cluster serves other modules (the e2e suite installs its own operator): the
        # jobs' pods and this operator go.
        cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")
        _helm(cluster, home, "uninstall", "sjob", "--namespace", OPERATOR_NS, "--wait")


@pytest.fixture(scope="module")
def jobs(kind_cluster: Cluster, operator: str) -> dict[str, float]:
    """Every job of the module, created at once; returns when each was applied."""
    img = operator
    cluster = kind_cluster
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    manifests = [
        _job("peers", PEERS, workers=2, image=img, affinity=_spread("peers")),
        _job(
            "sigkill", SIGKILL_FIRST, restart_policy="ExitCode", image=img,
            run_policy={"backoffLimit": 2}, shareProcessNamespace=True,
        ),
        _job(
            "oom", OVER_LIMIT, image=img, restart_policy="ExitCode",
            run_policy={"backoffLimit": 3},
            container={"resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}},
        ),
        _job("deleted", WAIT_FIRST, restart_policy="OnFailure", image=img,
             run_policy={"backoffLimit": 2}),
        _job(
            "absent", "print('never runs')", restart_policy="OnFailure",
            image="strategyjob-local/absent:1", pull="IfNotPresent",
        ),
        _job("iso-a", SERVE, workers=2, image=img),
        _job("iso-b", SERVE, image=img),
    ]  # fmt: skip
    applied = {}
    for m in manifests:
        cluster.apply(m)
        applied[m["metadata"]["name"]] = time.monotonic()
    return applied


# --- reading the job ----------------------------------------------------------------------------


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.get("-n", NS, "strategyjob", name).get("status") or {}


def _condition(cluster: Cluster, name: str, type_: str) -> dict[str, Any] | None:
    conds = _status(cluster, name).get("conditions") or []
    return next((x for x in conds if x["type"] == type_ and x["status"] == "True"), None)


def _wait_condition(cluster: Cluster, name: str, type_: str, timeout: float = DEADLINE) -> dict:
    def check() -> dict | None:
        for other in ("Succeeded", "Failed"):
            if other != type_ and (done := _condition(cluster, name, other)):
                pytest.fail(f"job {name} is {other}, not {type_}: {done['message']}")
        return _condition(cluster, name, type_)

    return poll(f"job {name} {type_}", check, timeout, every=2)  # type: ignore[return-value]


def _events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """The Events the operator posted about the job."""
    selector = f"involvedObject.kind=StrategyJob,involvedObject.name={name}"
    return cluster.get("-n", NS, "events", "--field-selector", selector)["items"]


def _pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return cluster.get("-n", NS, "pods", "-l", f"strategyjob.dev/job-name={name}")["items"]


@pytest.fixture(autouse=True)
def _evidence_if_failed(request: pytest.FixtureRequest, kind_cluster: Cluster) -> Iterator[None]:
    """A failed case leaves the namespace's pods and Events and the operator's log in the
    run's output (the cluster is deleted with the session)."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed:
        return
    for args in (
        ("-n", NS, "get", "pods", "-o", "wide", "--show-labels"),
        ("-n", NS, "get", "events", "--sort-by=.lastTimestamp"),
        ("-n", OPERATOR_NS, "logs", "-l", "app.kubernetes.io/instance=sjob", "--tail=400"),
        # the pod network: kube-router routes between the nodes and enforces NetworkPolicy
        ("-n", NS, "get", "networkpolicies"),
        ("-n", "kube-system", "get", "pods", "-o", "wide"),
        ("-n", "kube-system", "logs", "-l", "k8s-app=kube-router", "--prefix", "--tail=80"),
    ):
        try:
            out = kind_cluster.kubectl(*args, timeout=60)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            out = f"(failed: {e})"
        report(f"--- after {request.node.name} failed: kubectl {' '.join(args)}\n{out}")


def _running_pod(cluster: Cluster, pod: str) -> dict[str, Any]:
    def running() -> dict | None:
        found = [p for p in cluster.get("-n", NS, "pods")["items"] if p["metadata"]["name"] == pod]
        if found and found[0]["status"].get("phase") == "Running":
            return found[0]
        return None

    return poll(f"pod {pod} Running", running, DEADLINE, every=2)  # type: ignore[return-value]


# --- the tests ----------------------------------------------------------------------------------


def test_a_cross_node_job_reaches_its_peer_through_tf_config_and_succeeds(
    kind_cluster: Cluster, jobs: dict[str, float]
) -> None:
    cluster = kind_cluster
    nodes: dict[str, str] = {}

    def placed() -> bool:
        for p in _pods(cluster, "peers"):
            if p["spec"].get("nodeName"):
                nodes[p["metadata"]["name"]] = p["spec"]["nodeName"]
        return len(nodes) == 2

    poll("both pods of job peers scheduled", placed, DEADLINE)
    assert len(set(nodes.values())) == 2, f"the podAntiAffinity put both on one node: {nodes}"
    cond = _wait_condition(cluster, "peers", "Succeeded")
    took = time.monotonic() - jobs["peers"]
    report(f"job peers Succeeded {took:.0f} s after apply; pods on {sorted(nodes.values())}")
    assert "worker-0 completed" in cond["message"]
    status = _status(cluster, "peers")
    assert status.get("restartCount", 0) == 0, status
    reasons = [e["reason"] for e in _events(cluster, "peers")]
    assert "StrategyJobSucceeded" in reasons, reasons
    assert "JobRestarting" not in reasons, reasons
    # cleanPodPolicy Running keeps the finished leader's pod, so its log can be read.
    log = cluster.kubectl("-n", NS, "logs", "peers-worker-0")
    assert "hello from worker-1 reached worker 0" in log, log


def test_b_a_worker_killed_by_sigkill_exits_137_and_is_restarted(
    kind_cluster: Cluster, jobs: dict[str, float]
) -> None:
    cluster = kind_cluster
    _wait_condition(cluster, "sigkill", "Succeeded")
    status = _status(cluster, "sigkill")
    assert status["restartCount"] == 1, status
    assert status["replicaStatuses"]["worker"]["restarts"] == 1, status
    restarts = [e for e in _events(cluster, "sigkill") if e["reason"] == "JobRestarting"]
    assert len(restarts) == 1, restarts
    assert restarts[0]["type"] == "Warning"
    assert "worker-0 exited with code 137" in restarts[0]["message"], restarts[0]["message"]
    assert "(restart 1 of 2)" in restarts[0]["message"], restarts[0]["message"]
    # The restarted pod is a new pod of the next run.
    labels = [p["metadata"]["labels"] for p in _pods(cluster, "sigkill")]
    assert [x.get("strategyjob.dev/restart-attempt") for x in labels] == ["1"], labels


def test_c_the_kubelets_oomkilled_reaches_the_jobs_status_and_event(
    kind_cluster: Cluster, jobs: dict[str, float]
) -> None:
    """Killed by the kernel (137): ExitCode retries, until backoffLimit. Each message carries
    the reason the kubelet wrote. On containerd 1.6 with cgroup v1 about one OOM kill in six
    reaches the kubelet as "Error" (containerd's OOM event loses the race with the exit), so
    the job runs four times and OOMKilled must show at least once."""
    cluster = kind_cluster
    cond = _wait_condition(cluster, "oom", "Failed")
    assert cond["reason"] == "BackoffLimitExceeded", cond
    # The last pod is kept (cleanPodPolicy Running): its reason is the job's.
    (last,) = _pods(cluster, "oom")
    written = last["status"]["containerStatuses"][0]["state"]["terminated"]
    assert written["exitCode"] == 137, written
    said = f"worker-0 exited with code 137 ({written['reason']}), and backoffLimit=3 is reached"
    assert said in cond["message"], cond["message"]
    restarts = [e["message"] for e in _events(cluster, "oom") if e["reason"] == "JobRestarting"]
    assert len(restarts) == 3, restarts
    for m in restarts:
        assert re.search(r"worker-0 exited with code 137 \((OOMKilled|Error)\)", m), m
    assert any("(OOMKilled)" in m for m in [*restarts, cond["message"]]), restarts


def test_d_a_pod_deleted_with_kubectl_is_recreated_and_the_job_proceeds(
    kind_cluster: Cluster, jobs: dict[str, float]
) -> None:
    cluster = kind_cluster
    pod = _running_pod(cluster, "deleted-worker-0")
    cluster.kubectl("-n", NS, "delete", "pod", "deleted-worker-0", "--wait=false")
    _wait_condition(cluster, "deleted", "Succeeded")
    status = _status(cluster, "deleted")
    assert status["restartCount"] == 1, status
    restarts = [e for e in _events(cluster, "deleted") if e["reason"] == "JobRestarting"]
    assert len(restarts) == 1, restarts
    assert "worker-0 was deleted" in restarts[0]["message"], restarts[0]["message"]
    now = _pods(cluster, "deleted")
    assert now and now[0]["metadata"]["uid"] != pod["metadata"]["uid"], "not recreated"


def test_e_an_image_that_cannot_be_pulled_stalls_the_job_without_a_restart_loop(
    kind_cluster: Cluster, jobs: dict[str, float]
) -> None:
    cluster = kind_cluster
    cond = _wait_condition(cluster, "absent", "Stalled")
    stalled_after = time.monotonic() - jobs["absent"]
    report(f"job absent Stalled {stalled_after:.0f} s after apply: {cond['message'][:160]}")
    assert cond["reason"] == "ImagePullBackOff", cond
    assert "ErrImagePull" in cond["message"] or "ImagePullBackOff" in cond["message"], cond
    assert "absent-worker-0" in cond["message"], cond["message"]
    uid = _pods(cluster, "absent")[0]["metadata"]["uid"]

    # The kubelet keeps retrying the pull (ErrImagePull and ImagePullBackOff in turn); the
    # operator neither restarts nor reports it again. Watched until the kubelet has retried.
    def retried() -> bool:
        pod = _pods(cluster, "absent")[0]
        kubelet = cluster.get(
            "-n", NS, "events", "--field-selector",
            f"involvedObject.kind=Pod,involvedObject.name={pod['metadata']['name']}",
        )["items"]  # fmt: skip
        return sum(e.get("count", 1) for e in kubelet if e["reason"] == "Failed") >= 2

    poll("the kubelet retrying the pull", retried, DEADLINE, every=3)
    pods = _pods(cluster, "absent")
    assert [p["metadata"]["uid"] for p in pods] == [uid], "the stuck pod was recreated"
    status = _status(cluster, "absent")
    assert status.get("restartCount", 0) == 0, status
    assert _condition(cluster, "absent", "Failed") is None
    operator_warnings = [e for e in _events(cluster, "absent") if e["type"] == "Warning"]
    assert len(operator_warnings) == 1, operator_warnings
    assert operator_warnings[0]["reason"] in ("ErrImagePull", "ImagePullBackOff")
    assert "check the image name and tag" in operator_warnings[0]["message"]


def _connects(cluster: Cluster, pod: str, host: str, port: int) -> bool:
    probe = (
        "import socket, sys\n"
        f"s = socket.create_connection(({host!r}, {port}), timeout=3)\n"
        "sys.exit(0 if s.recv(2) == b'ok' else 1)\n"
    )
    ok, _ = cluster.exec_ok(NS, pod, "python", "-c", probe)
    return ok


def test_f_a_jobs_pods_reach_each_other_but_not_another_jobs_pods(
    kind_cluster: Cluster, jobs: dict[str, float]
) -> None:
    cluster = kind_cluster
    a0 = _running_pod(cluster, "iso-a-worker-0")
    a1 = _running_pod(cluster, "iso-a-worker-1")
    b0 = _running_pod(cluster, "iso-b-worker-0")
    env = {e["name"]: e.get("value") for e in a0["spec"]["containers"][0]["env"]}
    # the pod spec's TF_CONFIG refers to the job's ConfigMap for the cluster; every replica
    # listens on the job's port
    port = int(env["MASTER_PORT"])
    a1_dns = f"iso-a-worker-1.iso-a.{NS}.svc"
    poll(
        "iso-a-worker-0 reaching its peer iso-a-worker-1 (by its TF_CONFIG name)",
        lambda: _connects(cluster, "iso-a-worker-0", a1_dns, port),
        DEADLINE,
    )
    poll(
        "iso-a-worker-0 reaching its peer by pod IP",
        lambda: _connects(cluster, "iso-a-worker-0", a1["status"]["podIP"], port),
        60,
    )
    b_ip = b0["status"]["podIP"]
    # B serves (its own pod reaches it), so a refusal below is the policy's doing.
    poll("iso-b-worker-0 serving", lambda: _connects(cluster, "iso-b-worker-0", b_ip, port), 60)
    refusals: list[bool] = []

    def refused_three_times_running() -> bool:
        refusals.append(not _connects(cluster, "iso-a-worker-0", b_ip, port))
        return refusals[-3:] == [True, True, True]

    poll("job iso-b's NetworkPolicy refusing iso-a-worker-0", refused_three_times_running, 120)
    policies = cluster.get("-n", NS, "networkpolicies")["items"]
    assert {p["metadata"]["name"] for p in policies} >= {"iso-a", "iso-b"}
