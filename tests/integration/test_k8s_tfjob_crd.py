"""The TFJob CRD (crds/kubeflow.org_tfjobs.yaml) on the real API server: Kubeflow's own TFJob
manifests are accepted by ``kubectl apply`` with strict field validation and stored as written,
TFJob's status as training-operator writes it is kept and shown by ``kubectl get tfjobs``
(State, Age), and what training-operator's webhook refuses is refused at apply, naming the
field. No operator runs here: this is the API surface alone."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml
from integration_harness import Kube

from tests.support import kubeflow_tfjobs
from tests.support.control_plane import REPO_ROOT

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
#: What the API server adds to what was written: the CRD's defaults (as training-operator's),
#: where their object is written.
DEFAULTED = {("runPolicy", "suspend"): False}


def kubectl_apply(kube: Kube, manifest: dict[str, Any], verb: str = "apply") -> Any:
    """``kubectl <verb>`` of ``manifest`` with server-side strict field validation (an unknown
    or duplicate field is an error, not a warning); the CompletedProcess, unchecked."""
    args = [verb, "--validate=strict", "-f", "-", "-o", "json"]
    return kube.cp.kubectl(*args, input=yaml.safe_dump(manifest), check=False)


def leaves(obj: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """Every scalar of ``obj`` by its path (list items by index)."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in leaves(value, (*path, key)).items()}
    if isinstance(obj, list):
        return {k: v for i, value in enumerate(obj) for k, v in leaves(value, (*path, i)).items()}
    return {path: obj}


def tfjob(kube: Kube, name: str) -> dict[str, Any]:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, kube.ns, PLURAL, name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [n for n in kubeflow_tfjobs.NAMES if "status" not in n])
def test_kubeflow_manifests_are_accepted_strictly_and_stored_as_written(kube, name):
    manifest = kubeflow_tfjobs.load(name, kube.ns)
    # A manifest with generateName cannot be applied: the user guide creates it.
    verb = "create" if "generateName" in manifest["metadata"] else "apply"
    done = kubectl_apply(kube, manifest, verb)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr and "unknown field" not in done.stderr, done.stderr
    stored = tfjob(kube, json.loads(done.stdout)["metadata"]["name"])
    kept = leaves(stored["spec"])
    # A null is as good as absent (the API server drops it: `creationTimestamp: null`).
    written = {k: v for k, v in leaves(manifest["spec"]).items() if v is not None}
    # Nothing written was pruned or changed; the only additions are TFJob's defaults (and a
    # port's protocol, TCP, as in a Pod).
    assert {k: kept.get(k, "<pruned>") for k in written} == written
    added = {k: v for k, v in kept.items() if k not in written}
    defaulted = {k: v for k, v in DEFAULTED.items() if k[0] in manifest["spec"]}
    assert {k: v for k, v in added.items() if k[-1] != "protocol"} == defaulted
    assert all(v == "TCP" for k, v in added.items() if k[-1] == "protocol")


@pytest.mark.timeout(60)
def test_status_as_training_operator_writes_it_is_kept_and_printed(kube):
    """The user guide's ``kubectl get tfjob -o yaml`` of a finished job: its spec applied, its
    status written through the status subresource (as an operator does) and read back whole,
    and ``kubectl get tfjobs`` shows State (the last condition) and Age."""
    manifest = kubeflow_tfjobs.load("docs-tfjob-simple-status", kube.ns)
    status = manifest.pop("status")
    for server_field in ("creationTimestamp", "generation", "resourceVersion", "selfLink", "uid"):
        manifest["metadata"].pop(server_field)
    done = kubectl_apply(kube, manifest)
    assert done.returncode == 0, done.stderr
    listed = kube.cp.kubectl("get", "tfjobs", "-n", kube.ns).stdout.splitlines()
    assert listed[0].split() == ["NAME", "STATE", "AGE"]
    assert len(listed[1].split()) == 2  # no State yet: only the name and the age
    name = manifest["metadata"]["name"]
    # The operator's own bookkeeping beside TFJob's fields is kept too.
    extra = {"restartCount": 1}
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, kube.ns, PLURAL, name, {"status": {**status, **extra}}
    )
    assert tfjob(kube, name)["status"] == {**status, **extra}
    listed = kube.cp.kubectl("get", "tfjobs", "-n", kube.ns).stdout.splitlines()
    assert listed[1].split()[:2] == ["tfjob-simple", "Succeeded"]
    wide = kube.cp.kubectl("get", "tfjob", name, "-n", kube.ns, "-o", "wide").stdout
    assert wide.split()[:3] == ["NAME", "STATE", "AGE"]


