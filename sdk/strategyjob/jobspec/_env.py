"""The environment injected into every replica: one source of truth for
``strategyjob run`` (127.0.0.1 addresses) and the operator (cluster DNS names)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from strategyjob import _names
from strategyjob.jobspec._model import (
    REPLICA_TYPES,
    TRAINING_CONTAINER_NAME,
    StrategyJob,
)
from strategyjob.jobspec._tfmodel import TFJob

#: Variables :func:`replica_env` sets (RANK and WORLD_SIZE only for chief and worker); their
#: names are defined once, in strategyjob._names.
ENV_TF_CONFIG = _names.ENV_TF_CONFIG
ENV_MASTER_ADDR = _names.ENV_MASTER_ADDR
ENV_MASTER_PORT = _names.ENV_MASTER_PORT
ENV_WORLD_SIZE = _names.ENV_WORLD_SIZE
ENV_RANK = _names.ENV_RANK
ENV_JOB_NAME = _names.ENV_JOB_NAME
ENV_NAMESPACE = _names.ENV_NAMESPACE
ENV_STRATEGY = _names.ENV_STRATEGY
ENV_REPLICA_TYPE = _names.ENV_REPLICA_TYPE
ENV_REPLICA_INDEX = _names.ENV_REPLICA_INDEX
ENV_POD_NAME = _names.ENV_POD_NAME
#: Which run of the job this replica belongs to: 0, then one more per restart (whole-job or of
#: this replica), so that training code and logs can tell the attempts apart (JobSet's
#: restart attempt).
ENV_RESTART_ATTEMPT = _names.ENV_RESTART_ATTEMPT
#: Set for chief and worker replicas when the manifest has ``runPolicy.rendezvousTimeoutSeconds``.
ENV_RENDEZVOUS_TIMEOUT = _names.ENV_RENDEZVOUS_TIMEOUT

#: The job's shared secret, checked by the parameter-server gRPC servers
#: (``strategyjob.ps._transport.TOKEN_ENV``). Not part of :func:`replica_env`: the operator
#: injects it from the job's Secret (``valueFrom.secretKeyRef``, key :data:`TOKEN_SECRET_KEY`)
#: so the value never appears in a pod spec, and ``strategyjob run`` sets a fresh one per job.
ENV_TOKEN = _names.ENV_TOKEN
TOKEN_SECRET_KEY = "token"
#: Every job's token Secret is named ``<job>-<uid>`` + this suffix, a name no other object
#: has a reason to use, so that the loader can refuse a template that names another job's
#: token (its pods would then pass as that job's replicas to its servers).
TOKEN_SECRET_SUFFIX = "-strategyjob-token"
#: Every job's ServiceAccount (the operator's, bound to the job's Role) is named ``<job>`` +
#: this suffix, so that the loader can refuse a template that names another job's (its pods
#: would then hold that job's rights). A user's own ServiceAccount stays allowed.
SERVICE_ACCOUNT_SUFFIX = "-strategyjob-sa"
#: Under ``strategyjob run``: the file the leader's ``strategyjob.report`` appends to.
ENV_PROGRESS_FILE = _names.ENV_PROGRESS_FILE

#: On Kubernetes, the cluster part of TF_CONFIG (:func:`cluster_spec`) is stored once per job,
#: in its ConfigMap :func:`cluster_config_map_name` under :data:`CLUSTER_SPEC_KEY`; each pod
#: reads it into :data:`ENV_CLUSTER_SPEC` and its TF_CONFIG refers to that variable
#: (:func:`replica_env_by_reference`), so a job's pod specs grow with its size, not its square.
ENV_CLUSTER_SPEC = _names.ENV_CLUSTER_SPEC
CLUSTER_SPEC_KEY = "cluster"
CLUSTER_CONFIG_MAP_SUFFIX = "-strategyjob-cluster"
#: The job's metric history in a cluster (the operator writes it, the client reads it): a
#: ConfigMap whose key ``METRICS_HISTORY_KEY`` holds ``strategyjob._history``'s JSON.
METRICS_CONFIG_MAP_SUFFIX = "-strategyjob-metrics"
METRICS_HISTORY_KEY = "history.json"

#: Replica types that take part in training collectives and get a torch rank.
TRAINING_REPLICA_TYPES = ("chief", "worker")


def token_secret_name(job_name: str, job_uid: str) -> str:
    """The name of the token Secret of job ``job_name`` with uid ``job_uid``. The uid keeps
    it apart from the Secret of an earlier job of the same name, so the operator never has
    to delete one (and needs no right to delete Secrets)."""
    return f"{job_name}-{job_uid}{TOKEN_SECRET_SUFFIX}"


def is_token_secret_name(name: str) -> bool:
    """Whether ``name`` is the name of some StrategyJob's token Secret."""
    return name.endswith(TOKEN_SECRET_SUFFIX) and len(name) > len(TOKEN_SECRET_SUFFIX)


