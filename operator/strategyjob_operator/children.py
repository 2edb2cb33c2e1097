"""The children a StrategyJob should have: one headless Service, one ConfigMap with the
cluster part of TF_CONFIG that every pod reads, and one Pod per replica, and the job's own
security objects: a ServiceAccount whose Role allows only ``get`` and
``patch`` on the leader's pod (where ``strategyjob.report`` publishes progress), a Secret
with the job's token (``STRATEGYJOB_TOKEN``) and a NetworkPolicy that admits traffic only
from the job's own pods; with a gang scheduler, its PodGroup (:mod:`.gang`). Pods get a
restricted ``securityContext`` wherever their template leaves a field unset.

Pure functions of the job: names are deterministic (``<job>-<type>-<index>``), so an
operator that restarts halfway through creating a job creates exactly the pods that are
still missing. The injected environment comes from :mod:`strategyjob.jobspec`, the one
source of truth shared with ``strategyjob run``.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c
from strategyjob_operator import flavor, gang, scaling


def owner_reference(job_obj: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference to the job (a StrategyJob, or a TFJob), so that deleting it
    deletes its children."""
    meta = job_obj["metadata"]
    return {
        "apiVersion": job_obj.get("apiVersion") or c.API_VERSION,
        "kind": job_obj.get("kind") or c.KIND,
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


def _meta(job: jobspec.StrategyJob, name: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {c.LABEL_JOB_NAME: job.name},
        "ownerReferences": [dict(owner)],
    }


def build_replica_services(tfjob: jobspec.TFJob, owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A TFJob's Services, as training-operator makes them: one headless Service per
    replica, named like its pod and selecting it, exposing its ``tensorflow`` container's
    ports (the replica's address in ``TF_CONFIG``)."""
    job = tfjob.job
    services = []
    for replica_type, index in job.replicas():
        template = job.replica_specs[replica_type].template
        container = template["spec"]["containers"][
            jobspec.training_container_index(template, jobspec.TFJOB_CONTAINER_NAME)
        ]
        ports = [
            {
                **({"name": p["name"]} if p.get("name") else {}),
                "port": p["containerPort"],
                "targetPort": p["containerPort"],
                "protocol": p.get("protocol", "TCP"),
            }
            for p in container.get("ports") or []
        ]
        selector = {
            k: v
            for k, v in pod_labels(job, replica_type, index, tfjob).items()
            if k != flavor.TF_LABEL_JOB_ROLE and k.startswith("training.kubeflow.org/")
        }
        name = job.pod_name(replica_type, index)
        services.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {**_meta(job, name, owner), "labels": dict(selector)},
                "spec": {"clusterIP": "None", "selector": selector, "ports": ports},
            }
        )
    return services


def cluster_config_map_name(job: jobspec.StrategyJob, tfjob: jobspec.TFJob | None = None) -> str:
    """``<job>-strategyjob-cluster``: the ConfigMap every pod of the job reads its cluster
    from. A TFJob's cluster changes when its ``replicas`` are edited, and pods made before
    keep theirs (as under training-operator): each cluster has its own, immutable
    ConfigMap, ``<job>-strategyjob-cluster-<hash>``."""
    name = jobspec.cluster_config_map_name(job.name)
    if tfjob is not None:
        cluster = jobspec.tfjob_cluster_spec(tfjob)
    elif scaling.resizable(job, tfjob) or scaling.reforms(job, tfjob):  # kubectl scale
        cluster = jobspec.cluster_spec(jobspec.cluster_for_kubernetes(job))
    else:
        return name
    digest = hashlib.sha256(cluster.encode()).hexdigest()
    return f"{name}-{digest[:10]}"


def build_metrics_config_map(
    job: jobspec.StrategyJob, owner: Mapping[str, Any], data: Mapping[str, str]
) -> dict[str, Any]:
    """``<job>-strategyjob-metrics``: the job's metric history (:mod:`.history`), created at
    its first report and patched at each new one."""
    name = jobspec.metrics_config_map_name(job.name)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, name, owner),
        "data": dict(data),
    }


def members_config_map_name(job: jobspec.StrategyJob) -> str:
    """``<job>-strategyjob-members``: the workers a resizable job's chief follows
    (:mod:`.scaling`)."""
    return f"{job.name}-strategyjob-members"


