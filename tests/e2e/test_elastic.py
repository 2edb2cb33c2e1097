"""A ParameterServerStrategy job resized while it trains on a real cluster (issue 30):
``kubectl scale`` 2 -> 4 -> 1 -> 3, and a HorizontalPodAutoscaler driving the worker count from the
workers' CPU (metrics-server, built here). The chief's coordinator takes the new worker once its
pod is Ready (the operator's members ConfigMap, refreshed in the chief's pod by the kubelet when the
operator annotates the pod) and lets the removed ones go; nothing that stays is restarted, no
step is lost, and the job succeeds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import pytest
from strategyjob.client import StrategyJobClient

from e2e.e2e_support import STEP_LINE, Namespace, example, losses, wait_for
from tests.support.kind import report

JOB, CHIEF = "digits-ps", "digits-ps-chief-0"
KIND_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "kind"


def scale(ns: Namespace, replicas: int) -> float:
    ns.cluster.kubectl("scale", f"sjob/{JOB}", f"--replicas={replicas}", "-n", ns.name)
    return time.time()


def ready_at(ns: Namespace, pod: str) -> float | None:
    """When the pod's Ready condition last became True (the API server's clock; kind's nodes
    share this machine's)."""
    found = ns.pod(pod)
    for cond in (found.status.conditions or []) if found else []:
        if cond.type == "Ready" and cond.status == "True":
            return cond.last_transition_time.replace(tzinfo=UTC).timestamp()
    return None