def _worker(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["tfReplicaSpecs"]["Worker"]


def _container(manifest: dict[str, Any]) -> dict[str, Any]:
    return _worker(manifest)["template"]["spec"]["containers"][0]


def _add(manifest: dict[str, Any], rtype: str, replicas: int = 1) -> None:
    replica = copy.deepcopy(_worker(manifest))
    replica["replicas"] = replicas
    manifest["spec"]["tfReplicaSpecs"][rtype] = replica


#: case -> (mutation of Kubeflow's simple.yaml, the field the refusal names, its words).
REFUSALS: dict[str, tuple[Any, str, str]] = {
    "no container named tensorflow": (
        lambda m: _container(m).update(name="trainer"),
        "spec.tfReplicaSpecs[Worker].template.spec.containers",
        "must have at least one container with name tensorflow",
    ),
    "tensorflow not among several containers": (
        lambda m: _worker(m)["template"]["spec"].update(
            containers=[
                {**_container(m), "name": "main"},
                {"name": "sidecar", "image": "busybox"},
            ]
        ),
        "spec.tfReplicaSpecs[Worker].template.spec.containers",
        "must have at least one container with name tensorflow",
    ),
    "a container without image": (
        lambda m: _container(m).pop("image"),
        "spec.tfReplicaSpecs[Worker].template.spec.containers[0].image",
        "the container has no image",
    ),
    "a container with an empty image": (
        lambda m: _container(m).update(image=""),
        "spec.tfReplicaSpecs[Worker].template.spec.containers[0].image",
        "the container has no image",
    ),
    "a replica without pod template": (
        lambda m: _worker(m).pop("template"),
        "spec.tfReplicaSpecs[Worker].template.spec.containers",
        "must be specified",
    ),
    "Chief and Master": (
        lambda m: (_add(m, "Chief"), _add(m, "Master")),
        "spec.tfReplicaSpecs",
        "must not have more than 1 Chief or Master role",
    ),
    "chief and MASTER in other cases": (
        lambda m: (_add(m, "chief"), _add(m, "MASTER")),
        "spec.tfReplicaSpecs",
        "must not have more than 1 Chief or Master role",
    ),
    "two Chief replicas": (
        lambda m: _add(m, "Chief", replicas=2),
        "spec.tfReplicaSpecs",
        "must not have more than 1 Chief or Master role",
    ),
    "a name that is not a DNS-1035 label": (
        lambda m: m["metadata"].update(name="Tfjob-Simple"),
        "metadata.name",
        "should match: a DNS-1035 label",
    ),
    "a name starting with a digit": (
        lambda m: m["metadata"].update(name="1-tfjob"),
        "metadata.name",
        "should match: a DNS-1035 label",
    ),
    "a name longer than 63 characters": (
        lambda m: m["metadata"].update(name="t" * 64),
        "metadata.name",
        "at most 63 characters",
    ),
    "an empty tfReplicaSpecs": (
        lambda m: m["spec"].update(tfReplicaSpecs={}),
        "spec.tfReplicaSpecs",
        "must have at least one replica type",
    ),
    "no tfReplicaSpecs": (
        lambda m: m["spec"].pop("tfReplicaSpecs"),
        "spec.tfReplicaSpecs",
        "Required value",
    ),
    "a managedBy of neither value": (
        lambda m: m["spec"].update(runPolicy={"managedBy": "example.com/other"}),
        "spec.runPolicy.managedBy",
        'Unsupported value: "example.com/other": supported values: '
        '"kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue"',
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", REFUSALS, ids=REFUSALS)
def test_what_training_operators_webhook_refuses_is_refused_at_apply_naming_the_field(kube, case):
    mutate, field, words = REFUSALS[case]
    manifest = kubeflow_tfjobs.load("example-simple", kube.ns)
    mutate(manifest)
    done = kubectl_apply(kube, manifest)
    assert done.returncode != 0, done.stdout
    message = " ".join(done.stderr.split())
    assert f"{field}:" in message and words in message, message
    listed = kube.custom.list_namespaced_custom_object(GROUP, VERSION, kube.ns, PLURAL)
    assert listed["items"] == []


@pytest.mark.timeout(60)
def test_several_evaluators_and_replica_keys_in_any_case_are_accepted(kube):
    """What the webhook lets through and the CRD must too: Evaluator replicas: 3 (unbounded
    in TFJob), lowercase and uppercase keys, one Master, every restart policy, ExitCode."""
    manifest = kubeflow_tfjobs.load("example-simple", kube.ns)
    _add(manifest, "Evaluator", replicas=3)
    _add(manifest, "master")
    _add(manifest, "PS", replicas=2)
    replicas = manifest["spec"]["tfReplicaSpecs"]
    replicas["WORKER"] = replicas.pop("Worker")
    for rtype, policy in zip(replicas, ("ExitCode", "Always", "Never", "OnFailure"), strict=True):
        replicas[rtype]["restartPolicy"] = policy
    manifest["spec"]["enableDynamicWorker"] = True
    manifest["spec"]["successPolicy"] = "AllWorkers"
    manifest["spec"]["runPolicy"] = {
        "cleanPodPolicy": "All",
        "backoffLimit": 3,
        "activeDeadlineSeconds": 600,
        "ttlSecondsAfterFinished": 60,
        "suspend": True,
        "managedBy": "kubeflow.org/training-operator",
        "schedulingPolicy": {
            "minAvailable": 3,
            "queue": "q",
            "priorityClass": "high",
            "minResources": {"cpu": "2", "memory": "1Gi"},
            "scheduleTimeoutSeconds": 30,
        },
    }
    done = kubectl_apply(kube, manifest)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    stored = tfjob(kube, "tfjob-simple")
    assert stored["spec"]["runPolicy"] == manifest["spec"]["runPolicy"]
    assert sorted(stored["spec"]["tfReplicaSpecs"]) == ["Evaluator", "PS", "WORKER", "master"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("kueue.x-k8s.io/multikueue", "kubeflow.org/training-operator"),
        ("kueue.x-k8s.io/multikueue", None),
        (None, "kueue.x-k8s.io/multikueue"),
    ],
    ids=["changed", "removed", "added"],
)
def test_managed_by_is_immutable(kube, before, after):
    manifest = kubeflow_tfjobs.load("example-simple", kube.ns)
    if before is not None:
        manifest["spec"]["runPolicy"] = {"managedBy": before}
    assert kubectl_apply(kube, manifest).returncode == 0
    manifest["spec"]["runPolicy"] = {"managedBy": after} if after is not None else {}
    done = kubectl_apply(kube, manifest)
    assert done.returncode != 0, done.stdout
    message = " ".join(done.stderr.split())
    assert "spec.runPolicy.managedBy:" in message and "field is immutable" in message, message
    stored = tfjob(kube, "tfjob-simple")["spec"].get("runPolicy", {})
    assert stored.get("managedBy") == before


@pytest.mark.timeout(60)
def test_queue_is_immutable_and_replicas_may_change(kube):
    """As training-operator's CRD: the scheduling queue cannot change; replicas can (a TFJob
    scales)."""
    manifest = kubeflow_tfjobs.load("example-simple", kube.ns)
    manifest["spec"]["runPolicy"] = {"schedulingPolicy": {"queue": "a"}}
    assert kubectl_apply(kube, manifest).returncode == 0
    _worker(manifest)["replicas"] = 5
    assert kubectl_apply(kube, manifest).returncode == 0
    assert _worker(tfjob(kube, "tfjob-simple"))["replicas"] == 5
    manifest["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "b"
    done = kubectl_apply(kube, manifest)
    assert done.returncode != 0
    assert "spec.runPolicy.schedulingPolicy.queue is immutable" in done.stderr, done.stderr


@pytest.mark.timeout(60)
def test_the_migration_guides_worked_example_is_kubeflows_and_its_strategyjob_is_accepted(kube):
    """docs/kubernetes/migrating-from-tfjob.md: its TFJob is Kubeflow's simple.yaml as the tests
    hold it, and the StrategyJob it becomes passes the StrategyJob CRD's validation, strictly."""
    guide = (REPO_ROOT / "docs" / "kubernetes" / "migrating-from-tfjob.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", guide, re.S)]
    tfjob_doc, strategyjob_doc = blocks
    assert tfjob_doc == kubeflow_tfjobs.load("example-simple", "kubeflow")
    assert strategyjob_doc["kind"] == "StrategyJob"
    strategyjob_doc["metadata"]["namespace"] = kube.ns
    done = kube.cp.kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-f",
        "-",
        input=yaml.safe_dump(strategyjob_doc),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


@pytest.mark.timeout(60)
def test_a_misspelt_field_is_refused_naming_it(kube):
    """Strict field validation, as against training-operator's CRD: a typo outside the pod
    template is an error naming the field, not a silently dropped setting."""
    manifest = kubeflow_tfjobs.load("example-simple", kube.ns)
    manifest["spec"]["runpolicy"] = {"cleanPodPolicy": "None"}
    done = kubectl_apply(kube, manifest)
    assert done.returncode != 0, done.stdout
    assert 'unknown field "spec.runpolicy"' in done.stderr, done.stderr


@pytest.mark.timeout(60)
def test_a_large_tfjob_stays_within_the_validation_cost_budget(kube):
    """Chief, PS, Evaluator and 1000 Workers, pods of nine containers: the CEL rules' cost at
    admission stays under the API server's limit."""
    manifest = kubeflow_tfjobs.load("example-simple", kube.ns)
    worker = _worker(manifest)
    sidecars = [{"name": f"side-{i}", "image": "busybox"} for i in range(8)]
    worker["template"]["spec"]["containers"] += sidecars
    worker["replicas"] = 1000
    for rtype in ("Chief", "PS", "Evaluator"):
        _add(manifest, rtype)
    done = kubectl_apply(kube, manifest)
    assert done.returncode == 0, done.stderr
