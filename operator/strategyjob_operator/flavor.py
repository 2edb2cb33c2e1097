"""The kinds of job the operator serves, as data: a StrategyJob and a Kubeflow
``kubeflow.org/v1`` TFJob go through the same reconciler and the same pure decisions; a
:class:`Flavor` says where the job lives, how its manifest is read and how its status
reads, and the :class:`Loaded` job carries the TFJob's differences (names, labels,
Services, ``TF_CONFIG``) to the builders in :mod:`.children`.

The decisions work on StrategyJob's status (lowercase replica types, StrategyJob's
reasons); a TFJob's status is translated at the boundary, both ways, so that what is
written is what training-operator writes (``replicaStatuses`` keyed ``Worker``/``PS``,
reasons ``TFJobCreated``/``TFJobRunning``…) and what is read back decides as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c
from strategyjob_operator.failures import OPTIONAL_TYPES

#: The operator setting that makes it serve TFJobs too (the chart's ``tfjob.enabled``).
ENV_SERVE_TFJOBS = "STRATEGYJOB_SERVE_TFJOBS"

#: TFJob's labels on its pods and Services (training-operator v1.9 ``GenLabels``).
TF_LABEL_JOB_NAME = "training.kubeflow.org/job-name"
TF_LABEL_REPLICA_TYPE = "training.kubeflow.org/replica-type"
TF_LABEL_REPLICA_INDEX = "training.kubeflow.org/replica-index"
TF_LABEL_OPERATOR_NAME = "training.kubeflow.org/operator-name"
TF_LABEL_JOB_ROLE = "training.kubeflow.org/job-role"
TF_OPERATOR_NAME = "tfjob-controller"
TF_ROLE_MASTER = "master"

#: The fields of a TFJob's ``replicaStatuses`` entries (training-operator's ReplicaStatus).
TFJOB_REPLICA_STATUS_FIELDS = ("active", "succeeded", "failed", "selector", "labelSelector")
#: Where a TFJob's status keeps the rest of StrategyJob's per-type bookkeeping (restarts,
#: ``completedIndexes``, ``failedIndexes``, ``ready``), by CamelCase type: TFJob's CRD
#: prunes unknown fields inside ``replicaStatuses`` but keeps them at the status' top.
REPLICA_DETAILS = "strategyjobReplicaStatuses"

#: The reasons whose ``StrategyJob`` prefix names the kind (``StrategyJobCreated``).
_KIND_PREFIX = "StrategyJob"


@dataclass(frozen=True)
class Loaded:
    """A job read from the API server: the StrategyJob it runs as, and for a TFJob the
    TFJob record (its names, ports, labels and ``TF_CONFIG`` differ)."""

    job: jobspec.StrategyJob
    tfjob: jobspec.TFJob | None = None

    @property
    def optional_types(self) -> tuple[str, ...]:
        """The replica types whose failure never fails the job (:attr:`TFJob.optional_types`:
        the evaluator, and a TFJob's workers under ``enableDynamicWorker``)."""
        return OPTIONAL_TYPES if self.tfjob is None else self.tfjob.optional_types

    @property
    def served(self) -> bool:
        """False for a TFJob another controller manages (``runPolicy.managedBy``)."""
        return self.tfjob is None or self.tfjob.served


def _load_strategyjob(obj: Mapping[str, Any], cluster_domain: str) -> Loaded:
    # A StrategyJob's addresses are its pods' (``<pod>.<job>.<namespace>.svc``): the
    # resolver's search list completes them, so the cluster domain is TFJob's alone.
    del cluster_domain
    return Loaded(jobspec.load_manifest(obj))


def _load_tfjob(obj: Mapping[str, Any], cluster_domain: str) -> Loaded:
    tfjob = jobspec.load_tfjob(obj, cluster_domain=cluster_domain)
    return Loaded(tfjob.job, tfjob)


@dataclass(frozen=True)
class Flavor:
    """One kind of job: its API coordinates, its reader, and the prefix of its reasons."""

    kind: str
    group: str
    version: str
    plural: str
    #: Reads a job from the API server; the second argument is the operator's
    #: ``CUSTOM_CLUSTER_DOMAIN`` (``""`` when unset).
    load: Callable[[Mapping[str, Any], str], Loaded]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def job_path(self, namespace: str, name: str = "", subresource: str = "") -> str:
        path = f"/apis/{self.group}/{self.version}/namespaces/{namespace}/{self.plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path

    def reason(self, reason: str) -> str:
        """A decision's reason as this kind writes it (``StrategyJobRunning`` →
        ``TFJobRunning``)."""
        if self.kind != c.KIND and reason.startswith(_KIND_PREFIX):
            return self.kind + reason[len(_KIND_PREFIX) :]
        return reason

    def message(self, text: str, job_name: str) -> str:
        """A decision's message as this kind writes it: ``StrategyJob <job> ...`` names the
        job by its kind (``TFJob <job> is running.``)."""
        if self.kind == c.KIND:
            return text
        return text.replace(f"{_KIND_PREFIX} {job_name}", f"{self.kind} {job_name}")

    def _internal_message(self, text: str, job_name: str) -> str:
        if self.kind == c.KIND:
            return text
        return text.replace(f"{self.kind} {job_name}", f"{_KIND_PREFIX} {job_name}")

    def _internal_reason(self, reason: Any) -> Any:
        if self.kind != c.KIND and isinstance(reason, str) and reason.startswith(self.kind):
            return _KIND_PREFIX + reason[len(self.kind) :]
        return reason

    def external_status(self, status: Mapping[str, Any], loaded: Loaded) -> dict[str, Any]:
        """The status as the job's kind writes it, from the decisions' ``status``."""
        return _translated(status, loaded, self.reason, self.message, external=True)

    def internal_status(self, status: Mapping[str, Any], loaded: Loaded) -> dict[str, Any]:
        """The status the decisions read, from the one the API server holds."""
        return _translated(
            status, loaded, self._internal_reason, self._internal_message, external=False
        )


def _translated(
    status: Mapping[str, Any],
    loaded: Loaded,
    reason: Callable[[Any], Any],
    message: Callable[[str, str], str],
    *,
    external: bool,
) -> dict[str, Any]:
    out = dict(status)
    tfjob = loaded.tfjob
    if tfjob is None:
        return out
    conds = status.get("conditions")
    if isinstance(conds, list):
        out["conditions"] = [
            _condition(x, reason, message, loaded.job.name) if isinstance(x, Mapping) else x
            for x in (_tfjob_types_last(conds) if external else conds)
        ]
    keys = {t: tfjob.key(t) for t in tfjob.replicas}
    if external:
        counts = status.get("replicaStatuses")
        if isinstance(counts, Mapping):
            out["replicaStatuses"], details = {}, {}
            for t, entry in counts.items():
                split = _split(entry)
                out["replicaStatuses"][keys.get(t, t)], details[keys.get(t, t)] = split
            out[REPLICA_DETAILS] = details
        return out
    backwards = {k: t for t, k in keys.items()}
    counts = status.get("replicaStatuses")
    details = out.pop(REPLICA_DETAILS, None)
    details = details if isinstance(details, Mapping) else {}
    if isinstance(counts, Mapping):
        out["replicaStatuses"] = {
            backwards.get(k, k): {**_mapping(details.get(k)), **_mapping(v)}
            for k, v in counts.items()
        }
    return out


def _tfjob_types_last(conditions: list[Any]) -> list[Any]:
    """The conditions with TFJob's own types (``Created``, ``Running``…) after the ones only
    StrategyJob has (``Resizing``, ``Stalled``…), each kept in its order: ``kubectl get
    tfjob``'s State column is the last condition's type, which must stay a TFJob state."""

    def own(x: Any) -> bool:
        return isinstance(x, Mapping) and x.get("type") in c.STATE_PRECEDENCE

    return sorted(conditions, key=own)


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _split(entry: Any) -> tuple[Any, dict[str, Any]]:
    """A replica type's counts as TFJob has them (``active``, ``succeeded``, ``failed``),
    and the rest (restarts, the indices whose run is over), which TFJob's CRD would prune
    from ``replicaStatuses``."""
    if not isinstance(entry, Mapping):
        return entry, {}
    kept = {k: v for k, v in entry.items() if k in TFJOB_REPLICA_STATUS_FIELDS}
    return kept, {k: v for k, v in entry.items() if k not in TFJOB_REPLICA_STATUS_FIELDS}


STRATEGYJOB = Flavor(c.KIND, c.GROUP, c.VERSION, c.PLURAL, _load_strategyjob)
TFJOB = Flavor(
    jobspec.TFJOB_KIND,
    jobspec.TFJOB_GROUP,
    jobspec.TFJOB_VERSION,
    jobspec.TFJOB_PLURAL,
    _load_tfjob,
)
#: The kinds whose jobs control pods (owner references), by kind.
FLAVORS = {f.kind: f for f in (STRATEGYJOB, TFJOB)}


def _condition(
    condition: Mapping[str, Any],
    reason: Callable[[Any], Any],
    message: Callable[[str, str], str],
    job_name: str,
) -> dict[str, Any]:
    out = {**condition, "reason": reason(condition.get("reason"))}
    if isinstance(condition.get("message"), str):
        out["message"] = message(condition["message"], job_name)
    return out