def build_members_config_map(
    job: jobspec.StrategyJob,
    owner: Mapping[str, Any],
    members: scaling.Members,
    tfjob: jobspec.TFJob | None = None,
) -> dict[str, Any]:
    """The members ConfigMap, mounted in the chief: unlike the cluster ConfigMap it changes
    as the job is resized (the kubelet refreshes the chief's copy)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, members_config_map_name(job), owner),
        "data": scaling.members_data(job, members, tfjob),
    }


def _with_members_file(
    job: jobspec.StrategyJob, pod_spec: dict[str, Any], container: dict[str, Any]
) -> None:
    """Mount the members ConfigMap in a resizable job's chief and point
    ``STRATEGYJOB_CLUSTER_FILE`` at it (the coordinator follows that file). The directory,
    not a ``subPath``: only a directory mount sees the kubelet's updates."""
    volume = "strategyjob-members"
    pod_spec.setdefault("volumes", []).append(
        {"name": volume, "configMap": {"name": members_config_map_name(job)}}
    )
    container.setdefault("volumeMounts", []).append(
        {"name": volume, "mountPath": scaling.MEMBERS_DIR, "readOnly": True}
    )
    path = f"{scaling.MEMBERS_DIR}/{scaling.MEMBERS_FILE_KEY}"
    env = [e for e in container.get("env") or [] if e.get("name") != c.ENV_CLUSTER_FILE]
    container["env"] = [*env, {"name": c.ENV_CLUSTER_FILE, "value": path}]


def build_cluster_config_map(
    job: jobspec.StrategyJob, owner: Mapping[str, Any], tfjob: jobspec.TFJob | None = None
) -> dict[str, Any]:
    """The cluster part of TF_CONFIG (:func:`strategyjob.jobspec.cluster_spec`), stored once
    for the whole job: each pod reads it into ``STRATEGYJOB_CLUSTER_SPEC`` and its TF_CONFIG
    refers to that (:func:`build_pod`), so a job's pod specs grow with its size, not its
    square. Immutable (the kubelets need not watch it): a job's cluster never changes, as
    its name, namespace, port and replicas cannot (the CRD's rules). A TFJob's holds its
    own cluster (:func:`strategyjob.jobspec.tfjob_cluster_spec`), one per cluster
    (:func:`cluster_config_map_name`)."""
    if tfjob is not None:
        cluster = jobspec.tfjob_cluster_spec(tfjob)
    else:
        cluster = jobspec.cluster_spec(jobspec.cluster_for_kubernetes(job))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, cluster_config_map_name(job, tfjob), owner),
        "immutable": True,
        "data": {jobspec.CLUSTER_SPEC_KEY: cluster},
    }


def service_account_name(job: jobspec.StrategyJob) -> str:
    """``<job>-strategyjob-sa``, the job's ServiceAccount and its RoleBinding: a suffix of
    its own, so that the loader can refuse a template naming another job's
    (:data:`strategyjob.jobspec.SERVICE_ACCOUNT_SUFFIX`). The Role and the NetworkPolicy
    have the job's name. (Jobs created before the suffix keep their pods' ServiceAccount
    and binding named ``<job>``; pods made after an upgrade get the new pair.)"""
    return jobspec.service_account_name(job.name)


def token_secret_name(job: jobspec.StrategyJob, owner: Mapping[str, Any]) -> str:
    """``<job>-<uid>-strategyjob-token``: a suffix of its own, so that the loader can refuse
    a template naming another job's token (:data:`strategyjob.jobspec.TOKEN_SECRET_SUFFIX`),
    and the uid, so that it never collides with the Secret an earlier job of the same name
    left, so the operator never has to delete a Secret (only create one and read its metadata)."""
    return jobspec.token_secret_name(job.name, owner["uid"])


#: The job's uid on its pods: the NetworkPolicy admits only pods that carry both the job's
#: name and its uid (an earlier job of the same name, a pod someone labelled with the name
#: alone, do not pass; it is not a secret, see :func:`build_network_policy`).
LABEL_JOB_UID = f"{c.GROUP}/job-uid"


def build_service_account(job: jobspec.StrategyJob, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The identity of the job's pods (unless a template names its own ServiceAccount)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(job, service_account_name(job), owner),
    }


def build_role(job: jobspec.StrategyJob, owner: Mapping[str, Any]) -> dict[str, Any]:
    """Least privilege for progress reports: ``get`` and ``patch`` on the leader's pod only
    (the one pod whose annotation the operator reads); nothing on any other object."""
    leader_pod = job.pod_name(*jobspec.leader(job))
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(job, job.name, owner),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "resourceNames": [leader_pod],
                "verbs": ["get", "patch"],
            }
        ],
    }


def build_role_binding(job: jobspec.StrategyJob, owner: Mapping[str, Any]) -> dict[str, Any]:
    name = service_account_name(job)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(job, name, owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": job.name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
    }


