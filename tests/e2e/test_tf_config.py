"""The environment the operator injects is what TensorFlow reads, and its addresses work:
inside every pod, each TF_CONFIG address resolves to the pod of that task and accepts a
connection on the job's port (the headless Service's DNS names, pod to pod)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.e2e_support import Namespace, wait_for, worker_image

pytestmark = pytest.mark.timeout(150)

#: Run in every pod: listen on its own TF_CONFIG port, answer each connection with its task
#: name, connect to every address of TF_CONFIG (retrying while peers start) and print what
#: answered, then wait until every task has connected to it too; the ps and workers then serve
#: on until the job stops them, as a ParameterServerStrategy's do (their exit would fail it).
PROBE = r"""
import json, os, signal, socket, threading, time
raw = os.environ["TF_CONFIG"]
config = json.loads(raw)
task = config["task"]
me = "%s-%d" % (task["type"], task["index"])
addresses = [a for _, tasks in sorted(config["cluster"].items()) for a in tasks]
own = config["cluster"][task["type"]][task["index"]]
server = socket.create_server(("", int(own.rsplit(":", 1)[1])))
served = []
def serve():
    while True:
        conn, _ = server.accept()
        conn.sendall(me.encode())
        conn.close()
        served.append(1)
threading.Thread(target=serve, daemon=True).start()
peers, deadline = {}, time.time() + 90
for address in addresses:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            ip = socket.gethostbyname(host)
            with socket.create_connection((host, int(port)), timeout=2) as conn:
                peers[address] = {"ip": ip, "answered": conn.recv(64).decode()}
            break
        except OSError as e:
            if time.time() > deadline:
                peers[address] = {"error": repr(e)}
                break
            time.sleep(0.2)
master = [os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")]
report = {"task": me, "tf_config": raw, "hostname": socket.gethostname(), "master": master,
          "peers": peers}
print("PROBE " + json.dumps(report), flush=True)
while len(served) < len(addresses) and time.time() < deadline:
    time.sleep(0.1)
if task["type"] != "chief":  # a ps or worker of ParameterServerStrategy serves until stopped
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Event().wait()
"""

TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def tensorflow_reads(tf_config: str) -> tuple[dict[str, list[str]], str, int]:
    """TF_CONFIG as TensorFlow 2 reads it: ``TFConfigClusterResolver`` (json.loads of the
    variable; ``cluster`` becomes the ClusterSpec, ``task.type``/``task.index`` the task)
    and ``multi_worker_util._validate_cluster_spec`` (known task types, one chief, the task
    inside the cluster). Written out here so that it does not share the SDK's code."""
    config = json.loads(tf_config)
    assert isinstance(config, dict), config
    assert set(config) <= {"cluster", "task", "rpc_layer", "environment"}, config
    cluster, task = config.get("cluster", {}), config.get("task", {})
    for job, tasks in cluster.items():
        assert job in TASK_TYPES, f"TensorFlow knows no task type {job!r}"
        assert isinstance(tasks, list) and all(isinstance(a, str) for a in tasks), tasks
    assert len(cluster.get("chief", [])) <= 1, "TensorFlow allows one chief"
    task_type, task_id = task.get("type"), task.get("index")
    assert isinstance(task_id, int) and task_type in cluster, task
    assert 0 <= task_id < len(cluster[task_type]), task
    return cluster, task_type, task_id


def probe_job() -> dict[str, Any]:
    container = {
        "name": "strategyjob",
        "image": worker_image(),
        "command": ["python", "-c", PROBE],
    }
    template = {"spec": {"containers": [container]}}
    spec = {"replicas": 1, "restartPolicy": "Never", "template": template}
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "probe"},
        "spec": {
            "strategy": "ParameterServerStrategy",
            "replicaSpecs": {"chief": spec, "worker": {**spec, "replicas": 2}, "ps": spec},
            # Keep every pod (and its log) after the chief's success.
            "runPolicy": {"cleanPodPolicy": "None"},
        },
    }


def test_tf_config_is_what_tensorflow_reads_and_its_names_reach_the_pods(ns: Namespace):
    ns.apply(probe_job())
    ns.wait_job("probe", "Succeeded", timeout=120)
    pods = {p.metadata.name: p for p in ns.pods("probe")}
    assert sorted(pods) == ["probe-chief-0", "probe-ps-0", "probe-worker-0", "probe-worker-1"]

    def probe_of(pod: str) -> dict[str, Any] | None:
        for line in ns.logs(pod).splitlines():
            if line.startswith("PROBE "):
                return json.loads(line.removeprefix("PROBE "))
        return None

    reports = {
        name: wait_for(f"the probe report of {name}", lambda n=name: probe_of(n), timeout=60)
        for name in pods
    }
    expected = {
        t: [f"probe-{t}-{i}.probe.{ns.name}.svc:2222" for i in range(n)]
        for t, n in (("chief", 1), ("worker", 2), ("ps", 1))
    }
    ip_of = {name: pod.status.pod_ip for name, pod in pods.items()}
    for name, report in reports.items():
        cluster, task_type, task_id = tensorflow_reads(report["tf_config"])
        pod = pods[name]
        assert (task_type, str(task_id)) == (
            pod.metadata.labels["strategyjob.dev/replica-type"],
            pod.metadata.labels["strategyjob.dev/replica-index"],
        )
        assert cluster == expected, cluster
        assert report["hostname"] == name  # the pod's hostname is its own
        assert report["master"] == [f"probe-chief-0.probe.{ns.name}.svc", "2222"]
        # Every address, resolved inside this pod, is the pod of that task, and that task
        # answered on the job's port.
        for task_name, addresses in cluster.items():
            for index, address in enumerate(addresses):
                peer = f"probe-{task_name}-{index}"
                assert report["peers"][address] == {
                    "ip": ip_of[peer],
                    "answered": f"{task_name}-{index}",
                }, (name, address, report["peers"][address])
