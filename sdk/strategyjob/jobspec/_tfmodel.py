"""What a Kubeflow ``kubeflow.org/v1`` TFJob keeps beyond the StrategyJob it runs as.

A TFJob is read (``strategyjob.jobspec.load_tfjob``) into the SDK's :class:`StrategyJob`, so
that every decision made for StrategyJobs applies to it, plus this record of what only a
TFJob has: its replica keys as written (``Master``, ``PS``), a port per replica type, the
``tensorflow`` container, ``enableDynamicWorker`` and the ``runPolicy`` fields StrategyJob
lacks. Names follow training-operator v1.9.4, on which tools written for TFJob depend.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategyjob.jobspec._model import OPTIONAL_REPLICA_TYPES, REPLICA_TYPES, StrategyJob

TFJOB_GROUP = "kubeflow.org"
TFJOB_VERSION = "v1"
TFJOB_API_VERSION = f"{TFJOB_GROUP}/{TFJOB_VERSION}"
TFJOB_KIND = "TFJob"
TFJOB_PLURAL = "tfjobs"
#: The container that receives ``TF_CONFIG`` (training-operator's webhook requires one).
TFJOB_CONTAINER_NAME = "tensorflow"
#: The container port whose number a replica type serves on (``GetPortFromTFJob``).
TFJOB_PORT_NAME = "tfjob-port"
TFJOB_DEFAULT_PORT = 2222
#: TFJob's default, unlike StrategyJob's ``Running`` (``SetDefaults_TFJob``).
TFJOB_DEFAULT_CLEAN_POD_POLICY = "None"
#: ``runPolicy.managedBy`` values: the first (or none) means this operator serves the job.
TRAINING_OPERATOR = "kubeflow.org/training-operator"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
MANAGED_BY_VALUES: tuple[str, ...] = (TRAINING_OPERATOR, MULTIKUEUE)
#: ``successPolicy`` value that waits for every worker.
SUCCESS_POLICY_ALL_WORKERS = "AllWorkers"

#: TFJob's replica keys, CamelCase as its defaulter writes them, and the StrategyJob type
#: each runs as (``Master`` is a TF1 job's chief).
TFJOB_REPLICA_KEYS: Mapping[str, str] = {
    "Chief": "chief",
    "Master": "chief",
    "Worker": "worker",
    "PS": "ps",
    "Evaluator": "evaluator",
}


@dataclass(frozen=True)
class TFReplica:
    """One replica type of a TFJob as written: its key (``Worker``, ``Master``) and port."""

    key: str
    port: int = TFJOB_DEFAULT_PORT

    @property
    def type_name(self) -> str:
        """The lowercased key: in pod and Service names, labels and ``TF_CONFIG``."""
        return self.key.lower()


@dataclass(frozen=True)
class TFJob:
    """A validated TFJob: the :class:`StrategyJob` it runs as (replica types lowercased,
    ``Master`` as the chief, the strategy inferred) and what only a TFJob has."""

    job: StrategyJob
    #: By StrategyJob replica type (``chief`` for a ``Master``), in ``REPLICA_TYPES`` order.
    replicas: Mapping[str, TFReplica]
    enable_dynamic_worker: bool = False
    managed_by: str | None = None
    min_resources: Mapping[str, Any] | None = None
    schedule_timeout_seconds: int | None = None
    #: ``runPolicy.backoffLimit`` as written; None (TFJob: no limit) runs as the int32 maximum.
    backoff_limit: int | None = None
    #: The manifest's ``metadata.uid`` (a TFJob read from the API server), else None.
    uid: str | None = None
    #: The operator's ``CUSTOM_CLUSTER_DOMAIN`` (e.g. ``cluster.local``), appended to each
    #: address in ``TF_CONFIG`` as training-operator does; empty: ``...svc`` alone.
    cluster_domain: str = ""

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def namespace(self) -> str:
        return self.job.namespace

    @property
    def served(self) -> bool:
        """Whether this operator runs the job: ``managedBy`` unset or training-operator's
        (another value, e.g. MultiKueue's, means another controller does)."""
        return self.managed_by in (None, TRAINING_OPERATOR)

    @property
    def optional_types(self) -> tuple[str, ...]:
        """The replica types whose failure never fails the job: the evaluator, and under
        ``enableDynamicWorker`` the workers (training-operator ignores their failures; here
        each is restarted alone while its restart policy allows, then given up)."""
        if self.enable_dynamic_worker:
            return (*OPTIONAL_REPLICA_TYPES, "worker")
        return OPTIONAL_REPLICA_TYPES

    def key(self, replica_type: str) -> str:
        """The CamelCase key of StrategyJob type ``replica_type`` (``Master`` or ``Chief``
        for ``chief``): ``replicaStatuses`` is keyed by it."""
        return self.replicas[replica_type].key

    def type_name(self, replica_type: str) -> str:
        """The TFJob type of StrategyJob type ``replica_type``, lowercased (``master``)."""
        return self.replicas[replica_type].type_name

    def port(self, replica_type: str) -> int:
        return self.replicas[replica_type].port

    def pod_name(self, replica_type: str, index: int) -> str:
        """``<job>-<type>-<index>``: the pod's and its Service's name."""
        return self.job.pod_name(replica_type, index)

    def address(self, replica_type: str, index: int) -> str:
        """``<job>-<type>-<i>.<namespace>.svc[.<cluster domain>]:<port>``: the replica's
        Service, as training-operator writes it into ``TF_CONFIG``."""
        host = f"{self.pod_name(replica_type, index)}.{self.job.namespace}.svc"
        if self.cluster_domain:
            host += f".{self.cluster_domain}"
        return f"{host}:{self.port(replica_type)}"

    def cluster(self) -> dict[str, list[str]]:
        """Every replica's address by StrategyJob type, evaluator included (a copy: each
        replica's environment reads it, so it is made once per job)."""
        return {t: list(addresses) for t, addresses in self._cluster.items()}

    @functools.cached_property
    def _cluster(self) -> dict[str, list[str]]:
        return {
            replica_type: [
                self.address(replica_type, i) for i in range(self.job.num_replicas(replica_type))
            ]
            for replica_type in REPLICA_TYPES
            if replica_type in self.replicas
        }