def build_token_secret(
    job: jobspec.StrategyJob, owner: Mapping[str, Any], token: str
) -> dict[str, Any]:
    """The job's token (random, drawn by the caller), read by its pods through
    ``valueFrom.secretKeyRef``; owned by the job, so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, token_secret_name(job, owner), owner),
        "type": "Opaque",
        "stringData": {jobspec.TOKEN_SECRET_KEY: token},
    }


def build_network_policy(job: jobspec.StrategyJob, owner: Mapping[str, Any]) -> dict[str, Any]:
    """Ingress to the job's pods only from pods of the same job; egress unrestricted.

    No port list: besides the job's port (rendezvous, gRPC), gloo and NCCL connect the
    replicas on ports they choose at run time, so the job's pods must reach each other on
    any port. Everything outside the job, on any port, is refused (where the cluster's
    network plugin enforces NetworkPolicies).

    It protects every pod labelled with the job's name and admits those that also carry
    the job's uid. Labels prove nothing about who made a pod: anyone who may create pods in
    the namespace can copy both (the uid is readable on the job) and so get in. The uid
    keeps out pods of an earlier job of the same name and pods that guessed the name; a
    boundary against people who may create pods takes separate namespaces."""
    protected = {"matchLabels": {c.LABEL_JOB_NAME: job.name}}
    peers = {"matchLabels": {c.LABEL_JOB_NAME: job.name, LABEL_JOB_UID: owner["uid"]}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, job.name, owner),
        "spec": {
            "podSelector": protected,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": peers}]}],
        },
    }


def pod_labels(
    job: jobspec.StrategyJob, replica_type: str, index: int, tfjob: jobspec.TFJob | None = None
) -> dict[str, str]:
    """The labels that say which job and replica a pod is; a TFJob's pods carry TFJob's
    too (``training.kubeflow.org/...``, ``job-role: master`` on the chief or master, else
    worker 0), which tools written for TFJob select on."""
    labels = {
        c.LABEL_JOB_NAME: job.name,
        c.LABEL_REPLICA_TYPE: replica_type,
        c.LABEL_REPLICA_INDEX: str(index),
    }
    leads = (replica_type, index) == jobspec.leader(job)
    if leads:
        labels[c.LABEL_JOB_ROLE] = c.ROLE_CHIEF
    if tfjob is not None:
        labels[flavor.TF_LABEL_JOB_NAME] = job.name
        labels[flavor.TF_LABEL_OPERATOR_NAME] = flavor.TF_OPERATOR_NAME
        labels[flavor.TF_LABEL_REPLICA_TYPE] = tfjob.type_name(replica_type)
        labels[flavor.TF_LABEL_REPLICA_INDEX] = str(index)
        if leads:
            labels[flavor.TF_LABEL_JOB_ROLE] = flavor.TF_ROLE_MASTER
    return labels


def _with_env(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Set the injected variables (pod spec ``env`` entries), replacing any the template
    sets under the same names.

    They come first: Kubernetes expands ``$(VAR)`` only from variables listed earlier, so
    template values such as ``/ckpt/$(STRATEGYJOB_JOB_NAME)`` can use them (as they can
    under ``strategyjob run``)."""
    names = {e["name"] for e in env}
    kept = [e for e in container.get("env") or [] if e.get("name") not in names]
    container["env"] = [*env, *kept]


def _with_token(container: dict[str, Any], secret_name: str, position: int) -> None:
    """``STRATEGYJOB_TOKEN`` from the job's Secret, right after the injected variables
    (replacing one the template sets)."""
    entry = {
        "name": jobspec.ENV_TOKEN,
        "valueFrom": {"secretKeyRef": {"name": secret_name, "key": jobspec.TOKEN_SECRET_KEY}},
    }
    env = [e for e in container.get("env") or [] if e.get("name") != jobspec.ENV_TOKEN]
    env.insert(min(position, len(env)), entry)
    container["env"] = env


#: The restricted defaults (Pod Security Standards' ``restricted`` profile), set only
#: where the template leaves the field unset: the pod's, then each container's.
POD_SECURITY_DEFAULTS: dict[str, Any] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_DEFAULTS: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
_SECCOMP_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/", "container.seccomp.security.")
_SYS_ADMIN = {"SYS_ADMIN", "CAP_SYS_ADMIN"}


