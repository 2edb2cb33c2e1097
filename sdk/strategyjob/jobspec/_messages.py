"""Every manifest error message, as a format template.

Each message reads ``<path>: <what is wrong> (got <value>). <fix>``. Tests, the
launcher and the operator import these constants so that all of them show the
same text. Fill ``{value}`` with :func:`format_value`.
"""

from __future__ import annotations

import json
from typing import Any

from strategyjob import _names

_MAX_VALUE_CHARS = 80


def format_value(value: Any) -> str:
    """How a offending value is shown after ``got``: JSON-like, shortened."""
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


# --- document shape --------------------------------------------------------------------------
NOT_A_MAPPING = "{path}: must be a mapping of fields (got {value}). Write it as `key: value` lines."
NOT_A_MANIFEST = (
    "manifest: a StrategyJob manifest must be a mapping (got {value}). "
    f"Start the file with apiVersion: {_names.API_VERSION} and kind: {_names.KIND}."
)
BAD_API_VERSION = (
    f"apiVersion: unsupported apiVersion (got {{value}}). Use apiVersion: {_names.API_VERSION}."
)
BAD_KIND = f"kind: unsupported kind (got {{value}}). Use kind: {_names.KIND}."
UNKNOWN_FIELD = "{path}: unknown field (got {value}). Remove it or use one of: {known}."
#: A field a Kubernetes pod template, pod spec or container does not have; ``hint`` is
#: `` Did you mean command?`` when one is close, else empty.
UNKNOWN_K8S_FIELD = (
    "{path}: unknown field of a Kubernetes {kind} (got {value}).{hint} Remove it or fix its "
    "name; kubectl explain {explain} lists the fields."
)
MISSING_SPEC = (
    "spec: the manifest has no spec (got {value}). Add spec with strategy and replicaSpecs."
)

# --- metadata ----------------------------------------------------------------------------------
MISSING_NAME = (
    "metadata.name: the job needs a name (got {value}). Set metadata.name, e.g. name: mnist."
)
BAD_NAME = (
    "metadata.name: must be lowercase letters, digits and '-', start with a letter and end "
    "with a letter or digit (got {value}). Rename the job, e.g. mnist-train."
)
NAME_TOO_LONG = (
    "metadata.name: too long, pod name {pod_name} would have {length} characters, more than 63 "
    "(got {value}). Use a name of at most {max_length} characters."
)
BAD_NAMESPACE = (
    "metadata.namespace: must be lowercase letters, digits and '-', starting and ending with "
    "a letter or digit (got {value}). Use an existing namespace, e.g. default."
)

# --- generic field types -----------------------------------------------------------------------
NOT_AN_INTEGER = "{path}: must be an integer (got {value}). Write a whole number, e.g. {example}."
INTEGER_TOO_SMALL = "{path}: must be at least {minimum} (got {value}). Set it to {minimum} or more."
INTEGER_TOO_LARGE = "{path}: must be at most {maximum} (got {value}). Set it to {maximum} or less."
NOT_A_BOOLEAN = "{path}: must be true or false (got {value}). Write true or false."
NOT_A_STRING = '{path}: must be a string (got {value}). Quote it, e.g. "{example}".'
NOT_ONE_OF = "{path}: unknown value (got {value}). Use one of: {allowed}."
TOO_MANY_ITEMS = (
    "{path}: too many entries, at most {maximum} (got {value}). Use at most {maximum} entries."
)
INVALID_LABEL = (
    "{path}: not a label the API server admits: {reason} (got {value}). Fix or remove it, "
    "e.g. app: mnist."
)
STRING_TOO_LONG = (
    "{path}: too long, {length} characters, more than {maximum} (got {value}). "
    "Use a name of at most {maximum} characters."
)

