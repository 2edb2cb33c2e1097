"""Training that survives preemption on a real cluster: a 2-worker MultiWorkerMirroredStrategy
job (gloo on CPU, fixed seeds and data order) whose worker pod is deleted mid-training with a
plain ``kubectl delete pod`` (the kubelet sends SIGTERM and waits the grace period). Both
workers' ``PreemptionCheckpointHandler`` agree on one step, save it once and exit 143; the
operator restarts the whole job (``restartPolicy: ExitCode`` retries 143), which resumes from
that step and ends with parameters bit-identical to those of the same job run uninterrupted, at
the same time, in the same namespace.

The training script is ``tests/multiprocess/preemption_worker.py`` (the proof under
``strategyjob run``), given to the pods in a ConfigMap; its checkpoints live in the shared
directory every node mounts, so the restarted pods find them wherever they are scheduled."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.e2e_support import Namespace, wait_for, worker_image
from tests.support.kind import report
from tests.support.manifests import preemptible_workers

WORKER = Path(__file__).resolve().parents[1] / "multiprocess" / "preemption_worker.py"
CONFIGMAP = "preemption-worker"
STEPS = 20  # per job
MARK = 3  # the workers print "RUNNING 3" once step 3 has run: the test deletes a pod then
PACE = 1.0  # seconds between steps: the deletion lands mid-training, the job stays short
GRACE = 30  # terminationGracePeriodSeconds: ample for one save of a small model

SAVED = re.compile(
    r"termination notice received \((this worker|a peer)\); saving a checkpoint after "
    r"(\d+) run calls"
)


def _job(name: str, shared_dir: str) -> dict[str, Any]:
    """The 2-worker job of ``preemptible_workers`` as pods: the script from the ConfigMap,
    its output (checkpoints, attempt counts) in ``<shared dir>/<name>``, pods kept after
    success for their logs."""
    out = f"/shared/{name}"
    script = f"/opt/preemption/{WORKER.name}"
    command = ["python", script, out, "mark", str(MARK), str(STEPS), str(PACE)]
    manifest = preemptible_workers(name, command, "ExitCode")  # backoffLimit 1
    manifest["spec"]["runPolicy"]["cleanPodPolicy"] = "None"
    pod = manifest["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = GRACE
    shared = {"name": "shared", "mountPath": "/shared"}
    pod["containers"][0].update(
        image=worker_image(),
        command=command,
        env=[{"name": "OMP_NUM_THREADS", "value": "1"}],
        volumeMounts=[shared, {"name": "script", "mountPath": "/opt/preemption", "readOnly": True}],
    )
    # The image runs as a non-root user; a hostPath directory is created root-owned.
    prepare = f"import os; os.makedirs({out!r}, exist_ok=True); " + "; ".join(
        f"os.chmod({d!r}, 0o1777)" for d in ("/shared", out)
    )
    pod["initContainers"] = [
        {
            "name": "shared-dir",
            "image": worker_image(),
            "command": ["python", "-c", prepare],
            "securityContext": {"runAsUser": 0},
            "volumeMounts": [shared],
        }
    ]
    pod["volumes"] = [
        {"name": "shared", "hostPath": {"path": shared_dir, "type": "DirectoryOrCreate"}},
        {"name": "script", "configMap": {"name": CONFIGMAP}},
    ]
    return manifest


def _events(ns: Namespace, job: str) -> list[tuple[str, str]]:
    items = ns.cluster.core.list_namespaced_event(
        ns.name, field_selector=f"involvedObject.name={job}"
    ).items
    return [(e.reason, e.message) for e in items]


def _lines(log: str, prefix: str) -> list[str]:
    return [line[len(prefix) :] for line in log.splitlines() if line.startswith(prefix)]


def _follow(ns: Namespace, pod: str, path: Path) -> subprocess.Popen[bytes]:
    """``kubectl logs -f`` of the pod into ``path``: the whole log of this attempt, which
    goes with the pod once the job restarts."""
    cluster = ns.cluster
    with path.open("wb") as sink:
        return subprocess.Popen(
            [cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}", "logs", "-f", pod,
             "-n", ns.name],
            stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.timeout(420)
def test_deleted_worker_saves_once_and_the_restarted_job_ends_bit_identical(
    ns: Namespace, shared_dir: str, tmp_path: Path
):
    ns.cluster.kubectl(
        "create", "configmap", CONFIGMAP, "-n", ns.name, f"--from-file={WORKER.name}={WORKER}"
    )
    started = time.monotonic()
    ns.apply(_job("ref", shared_dir))
    ns.apply(_job("preempted", shared_dir))

    ns.wait_log("preempted-worker-1", rf"^RUNNING {MARK}$", timeout=240)
    before = {p.metadata.name: p.metadata.uid for p in ns.pods("preempted")}
    assert sorted(before) == ["preempted-worker-0", "preempted-worker-1"]
    followers = {pod: _follow(ns, pod, tmp_path / f"{pod}.log") for pod in sorted(before)}
    try:
        deleted = time.monotonic()
        # Normal grace: the kubelet sends SIGTERM and waits up to GRACE seconds.
        ns.cluster.kubectl("delete", "pod", "preempted-worker-1", "-n", ns.name, "--wait=false")
        for pod, follower in followers.items():
            wait_for(
                f"the first attempt of {pod} to end",
                lambda f=follower: f.poll() is not None,
                timeout=GRACE + 60,
                interval=0.2,
            )
    finally:
        for follower in followers.values():
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    first = {pod: (tmp_path / f"{pod}.log").read_text() for pod in followers}

    job = ns.wait_job("preempted", "Succeeded", timeout=300)
    preempted_done = time.monotonic()
    ref = ns.wait_job("ref", "Succeeded", timeout=120)
    evidence = "\n".join(f"--- {pod} (first attempt):\n{log[-3000:]}" for pod, log in first.items())

    # The first attempt: both workers saved once, after the same step, and exited for a restart
    # (worker 1 told by the kubelet's SIGTERM, worker 0 by its peer); no RESULT.
    saves = {pod: SAVED.findall(log) for pod, log in first.items()}
    assert [who for who, _ in saves["preempted-worker-1"]] == ["this worker"], evidence
    assert [who for who, _ in saves["preempted-worker-0"]] == ["a peer"], evidence
    (saved,) = {int(found[0][1]) for found in saves.values()}  # the same step on both
    assert MARK < saved < STEPS, evidence
    for log in first.values():
        assert log.count("exiting for a restart") == 1, evidence
        assert not _lines(log, "RESULT "), evidence

    # The operator restarted the whole job once, counted against backoffLimit.
    status = job["status"]
    assert status["restartCount"] == 1, status
    assert not status.get("preemptions"), status  # a user's delete is no cluster disruption
    restarts = [m for r, m in _events(ns, "preempted") if r == "JobRestarting"]
    assert len(restarts) == 1, _events(ns, "preempted")
    assert "restarts all 2 pods" in restarts[0] and "(restart 1 of 1)" in restarts[0], restarts
    # Its root: whichever the operator saw first, the deleted pod gone or its peer's exit 143.
    root = ("worker-1 was deleted", "worker-0 exited with code 143")
    assert any(f": {r}" in restarts[0] for r in root), restarts
    after = {p.metadata.name: p.metadata.uid for p in ns.pods("preempted")}
    assert set(after) == set(before) and not set(after.values()) & set(before.values())

    # The resumed attempt started at the saved step, not 0, and ran the rest: STEPS in all.
    states = {}
    for rank in (0, 1):
        log = ns.logs(f"preempted-worker-{rank}")
        (result,) = (json.loads(line) for line in _lines(log, "RESULT "))
        assert result == {"attempt": 2, "first": saved, "ran": list(range(saved, STEPS))}, log
        assert saved + len(result["ran"]) == STEPS
        (states[rank],) = _lines(log, "STATE ")

    # The uninterrupted reference: one attempt, every step.
    assert ref["status"]["restartCount"] == 0, ref["status"]
    reference = {}
    for rank in (0, 1):
        log = ns.logs(f"ref-worker-{rank}")
        (result,) = (json.loads(line) for line in _lines(log, "RESULT "))
        assert result == {"attempt": 1, "first": 0, "ran": list(range(STEPS))}, log
        (reference[rank],) = _lines(log, "STATE ")

    # Bit-identical: parameters, momenta and learning rate, on every worker of both jobs.
    assert states[0] == states[1] == reference[0] == reference[1], (states, reference)
    report(
        f"preemption e2e: saved after {saved} steps, resumed at {saved}; "
        f"deleted {deleted - started:.0f}s after apply, preempted job Succeeded "
        f"{preempted_done - deleted:.0f}s after the delete ({preempted_done - started:.0f}s in all)"
        f"\n{restarts[0]}\n" + "\n".join(re.findall(r".*checkpoint .* saved in .*", evidence))
    )
