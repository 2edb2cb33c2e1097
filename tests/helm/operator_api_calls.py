"""Every Kubernetes API call the operator makes, by whom and why: the single list that the
chart's RBAC must equal (test_helm_chart.py compares it with the rendered rules, both ways) and
that a real run must not exceed (test_helm_cluster.py reads the API server's audit log).

Change it together with the operator: a new call here without a rule fails the chart test, a
rule without a call here fails it too, and a call the operator makes but this list lacks fails
the run against the API server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: ``any``: both modes; ``cluster-wide``: only with ``watchNamespaces: []``; ``namespaced``:
#: only with ``watchNamespaces: [a, b]``.
Mode = Literal["any", "cluster-wide", "namespaced"]


@dataclass(frozen=True)
class Call:
    group: str  # "" is the core group
    resource: str  # "plural" or "plural/subresource"
    verb: str
    mode: Mode
    #: ``watched``: objects in the watched namespaces (a Role each, or the ClusterRole);
    #: ``cluster``: cluster-scoped objects (always a ClusterRole).
    scope: Literal["watched", "cluster"]
    #: True when the rule names the peering object only (``resourceNames``).
    own_peering_only: bool
    by: str  # where the call is made
    #: True for a verb the operator holds but never calls: to grant it to each job's Role (RBAC
    #: refuses to create a Role with verbs its creator lacks), or for an admission plugin's check.
    delegated: bool = False
    #: Non-empty for a call made only in a situation the audited chart run does not stage
    #: (it names the situation); the chart must still grant it.
    only_when: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.resource, self.verb)


def _calls(
    group: str,
    resource: str,
    verbs: dict[str, str],
    mode: Mode = "any",
    scope: Literal["watched", "cluster"] = "watched",
    own_peering_only_verbs: tuple[str, ...] = (),
    delegated: bool = False,
    only_when: dict[str, str] | None = None,
) -> list[Call]:
    return [
        Call(
            group,
            resource,
            verb,
            mode,
            scope,
            verb in own_peering_only_verbs,
            by,
            delegated,
            (only_when or {}).get(verb, ""),
        )
        for verb, by in verbs.items()
    ]


LEFTOVERS = "a job is created again before the children of its namesake are deleted"
RESIZED = "a ParameterServerStrategy job's workers are resized (kubectl scale)"
FOUND = "a pass finds the object there (a whole-job restart, an operator restarted mid-creation)"


def _job_object_calls(
    group: str, resource: str, what: str, *, deletes_leftovers: bool = True
) -> list[Call]:
    """The calls on one of the objects ``reconcile._ensure_job_objects`` creates once.
    ``deletes_leftovers=False``: its name carries the job's uid, so no earlier job's is ever
    in the way (the token Secret)."""
    where = "reconcile.Reconciler._create_child"
    verbs = {
        "create": f"{where}: {what} (409: an existing one is kept if this job owns it)",
        "get": f"{where}: on 409, the existing object's metadata (PartialObjectMetadata)",
    }
    if deletes_leftovers:
        verbs["delete"] = f"{where}: on 409, one an earlier job of the same name left behind"
    return _calls(group, resource, verbs, only_when={"get": FOUND, "delete": LEFTOVERS})


SJ = "strategyjob.dev"
KOPF_PEERING_VERBS = {
    "list": "kopf peering: lists the peering objects, then watches them (engines/peering.py)",
    "watch": "kopf peering: sees the other operator pods and their priorities",
    "patch": "kopf peering: keep-alive of this pod in its own peering object (peering.touch)",
}

CALLS: list[Call] = [
    *_calls(
        SJ,
        "strategyjobs",
        {
            "get": "reconcile.Reconciler._reconcile: api.get(job_path) at the start of a pass",
            "list": "kopf: the watch stream's initial listing (@kopf.on.event, @kopf.daemon)",
            "watch": "kopf: the StrategyJob watch stream",
            "patch": "kopf: takes off the finalizer strategyjob.dev/operator that earlier "
            "versions put on every job (handlers.no_finalizer_for_daemons)",
            "delete": "reconcile: plan.delete_job when ttlSecondsAfterFinished has passed",
        },
        only_when={"patch": "a job made under an earlier version carries its finalizer"},
    ),
    *_calls(
        SJ,
        "strategyjobs/status",
        {
            "patch": "reconcile: the one status write per pass (merge patch); kopf's own "
            "progress part of status"
        },
    ),
    *_calls(
        "",
        "pods",
        {
            "list": "reconcile: the job's pods by label selector; kopf's initial listing",
            "watch": "kopf: @kopf.on.event pods with the job-name label (wakes the job's loop)",
            "create": "reconcile: the missing pods (children.missing_pods)",
            "delete": "reconcile: plan.delete_pods (restarts, failures, cleanPodPolicy)",
            "get": "reconcile.Reconciler._create_child: on 409, whose is the pod of that name "
            "(PartialObjectMetadata); also granted to each job's Role on its leader pod",
        },
        only_when={"get": "a pod's name is taken (an orphaned pod, a stale listing)"},
    ),
    *_calls(
        "",
        "pods",
        {
            "patch": "reconcile.Reconciler._nudge_chief: the members annotation of a resized "
            "ParameterServerStrategy job's chief (the kubelet refreshes its ConfigMap volume); "
            "also granted to each job's Role on its leader pod (progress)"
        },
        only_when={"patch": RESIZED},
    ),
    *_calls(
        "",
        "configmaps",
        {
            "patch": "reconcile.Reconciler._follow_workers: the workers in the "
            "<job>-strategyjob-members ConfigMap that a resized ParameterServerStrategy job's "
            "chief follows; reconcile.Reconciler._record_history: a job's metric history, "
            "<job>-strategyjob-metrics, at each new progress report after its first"
        },
        only_when={"patch": f"{RESIZED}, or a job reports its progress twice"},
    ),
    *_calls(
        SJ,
        "strategyjobs/finalizers",
        {
            "update": "never called: OwnerReferencesPermissionEnforcement (OpenShift) checks "
            "it when a child's owner reference sets blockOwnerDeletion"
        },
        delegated=True,
    ),
    *_job_object_calls("", "services", "the job's headless Service"),
    *_job_object_calls("", "serviceaccounts", "the job's ServiceAccount"),
    *_job_object_calls(
        "",
        "configmaps",
        "the job's <job>-strategyjob-cluster, the cluster its pods read, a "
        "ParameterServerStrategy job's <job>-strategyjob-members, the workers its chief "
        "follows, and <job>-strategyjob-metrics, its metric history (at its first report)",
    ),
    *_job_object_calls(
        "",
        "secrets",
        "the job's token Secret <job>-<uid>-strategyjob-token (metadata only, never its data)",
        deletes_leftovers=False,
    ),
    *_job_object_calls("rbac.authorization.k8s.io", "roles", "get/patch on the job's leader pod"),
    *_job_object_calls(
        "rbac.authorization.k8s.io", "rolebindings", "the job's Role to its ServiceAccount"
    ),
    *_job_object_calls(
        "networking.k8s.io", "networkpolicies", "ingress only from the job's own pods"
    ),
    *_calls("", "events", {"create": "kube.KubeApi.post_event: the job's Events"}),
    *_calls(
        "kopf.dev",
        "clusterkopfpeerings",
        KOPF_PEERING_VERBS,
        mode="cluster-wide",
        scope="cluster",
        own_peering_only_verbs=("patch",),
    ),
    *_calls(
        "kopf.dev",
        "kopfpeerings",
        KOPF_PEERING_VERBS,
        mode="namespaced",
        own_peering_only_verbs=("patch",),
    ),
    *_calls(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        {
            "list": "kopf resource observer (reactor/observation.py): initial CRD listing",
            "watch": "kopf resource observer: re-scans the API when a CRD changes",
        },
        scope="cluster",
    ),
    *_calls(
        "",
        "nodes",
        {
            "get": "reconcile.Reconciler._force_delete_lost: the node of a pod still "
            "terminating past its grace period (gone or NotReady: force-delete it)"
        },
        scope="cluster",
        only_when={"get": "a job's pod stays terminating on a lost node"},
    ),
    *_calls(
        "",
        "namespaces",
        {
            "list": "kopf namespace observer: which watched namespaces exist (not when "
            "cluster-wide)",
            "watch": "kopf namespace observer: watched namespaces created or deleted later",
        },
        mode="namespaced",
        scope="cluster",
    ),
]


def gang_calls(group: str) -> list[Call]:
    """The calls an operator with a gang scheduler (``operator.gangScheduler``) makes besides
    :data:`CALLS`, its PodGroups in the scheduler's API ``group``: what the chart adds then
    (test_helm_chart.py compares them both ways)."""
    where = "reconcile.Reconciler._create_child"
    return [
        *_calls(
            group,
            "podgroups",
            {
                "create": f"{where}: the job's PodGroup (409: kept if this job owns it); again "
                "when a suspended job is resumed",
                "get": f"{where}: on 409, the existing PodGroup's metadata; "
                "gang.release_pod_group: whose is the PodGroup of a suspended job; "
                "reconcile.Reconciler._sync_pod_group: its spec on a TFJob's replicas edit",
                "delete": "gang.release_pod_group: the PodGroup of a suspended job (the "
                f"scheduler reserves nothing for it); {where}: one an earlier job left",
                "patch": "reconcile.Reconciler._sync_pod_group: minMember after a served "
                "TFJob's replicas edit",
            },
            only_when={
                "get": FOUND,
                "delete": "a job is suspended",
                "patch": "a served TFJob's replicas are edited",
            },
        ),
        *_calls(
            "",
            "resourcequotas",
            {
                "list": "gang.quota_shortfall: the namespace's quotas, before a gang's pods "
                "are created (all of them fit, or none is created); kopf's initial listing",
                "watch": "kopf: @kopf.on.event resourcequotas (handlers.watch_resource_quotas, "
                "only with a gang scheduler): a quota that frees room wakes the gangs waiting "
                "for it",
            },
        ),
    ]


def tfjob_calls() -> list[Call]:
    """The calls an operator that serves Kubeflow TFJobs (``tfjob.enabled``,
    STRATEGYJOB_SERVE_TFJOBS=true) makes besides :data:`CALLS`: the same on its TFJobs as on
    StrategyJobs, with the verbs training-operator's own role grants (update). What the chart
    adds then (test_helm_chart.py compares them both ways)."""
    return [
        *_calls(
            "kubeflow.org",
            "tfjobs",
            {
                "get": "reconcile: the TFJob at the start of a pass",
                "list": "kopf: the TFJob watch stream's initial listing",
                "watch": "kopf: the TFJob watch stream",
                "patch": "kopf: its annotations and finalizer clean-up on a TFJob",
                "update": "a whole write of a TFJob, as training-operator's role grants",
                "delete": "reconcile: plan.delete_job when ttlSecondsAfterFinished has passed",
            },
            only_when={
                "patch": "a TFJob carries an earlier operator's finalizer",
                "update": "a TFJob is written whole",
                "delete": "a finished TFJob's ttlSecondsAfterFinished passes",
            },
        ),
        *_calls(
            "kubeflow.org",
            "tfjobs/status",
            {
                "get": "a read of the TFJob's status subresource",
                "patch": "reconcile: the one status write per pass (TFJob's conditions, "
                "replicaStatuses, startTime, completionTime, lastReconcileTime)",
                "update": "a whole write of the TFJob's status",
            },
            only_when={"get": "status is read alone", "update": "status is written whole"},
        ),
        *_calls(
            "kubeflow.org",
            "tfjobs/finalizers",
            {
                "update": "never called: OwnerReferencesPermissionEnforcement (OpenShift) checks "
                "it when a pod's or Service's owner reference to its TFJob sets "
                "blockOwnerDeletion"
            },
            delegated=True,
        ),
    ]


#: The cluster-scoped reads the operator can do without (kopf logs a warning and falls back;
#: pods stuck on lost nodes are not force-deleted): granted by ``rbac.discovery`` (default
#: true).
DISCOVERY_RESOURCES = frozenset({"customresourcedefinitions", "namespaces", "nodes"})


def calls_for(mode: Literal["cluster-wide", "namespaced"], *, discovery: bool = True) -> list[Call]:
    """The calls an operator in ``mode`` makes."""
    return [
        c
        for c in CALLS
        if c.mode in ("any", mode) and (discovery or c.resource not in DISCOVERY_RESOURCES)
    ]