# --- strategy and replicas ---------------------------------------------------------------------
MISSING_STRATEGY = (
    "spec.strategy: a strategy is required (got {value}). Set it to one of: {allowed}."
)
UNKNOWN_STRATEGY = "spec.strategy: unknown strategy (got {value}). Use one of: {allowed}."
MISSING_REPLICA_SPECS = (
    "spec.replicaSpecs: the job has no replicas (got {value}). "
    "Add spec.replicaSpecs.worker with replicas and a template."
)
UNKNOWN_REPLICA_TYPE = (
    "spec.replicaSpecs.{replica_type}: unknown replica type (got {value}). "
    "Use chief, worker, ps or evaluator{hint}."
)
MISSING_TEMPLATE = (
    "spec.replicaSpecs.{replica_type}.template: a pod template is required (got {value}). "
    "Add template.spec.containers with a container named strategyjob."
)
MISSING_CONTAINERS = (
    "spec.replicaSpecs.{replica_type}.template.spec.containers: the pod template has no "
    "container (got {value}). Add a container named strategyjob with its image and command."
)
BAD_CONTAINER = "{path}: a container needs a name (got {value}). Add name: strategyjob."

# --- pod template containers and metadata ------------------------------------------------------
NOT_A_LIST = "{path}: must be a list (got {value}). Write one `- ` entry per item, e.g. {example}."
NOT_A_STRING_LIST = (
    "{path}: must be a list of strings (got {value}). "
    "Write it as a list and quote each part, e.g. {example}."
)
INVALID_IMAGE = (
    "{path}: not an image the cluster can pull, its pods would wait in InvalidImageName "
    "({reason}) (got {value}). Write [registry[:port]/]name[:tag][@sha256:digest], the name "
    "in lowercase, e.g. python:3.11."
)
BAD_ENV_ENTRY = (
    "{path}: an env entry must be a mapping with a name (got {value}). "
    "Write - name: VAR with value: text (or valueFrom)."
)
BAD_PORT_ENTRY = (
    "{path}: a port must be a mapping with a containerPort (got {value}). "
    "Write - containerPort: 2222."
)

# --- topology, per strategy --------------------------------------------------------------------
AT_MOST_ONE = (
    "spec.replicaSpecs.{replica_type}.replicas: there must be at most one {replica_type} "
    "(got {value}). Set replicas: 1."
)
NEEDS_CHIEF_OR_WORKER = (
    "spec.replicaSpecs: {strategy} needs at least one chief or worker replica (got {value}). "
    "Add spec.replicaSpecs.worker with replicas: 1."
)
TAKES_NO_PS = (
    "spec.replicaSpecs.ps: {strategy} takes no ps replicas (got {value}). "
    "Remove spec.replicaSpecs.ps, or use ParameterServerStrategy."
)
SINGLE_PROCESS = (
    "spec.replicaSpecs: {strategy} runs in one process and takes exactly one chief or worker "
    "replica (got {value}). Use one worker with replicas: 1, or MultiWorkerMirroredStrategy "
    "for several."
)
PS_NEEDS_CHIEF = (
    "spec.replicaSpecs.chief: ParameterServerStrategy needs one chief, the coordinator "
    "(got {value}). Add spec.replicaSpecs.chief with replicas: 1."
)
PS_NEEDS_WORKER = (
    "spec.replicaSpecs.worker: ParameterServerStrategy needs at least one worker (got {value}). "
    "Add spec.replicaSpecs.worker with replicas: 1 or more."
)
PS_NEEDS_PS = (
    "spec.replicaSpecs.ps: ParameterServerStrategy needs at least one ps replica (got {value}). "
    "Add spec.replicaSpecs.ps with replicas: 1 or more."
)
TPU_WORKERS_ONLY = (
    "spec.replicaSpecs.chief: TPUStrategy takes worker replicas only (got {value}). "
    "Remove spec.replicaSpecs.chief; worker 0 leads the job."
)
TOO_MANY_REPLICAS = (
    "spec.replicaSpecs: a StrategyJob may have at most {maximum} replicas in all: every "
    "replica's TF_CONFIG lists the whole cluster and must stay under the kernel's 128 KiB "
    "limit per environment string (got {value}). Use at most {maximum} replicas in all."
)
NAME_TOO_LONG_FOR_REPLICAS = (
    "metadata.name: too long for {total} replicas: every replica's TF_CONFIG lists the whole "
    "cluster, each address with the job's name twice, and must stay under the kernel's "
    "128 KiB limit per environment string (got {value}). Use a name of at most {max_length} "
    "characters, or fewer replicas."
)
MIN_AVAILABLE_TOO_LARGE = (
    "spec.runPolicy.schedulingPolicy.minAvailable: more than the job's {total} replicas "
    "(got {value}). Set it to at most {total}."
)

