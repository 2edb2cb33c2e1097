"""Malformed StrategyJob manifests, one mistake each, shared by the loader's unit tests and
the integration test that asks the real API server: where the mistake goes, the field its
problem names and a fragment of the fix the loader's message gives."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

WORKER = "spec.replicaSpecs.worker"
CONTAINER = f"{WORKER}.template.spec.containers[0]"


def container_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The worker's first container."""
    return obj["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]


def template_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The worker's pod template."""
    return obj["spec"]["replicaSpecs"]["worker"]["template"]


#: Where a mistake goes: (the mapping to update, the path the problem starts with).
PLACES: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "container": (container_of, f"{CONTAINER}."),
    "template": (template_of, f"{WORKER}.template."),
    "pod": (lambda o: template_of(o)["spec"], f"{WORKER}.template.spec."),
    "metadata": (lambda o: o["metadata"], "metadata."),
    "runPolicy": (lambda o: o["spec"].setdefault("runPolicy", {}), "spec.runPolicy."),
    "scheduling": (
        lambda o: o["spec"].setdefault("runPolicy", {}).setdefault("schedulingPolicy", {}),
        "spec.runPolicy.schedulingPolicy.",
    ),
    "worker": (lambda o: o["spec"]["replicaSpecs"]["worker"], f"{WORKER}."),
}


class Mistake(NamedTuple):
    """``fields`` set at ``place``; the problem's path after the place's (``where``) and a
    fragment of its fix."""

    place: str
    fields: dict[str, Any]
    where: str
    fix: str

    def apply(self, obj: dict[str, Any]) -> None:
        """Make the mistake in the 2-worker manifest ``obj``."""
        PLACES[self.place][0](obj).update(copy.deepcopy(self.fields))

    @property
    def field(self) -> str:
        """The field's whole path, e.g. ``spec.runPolicy.backoffLimit``."""
        return PLACES[self.place][1] + self.where


