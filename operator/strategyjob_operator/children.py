"""The children a StrategyJob should have: one headless Service and one Pod per replica.

Pure functions of the job: names are deterministic (``<job>-<type>-<index>``), so an
operator that restarts halfway through creating a job creates exactly the pods that are
still missing. The injected environment comes from :mod:`strategyjob.jobspec`, the one
source of truth shared with ``strategyjob run``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c


def owner_reference(job_obj: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference to the StrategyJob, so that deleting it deletes its children."""
    meta = job_obj["metadata"]
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_selector(job_name: str) -> str:
    """Label selector of every pod of the job."""
    return f"{c.LABEL_JOB_NAME}={job_name}"


def build_service(job: jobspec.StrategyJob, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The job's headless Service: the subdomain that gives each pod its DNS name.

    It publishes not-ready addresses so replicas can find each other while starting.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "labels": {c.LABEL_JOB_NAME: job.name},
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {c.LABEL_JOB_NAME: job.name},
            "ports": [{"name": c.PORT_NAME, "port": job.port, "targetPort": job.port}],
        },
    }


def pod_labels(job: jobspec.StrategyJob, replica_type: str, index: int) -> dict[str, str]:
    labels = {
        c.LABEL_JOB_NAME: job.name,
        c.LABEL_REPLICA_TYPE: replica_type,
        c.LABEL_REPLICA_INDEX: str(index),
    }
    if (replica_type, index) == jobspec.leader(job):
        labels[c.LABEL_JOB_ROLE] = c.ROLE_CHIEF
    return labels


def _with_env(container: dict[str, Any], env: Mapping[str, str]) -> None:
    """Set the injected variables, replacing any the template sets under the same names."""
    kept = [e for e in container.get("env") or [] if e.get("name") not in env]
    container["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]


def _with_port(container: dict[str, Any], port: int) -> None:
    ports = list(container.get("ports") or [])
    if not any(p.get("containerPort") == port for p in ports):
        ports.append({"name": c.PORT_NAME, "containerPort": port, "protocol": "TCP"})
    container["ports"] = ports


def build_pod(
    job: jobspec.StrategyJob,
    replica_type: str,
    index: int,
    owner: Mapping[str, Any],
    cluster: Mapping[str, list[str]],
) -> dict[str, Any]:
    """The pod of replica ``(replica_type, index)``, from its template plus what the
    operator owns: name, hostname/subdomain, labels, owner reference, env and port.

    ``restartPolicy`` is always ``Never``: the operator, not the kubelet, restarts
    replicas, so that it can count restarts and restart the whole job when the strategy
    needs it.
    """
    spec = job.replica_specs[replica_type]
    template = copy.deepcopy(dict(spec.template))
    meta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    name = job.pod_name(replica_type, index)

    pod_spec["hostname"] = name
    pod_spec["subdomain"] = job.name
    pod_spec["restartPolicy"] = "Never"
    priority_class = job.run_policy.scheduling_policy.priority_class
    if priority_class and not pod_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = priority_class

    container = jobspec.training_container({"spec": pod_spec})
    env = jobspec.replica_env(job, replica_type, index, cluster)
    _with_env(container, env)  # training_container returns the dict inside pod_spec
    _with_port(container, job.port)

    labels = {**(meta.get("labels") or {}), **pod_labels(job, replica_type, index)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [dict(owner)],
        },
        "spec": pod_spec,
    }


def missing_pods(
    job: jobspec.StrategyJob,
    owner: Mapping[str, Any],
    replicas: Iterable[tuple[str, int]],
) -> list[dict[str, Any]]:
    """The pods to create for ``replicas`` (those the decision found missing)."""
    cluster = jobspec.cluster_for_kubernetes(job)
    return [build_pod(job, t, i, owner, cluster) for t, i in replicas]