def resized(ns: Namespace, replicas: int, change: str, tasks: list[int], timeout: float) -> float:
    """Scale the job to ``replicas`` and wait until the chief has said that each of ``tasks``
    ``change`` (joined, left) since; returns the seconds that took."""
    seen = len(ns.logs(CHIEF))
    asked = scale(ns, replicas)

    def followed() -> bool:
        said = re.findall(rf"workers resized \({change}: ([^)]*)\)", ns.logs(CHIEF)[seen:])
        return all(any(f"task:{t}" in line for line in said) for t in tasks)

    try:
        wait_for(f"the chief: tasks {tasks} {change}", followed, timeout, 0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{where_it_stands(ns)}") from e
    return time.time() - asked


def where_it_stands(ns: Namespace) -> str:
    """The job's pods, conditions and members, and the chief's last lines: what a failed wait
    needs to be understood."""
    pods = [
        f"{p.metadata.name} {p.status.phase} deleting={bool(p.metadata.deletion_timestamp)} "
        + ",".join(f"{c.type}={c.status}" for c in p.status.conditions or [])
        for p in ns.pods(JOB)
    ]
    status = ns.job(JOB).get("status", {})
    members = ns.cluster.core.read_namespaced_config_map(f"{JOB}-strategyjob-members", ns.name)
    return (
        "pods:\n  " + "\n  ".join(pods) + f"\nconditions: {status.get('conditions')}"
        f"\nmembers: {members.data}\nchief:\n{ns.logs(CHIEF)[-3000:]}"
    )


def resizing_false(ns: Namespace) -> dict:
    return wait_for(
        "Resizing False",
        lambda: next(
            (
                c
                for c in ns.job(JOB)["status"].get("conditions", [])
                if c["type"] == "Resizing" and c["status"] == "False"
            ),
            None,
        ),
        30,
        0.5,
    )


def two_more_steps(ns: Namespace) -> None:
    mark = len(losses(ns.logs(CHIEF), STEP_LINE))
    wait_for("two more step lines", lambda: len(losses(ns.logs(CHIEF), STEP_LINE)) >= mark + 2)


@pytest.mark.timeout(540)
def test_a_ps_job_resized_while_training_restarts_nothing_and_loses_no_step(
    ns: Namespace, tmp_path
):
    """2 -> 4 -> 1 -> 3 while the chief trains: it takes each new worker once its pod is Ready
    and lets the removed ones go; the chief, the ps and worker 0 are never replaced, and every
    step is logged once."""
    steps, every = 20000, 200  # about 170 steps/s: two minutes of training
    ns.apply(example("digits_ps", env={"chief": {"STEPS": str(steps), "LOG_EVERY": str(every)}}))
    ns.wait_log(CHIEF, rf"step {2 * every}/{steps}", timeout=180)
    before = {p.metadata.name: p.metadata.uid for p in ns.pods(JOB)}

    took = resized(ns, 4, "joined", [2, 3], 150)
    joined = time.time()
    ready = max(
        wait_for(f"{p} Ready", lambda p=p: ready_at(ns, p), 30, 0.5)
        for p in ("digits-ps-worker-2", "digits-ps-worker-3")
    )
    assert resizing_false(ns)["message"] == "StrategyJob digits-ps runs 4 workers."
    report(
        f"ps resize on kind: kubectl scale 2 -> 4: the chief took workers 2 and 3 {took:.0f} s "
        f"after the scale, {joined - ready:.1f} s after the last pod was Ready"
    )
    assert joined - ready < 10, "the chief should follow a Ready worker within seconds"
    two_more_steps(ns)

    took = resized(ns, 1, "left", [1, 2, 3], 60)
    report(f"ps resize on kind: kubectl scale 4 -> 1: the chief let them go {took:.0f} s after")
    two_more_steps(ns)

    asked = time.time()
    took = resized(ns, 3, "joined", [1, 2], 150)
    assert resizing_false(ns)["message"] == "StrategyJob digits-ps runs 3 workers."
    back = [ns.pod(f"digits-ps-worker-{i}") for i in (1, 2)]
    made = max(p.metadata.creation_timestamp.replace(tzinfo=UTC).timestamp() for p in back)
    ready = max(ready_at(ns, p.metadata.name) or 0.0 for p in back)
    report(
        f"ps resize on kind: kubectl scale 1 -> 3 (workers 1 and 2 removed moments before): "
        f"their new pods made {made - asked:.0f} s after the scale, Ready {ready - asked:.0f} s "
        f"after, taken by the chief {took:.0f} s after; step "
        f"{losses(ns.logs(CHIEF), STEP_LINE)[-1][0]} of {steps} was logged then"
    )
    stayed = {p.metadata.name: p.metadata.uid for p in ns.pods(JOB)}
    for name in (CHIEF, "digits-ps-ps-0", "digits-ps-worker-0"):
        assert stayed[name] == before[name], f"{name} was replaced"
    assert stayed["digits-ps-worker-1"] != before["digits-ps-worker-1"]  # gone, then made anew
    copied = copy_summaries(ns, tmp_path / "summaries")

    job = ns.wait_job(JOB, "Succeeded", timeout=300)
    chief = ns.logs(CHIEF)
    points = losses(chief, STEP_LINE)
    assert [step for step, _ in points] == list(range(every, steps + 1, every)), chief
    statuses = job["status"]["replicaStatuses"]
    assert all(statuses[t].get("restarts", 0) == 0 for t in ("chief", "ps", "worker")), statuses
    assert not re.search(r"Traceback", chief), chief
    assert copied and copied == [s for s, _ in points[: len(copied)]], (copied, points)


@pytest.fixture(scope="module")
def metrics_api(cluster) -> None:
    """metrics-server in the session's kind cluster (built by tools/kind/metrics-server.sh:
    minutes the first time, cached after), serving node metrics."""
    if cluster.kind is None:
        pytest.skip("metrics-server is built for the session's kind cluster")
    built = subprocess.run(
        ["bash", str(KIND_TOOLS / "metrics-server.sh")],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert built.returncode == 0, built.stderr
    image, manifest = built.stdout.split()
    cluster.kind.load(image)
    cluster.kubectl("apply", "-f", "-", input=Path(manifest).read_text().replace("IMAGE", image))

    def serving() -> bool:
        try:
            nodes = json.loads(
                cluster.kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes")
            )
        except AssertionError:  # not registered, or no scrape yet
            return False
        return bool(nodes.get("items"))

    wait_for("the metrics API serving node metrics", serving, 180, 2.0)


@pytest.mark.timeout(600)
def test_a_horizontal_pod_autoscaler_grows_a_ps_jobs_workers_while_it_trains(
    ns: Namespace, metrics_api
):
    """An HPA on the StrategyJob's scale subresource (its selector: the worker pods), the
    workers' CPU far over its 50 % target: it scales the job 2 -> 3 (its maxReplicas, within
    the job's own bounds) and the chief takes the new worker without a restart. Then the
    operator restarts: the job's metric history goes on, no report lost."""
    manifest = example("digits_ps", env={"chief": {"STEPS": "100000", "LOG_EVERY": "60"}})
    workers = manifest["spec"]["replicaSpecs"]["worker"]
    workers["minReplicas"], workers["maxReplicas"] = 2, 3
    for container in workers["template"]["spec"]["containers"]:
        container["resources"] = {"requests": {"cpu": "100m"}}  # busy workers: far over 50 %
    ns.apply(manifest)
    ns.wait_log(CHIEF, r"step 120/", timeout=180)
    before = {p.metadata.name: p.metadata.uid for p in ns.pods(JOB)}
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": JOB},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "strategyjob.dev/v1alpha1",
                "kind": "StrategyJob",
                "name": JOB,
            },
            "minReplicas": 2,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 50},
                    },
                }
            ],
        },
    }
    created = time.time()
    ns.cluster.kubectl("apply", "-n", ns.name, "-f", "-", input=json.dumps(hpa))
    ns.wait_log(CHIEF, r"workers resized \(joined: /job:worker/replica:0/task:2\)", timeout=300)
    joined = time.time()
    job = ns.job(JOB)
    assert job["spec"]["replicaSpecs"]["worker"]["replicas"] == 3
    status = json.loads(ns.cluster.kubectl("get", "hpa", JOB, "-n", ns.name, "-o", "json"))[
        "status"
    ]
    assert status["desiredReplicas"] == 3, status
    after = {p.metadata.name: p.metadata.uid for p in ns.pods(JOB)}
    assert all(after[name] == uid for name, uid in before.items()), "a pod was replaced"
    usage = [m.get("resource", {}).get("current", {}) for m in status.get("currentMetrics") or []]
    report(
        f"HPA on kind: the autoscaler (CPU target 50 %, the workers at {usage}) grew the job "
        f"2 -> 3 and the chief took worker-2 {joined - created:.0f} s after the HPA was created"
    )

    # The operator restarted (as a helm upgrade does) while the job trains: the metric history
    # goes on where it was, every report kept (the chief reports every 60 steps).
    def kept() -> list[int]:
        with StrategyJobClient(kubeconfig=str(ns.cluster.kubeconfig), namespace=ns.name) as c:
            return [step for step, _ in c.metrics(JOB).get("loss", [])]

    last = wait_for("a history", kept, 60, 1.0)[-1]
    namespace, release = ns.operator
    ns.cluster.kubectl("rollout", "restart", f"deployment/{release}", "-n", namespace)
    ns.cluster.kubectl(
        "rollout", "status", f"deployment/{release}", "-n", namespace, "--timeout=180s",
        timeout=200,
    )  # fmt: skip
    steps = wait_for(
        "the history going on after the operator's restart",
        lambda: (s := kept()) and s[-1] >= last + 180 and s,
        180,
        2.0,
    )
    assert steps == list(range(60, steps[-1] + 1, 60)), steps
    report(
        f"operator restarted on kind mid-training: the history went on from step {last} to "
        f"{steps[-1]} with every report kept"
    )


