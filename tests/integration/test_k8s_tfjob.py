"""Kubeflow TFJobs on the real control plane, served by the operator started with
``STRATEGYJOB_SERVE_TFJOBS=true``: Kubeflow's own example manifests get training-operator's
pods, Services, labels, ``TF_CONFIG`` and conditions; the status lifecycle."""

from __future__ import annotations

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