def service_account_name(job_name: str) -> str:
    """The ServiceAccount the operator makes for job ``job_name`` (and its RoleBinding)."""
    return f"{job_name}{SERVICE_ACCOUNT_SUFFIX}"


def is_service_account_name(name: str) -> bool:
    """Whether ``name`` is the name of some StrategyJob's operator-made ServiceAccount."""
    return name.endswith(SERVICE_ACCOUNT_SUFFIX) and len(name) > len(SERVICE_ACCOUNT_SUFFIX)


def leader(job: StrategyJob) -> tuple[str, int]:
    """The replica that leads the job: chief 0, else worker 0 (TF's ``is_chief`` rule).
    It hosts the torch rendezvous and saves checkpoints."""
    found = leader_among(job.replicas())
    if found is None:
        raise ValueError(f"StrategyJob {job.name!r} has neither a chief nor a worker to lead it.")
    return found


def leader_among(replicas: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """:func:`leader`'s rule over a job's ``(type, index)`` replicas, for callers that hold a
    job's replicas but not its loaded spec (the client's view of a submitted job)."""
    present = set(replicas)
    return next((k for k in (("chief", 0), ("worker", 0)) if k in present), None)


def success_replicas(job: StrategyJob) -> list[tuple[str, int]]:
    """The replicas whose exit code 0 makes the job succeed.

    Default policy: the leader alone. ``AllWorkers``: every chief and worker replica.
    """
    if job.success_policy == "AllWorkers":
        return [(t, i) for t, i in job.replicas() if t in TRAINING_REPLICA_TYPES]
    return [leader(job)]


def serves_until_stopped(job: StrategyJob, replica_type: str) -> bool:
    """Whether a replica of ``replica_type`` never ends by itself while the job runs, so
    that its exit, even with code 0, is a failure of that replica.

    As in TensorFlow, a ps task only serves (``server.join()``, which never returns), and so
    does a worker under ParameterServerStrategy (the chief's coordinator ships it work until
    training ends), unless ``AllWorkers`` makes its exit part of the job's success. An
    evaluator is not one: TF's ``SidecarEvaluator`` returns after its last evaluation."""
    if replica_type == "ps":
        return True
    return (
        replica_type == "worker"
        and job.strategy == "ParameterServerStrategy"
        and job.success_policy != "AllWorkers"
    )


def early_exit(replica_type: str) -> str:
    """How ``strategyjob run`` and the operator say that a replica which serves until the
    job ends exited with code 0: ``exited with code 0 while the job ran (a ps ...)``."""
    return f"exited with code 0 while the job ran (a {replica_type} serves until the job ends)"


def training_container_index(
    pod_template: Mapping[str, Any], name: str = TRAINING_CONTAINER_NAME
) -> int:
    """Where the training container is in the template's ``spec.containers``: the one
    named ``name`` (``strategyjob``; a TFJob's ``tensorflow``), else the first (the
    operator edits it in place there)."""
    containers = (pod_template.get("spec") or {}).get("containers") or []
    if not containers:
        raise ValueError("The pod template has no containers.")
    for index, container in enumerate(containers):
        if container.get("name") == name:
            return index
    return 0


def training_container(pod_template: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container that runs training and receives the injected environment:
    the one named ``strategyjob``, else the first."""
    index = training_container_index(pod_template)  # raises when there is none
    container: Mapping[str, Any] = pod_template["spec"]["containers"][index]
    return container


def cluster_for_kubernetes(job: StrategyJob) -> dict[str, list[str]]:
    """Every replica's in-cluster address, ``<job>-<type>-<i>.<job>.<namespace>.svc:<port>``
    (pod hostname + the job's headless Service as subdomain), evaluator included."""
    return {
        replica_type: [
            f"{job.pod_name(replica_type, i)}.{job.name}.{job.namespace}.svc:{job.port}"
            for i in range(job.num_replicas(replica_type))
        ]
        for replica_type in REPLICA_TYPES
        if job.num_replicas(replica_type) > 0
    }


def cluster_config_map_name(job_name: str) -> str:
    """The ConfigMap holding job ``job_name``'s :func:`cluster_spec` (the operator's)."""
    return f"{job_name}{CLUSTER_CONFIG_MAP_SUFFIX}"


def metrics_config_map_name(job_name: str) -> str:
    """The ConfigMap holding job ``job_name``'s metric history (the operator's)."""
    return f"{job_name}{METRICS_CONFIG_MAP_SUFFIX}"


def _compact_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def cluster_spec(cluster: Mapping[str, list[str]]) -> str:
    """The cluster part of TF_CONFIG, the same for every replica of a job: the exact JSON
    that :func:`tf_config` puts after ``"cluster":`` (the training cluster; the evaluator is
    left out: it evaluates on its own, and a listed evaluator that never serves would hang a
    parameter-server coordinator)."""
    return _compact_json({t: list(a) for t, a in cluster.items() if t != "evaluator" and a})


def _around_cluster_spec(replica_type: str, index: int) -> tuple[str, str]:
    """What TF_CONFIG has before and after its :func:`cluster_spec`: with sorted keys,
    ``"cluster"`` comes first and ``"task"`` after it."""
    task = _compact_json({"type": replica_type, "index": index})
    return '{"cluster":', f',"task":{task}}}'


def tf_config(cluster: Mapping[str, list[str]], replica_type: str, index: int) -> str:
    """TF_CONFIG exactly as TensorFlow reads it: compact JSON, sorted keys, the training
    cluster (:func:`cluster_spec`) and the task."""
    before, after = _around_cluster_spec(replica_type, index)
    return before + cluster_spec(cluster) + after


def kubernetes_literal(value: str) -> str:
    """``value`` as an env ``value`` of a pod spec that Kubernetes gives the container
    unchanged: it expands ``$(VAR)`` and turns ``$$`` into ``$``, so each ``$`` is doubled."""
    return value.replace("$", "$$")


def replica_env(
    job: StrategyJob,
    replica_type: str,
    index: int,
    cluster: Mapping[str, list[str]],
    restart_attempt: int = 0,
) -> dict[str, str]:
    """The whole environment injected into replica ``(replica_type, index)``, as its
    process sees it (``strategyjob run`` sets exactly this).

    ``cluster`` maps each replica type to its addresses (``host:port``), as
    :func:`cluster_for_kubernetes` gives them or as the launcher allocates them;
    ``restart_attempt`` is the job's restarts so far (:data:`ENV_RESTART_ATTEMPT`).
    """
    return _replica_env(
        job,
        replica_type,
        index,
        cluster,
        restart_attempt,
        tf_config(cluster, replica_type, index),
    )


def replica_env_by_reference(
    job: StrategyJob,
    replica_type: str,
    index: int,
    cluster: Mapping[str, list[str]],
    restart_attempt: int = 0,
    *,
    config_map: str,
) -> list[dict[str, Any]]:
    """:func:`replica_env` as the ``env`` entries of a pod spec, with the cluster stored once
    per job instead of in every pod (each pod's TF_CONFIG lists the whole cluster, so the
    pod specs of a job would grow with the square of its size).

    First :data:`ENV_CLUSTER_SPEC` from ConfigMap ``config_map`` (key
    :data:`CLUSTER_SPEC_KEY`, holding :func:`cluster_spec`), then the variables of
    :func:`replica_env` in its order, TF_CONFIG's value being the JSON around the cluster
    with ``$(STRATEGYJOB_CLUSTER_SPEC)`` in its place. Kubernetes expands a ``$(VAR)``
    defined earlier in the list, so the container gets TF_CONFIG byte for byte as
    :func:`tf_config` makes it. Every other character is written with
    :func:`kubernetes_literal` (no value has a ``$`` today; one added later stays as it is).
    """
    before, after = _around_cluster_spec(replica_type, index)
    env = _replica_env(job, replica_type, index, cluster, restart_attempt, "")
    return _env_entries(env, before, after, config_map)


def _env_entries(
    env: Mapping[str, str], before: str, after: str | None, config_map: str
) -> list[dict[str, Any]]:
    """``env`` as pod-spec entries, every value a :func:`kubernetes_literal`. With ``after``
    (not None), TF_CONFIG is ``before`` + the ConfigMap's cluster + ``after``: first
    :data:`ENV_CLUSTER_SPEC` from ``config_map``, then TF_CONFIG referring to it."""
    if after is None:
        return [{"name": k, "value": kubernetes_literal(v)} for k, v in env.items()]
    reference = f"{kubernetes_literal(before)}$({ENV_CLUSTER_SPEC}){kubernetes_literal(after)}"
    source = {"configMapKeyRef": {"name": config_map, "key": CLUSTER_SPEC_KEY}}
    return [
        {"name": ENV_CLUSTER_SPEC, "valueFrom": source},
        *(
            {"name": k, "value": reference if k == ENV_TF_CONFIG else kubernetes_literal(v)}
            for k, v in env.items()
        ),
    ]


def _replica_env(
    job: StrategyJob,
    replica_type: str,
    index: int,
    cluster: Mapping[str, list[str]],
    restart_attempt: int,
    tf_config_value: str | None,
) -> dict[str, str]:
    """The environment of :func:`replica_env`, with ``tf_config_value`` as TF_CONFIG (none
    when None)."""
    count = job.num_replicas(replica_type)
    if replica_type not in REPLICA_TYPES or not 0 <= index < count:
        raise ValueError(
            f"StrategyJob {job.name!r} has no replica {replica_type}-{index} "
            f"(it has {count} {replica_type} replicas)."
        )
    for t, i in job.replicas():
        if len(cluster.get(t, ())) <= i:
            raise ValueError(f"The cluster has no address for {t}-{i}: {dict(cluster)!r}.")

    leader_type, leader_index = leader(job)
    master_host, _, master_port = cluster[leader_type][leader_index].rpartition(":")
    env = {} if tf_config_value is None else {ENV_TF_CONFIG: tf_config_value}
    env |= {
        ENV_MASTER_ADDR: master_host,
        ENV_MASTER_PORT: master_port,
        ENV_JOB_NAME: job.name,
        ENV_NAMESPACE: job.namespace,
        ENV_STRATEGY: job.strategy,
        ENV_REPLICA_TYPE: replica_type,
        ENV_REPLICA_INDEX: str(index),
        ENV_POD_NAME: job.pod_name(replica_type, index),
        ENV_RESTART_ATTEMPT: str(restart_attempt),
    }
    if replica_type in TRAINING_REPLICA_TYPES:
        num_chief = job.num_replicas("chief")
        env[ENV_WORLD_SIZE] = str(num_chief + job.num_replicas("worker"))
        env[ENV_RANK] = str(0 if replica_type == "chief" else index + num_chief)
        if job.run_policy.rendezvous_timeout_seconds is not None:
            env[ENV_RENDEZVOUS_TIMEOUT] = str(job.run_policy.rendezvous_timeout_seconds)
    return env


# -- Kubeflow TFJob: TF_CONFIG byte for byte as training-operator v1.9.4 writes it --------------


def _go_json(value: object) -> str:
    """Compact JSON in the key order given (Go marshals a struct's fields in order)."""
    return json.dumps(value, separators=(",", ":"))


def tfjob_cluster_spec(tfjob: TFJob, cluster: Mapping[str, list[str]] | None = None) -> str:
    """The cluster of a TFJob's (dense) ``TF_CONFIG``: every replica type, evaluator and
    master included, by lowercased type in sorted order (Go marshals a map so), each with
    its addresses ``<job>-<type>-<i>.<namespace>.svc:<port>`` (or ``cluster``'s, by
    StrategyJob type: ``strategyjob run``'s 127.0.0.1 ports). The same for every replica,
    so the operator stores it once, in the job's ConfigMap."""
    addresses = tfjob.cluster() if cluster is None else cluster
    return _compact_json({tfjob.type_name(t): a for t, a in addresses.items()})


def _tfjob_task(tfjob: TFJob, replica_type: str, index: int) -> str:
    return _go_json({"type": tfjob.type_name(replica_type), "index": index})


def _tfjob_around_cluster(tfjob: TFJob, replica_type: str, index: int) -> tuple[str, str]:
    """What a TFJob's dense ``TF_CONFIG`` has before and after :func:`tfjob_cluster_spec`."""
    task = _tfjob_task(tfjob, replica_type, index)
    return '{"cluster":', f',"task":{task},"environment":"cloud"}}'


def _sparse_tf_config(
    tfjob: TFJob, replica_type: str, index: int, cluster: Mapping[str, list[str]]
) -> str:
    """``enableDynamicWorker``'s ``TF_CONFIG``, without ``environment``: a worker sees itself
    (``{"<i>": addr}``) and every ps (``null`` when there is none, as Go writes a nil list),
    a ps itself; the chief (or master) the whole cluster, where training-operator gives it
    an empty one (its bug #1763); an evaluator an empty one."""
    task = _tfjob_task(tfjob, replica_type, index)
    if replica_type == "chief":
        return f'{{"cluster":{tfjob_cluster_spec(tfjob, cluster)},"task":{task}}}'
    workers: dict[str, str] = {}
    ps: list[str] | None = []
    if replica_type == "worker":
        workers = {str(index): cluster["worker"][index]}
        ps = cluster.get("ps")
    elif replica_type == "ps":
        ps = [cluster["ps"][index]]
    return f'{{"cluster":{_go_json({"worker": workers, "ps": ps})},"task":{task}}}'


def tfjob_tf_config(
    tfjob: TFJob, replica_type: str, index: int, cluster: Mapping[str, list[str]] | None = None
) -> str | None:
    """Replica ``(replica_type, index)``'s ``TF_CONFIG`` (``replica_type`` a StrategyJob type,
    ``chief`` for a Master), byte for byte as training-operator writes it:
    ``{"cluster":{...},"task":{"type":<lowercased type>,"index":i},"environment":"cloud"}``;
    the sparse form under ``enableDynamicWorker``; None in a one-replica job, which gets
    none (``isDistributed``). ``cluster``: the addresses to write, as in
    :func:`tfjob_cluster_spec`."""
    if tfjob.job.total_replicas == 1:
        return None
    addresses = tfjob.cluster() if cluster is None else cluster
    if tfjob.enable_dynamic_worker:
        return _sparse_tf_config(tfjob, replica_type, index, addresses)
    before, after = _tfjob_around_cluster(tfjob, replica_type, index)
    return before + tfjob_cluster_spec(tfjob, addresses) + after


def _tfjob_env(
    tfjob: TFJob,
    replica_type: str,
    index: int,
    restart_attempt: int,
    tf_config_value: str | None,
    cluster: Mapping[str, list[str]] | None = None,
) -> dict[str, str]:
    """The StrategyJob environment of a TFJob's replica (torch rendezvous at the leader's
    Service, or its address in ``cluster``), its ``TF_CONFIG`` being ``tf_config_value``."""
    addresses = tfjob.cluster() if cluster is None else cluster
    return _replica_env(tfjob.job, replica_type, index, addresses, restart_attempt, tf_config_value)


def tfjob_replica_env(
    tfjob: TFJob,
    replica_type: str,
    index: int,
    restart_attempt: int = 0,
    cluster: Mapping[str, list[str]] | None = None,
) -> dict[str, str]:
    """:func:`replica_env` for a TFJob's replica: :func:`tfjob_tf_config` (none in a
    one-replica job), beside the SDK's variables, which leave ``TF_CONFIG`` unchanged.
    ``cluster``: every replica's address by StrategyJob type, where the job does not run
    behind its Services (``strategyjob run``)."""
    value = tfjob_tf_config(tfjob, replica_type, index, cluster)
    return _tfjob_env(tfjob, replica_type, index, restart_attempt, value, cluster)


def tfjob_replica_env_by_reference(
    tfjob: TFJob, replica_type: str, index: int, restart_attempt: int = 0, *, config_map: str
) -> list[dict[str, Any]]:
    """:func:`tfjob_replica_env` as a pod spec's ``env`` entries. The dense ``TF_CONFIG``
    refers to the cluster in ConfigMap ``config_map`` (holding :func:`tfjob_cluster_spec`),
    as :func:`replica_env_by_reference` does, so the container gets it byte for byte; the
    sparse one, a replica's own, is written out."""
    if tfjob.job.total_replicas == 1 or tfjob.enable_dynamic_worker:
        env = tfjob_replica_env(tfjob, replica_type, index, restart_attempt)
        return _env_entries(env, "", None, config_map)
    before, after = _tfjob_around_cluster(tfjob, replica_type, index)
    env = _tfjob_env(tfjob, replica_type, index, restart_attempt, "")
    return _env_entries(env, before, after, config_map)
