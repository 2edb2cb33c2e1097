"""Kubeflow TFJobs on the real control plane, served by the operator started with
``STRATEGYJOB_SERVE_TFJOBS=true``: Kubeflow's own example manifests get training-operator's
pods, Services, labels, ``TF_CONFIG`` and conditions; the status lifecycle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from integration_harness import Kube, OperatorProcess, wait_for
from strategyjob import jobspec

from tests.support import kubeflow_tfjobs
from tests.support.control_plane import ControlPlane

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
#: The namespaces of this module (conftest's ``tf_kube``): only its operator watches them.
PREFIX = "tf-"
#: The operator's ``CUSTOM_CLUSTER_DOMAIN``, as a platform team moving from training-operator
#: keeps it: every ``TF_CONFIG`` address ends with it.
DOMAIN = "cluster.local"
#: training-operator's label naming a pod's TFJob.
TF_JOB_LABEL = "training.kubeflow.org/job-name"


@pytest.fixture(scope="module")
def tf_operator(control_plane: ControlPlane) -> Iterator[OperatorProcess]:
    env = {"STRATEGYJOB_SERVE_TFJOBS": "true", "CUSTOM_CLUSTER_DOMAIN": DOMAIN}
    op = OperatorProcess(control_plane, "--standalone", "-n", f"{PREFIX}*", env=env).start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def tf(tf_kube: Kube, tf_operator: OperatorProcess) -> Kube:
    """A namespace the TFJob-serving operator watches."""
    return tf_kube


def create(k: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = k.custom.create_namespaced_custom_object(
        GROUP, VERSION, k.ns, PLURAL, manifest
    )
    return obj


def tfjob(k: Kube, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = k.custom.get_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL, name)
    return obj


def patch(k: Kube, name: str, body: dict[str, Any]) -> None:
    k.custom.patch_namespaced_custom_object(GROUP, VERSION, k.ns, PLURAL, name, body)


def wait_condition(k: Kube, name: str, type_: str, timeout: float = 30.0) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        conds = (tfjob(k, name).get("status") or {}).get("conditions") or []
        return next((x for x in conds if x["type"] == type_ and x["status"] == "True"), None)

    condition: dict[str, Any] = wait_for(f"{name} {type_}", found, timeout)
    return condition


def tf_pods(k: Kube, name: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p, _ in k.raw_pods(name)}


def wait_tf_pods(k: Kube, name: str, count: int) -> dict[str, dict[str, Any]]:
    def ready() -> dict[str, dict[str, Any]] | None:
        pods = {
            n: p for n, p in tf_pods(k, name).items() if not p["metadata"].get("deletionTimestamp")
        }
        return pods if len(pods) == count else None

    pods: dict[str, dict[str, Any]] = wait_for(f"{count} pods of {name}", ready, 30.0)
    return pods


@pytest.mark.timeout(120)
@pytest.mark.parametrize("file", ["example-dist-mnist", "example-simple", "example-multi-worker"])
def test_kubeflow_examples_get_training_operators_pods_services_and_tf_config(
    tf: Kube, file: str
) -> None:
    manifest = kubeflow_tfjobs.load(file, tf.ns)
    expected = jobspec.load_tfjob(manifest, cluster_domain=DOMAIN)
    name = expected.name
    uid = create(tf, manifest)["metadata"]["uid"]
    replicas = expected.job.replicas()
    pods = wait_tf_pods(tf, name, len(replicas))
    assert set(pods) == {f"{name}-{expected.type_name(t)}-{i}" for t, i in replicas}

    for replica_type, index in replicas:
        pod_name = expected.pod_name(replica_type, index)
        pod = pods[pod_name]
        labels = pod["metadata"]["labels"]
        tf_type = expected.type_name(replica_type)
        assert labels["training.kubeflow.org/job-name"] == name
        assert labels["training.kubeflow.org/replica-type"] == tf_type
        assert labels["training.kubeflow.org/replica-index"] == str(index)
        assert labels["training.kubeflow.org/operator-name"] == "tfjob-controller"
        # the chief leads (dist-mnist has one), else worker 0
        leads = (replica_type, index) == (
            ("chief", 0) if "chief" in expected.replicas else ("worker", 0)
        )
        assert (labels.get("training.kubeflow.org/job-role") == "master") is leads
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["apiVersion"], owner["uid"]) == (
            "TFJob",
            "kubeflow.org/v1",
            uid,
        )
        assert owner["controller"] is True

        # the namespace's default account, as under training-operator (image pull secrets)
        assert "serviceAccountName" not in pod["spec"] or pod["spec"]["serviceAccountName"] == (
            "default"
        )
        # Kubeflow's images run as root: no runAsNonRoot default, the others stay
        assert "runAsNonRoot" not in pod["spec"]["securityContext"]
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        containers = pod["spec"]["containers"]
        at = next(i for i, c in enumerate(containers) if c["name"] == "tensorflow")
        assert {"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"} in containers[at][
            "ports"
        ]
        env = tf.container_env(pod, at)  # as the kubelet gives it to the container
        assert env["TF_CONFIG"] == jobspec.tfjob_tf_config(expected, replica_type, index)
        assert f'"{pod_name}.{tf.ns}.svc.{DOMAIN}:2222"' in env["TF_CONFIG"]
        assert env["TF_CONFIG"].endswith(
            f'"task":{{"type":"{tf_type}","index":{index}}},"environment":"cloud"}}'
        )

        svc = wait_for("service", lambda n=pod_name: tf.core.read_namespaced_service(n, tf.ns))
        assert svc.spec.cluster_ip == "None"
        assert svc.spec.selector == {
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": "tfjob-controller",
            "training.kubeflow.org/replica-type": tf_type,
            "training.kubeflow.org/replica-index": str(index),
        }
        assert [(p.name, p.port) for p in svc.spec.ports] == [("tfjob-port", 2222)]
        assert svc.metadata.owner_references[0].kind == "TFJob"

    created = wait_condition(tf, name, "Created")
    assert created["reason"] == "TFJobCreated"
    for pod_name in pods:
        tf.set_phase(pod_name, "Running")
    running = wait_condition(tf, name, "Running")
    assert running["reason"] == "TFJobRunning"
    assert running["message"] == f"TFJob {name} is running."
    status = tfjob(tf, name)["status"]
    keys = {expected.key(t) for t in expected.replicas}
    assert set(status["replicaStatuses"]) == keys  # CamelCase: Worker, PS
    for key in keys:
        assert status["replicaStatuses"][key]["active"] == sum(
            1 for t, _ in replicas if expected.key(t) == key
        )
    assert status["startTime"] and status["lastReconcileTime"]


def two_types(
    name: str, namespace: str, restart_policy: str = "Never", **spec: Any
) -> dict[str, Any]:
    def replica(n: int) -> dict[str, Any]:
        container = {"name": "tensorflow", "image": "busybox", "command": ["sh"]}
        return {
            "replicas": n,
            "restartPolicy": restart_policy,
            "template": {"spec": {"containers": [container]}},
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tfReplicaSpecs": {"Chief": replica(1), "Worker": replica(2)}, **spec},
    }


@pytest.mark.timeout(90)
def test_chief_success_succeeds_the_tfjob(tf: Kube) -> None:
    create(tf, two_types("ok", tf.ns))
    pods = wait_tf_pods(tf, "ok", 3)
    assert pods["ok-chief-0"]["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    for pod_name in pods:
        tf.set_phase(pod_name, "Running")
    wait_condition(tf, "ok", "Running")
    tf.set_phase("ok-chief-0", "Succeeded", exit_code=0)
    done = wait_condition(tf, "ok", "Succeeded")
    assert done["reason"] == "TFJobSucceeded"
    status = tfjob(tf, "ok")["status"]
    assert status["completionTime"]
    assert status["replicaStatuses"]["Chief"]["succeeded"] == 1


@pytest.mark.timeout(90)
def test_worker_failure_fails_the_tfjob(tf: Kube) -> None:
    create(tf, two_types("bad", tf.ns))
    pods = wait_tf_pods(tf, "bad", 3)
    for pod_name in pods:
        tf.set_phase(pod_name, "Running")
    wait_condition(tf, "bad", "Running")
    tf.set_phase("bad-worker-1", "Failed", exit_code=1)
    wait_condition(tf, "bad", "Failed")
    assert tfjob(tf, "bad")["status"]["replicaStatuses"]["Worker"]["failed"] == 1


@pytest.mark.timeout(90)
def test_on_failure_restarts_and_suspend_deletes_the_pods(tf: Kube) -> None:
    create(tf, two_types("again", tf.ns, restart_policy="OnFailure"))
    pods = wait_tf_pods(tf, "again", 3)
    first = {n: p["metadata"]["uid"] for n, p in pods.items()}
    for pod_name in pods:
        tf.set_phase(pod_name, "Running")
    wait_condition(tf, "again", "Running")
    tf.set_phase("again-worker-0", "Failed", exit_code=1)
    wait_condition(tf, "again", "Restarting")

    def recreated() -> dict[str, dict[str, Any]] | None:
        now = wait_tf_pods(tf, "again", 3)
        return now if now["again-worker-0"]["metadata"]["uid"] != first["again-worker-0"] else None

    wait_for("worker-0 recreated", recreated, 30.0)

    patch(tf, "again", {"spec": {"runPolicy": {"suspend": True}}})
    suspended = wait_condition(tf, "again", "Suspended")
    assert suspended["reason"] == "TFJobSuspended"
    wait_for("pods deleted", lambda: not tf_pods(tf, "again"), 30.0)


@pytest.mark.timeout(90)
def test_a_tfjob_managed_by_multikueue_is_left_alone(tf: Kube) -> None:
    manifest = two_types("elsewhere", tf.ns, runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"})
    create(tf, manifest)
    create(tf, two_types("here", tf.ns))
    wait_tf_pods(tf, "here", 3)  # the operator has had its passes: the other one it left
    wait_condition(tf, "here", "Created")
    assert tf_pods(tf, "elsewhere") == {}
    assert not tfjob(tf, "elsewhere").get("status")


@pytest.mark.timeout(90)
def test_dynamic_worker_gets_its_sparse_tf_config_and_its_failure_does_not_fail_the_job(
    tf: Kube,
) -> None:
    manifest = two_types("dyn", tf.ns, enableDynamicWorker=True)
    expected = jobspec.load_tfjob(manifest, cluster_domain=DOMAIN)
    create(tf, manifest)
    pods = wait_tf_pods(tf, "dyn", 3)
    env = tf.container_env(pods["dyn-worker-1"])
    assert env["TF_CONFIG"] == (
        '{"cluster":{"worker":{"1":"dyn-worker-1.' + tf.ns + '.svc.cluster.local:2222"},"ps":null},'
        '"task":{"type":"worker","index":1}}'
    )
    assert tf.container_env(pods["dyn-chief-0"])["TF_CONFIG"] == jobspec.tfjob_tf_config(
        expected, "chief", 0
    )
    for pod_name in pods:
        tf.set_phase(pod_name, "Running")
    wait_condition(tf, "dyn", "Running")
    tf.set_phase("dyn-worker-1", "Failed", exit_code=1)

    def given_up() -> dict[str, Any] | None:
        status = tfjob(tf, "dyn").get("status") or {}
        details = status.get("strategyjobReplicaStatuses", {}).get("Worker") or {}
        return status if details.get("failedIndexes") == "1" else None

    status = wait_for("the worker given up", given_up, 30.0)
    assert status["replicaStatuses"]["Worker"]["failed"] == 1
    conds = {x["type"]: x["status"] for x in tfjob(tf, "dyn")["status"]["conditions"]}
    assert conds.get("Failed") != "True"
    tf.set_phase("dyn-chief-0", "Succeeded", exit_code=0)
    wait_condition(tf, "dyn", "Succeeded")


@pytest.mark.timeout(90)
def test_replicas_edits_scale_the_tfjob(tf: Kube) -> None:
    create(tf, two_types("grow", tf.ns))
    pods = wait_tf_pods(tf, "grow", 3)
    before = {n: p["metadata"]["uid"] for n, p in pods.items()}
    for pod_name in pods:
        tf.set_phase(pod_name, "Running")
    wait_condition(tf, "grow", "Running")

    patch(tf, "grow", {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 3}}}})
    pods = wait_tf_pods(tf, "grow", 4)
    assert {n: p["metadata"]["uid"] for n, p in pods.items() if n in before} == before
    bigger = jobspec.load_tfjob(tfjob(tf, "grow"), cluster_domain=DOMAIN)
    env = tf.container_env(pods["grow-worker-2"])
    assert env["TF_CONFIG"] == jobspec.tfjob_tf_config(bigger, "worker", 2)
    assert "grow-worker-2" in env["TF_CONFIG"]
    wait_for("its Service", lambda: tf.core.read_namespaced_service("grow-worker-2", tf.ns))
    tf.set_phase("grow-worker-2", "Running")

    patch(tf, "grow", {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1}}}})

    def shrunk() -> bool:
        names = {p.metadata.name for p in tf.core.list_namespaced_service(tf.ns).items}
        return set(tf_pods(tf, "grow")) == {"grow-chief-0", "grow-worker-0"} and names == {
            "grow-chief-0",
            "grow-worker-0",
        }

    wait_for("pods and Services at index >= 1 deleted", shrunk, 30.0)
    wait_for(
        "the edit observed",
        lambda: (
            tfjob(tf, "grow")["status"].get("observedGeneration")
            == tfjob(tf, "grow")["metadata"]["generation"]
        ),
        30.0,
    )
    conds = {x["type"]: x["status"] for x in tfjob(tf, "grow")["status"]["conditions"]}
    assert conds["Running"] == "True"
    assert conds.get("Failed") != "True" and conds.get("Restarting") != "True"


def tfjob_events(k: Kube, name: str, reason: str) -> list[str]:
    return [
        e.message
        for e in k.core.list_namespaced_event(k.ns).items
        if e.involved_object.kind == "TFJob"
        and e.involved_object.name == name
        and e.reason == reason
    ]


@pytest.mark.timeout(150)
def test_a_dynamic_ps_tfjobs_chief_follows_its_workers_2_3_1(tf: Kube) -> None:
    """enableDynamicWorker with a Chief and PS: the chief's members file (the TFJob's own
    cluster) gains worker 2 once its pod is Ready and loses workers 1 and 2 before their pods
    are deleted; the chief is never replaced; Resizing and Events say each change."""
    from kubernetes import watch

    name, members_name = "dynps", "dynps-strategyjob-members"
    manifest = two_types(name, tf.ns, enableDynamicWorker=True)
    ps = dict(manifest["spec"]["tfReplicaSpecs"]["Worker"], replicas=1)
    manifest["spec"]["tfReplicaSpecs"]["PS"] = ps
    create(tf, manifest)
    pods = wait_tf_pods(tf, name, 4)
    chief_uid = pods["dynps-chief-0"]["metadata"]["uid"]
    env = tf.container_env(pods["dynps-chief-0"])
    assert env["STRATEGYJOB_CLUSTER_FILE"] == "/etc/strategyjob/members/cluster.json"
    volumes = pods["dynps-chief-0"]["spec"]["volumes"]
    assert members_name in [(v.get("configMap") or {}).get("name") for v in volumes]
    for pod_name in pods:
        tf.make_ready(pod_name)
    wait_condition(tf, name, "Running")

    def members() -> dict[str, str]:
        return dict(tf.core.read_namespaced_config_map(members_name, tf.ns).data or {})

    def wait_members(workers: str) -> dict[str, str]:
        found: dict[str, str] = wait_for(
            f"the chief's members to be workers {workers}",
            lambda: (m := members()).get("workers") == workers and m,
        )
        return found

    svc = f"{tf.ns}.svc.{DOMAIN}:2222"
    assert json.loads(wait_members("0-1")["cluster.json"]) == {
        "chief": [f"dynps-chief-0.{svc}"],
        "ps": [f"dynps-ps-0.{svc}"],
        "worker": {"0": f"dynps-worker-0.{svc}", "1": f"dynps-worker-1.{svc}"},
    }

    # 2 -> 3: worker 2 gets its Service and pod; the chief takes it once it is Ready
    patch(tf, name, {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 3}}}})
    pods = wait_tf_pods(tf, name, 5)
    assert tf.container_env(pods["dynps-worker-2"])["TF_CONFIG"] == (
        '{"cluster":{"worker":{"2":"dynps-worker-2.' + svc + '"},"ps":["dynps-ps-0.' + svc + '"]},'
        '"task":{"type":"worker","index":2}}'
    )
    wait_for("its Service", lambda: tf.core.read_namespaced_service("dynps-worker-2", tf.ns))
    waiting = wait_condition(tf, name, "Resizing")
    # (no node here: the scheduler's words follow, as for a StrategyJob's ResizeStalled)
    assert waiting["message"].startswith(
        "TFJob dynps: resizing to 3 workers; the chief follows 2, waiting for dynps-worker-2 to "
        "be Ready."
    )
    conds = tfjob(tf, name)["status"]["conditions"]
    assert conds[-1]["type"] == "Running", conds  # kubectl get tfjob's State column
    assert members()["workers"] == "0-1"
    tf.make_ready("dynps-worker-2")
    joined = json.loads(wait_members("0-2")["cluster.json"])
    assert joined["worker"]["2"] == f"dynps-worker-2.{svc}"
    wait_for(
        "the chief's members annotation",
        lambda: (
            (tf.core.read_namespaced_pod("dynps-chief-0", tf.ns).metadata.annotations or {}).get(
                "strategyjob.dev/members"
            )
            == "0,1,2"
        ),
    )
    wait_for(
        "Resizing False",
        lambda: any(
            x["type"] == "Resizing" and x["status"] == "False"
            for x in tfjob(tf, name)["status"]["conditions"]
        ),
    )
    assert tfjob(tf, name)["status"]["workers"] == 3

    # 3 -> 1: each pod of a worker that left is deleted only once the file no longer has it
    listed = tf.core.list_namespaced_pod(tf.ns, label_selector=f"{TF_JOB_LABEL}={name}")
    patch(tf, name, {"spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1}}}})
    going: set[str] = set()
    pod_events = watch.Watch()
    try:  # every pod change since the list, the deletions included, within 30 s
        for event in pod_events.stream(
            tf.core.list_namespaced_pod,
            tf.ns,
            label_selector=f"{TF_JOB_LABEL}={name}",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=30,
        ):
            pod = event["object"]
            if pod.metadata.name in ("dynps-worker-1", "dynps-worker-2") and (
                event["type"] == "DELETED" or pod.metadata.deletion_timestamp
            ):
                held = members()["workers"]
                assert held == "0", f"{pod.metadata.name} went while the chief had {held}"
                going.add(pod.metadata.name)
                if len(going) == 2:
                    break
    finally:
        pod_events.stop()
    assert going == {"dynps-worker-1", "dynps-worker-2"}
    assert sorted(json.loads(members()["cluster.json"])["worker"]) == ["0"]
    wait_for(
        "their Services deleted",
        lambda: (
            {s.metadata.name for s in tf.core.list_namespaced_service(tf.ns).items}
            == {"dynps-chief-0", "dynps-ps-0", "dynps-worker-0"}
        ),
    )
    assert wait_tf_pods(tf, name, 3)["dynps-chief-0"]["metadata"]["uid"] == chief_uid
    resized = wait_for(
        "both Resized Events",
        lambda: (m := tfjob_events(tf, name, "Resized")) and len(m) >= 2 and m,
    )
    assert any("TFJob dynps: workers 2 -> 3 (joined: worker 2)" in m for m in resized), resized
    assert any("workers 3 -> 1 (left: worker 1-2)" in m for m in resized), resized
    status = tfjob(tf, name)["status"]
    conds = {x["type"]: x["status"] for x in status["conditions"]}
    assert conds["Running"] == "True" and conds.get("Failed") != "True"
    assert status["conditions"][-1]["type"] == "Running"
    assert status.get("restartCount", 0) == 0


@pytest.mark.timeout(90)
def test_a_dynamic_tfjob_without_ps_keeps_no_members_file(tf: Kube) -> None:
    """Without ps (so not ParameterServerStrategy-shaped) a dynamic TFJob's chief gets no
    members file: its edits stay training-operator's."""
    create(tf, two_types("dynmw", tf.ns, enableDynamicWorker=True))
    pods = wait_tf_pods(tf, "dynmw", 3)
    assert "STRATEGYJOB_CLUSTER_FILE" not in tf.container_env(pods["dynmw-chief-0"])
    names = {m.metadata.name for m in tf.core.list_namespaced_config_map(tf.ns).items}
    assert "dynmw-strategyjob-members" not in names