# --- Kubeflow TFJob (kubeflow.org/v1) ------------------------------------------------------------
NOT_A_TFJOB = (
    "manifest: a TFJob manifest must be a mapping (got {value}). "
    "Start the file with apiVersion: kubeflow.org/v1 and kind: TFJob."
)
BAD_TFJOB_API_VERSION = (
    "apiVersion: unsupported apiVersion for a TFJob (got {value}). Use apiVersion: kubeflow.org/v1."
)
BAD_TFJOB_KIND = "kind: unsupported kind (got {value}). Use kind: TFJob."
MISSING_TF_REPLICA_SPECS = (
    "spec.tfReplicaSpecs: the TFJob has no replicas (got {value}). "
    "Add spec.tfReplicaSpecs.Worker with replicas and a template."
)
UNKNOWN_TF_REPLICA_TYPE = (
    "spec.tfReplicaSpecs.{key}: unknown replica type (got {value}). "
    "Use Chief, Master, Worker, PS or Evaluator."
)
DUPLICATE_TF_REPLICA_TYPE = (
    "spec.tfReplicaSpecs.{key}: the same replica type as {other}, as keys are "
    "case-insensitive (got {value}). Keep one of them."
)
# --- resizing bounds (the CRD says the same; only workers may be resized) ------------------------
BOUNDS_NOT_WORKER = (
    "spec.replicaSpecs.{replica_type}: minReplicas and maxReplicas bound the worker count only "
    "(got {value}). Remove them here; set them on spec.replicaSpecs.worker."
)
BOUNDS_CROSSED = (
    "spec.replicaSpecs.worker: minReplicas is greater than maxReplicas (got {value}). Set "
    "minReplicas <= maxReplicas."
)
BELOW_MIN_REPLICAS = (
    "spec.replicaSpecs.worker.replicas: below minReplicas {minimum} (got {value}). Ask for "
    "{minimum} workers or more, or change minReplicas."
)
NOT_RESIZABLE = (
    "spec.replicaSpecs.worker.replicas: a {strategy} job runs as one process and cannot be "
    "resized; only ParameterServerStrategy (workers join and leave), MultiWorkerMirroredStrategy "
    "and TPUStrategy (re-formed from their checkpoint) jobs can (got {value}). Create a "
    "MultiWorkerMirroredStrategy job to train on several workers."
)
ABOVE_MAX_REPLICAS = (
    "spec.replicaSpecs.worker.replicas: above maxReplicas {maximum} (got {value}). Ask for "
    "{maximum} workers or fewer, or change maxReplicas."
)
TOO_MANY_CHIEFS = (
    "spec.tfReplicaSpecs: a TFJob may have at most one Chief or Master replica in all "
    "(got {value}). Keep one, with replicas: 1."
)
NO_TENSORFLOW_CONTAINER = (
    "spec.tfReplicaSpecs.{key}.template.spec.containers: there is no container named "
    "tensorflow (got {value}). Name the training container tensorflow."
)
TFJOB_NEEDS_TRAINER = (
    "spec.tfReplicaSpecs: the TFJob has no Chief, Master or Worker replica to run training "
    "(got {value}). Add spec.tfReplicaSpecs.Worker with replicas: 1."
)
BAD_MANAGED_BY = (
    "spec.runPolicy.managedBy: unknown controller (got {value}). "
    "Use kubeflow.org/training-operator, kueue.x-k8s.io/multikueue, or leave it unset."
)
NOT_A_TFJOB_TO_CONVERT = (
    "manifest: strategyjob convert reads a Kubeflow TFJob, not this (got {value}). Give it a "
    "manifest with apiVersion: kubeflow.org/v1 and kind: TFJob; a StrategyJob needs no "
    "converting."
)
