"""Names shared by the operator's modules: API coordinates, labels, condition types,
Event reasons. Kept in one place so tests and handlers use the same strings."""

from __future__ import annotations

# The API coordinates, labels and annotation are the SDK's too (``strategyjob report``,
# ``strategyjob status``, the manifest model): defined once, in strategyjob._names.
from strategyjob import _names

GROUP = _names.GROUP
VERSION = _names.VERSION
PLURAL = _names.PLURAL
KIND = _names.KIND
API_VERSION = _names.API_VERSION
LABEL_JOB_NAME = _names.LABEL_JOB_NAME
LABEL_REPLICA_TYPE = _names.LABEL_REPLICA_TYPE
LABEL_REPLICA_INDEX = _names.LABEL_REPLICA_INDEX
#: The file a resizable job's chief follows for its workers (:mod:`.scaling`).
ENV_CLUSTER_FILE = _names.ENV_CLUSTER_FILE
LABEL_JOB_ROLE = _names.LABEL_JOB_ROLE
LABEL_RESTART_ATTEMPT = _names.LABEL_RESTART_ATTEMPT
ANNOTATION_PROGRESS = _names.ANNOTATION_PROGRESS

ROLE_CHIEF = "chief"

#: The operator's own settings, from its Deployment's environment (the Helm chart sets them).
ENV_METRICS_PORT = "STRATEGYJOB_METRICS_PORT"
ENV_MAX_IN_FLIGHT = "STRATEGYJOB_MAX_IN_FLIGHT"
ENV_GANG_SCHEDULER = "STRATEGYJOB_GANG_SCHEDULER"
ENV_RESYNC_SECONDS = "STRATEGYJOB_RESYNC_SECONDS"
ENV_TERMINATION_GRACE_SECONDS = "STRATEGYJOB_TERMINATION_GRACE_SECONDS"
ENV_LOST_POD_SECONDS = "STRATEGYJOB_LOST_POD_SECONDS"
ENV_STARTUP_SECONDS = "STRATEGYJOB_STARTUP_SECONDS"
#: training-operator's own name for it: a served TFJob's ``TF_CONFIG`` addresses end with it.
ENV_CUSTOM_CLUSTER_DOMAIN = "CUSTOM_CLUSTER_DOMAIN"

#: Name of the container port the operator adds to the training container.
PORT_NAME = "sjob-port"

# Condition types (TFJob's set).
CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
#: Order in which a true condition wins the ``status.state`` column.
STATE_PRECEDENCE = (FAILED, SUCCEEDED, SUSPENDED, RESTARTING, RUNNING, CREATED)

# Condition / Event reasons.
REASON_CREATED = "StrategyJobCreated"
REASON_RUNNING = "StrategyJobRunning"
REASON_PODS_CREATED = "PodsCreated"
REASON_JOB_RESTARTING = "JobRestarting"
REASON_REPLICA_RESTARTING = "ReplicaRestarting"
#: Restarts whose root cause is a disruption (preemption, eviction, node drain): not
#: counted against backoffLimit.
REASON_JOB_PREEMPTED = "JobPreempted"
REASON_REPLICA_PREEMPTED = "ReplicaPreempted"
REASON_SUCCEEDED = "StrategyJobSucceeded"
REASON_REPLICA_FAILED = "ReplicaFailed"
REASON_EVALUATOR_FAILED = "EvaluatorFailed"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_DEADLINE = "DeadlineExceeded"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_SUSPENDED = "StrategyJobSuspended"
REASON_RESUMED = "StrategyJobResumed"
REASON_TTL = "TTLExpired"
REASON_CREATE_FAILED = "FailedCreatePod"

# Pods that cannot start (an image that does not pull, a missing Secret, no node that fits).
#: Condition: some pods of the job are stuck; its message names them (kstatus' "Stalled").
STALLED = "Stalled"
#: A ParameterServerStrategy job's workers are being resized (issue 30): True until the
#: chief follows every worker the spec asks for.
RESIZING = "Resizing"
REASON_RESIZING = "Resizing"
#: Resizing, but a worker it added cannot start (unschedulable, its image does not pull): the
#: job runs on at its old size.
REASON_RESIZE_STALLED = "ResizeStalled"
REASON_RESIZED = "Resized"
REASON_NOT_STALLED = "PodsProgressing"
REASON_PENDING_TIMEOUT = "PendingTimeoutExceeded"
REASON_EVALUATOR_RESTARTING = "EvaluatorRestarting"

# Node failure: pods whose node is lost.
#: Event reason: a pod that was still terminating long after its grace period on a node that
#: is gone or NotReady was force-deleted (no kubelet would ever confirm its end).
REASON_POD_FORCE_DELETED = "PodForceDeleted"

# Creation errors: the API server refuses the job's pods or objects.
#: Condition: True while the operator cannot create the job's pods or objects; its message is
#: the API server's answer and what the operator does about it.
CREATE_FAILED = "CreateFailed"
#: Reason (condition and Event) when an object of the job (Service, ServiceAccount, Role,
#: RoleBinding, token Secret, NetworkPolicy, PodGroup) cannot be created.
REASON_SETUP_FAILED = "FailedCreate"
#: Reason of the CreateFailed condition once everything could be created again.
REASON_CREATE_SUCCEEDED = "CreateSucceeded"
