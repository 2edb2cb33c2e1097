"""The fields Kubernetes defines for the parts of a pod template a manifest holds, so that a
misspelt one (``comand:``) is named as unknown before a pod runs without it. The CRDs in
``crds/`` declare exactly these fields (tests/unit/jobspec/test_jobspec_k8s_fields.py), so
the API server prunes the same ones (and ``kubectl apply`` refuses them): a job read back
from it loads.

From ``k8s.io/api`` v0.36.3 ``core/v1/types.go`` (``Container``, ``PodSpec``), the version
the project's control plane and kind clusters run; a field a newer Kubernetes adds is
added here and in both CRDs (then tools/sync-chart-crds.sh).
"""

from __future__ import annotations

#: ``template``: a ``PodTemplateSpec``.
POD_TEMPLATE_FIELDS: tuple[str, ...] = ("metadata", "spec")

#: ``template.spec``: a ``PodSpec``.
POD_SPEC_FIELDS: tuple[str, ...] = (
    "volumes",
    "initContainers",
    "containers",
    "ephemeralContainers",
    "restartPolicy",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "dnsPolicy",
    "nodeSelector",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "nodeName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "shareProcessNamespace",
    "securityContext",
    "imagePullSecrets",
    "hostname",
    "subdomain",
    "affinity",
    "schedulerName",
    "tolerations",
    "hostAliases",
    "priorityClassName",
    "priority",
    "dnsConfig",
    "readinessGates",
    "runtimeClassName",
    "enableServiceLinks",
    "preemptionPolicy",
    "overhead",
    "topologySpreadConstraints",
    "setHostnameAsFQDN",
    "os",
    "hostUsers",
    "schedulingGates",
    "resourceClaims",
    "resources",
    "hostnameOverride",
    "workloadRef",
    "schedulingGroup",
)

#: ``template.spec.containers[i]`` (and ``initContainers[i]``): a ``Container``.
CONTAINER_FIELDS: tuple[str, ...] = (
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "ports",
    "envFrom",
    "env",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "restartPolicyRules",
    "volumeMounts",
    "volumeDevices",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
)