def _with_security_defaults(
    pod_spec: dict[str, Any], annotations: Mapping[str, Any], non_root: bool = True
) -> None:
    """Fill the unset fields of the pod's and its containers' ``securityContext`` with the
    restricted defaults: not root, no privilege escalation, no capabilities, the runtime's
    seccomp profile (``runAsNonRoot`` on the pod, or on each container not run as uid 0 when
    the template runs one as root). What the template sets wins, field by field
    (``runAsNonRoot: false``, ``allowPrivilegeEscalation: true``, ``capabilities: {drop:
    []}``, ``seccompProfile: {type: Unconfined}`` opt out). Defaults that would contradict
    the template, so that the API server or the kubelet refused the pod, are left out:
    ``runAsNonRoot`` beside a ``runAsUser: 0``, ``allowPrivilegeEscalation: false`` beside
    ``privileged`` or an added ``SYS_ADMIN``, the seccomp field beside the legacy seccomp
    annotations; and every Linux default on a Windows pod."""
    os_ = pod_spec.get("os")
    if isinstance(os_, Mapping) and os_.get("name") == "windows":
        return
    pod_sc = _mapping_or_none(pod_spec.get("securityContext"))
    if pod_sc is None:  # not a mapping: the API server names it; nothing to fill in
        return
    containers = [
        x
        for key in ("initContainers", "containers")
        for x in _list(pod_spec.get(key))
        if isinstance(x, dict)
    ]
    contexts = [pod_sc, *(_mapping_or_none(x.get("securityContext")) or {} for x in containers)]
    # Not root: for the whole pod, or, beside a container the template runs as root (uid 0),
    # for each of the others.
    # (``non_root`` False: none of that, for a TFJob, whose images often run as root.)
    as_root = not non_root or any(sc.get("runAsUser") == 0 for sc in contexts)
    if "runAsNonRoot" not in pod_sc and not as_root:
        pod_sc["runAsNonRoot"] = POD_SECURITY_DEFAULTS["runAsNonRoot"]
    per_container = non_root and "runAsNonRoot" not in pod_sc
    legacy_seccomp = any(str(k).startswith(_SECCOMP_ANNOTATIONS) for k in annotations)
    if "seccompProfile" not in pod_sc and not legacy_seccomp:
        pod_sc["seccompProfile"] = copy.deepcopy(POD_SECURITY_DEFAULTS["seccompProfile"])
    pod_spec["securityContext"] = pod_sc
    for container in containers:
        sc = _mapping_or_none(container.get("securityContext"))
        caps = _mapping_or_none(sc.get("capabilities")) if sc is not None else None
        if sc is None or caps is None:
            continue
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if per_container and "runAsNonRoot" not in sc and uid != 0:
            sc["runAsNonRoot"] = POD_SECURITY_DEFAULTS["runAsNonRoot"]
        privileged = sc.get("privileged") is True
        adds_sys_admin = any(str(a).upper() in _SYS_ADMIN for a in _list(caps.get("add")))
        if "allowPrivilegeEscalation" not in sc and not privileged and not adds_sys_admin:
            sc["allowPrivilegeEscalation"] = CONTAINER_SECURITY_DEFAULTS["allowPrivilegeEscalation"]
        if "drop" not in caps and not privileged:
            caps["drop"] = list(CONTAINER_SECURITY_DEFAULTS["capabilities"]["drop"])
            sc["capabilities"] = caps
        container["securityContext"] = sc


def _mapping_or_none(value: Any) -> dict[str, Any] | None:
    """A copy of ``value`` when it is a mapping (``{}`` when unset); None when the template
    put something else there, which is the API server's to refuse, not the operator's."""
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else None


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _with_port(container: dict[str, Any], port: int) -> None:
    ports = list(container.get("ports") or [])
    if not any(p.get("containerPort") == port for p in ports):
        ports.append({"name": c.PORT_NAME, "containerPort": port, "protocol": "TCP"})
    container["ports"] = ports


def _with_pod_identity(
    job: jobspec.StrategyJob, pod_spec: dict[str, Any], name: str, tfjob: jobspec.TFJob | None
) -> None:
    """What the operator owns of the pod's spec, set in place: its hostname (and a
    StrategyJob's subdomain, the job's Service), ``restartPolicy: Never``, the job's
    priority class and ServiceAccount where the template names none."""
    pod_spec["hostname"] = name
    if tfjob is None:
        pod_spec["subdomain"] = job.name
    pod_spec["restartPolicy"] = "Never"
    priority_class = job.run_policy.scheduling_policy.priority_class
    if priority_class and not pod_spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = priority_class
    # A TFJob's pods run as training-operator's do: as the template says, else as the
    # namespace's default ServiceAccount, whose image pull secrets and cloud identity the
    # manifest may rely on (so progress reports need the job's account named in the template).
    named = pod_spec.get("serviceAccountName") or pod_spec.get("serviceAccount")
    if tfjob is None and not named:
        pod_spec["serviceAccountName"] = service_account_name(job)


