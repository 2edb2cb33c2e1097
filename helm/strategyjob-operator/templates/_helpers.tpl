{{/* vim: set filetype=mustache: */}}
{{/*
The chart name. Truncated at 63 characters because some Kubernetes name fields are limited to
this (by the DNS naming spec).
*/}}
{{- define "strategyjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name of the release's objects: <release>-<chart>, or <release> when it already contains
the chart name. Truncated at 63 characters (DNS label limit); suffixed names cut it to 52 first.
*/}}
{{- define "strategyjob-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
A suffixed name, e.g. (tuple . "metrics") -> <fullname>-metrics, within 63 characters.
*/}}
{{- define "strategyjob-operator.suffixed" -}}
{{- if ne (len .) 2 -}}
{{- fail (printf "ERROR: template \"strategyjob-operator.suffixed\" expects (tuple . \"suffix\"), got %d arguments" (len .)) -}}
{{- end -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" (include "strategyjob-operator.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end -}}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "strategyjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels that select the operator's pods. Never change them: a Deployment's selector is immutable.
*/}}
{{- define "strategyjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strategyjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/*
Labels of every object of the release.
*/}}
{{- define "strategyjob-operator.labels" -}}
{{ include "strategyjob-operator.selectorLabels" . }}
app.kubernetes.io/part-of: strategyjob
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "strategyjob-operator.chart" . }}
{{- end -}}