def copy_summaries(ns: Namespace, into) -> list[int]:
    """``strategyjob tensorboard JOB --copy-only`` while the chief trains: the steps of the
    loss curve in the copied event files, read back with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    wait_for(
        "the chief's reports naming its logdir",
        lambda: (ns.job(JOB)["status"].get("progress") or {}).get("logdir") == "/workspace/logs",
        60,
        0.5,
    )
    cli = [sys.executable, "-m", "strategyjob", "tensorboard", JOB, "--copy-only"]
    where = ["--copy-to", str(into), "-n", ns.name, "--kubeconfig", str(ns.cluster.kubeconfig)]

    def copied() -> list[int]:  # the chief's writer flushes every 10 s: copy until it has
        done = subprocess.run([*cli, *where], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"of /workspace/logs in pod {CHIEF} into {into}" in done.stdout, done.stdout
        events = EventAccumulator(str(into), size_guidance={"tensors": 0})
        events.Reload()
        if "loss" not in events.Tags()["tensors"]:
            return []
        return [e.step for e in events.Tensors("loss")]

    return wait_for("a loss curve in the copied event files", copied, 60, 1.0)


@pytest.mark.timeout(480)
def test_a_mwms_job_resized_2_3_2_re_forms_from_its_checkpoint(
    ns: Namespace, shared_dir: str, cluster
):
    """A MultiWorkerMirroredStrategy job really training (tests/multiprocess/
    preemption_worker.py, paced steps, a checkpoint every 3 steps and on SIGTERM) is scaled
    2 -> 3 -> 2: each time every pod saves at the same step and stops, the group is created at
    the new size and resumes from that step; the job succeeds with its workers in sync and no
    restart counted."""
    from e2e.test_preemption import CONFIGMAP, WORKER, _job

    ns.cluster.kubectl(
        "create", "configmap", CONFIGMAP, "-n", ns.name, f"--from-file={WORKER.name}={WORKER}"
    )
    manifest = _job("grow", shared_dir)
    container = manifest["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["command"][-2] = "40"  # steps: long enough for two re-formings
    container["env"].append({"name": "REPORT", "value": "1"})  # each step, for the history
    ns.apply(manifest)
    ckpt = cluster.kind.shared_dir / ns.name / "grow" / "ckpt"

    def resized_and_training(workers: int) -> float:
        asked = time.monotonic()
        ns.cluster.kubectl("scale", "sjob/grow", f"--replicas={workers}", "-n", ns.name)
        wait_for(
            f"{workers} workers running",
            lambda: (
                (job := ns.job("grow")["status"]).get("workers") == workers
                and any(
                    c["type"] == "Resizing" and c["status"] == "False"
                    for c in job.get("conditions", [])
                )
            ),
            240,
            0.5,
        )
        ready = time.monotonic() - asked
        seen = set(os.listdir(ckpt))
        wait_for(
            f"a checkpoint of the {workers}-worker group",
            lambda: set(os.listdir(ckpt)) - seen,
            120,
            0.5,
        )
        return ready

    ns.wait_log("grow-worker-1", r"^RUNNING 3$", timeout=240)
    up = resized_and_training(3)
    down = resized_and_training(2)
    job = ns.wait_job("grow", "Succeeded", timeout=300)
    status = job["status"]
    assert (status.get("resizes"), status.get("restartCount", 0)) == (2, 0), status
    results, states = [], set()
    for rank in (0, 1):
        log = ns.logs(f"grow-worker-{rank}")
        (line,) = [x for x in log.splitlines() if x.startswith("RESULT ")]
        results.append(json.loads(line[len("RESULT ") :]))
        states.update(x for x in log.splitlines() if x.startswith("STATE "))
    first = results[0]["first"]
    assert first > 3 and all(r["first"] == first for r in results), results  # resumed, together
    assert all(r["ran"] == list(range(first, 40)) for r in results), results  # each step once
    assert len(states) == 1, states  # the two workers end bit-identical
    events = [
        e.message
        for e in ns.cluster.core.list_namespaced_event(
            ns.name, field_selector="involvedObject.name=grow"
        ).items
        if e.reason == "Resizing"
    ]
    assert any("re-forms with 3 workers (it ran 2)" in m for m in events), events
    assert any("re-forms with 2 workers (it ran 3)" in m for m in events), events
    # The history the operator keeps went on through both re-formings: not reset (step 1 is
    # still there), each step once, ascending, up to the last.
    with StrategyJobClient(kubeconfig=str(ns.cluster.kubeconfig), namespace=ns.name) as client:
        kept = [step for step, _ in client.metrics("grow")["lr"]]
    assert kept[0] == 1 and kept[-1] == 40 and kept == sorted(set(kept)), kept
    missing = sorted(set(range(1, 41)) - set(kept))
    report(
        f"MWMS resize on kind: kubectl scale 2 -> 3: the 3-worker group running {up:.0f} s "
        f"after; 3 -> 2: {down:.0f} s after (resumed at step {first} of 40, no restart counted); "
        f"the history kept {len(kept)} of the 40 steps (missing: {missing or 'none'})"
    )
