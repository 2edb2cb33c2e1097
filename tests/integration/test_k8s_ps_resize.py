"""Resizing a running ParameterServerStrategy job (issue 30) against a real API server and
the operator, the test playing the kubelet: ``kubectl scale`` 2 -> 4 -> 1 -> 3. New workers get
pods with the new cluster; the chief's members ConfigMap (the file its coordinator follows)
gains each once its pod is Ready, loses removed ones before their pods are deleted; the chief,
the ps and the workers that stay are never replaced; ``Resizing`` and an Event say each
change."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from integration_harness import manifest, wait_for

pytestmark = pytest.mark.timeout(180)

MEMBERS = "elastic-strategyjob-members"


def members(kube) -> dict[str, str]:
    return dict(kube.core.read_namespaced_config_map(MEMBERS, kube.ns).data or {})


def wait_members(kube, workers: str) -> dict[str, str]:
    return wait_for(
        f"the chief's members to be workers {workers}",
        lambda: (m := members(kube)).get("workers") == workers and m,
    )


def scale(cp, kube, replicas: int) -> None:
    done = cp.kubectl("scale", "sjob/elastic", f"--replicas={replicas}", "-n", kube.ns)
    assert done.returncode == 0, done.stderr


def uids(kube) -> dict[str, str]:
    return {name: pod.metadata.uid for name, pod in kube.pods("elastic").items()}


HOLD = "strategyjob.dev/test-hold"


def test_a_ps_job_is_resized_2_4_1_3_without_restarting_anything_that_stays(
    kube, operator, control_plane
):
    cp = control_plane
    kube.create_job(
        manifest("elastic", "ParameterServerStrategy", {"chief": 1, "ps": 1, "worker": 2})
    )
    for name in kube.wait_pods("elastic", 4):
        kube.make_ready(name)
    kube.wait_condition("elastic", "Running")
    first = wait_members(kube, "0-1")
    cluster = json.loads(first["cluster.json"])
    assert sorted(cluster["worker"]) == ["0", "1"]
    chief = kube.core.read_namespaced_pod("elastic-chief-0", kube.ns)
    env = {e.name: e.value for e in chief.spec.containers[0].env}
    assert env["STRATEGYJOB_CLUSTER_FILE"] == "/etc/strategyjob/members/cluster.json"
    assert any(v.config_map and v.config_map.name == MEMBERS for v in chief.spec.volumes)
    before = uids(kube)

    # 2 -> 4: the new pods are made with the cluster of 4; the chief waits for them to be Ready
    scale(cp, kube, 4)
    pods = kube.wait_pods("elastic", 6)
    assert {"elastic-worker-2", "elastic-worker-3"} <= pods.keys()
    raw = {p["metadata"]["name"]: p for p, _ in kube.raw_pods("elastic")}
    tf_config = json.loads(kube.container_env(raw["elastic-worker-3"])["TF_CONFIG"])
    assert len(tf_config["cluster"]["worker"]) == 4
    assert tf_config["task"] == {"type": "worker", "index": 3}
    waiting = wait_for(
        "Resizing",
        lambda: (r := condition_of(kube, "elastic", "Resizing")) and r["status"] == "True" and r,
    )
    assert "waiting for elastic-worker-2, elastic-worker-3 to be Ready" in waiting["message"]
    assert members(kube)["workers"] == "0-1"
    kube.make_ready("elastic-worker-2")
    joined = wait_members(kube, "0-2")
    assert sorted(json.loads(joined["cluster.json"])["worker"]) == ["0", "1", "2"]
    wait_for(
        "the chief's members annotation",
        lambda: (
            kube.core.read_namespaced_pod("elastic-chief-0", kube.ns).metadata.annotations.get(
                "strategyjob.dev/members"
            )
            == "0,1,2"
        ),
    )
    kube.make_ready("elastic-worker-3")
    wait_members(kube, "0-3")
    done = wait_for(
        "Resizing False",
        lambda: (r := condition_of(kube, "elastic", "Resizing")) and r["status"] == "False" and r,
    )
    assert done["message"] == "StrategyJob elastic runs 4 workers."
    assert kube.job("elastic")["status"]["workers"] == 4
    header, row = cp.kubectl("get", "sjob", "elastic", "-n", kube.ns, "-o", "wide").stdout.split(
        "\n"
    )[:2]
    at = header.index("WORKERS")  # columns are aligned; an empty one (PROGRESS) has no word
    assert row[at:].split()[:2] == ["4", "4"], (header, row)
    assert header[at:].split()[:2] == ["WORKERS", "DESIRED"]
    events = kube.wait_events("elastic", "Resized")
    assert any("workers 2 -> 3 (joined: worker 2)" in e.message for e in events)

    # 4 -> 1: the chief is told first, then the pods go; workers 1 and 2 are held going (a
    # finalizer: a kubelet's grace period) while the job is scaled back to 3
    going = ("elastic-worker-1", "elastic-worker-2")
    for name in going:
        kube.core.patch_namespaced_pod(name, kube.ns, {"metadata": {"finalizers": [HOLD]}})
    old = uids(kube)
    scale(cp, kube, 1)
    wait_members(kube, "0")
    kube.wait_pods("elastic", 3)
    # 1 -> 3: the new workers 1 and 2 get pods once the old ones are gone, and join
    scale(cp, kube, 3)
    # nothing says the operator saw the edit (its pods cannot be made yet): give it 2 s, in
    # which the going pods must stay the old ones
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert {n: uids(kube).get(n) for n in going} == {n: old[n] for n in going}
        time.sleep(0.2)
    for name in going:
        drop = '[{"op": "remove", "path": "/metadata/finalizers"}]'
        done = cp.kubectl("patch", "pod", name, "-n", kube.ns, "--type=json", "-p", drop)
        assert done.returncode == 0, done.stderr
    pods = kube.wait_pods("elastic", 5)
    for name in going:
        assert pods[name].metadata.uid != old[name]
        kube.make_ready(name)
    wait_members(kube, "0-2")

    after = uids(kube)
    for name in ("elastic-chief-0", "elastic-ps-0", "elastic-worker-0"):
        assert after[name] == before[name], f"{name} was replaced"
    job = kube.job("elastic")
    assert job["status"].get("restartCount", 0) == 0
    assert not kube.condition("elastic", "Failed")
    assert job["status"]["replicaStatuses"]["worker"]["selector"] == (
        "strategyjob.dev/job-name=elastic,strategyjob.dev/replica-type=worker"
    )
    scale_view = kube.custom.get_namespaced_custom_object_scale(
        "strategyjob.dev", "v1alpha1", kube.ns, "strategyjobs", "elastic"
    )
    assert scale_view["spec"]["replicas"] == 3
    assert (
        scale_view["status"]["selector"] == job["status"]["replicaStatuses"]["worker"]["selector"]
    )


@pytest.mark.parametrize(
    ("strategy", "name"), [("MultiWorkerMirroredStrategy", "mwms"), ("TPUStrategy", "tpu")]
)
def test_a_collective_job_re_forms_at_each_new_size_from_its_checkpoint(
    kube, operator, control_plane, strategy, name
):
    """MultiWorkerMirroredStrategy (and TPUStrategy, on its group) cannot lose or gain a member
    while it runs: a resize stops every pod (each saves its checkpoint at the next step
    boundary on SIGTERM) and creates the group at the new size, which resumes from it; not
    counted as a restart. Growing, the new workers' pods are made first and the old group
    stops once they run."""
    cp = control_plane

    def group(count: int, attempt: int) -> None:
        pods = kube.wait_pods(name, count)
        raw = {p["metadata"]["name"]: p for p, _ in kube.raw_pods(name)}
        for pod in sorted(pods):
            labels = raw[pod]["metadata"]["labels"]
            assert labels["strategyjob.dev/restart-attempt"] == str(attempt), pod
            env = kube.container_env(raw[pod])
            assert env["WORLD_SIZE"] == str(count)
            assert len(json.loads(env["TF_CONFIG"])["cluster"]["worker"]) == count
            kube.make_ready(pod)

    kube.create_job(manifest(name, strategy, {"worker": 2}))
    group(2, 0)
    kube.wait_condition(name, "Running")
    wait_for("status.workers 2", lambda: kube.job(name)["status"].get("workers") == 2)
    before = uids_of(kube, name)

    done = cp.kubectl("scale", f"sjob/{name}", "--replicas=3", "-n", kube.ns)
    assert done.returncode == 0, done.stderr
    # growing: worker-2 is made first, for the next attempt, while the group trains on
    ahead = wait_for(f"{name}-worker-2", lambda: kube.pods(name).get(f"{name}-worker-2"))
    assert ahead.metadata.labels["strategyjob.dev/restart-attempt"] == "1"
    assert set(before.values()) <= set(uids_of(kube, name).values())
    kube.make_ready(f"{name}-worker-2")  # it runs (its task waits for the group's leader)
    wait_for(
        "the old group gone",
        lambda: not set(before.values()) & set(uids_of(kube, name).values()),
    )
    events = kube.wait_events(name, "Resizing")
    assert any("re-forms with 3 workers (it ran 2)" in e.message for e in events)
    group(3, 1)
    settled = wait_for(
        "Resizing False",
        lambda: (r := condition_of(kube, name, "Resizing")) and r["status"] == "False" and r,
    )
    assert settled["message"] == f"StrategyJob {name} runs 3 workers."
    status = kube.job(name)["status"]
    assert (status["workers"], status.get("resizes"), status.get("restartCount", 0)) == (3, 1, 0)

    before = uids_of(kube, name)
    done = cp.kubectl("scale", f"sjob/{name}", "--replicas=2", "-n", kube.ns)
    assert done.returncode == 0, done.stderr
    # worker-2 may go before worker-0 and worker-1 of its group: wait for the whole group.
    wait_for(
        "the 3-worker group gone",
        lambda: not set(before.values()) & set(uids_of(kube, name).values()),
    )
    assert f"{name}-worker-2" not in kube.pods(name)
    group(2, 2)
    wait_for("status.workers 2 again", lambda: kube.job(name)["status"].get("workers") == 2)
    assert not kube.condition(name, "Failed")


@pytest.mark.parametrize(
    ("strategy", "counts"),
    [
        ("ParameterServerStrategy", {"chief": 1, "ps": 1, "worker": 2}),
        ("MultiWorkerMirroredStrategy", {"worker": 2}),
    ],
)
def test_a_worker_added_that_cannot_start_leaves_the_job_running_at_its_old_size(
    kube, operator, control_plane, strategy, counts
):
    """Scaled 2 -> 3, the new worker finds no node (this control plane's scheduler has none):
    past pendingTimeoutSeconds the job neither fails nor stalls; Resizing (ResizeStalled)
    quotes the scheduler and says the job runs on with 2 workers, whose pods are untouched
    (a MultiWorkerMirroredStrategy job makes its new pods first and re-forms only once they
    run); once the pod starts the chief takes it, or the job re-forms at 3."""
    m = manifest("stuckgrow", strategy, counts)
    m["spec"]["runPolicy"] = {"pendingTimeoutSeconds": 3}
    kube.create_job(m)
    for name in kube.wait_pods("stuckgrow", sum(counts.values())):
        kube.make_ready(name)
    kube.wait_condition("stuckgrow", "Running")
    before = uids_of(kube, "stuckgrow")
    done = control_plane.kubectl("scale", "sjob/stuckgrow", "--replicas=3", "-n", kube.ns)
    assert done.returncode == 0, done.stderr
    held = wait_for(
        "Resizing: ResizeStalled",
        lambda: (
            (r := condition_of(kube, "stuckgrow", "Resizing"))
            and r["reason"] == "ResizeStalled"
            and r
        ),
    )
    assert held["status"] == "True"
    assert "Pod stuckgrow-worker-2 cannot start: Unschedulable: " in held["message"]
    assert held["message"].endswith("the job runs on with 2 workers meanwhile.")
    created = kube.pods("stuckgrow")["stuckgrow-worker-2"].metadata.creation_timestamp
    # past the pending timeout (3 s) and a pass after it: no verdict comes to wait for
    wait_for(
        "5 s past the new pod's creation",
        lambda: datetime.now(UTC) > created + timedelta(seconds=5),
        timeout=30,
        interval=0.2,
    )
    job = kube.job("stuckgrow")
    assert not kube.condition("stuckgrow", "Failed"), job["status"]["conditions"]
    stalled = condition_of(kube, "stuckgrow", "Stalled")
    assert stalled is None or stalled["status"] == "False", stalled
    assert (job["status"]["state"], job["status"]["workers"]) == ("Running", 2)
    running = {n: u for n, u in uids_of(kube, "stuckgrow").items() if n != "stuckgrow-worker-2"}
    assert set(running) == set(before)
    assert running == before, "the running group's pods are untouched"
    kube.make_ready("stuckgrow-worker-2")
    if strategy == "MultiWorkerMirroredStrategy":  # re-forms now: the old group is made anew
        ahead = kube.pods("stuckgrow")["stuckgrow-worker-2"].metadata.uid
        wait_for(
            "the old group gone",
            lambda: not set(before.values()) & set(uids_of(kube, "stuckgrow").values()),
        )
        for name in kube.wait_pods("stuckgrow", 3):
            kube.make_ready(name)
        assert uids_of(kube, "stuckgrow")["stuckgrow-worker-2"] == ahead  # it waited, kept
    settled = wait_for(
        "Resizing False",
        lambda: (r := condition_of(kube, "stuckgrow", "Resizing")) and r["status"] == "False" and r,
    )
    assert settled["message"] == "StrategyJob stuckgrow runs 3 workers."


def uids_of(kube, job: str) -> dict[str, str]:
    return {name: pod.metadata.uid for name, pod in kube.pods(job).items()}


def condition_of(kube, job: str, kind: str) -> dict | None:
    conds = ((kube.job(job) or {}).get("status") or {}).get("conditions") or []
    return next((x for x in conds if x["type"] == kind), None)