{{/*
The operator's ServiceAccount.
*/}}
{{- define "strategyjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "strategyjob-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "ERROR: serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The image reference: repository@digest when a digest is set, else repository:tag (tag defaults
to the chart's appVersion).
*/}}
{{- define "strategyjob-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Misuse that the schema cannot express fails here, naming the option and the fix.
*/}}
{{- define "strategyjob-operator.validate" -}}
{{- if and (not .Values.peering.enabled) (gt (int .Values.replicaCount) 1) -}}
{{- fail (printf "ERROR: replicaCount is %d but peering.enabled is false: without peering every operator pod acts on every job. Set peering.enabled=true or replicaCount=1." (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.peering.enabled (not (kindIs "invalid" .Values.peering.priority)) (gt (int .Values.replicaCount) 1) -}}
{{- fail (printf "ERROR: peering.priority is fixed (%v) with replicaCount %d: kopf pauses every peer that shares the highest priority, so no pod would act. Leave peering.priority null (a random priority per pod) or set replicaCount=1." .Values.peering.priority (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "ERROR: metrics.serviceMonitor.enabled needs metrics.enabled=true (the ServiceMonitor scrapes the metrics Service)." -}}
{{- end -}}
{{- end -}}

{{/*
What the operator does to namespaced objects: the same rules go into the ClusterRole
(cluster-wide) or into a Role per watched namespace. Each verb is one API call of the operator or
of kopf; tests/helm/operator_api_calls.py lists them with where each comes from, and a test keeps
the two identical.
*/}}
{{- define "strategyjob-operator.namespacedRules" -}}
# The StrategyJobs: kopf watches them (list, watch) and keeps its finalizer and handler state on
# them (patch); the reconciler reads one (get) and deletes it when its TTL after finishing ends.
- apiGroups: [strategyjob.dev]
  resources: [strategyjobs]
  verbs: [get, list, watch, patch, delete]
# The reconciler's one status write per pass.
- apiGroups: [strategyjob.dev]
  resources: [strategyjobs/status]
  verbs: [patch]
# Never called: the job's children carry blockOwnerDeletion, and where the
# OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift) setting it needs update
# on the owner's finalizers; without it every child's creation is refused (403).
- apiGroups: [strategyjob.dev]
  resources: [strategyjobs/finalizers]
  verbs: [update]
# The job's pods: kopf watches them (wake-ups), the reconciler lists them by label, creates the
# missing ones and deletes them on restarts and failures, and reads one's metadata (get) when
# its creation answers 409: whose is the pod of that name? patch: the annotation that makes the
# kubelet refresh a resized ParameterServerStrategy job's members file in its chief; each job's
# Role also grants get and patch on the job's leader pod (progress reports), and RBAC lets the
# operator grant only verbs it holds itself; holding them is narrower than escalate and bind.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete, get, patch]
# The job's objects below are created once; on 409 the operator reads the existing one's
# metadata (get as PartialObjectMetadata) and deletes it if an earlier job of the same name
# left it there, before the garbage collector got to it.
# The job's headless Service and ServiceAccount.
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [create, get, delete]
# The ConfigMap <job>-strategyjob-cluster with the cluster part of TF_CONFIG that every pod of
# the job reads (the pod specs refer to it), a ParameterServerStrategy job's
# <job>-strategyjob-members, the workers its chief follows (patched when the job is resized), and
# <job>-strategyjob-metrics, the job's metric history (patched at each new progress report).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, delete, patch]
# The job's token Secret, <job>-<uid>-strategyjob-token: created once; on 409 the operator reads
# its metadata only (PartialObjectMetadata, never its data) to check that this job owns it. The
# uid in the name means an earlier job's Secret never stands in the way, so no delete. get
# stays: RBAC cannot limit a verb to metadata, nor to names chosen at run time
# (resourceNames); with watchNamespaces it covers only the watched namespaces.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, get]
# The job's Role (get and patch on its leader pod) and the RoleBinding to its ServiceAccount.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, get, delete]
# The job's NetworkPolicy: ingress only from the job's own pods.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get, delete]
# The job's Events (the reconciler posts its own; kopf's posting is off).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.tfjob.enabled }}
# Kubeflow TFJobs, served as StrategyJobs are (tfjob.enabled): watched (list, watch), read at
# each pass (get), kopf's annotations (patch) or a whole write (update, as training-operator's
# own role grants), deleted when ttlSecondsAfterFinished has passed.
- apiGroups: [kubeflow.org]
  resources: [tfjobs]
  verbs: [get, list, watch, patch, update, delete]
# The TFJob status training-operator writes (conditions, replicaStatuses, times).
- apiGroups: [kubeflow.org]
  resources: [tfjobs/status]
  verbs: [get, patch, update]
# Never called: a TFJob is the controller owner of its pods and Services, with
# blockOwnerDeletion, which OwnerReferencesPermissionEnforcement (OpenShift) lets set only with
# update on the owner's finalizers.
- apiGroups: [kubeflow.org]
  resources: [tfjobs/finalizers]
  verbs: [update]
{{- end }}
{{- with .Values.operator.gangScheduler }}
# The job's PodGroup for the gang scheduler ({{ . }}), created once; deleted while the job is
# suspended (the scheduler reserves nothing for it) and created again on resume; its minMember
# patched when a served TFJob's replicas are edited.
- apiGroups: [{{ ternary "scheduling.volcano.sh" "scheduling.x-k8s.io" (eq . "volcano") }}]
  resources: [podgroups]
  verbs: [create, get, delete, patch]
# The namespace's ResourceQuotas: read before a gang's pods are created (all of them fit, or
# none is created), and watched: a quota's update that frees room wakes the gangs waiting for it.
- apiGroups: [""]
  resources: [resourcequotas]
  verbs: [list, watch]
{{- end }}
{{- end -}}

{{/*
kopf peering: watch the peering objects, and keep-alive (patch) only the release's own one.
Argument: (tuple . "clusterkopfpeerings"|"kopfpeerings").
*/}}
{{- define "strategyjob-operator.peeringRules" -}}
{{- $root := index . 0 -}}
{{- $plural := index . 1 -}}
- apiGroups: [kopf.dev]
  resources: [{{ $plural }}]
  verbs: [list, watch]
- apiGroups: [kopf.dev]
  resources: [{{ $plural }}]
  resourceNames: [{{ $root.Values.peering.name | quote }}]
  verbs: [patch]
{{- end -}}
