"""The names the SDK, ``strategyjob run`` and the operator must agree on, defined once:
the API group and version, the labels and annotations on a job's pods, and the
environment variables a replica reads.

Imports nothing, so that every layer (``strategyjob.report`` in a training process, the
manifest model, the operator) can use it at no cost. A name here is a contract with
manifests, pods and scripts already out there: renaming one breaks them.
"""

from __future__ import annotations

# -- the custom resource -------------------------------------------------------------------------
GROUP = "strategyjob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StrategyJob"
PLURAL = "strategyjobs"

# -- labels and annotations on a job's pods ------------------------------------------------------
LABEL_JOB_NAME = f"{GROUP}/job-name"
LABEL_REPLICA_TYPE = f"{GROUP}/replica-type"
LABEL_REPLICA_INDEX = f"{GROUP}/replica-index"
LABEL_JOB_ROLE = f"{GROUP}/job-role"
#: The job's restarts when the pod was created (as :data:`ENV_RESTART_ATTEMPT` in its env).
LABEL_RESTART_ATTEMPT = f"{GROUP}/restart-attempt"
#: On the leader's pod: where ``strategyjob.report`` publishes (JSON); the operator copies it
#: into ``status.progress``.
ANNOTATION_PROGRESS = f"{GROUP}/progress"

# -- the environment of a replica: TensorFlow's and torch.distributed's names --------------------
ENV_TF_CONFIG = "TF_CONFIG"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"

# -- the environment of a replica: StrategyJob's own -------------------------------------------
ENV_JOB_NAME = "STRATEGYJOB_JOB_NAME"
ENV_NAMESPACE = "STRATEGYJOB_NAMESPACE"
ENV_STRATEGY = "STRATEGYJOB_STRATEGY"
ENV_REPLICA_TYPE = "STRATEGYJOB_REPLICA_TYPE"
ENV_REPLICA_INDEX = "STRATEGYJOB_REPLICA_INDEX"
ENV_POD_NAME = "STRATEGYJOB_POD_NAME"
#: Which run of the job this replica belongs to: 0, then one more per restart.
ENV_RESTART_ATTEMPT = "STRATEGYJOB_RESTART_ATTEMPT"
#: The job's shared secret, checked by the parameter-server gRPC servers.
ENV_TOKEN = "STRATEGYJOB_TOKEN"
#: On Kubernetes: the cluster part of TF_CONFIG, read from the job's ConfigMap; TF_CONFIG's
#: value in the pod spec refers to it as ``$(STRATEGYJOB_CLUSTER_SPEC)``.
ENV_CLUSTER_SPEC = "STRATEGYJOB_CLUSTER_SPEC"
#: The chief of a ParameterServerStrategy job follows this file's ``worker`` addresses (a JSON
#: like TF_CONFIG's ``cluster``), re-read when it changes: the job's resizes.
ENV_CLUSTER_FILE = "STRATEGYJOB_CLUSTER_FILE"
#: Under ``strategyjob run``: the file the leader's ``strategyjob.report`` appends to.
ENV_PROGRESS_FILE = "STRATEGYJOB_PROGRESS_FILE"
#: Seconds between two progress writes of ``strategyjob.report``.
ENV_PROGRESS_INTERVAL = "STRATEGYJOB_PROGRESS_INTERVAL"
#: For tests: the API server and ServiceAccount directory ``strategyjob.report`` uses instead
#: of the in-cluster ones.
ENV_KUBE_API = "STRATEGYJOB_KUBE_API"
ENV_SERVICEACCOUNT_DIR = "STRATEGYJOB_SERVICEACCOUNT_DIR"

#: The documentation page of every fault, its bound and its setting, named by the messages
#: that tell a user to change one (``strategyjob.cli.DOCS`` names the others).
DOCS_FAULTS = "docs/guide/faults.md"

# -- tuning a replica reads (set by the user in the pod template) -------------------------------
ENV_RENDEZVOUS_TIMEOUT = "STRATEGYJOB_RENDEZVOUS_TIMEOUT"
#: Seconds between two "waiting for <task>" lines of a worker waiting for its peers.
ENV_WAITING_REPORT_SECONDS = "STRATEGYJOB_WAITING_REPORT_SECONDS"
ENV_UNRESPONSIVE_PEER_SECONDS = "STRATEGYJOB_UNRESPONSIVE_PEER_SECONDS"
#: The stuck-peer bound without ``timeout_seconds``: its floor (seconds, or ``off``) and factor.
ENV_STUCK_PEER_SECONDS = "STRATEGYJOB_STUCK_PEER_SECONDS"
ENV_STUCK_PEER_FACTOR = "STRATEGYJOB_STUCK_PEER_FACTOR"
ENV_PS_CONNECT_TIMEOUT = "STRATEGYJOB_PS_CONNECT_TIMEOUT"
ENV_PS_TIMEOUT = "STRATEGYJOB_PS_TIMEOUT"
ENV_MAX_CONCURRENT_CALLS = "STRATEGYJOB_MAX_CONCURRENT_CALLS"
ENV_CLOSURES_IN_FLIGHT_PER_WORKER = "STRATEGYJOB_CLOSURES_IN_FLIGHT_PER_WORKER"
