"""The StrategyJob manifest model, its validation and the injected replica environment.

Shared by ``strategyjob run`` and the operator; imports neither torch nor kopf.

    job = load_manifest(yaml.safe_load(text))      # raises ManifestError
    env = replica_env(job, "worker", 1, cluster_for_kubernetes(job))
    job = StrategyJob.build("mnist", strategy=..., image=..., command=[...])
    job.to_manifest()                               # the YAML a user would write
"""

from strategyjob.jobspec import _messages as messages
from strategyjob.jobspec._env import (
    ENV_JOB_NAME,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_NAMESPACE,
    ENV_RANK,
    ENV_REPLICA_INDEX,
    ENV_REPLICA_TYPE,
    ENV_STRATEGY,
    ENV_TF_CONFIG,
    ENV_WORLD_SIZE,
    TRAINING_REPLICA_TYPES,
    cluster_for_kubernetes,
    leader,
    replica_env,
    success_replicas,
    tf_config,
    training_container,
)
from strategyjob.jobspec._load import (
    ManifestError,
    load_manifest,
    load_manifest_file,
    read_manifest_file,
    read_manifest_text,
)
from strategyjob.jobspec._messages import format_value
from strategyjob.jobspec._model import (
    API_VERSION,
    CLEAN_POD_POLICIES,
    COLLECTIVE_STRATEGIES,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_CLEAN_POD_POLICY,
    DEFAULT_NAMESPACE,
    DEFAULT_PORT,
    DEFAULT_REPLICAS,
    DEFAULT_RESTART_POLICY,
    KIND,
    MAX_NAME_LENGTH,
    REPLICA_TYPES,
    RESTART_POLICIES,
    SINGLE_PROCESS_STRATEGIES,
    STRATEGIES,
    SUCCESS_POLICIES,
    TRAINING_CONTAINER_NAME,
    ReplicaSpec,
    RunPolicy,
    SchedulingPolicy,
    StrategyJob,
)

__all__ = [
    "API_VERSION",
    "CLEAN_POD_POLICIES",
    "COLLECTIVE_STRATEGIES",
    "DEFAULT_BACKOFF_LIMIT",
    "DEFAULT_CLEAN_POD_POLICY",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "DEFAULT_REPLICAS",
    "DEFAULT_RESTART_POLICY",
    "ENV_JOB_NAME",
    "ENV_MASTER_ADDR",
    "ENV_MASTER_PORT",
    "ENV_NAMESPACE",
    "ENV_RANK",
    "ENV_REPLICA_INDEX",
    "ENV_REPLICA_TYPE",
    "ENV_STRATEGY",
    "ENV_TF_CONFIG",
    "ENV_WORLD_SIZE",
    "KIND",
    "MAX_NAME_LENGTH",
    "REPLICA_TYPES",
    "RESTART_POLICIES",
    "SINGLE_PROCESS_STRATEGIES",
    "STRATEGIES",
    "SUCCESS_POLICIES",
    "TRAINING_CONTAINER_NAME",
    "TRAINING_REPLICA_TYPES",
    "ManifestError",
    "ReplicaSpec",
    "RunPolicy",
    "SchedulingPolicy",
    "StrategyJob",
    "cluster_for_kubernetes",
    "format_value",
    "leader",
    "load_manifest",
    "load_manifest_file",
    "messages",
    "read_manifest_file",
    "read_manifest_text",
    "replica_env",
    "success_replicas",
    "tf_config",
    "training_container",
]