MISTAKES: dict[str, Mistake] = {
    "env-string": Mistake("container", {"env": "LR=0.1"}, "env", "- name: VAR"),
    "env-entry-string": Mistake("container", {"env": ["LR=0.1"]}, "env[0]", "name: VAR"),
    "env-entry-no-name": Mistake("container", {"env": [{"value": "1"}]}, "env[0]", "name: VAR"),
    "env-entry-empty-name": Mistake("container", {"env": [{"name": ""}]}, "env[0]", "name: VAR"),
    "env-value-number": Mistake(
        "container", {"env": [{"name": "A", "value": 1}]}, "env[0].value", '"1"'
    ),
    "env-valuefrom-string": Mistake(
        "container",
        {"env": [{"name": "A", "valueFrom": "x"}]},
        "env[0].valueFrom",
        "key: value",
    ),
    "ports-string": Mistake("container", {"ports": "2222"}, "ports", "- containerPort: 2222"),
    "port-entry-number": Mistake("container", {"ports": [2222]}, "ports[0]", "containerPort: 2222"),
    "port-entry-string": Mistake(
        "container", {"ports": ["2222"]}, "ports[0]", "containerPort: 2222"
    ),
    "port-no-number": Mistake(
        "container", {"ports": [{"name": "x"}]}, "ports[0]", "containerPort: 2222"
    ),
    "port-huge": Mistake(
        "container",
        {"ports": [{"containerPort": 10**30}]},
        "ports[0].containerPort",
        "65535 or less",
    ),
    "port-string": Mistake(
        "container",
        {"ports": [{"containerPort": "http"}]},
        "ports[0].containerPort",
        "e.g. 2222",
    ),
    "port-protocol": Mistake(
        "container",
        {"ports": [{"containerPort": 80, "protocol": "tcp"}]},
        "ports[0].protocol",
        "TCP, UDP, SCTP",
    ),
    "command-string": Mistake(
        "container",
        {"command": "python x.py"},
        "command",
        '["python", "train.py"]',
    ),
    "command-number": Mistake("container", {"command": ["sleep", 3]}, "command", "quote each part"),
    "args-string": Mistake("container", {"args": "--epochs 3"}, "args", '["--epochs", "3"]'),
    "labels-list": Mistake("metadata", {"labels": ["team=vision"]}, "labels", "key: value"),
    "annotations-string": Mistake("metadata", {"annotations": "a=b"}, "annotations", "key: value"),
    "label-value-number": Mistake("metadata", {"labels": {"gen": 2}}, "labels.gen", 'e.g. "2"'),
    "annotation-value-bool": Mistake(
        "metadata", {"annotations": {"x": True}}, "annotations.x", '"true"'
    ),
    "template-metadata-list": Mistake("template", {"metadata": ["a"]}, "metadata", "key: value"),
    "template-labels-list": Mistake(
        "template",
        {"metadata": {"labels": ["a"]}},
        "metadata.labels",
        "key: value",
    ),
    "template-annotation-number": Mistake(
        "template",
        {"metadata": {"annotations": {"n": 1.5}}},
        "metadata.annotations.n",
        'e.g. "1.5"',
    ),
    "deadline-huge": Mistake(
        "runPolicy",
        {"activeDeadlineSeconds": 10**30},
        "activeDeadlineSeconds",
        "2147483647 or less",
    ),
    "deadline-int32": Mistake(
        "runPolicy",
        {"activeDeadlineSeconds": 2**31},
        "activeDeadlineSeconds",
        "2147483647 or less",
    ),
    "deadline-float": Mistake(
        "runPolicy",
        {"activeDeadlineSeconds": 1.5},
        "activeDeadlineSeconds",
        "3600",
    ),
    "ttl-huge": Mistake(
        "runPolicy",
        {"ttlSecondsAfterFinished": 2**63},
        "ttlSecondsAfterFinished",
        "2147483647 or less",
    ),
    "backoff-huge": Mistake(
        "runPolicy", {"backoffLimit": 2**40}, "backoffLimit", "2147483647 or less"
    ),
    "replicas-huge": Mistake("worker", {"replicas": 10**12}, "replicas", "1000 or less"),
    "replicas-over-the-type-limit": Mistake(
        "worker", {"replicas": 1001}, "replicas", "1000 or less"
    ),
    # what the CRD bounds and types for its CEL rules (volumes, projected sources, the names
    # of Secrets and ServiceAccounts), and names a scheduler reads
    "container-empty-name": Mistake(
        "pod", {"containers": [{"name": "", "image": "python:3.11"}]}, "containers[0]", "name:"
    ),
    "volumes-number": Mistake("pod", {"volumes": 5}, "volumes", "- name: data"),
    "volumes-too-many": Mistake(
        "pod",
        {"volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(513)]},
        "volumes",
        "at most 512 entries",
    ),
    "volume-entry-string": Mistake("pod", {"volumes": ["data"]}, "volumes[0]", "key: value"),
    "volume-secret-string": Mistake(
        "pod", {"volumes": [{"name": "s", "secret": "s"}]}, "volumes[0].secret", "key: value"
    ),
    "volume-secret-name-number": Mistake(
        "pod",
        {"volumes": [{"name": "s", "secret": {"secretName": 5}}]},
        "volumes[0].secret.secretName",
        '"my-secret"',
    ),
    "volume-secret-name-too-long": Mistake(
        "pod",
        {"volumes": [{"name": "s", "secret": {"secretName": "s" * 254}}]},
        "volumes[0].secret.secretName",
        "at most 253 characters",
    ),
    "projected-sources-too-many": Mistake(
        "pod",
        {
            "volumes": [
                {
                    "name": "p",
                    "projected": {"sources": [{"configMap": {"name": "c"}}] * 129},
                }
            ]
        },
        "volumes[0].projected.sources",
        "at most 128 entries",
    ),
    "projected-secret-name-number": Mistake(
        "pod",
        {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": 5}}]}}]},
        "volumes[0].projected.sources[0].secret.name",
        '"my-secret"',
    ),
    "service-account-number": Mistake(
        "pod", {"serviceAccountName": 5}, "serviceAccountName", '"my-account"'
    ),
    "service-account-too-long": Mistake(
        "pod", {"serviceAccountName": "a" * 254}, "serviceAccountName", "at most 253 characters"
    ),
    "secret-key-ref-name-too-long": Mistake(
        "container",
        {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s" * 254, "key": "k"}}}]},
        "env[0].valueFrom.secretKeyRef.name",
        "at most 253 characters",
    ),
    "env-from-string": Mistake("container", {"envFrom": "s"}, "envFrom", "- secretRef:"),
    "env-from-secret-ref-name-number": Mistake(
        "container",
        {"envFrom": [{"secretRef": {"name": 5}}]},
        "envFrom[0].secretRef.name",
        '"my-secret"',
    ),
    "queue-too-long": Mistake("scheduling", {"queue": "q" * 254}, "queue", "at most 253"),
    "priority-class-number": Mistake(
        "scheduling", {"priorityClass": 1}, "priorityClass", '"high-priority"'
    ),
}

#: The mistakes the CRD's schema refuses too (the API server answers 400 or 422), each with
#: the field that both its message and the loader's problem name: the whole path, but for
#: the job's own labels and annotations, which the API server calls ObjectMeta.labels.
CRD_REFUSES: dict[str, str] = {
    **{
        k: MISTAKES[k].field
        for k in (
            "env-string",
            "env-entry-string",
            "env-entry-no-name",
            "env-value-number",
            "ports-string",
            "port-entry-string",
            "port-huge",
            "command-string",
            "args-string",
            "deadline-huge",
            "deadline-int32",
            "template-labels-list",
            "template-annotation-number",
            "container-empty-name",
            "volumes-number",
            "volumes-too-many",
            "volume-entry-string",
            "volume-secret-string",
            "volume-secret-name-number",
            "volume-secret-name-too-long",
            "projected-sources-too-many",
            "projected-secret-name-number",
            "service-account-number",
            "service-account-too-long",
            "secret-key-ref-name-too-long",
            "env-from-string",
            "env-from-secret-ref-name-number",
            "queue-too-long",
            "priority-class-number",
        )
    },
    "labels-list": "labels",
    "annotations-string": "annotations",
}