def build_pod(
    job: jobspec.StrategyJob,
    replica_type: str,
    index: int,
    owner: Mapping[str, Any],
    cluster: Mapping[str, list[str]],
    restart_attempt: int = 0,
    tfjob: jobspec.TFJob | None = None,
    config_map: str | None = None,
) -> dict[str, Any]:
    """The pod of replica ``(replica_type, index)``, from its template plus what the
    operator owns: name, hostname/subdomain, labels (the job's name and uid, the restart
    attempt), owner reference, env (the cluster by reference to the job's ConfigMap,
    :func:`build_cluster_config_map`) and port; and the restricted ``securityContext``
    defaults wherever the template leaves a field unset (:func:`_with_security_defaults`).

    ``restartPolicy`` is always ``Never``: the operator, not the kubelet, restarts
    replicas, so that it can count restarts and restart the whole job when the strategy
    needs it.

    A TFJob's pod (``tfjob``) has TFJob's name, labels and ``TF_CONFIG``
    (:func:`strategyjob.jobspec.tfjob_replica_env_by_reference`), in its ``tensorflow``
    container, and no subdomain: its address is its own Service's.
    """
    spec = job.replica_specs[replica_type]
    template = copy.deepcopy(dict(spec.template))
    meta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    name = job.pod_name(replica_type, index)

    _with_pod_identity(job, pod_spec, name, tfjob)
    # edited in place: the container's own dict inside pod_spec (a deep copy of the template)
    config_map = config_map or cluster_config_map_name(job, tfjob)
    if tfjob is None:
        at = jobspec.training_container_index({"spec": pod_spec})
        env = jobspec.replica_env_by_reference(
            job, replica_type, index, cluster, restart_attempt, config_map=config_map
        )
    else:
        at = jobspec.training_container_index({"spec": pod_spec}, jobspec.TFJOB_CONTAINER_NAME)
        env = jobspec.tfjob_replica_env_by_reference(
            tfjob, replica_type, index, restart_attempt, config_map=config_map
        )
    container = pod_spec["containers"][at]
    _with_env(container, env)
    _with_token(container, token_secret_name(job, owner), len(env))
    if replica_type == "chief" and scaling.resizable(job, tfjob):
        _with_members_file(job, pod_spec, container)
    _with_port(container, job.port if tfjob is None else tfjob.port(replica_type))
    # A failed container's last log lines become its termination message, whence a failure's
    # condition quotes the error (``ValueError: bad batch``); a template's own policy stays.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    # A TFJob runs unchanged: Kubeflow's TensorFlow images run as root, which training-
    # operator allows; its pods get the other restricted defaults only.
    _with_security_defaults(pod_spec, meta.get("annotations") or {}, non_root=tfjob is None)

    labels = {
        **(meta.get("labels") or {}),
        **pod_labels(job, replica_type, index, tfjob),
        LABEL_JOB_UID: owner["uid"],
        c.LABEL_RESTART_ATTEMPT: str(restart_attempt),
    }
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


def iter_missing_pods(
    job: jobspec.StrategyJob,
    owner: Mapping[str, Any],
    replicas: Iterable[tuple[str, int]],
    scheduler: gang.GangScheduler | None = None,
    restart_attempt: int = 0,
    tfjob: jobspec.TFJob | None = None,
) -> Iterator[dict[str, Any]]:
    """The pods to create for ``replicas`` (those the decision found missing), built one at a
    time as the caller asks for them, members of the job's PodGroup when a gang ``scheduler``
    is configured. Each pod is small (its TF_CONFIG refers to the job's ConfigMap for the
    cluster), but a job has up to 1000: the reconciler creates each as it is built and drops
    it, and never holds them all."""
    cluster = jobspec.cluster_for_kubernetes(job)
    config_map = cluster_config_map_name(job, tfjob)  # once: a TFJob's hashes its cluster
    for replica_type, index in replicas:
        pod = build_pod(
            job, replica_type, index, owner, cluster, restart_attempt, tfjob, config_map
        )
        if scheduler is not None:
            gang.join_gang(pod, job, scheduler)
        yield pod


def missing_pods(
    job: jobspec.StrategyJob,
    owner: Mapping[str, Any],
    replicas: Iterable[tuple[str, int]],
    scheduler: gang.GangScheduler | None = None,
    restart_attempt: int = 0,
) -> list[dict[str, Any]]:
    """:func:`iter_missing_pods` as a list, for small jobs and tests."""
    return list(iter_missing_pods(job, owner, replicas, scheduler, restart_attempt))
