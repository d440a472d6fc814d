{{/*
Names and labels.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "podgroup-sync.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: fullnameOverride, else <release>-<name> unless the release name already contains the name. */}}
{{- define "podgroup-sync.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "podgroup-sync.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels that select the controller pods; never change them after a release exists. */}}
{{- define "podgroup-sync.selectorLabels" -}}
app.kubernetes.io/name: {{ include "podgroup-sync.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Labels on every object. */}}
{{- define "podgroup-sync.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "podgroup-sync.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: podgroup-sync
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the controller runs as. */}}
{{- define "podgroup-sync.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "podgroup-sync.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The leader-election Lease. */}}
{{- define "podgroup-sync.leaseName" -}}
{{- default (include "podgroup-sync.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* repository[:tag][@digest] */}}
{{- define "podgroup-sync.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- .Values.image.repository }}:{{ $tag }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
The controller's cluster-wide permissions (SPEC §6), the single source of the ClusterRole.
Each rule is what one part of the controller does, and nothing more; tests/chart.rs removes
them one at a time and checks that the controller reports the missing permission. Read-only kinds
are only listed and watched (by caches), never fetched one by one, so "get" is not granted.
*/}}
{{- define "podgroup-sync.clusterRules" -}}
# The job kinds (PyTorchJob, TFJob, MPIJob v1 or v2beta1, XGBoostJob, PaddleJob, JAXJob). It
# never writes a job or its status; get only when the stale-PodGroup audit confirms that a job
# its cache no longer holds is gone, before deleting that job's PodGroup.
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs"]
  verbs: ["get", "list", "watch"]
# The workloads of other operators, read the same way: JobSets (Trainer v2's TrainJobs run as
# JobSets), LeaderWorkerSets (one gang per group) and KubeRay's RayClusters (a RayJob runs on
# one).
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "list", "watch"]
{{- if .Values.controller.batchJobs }}
# With controller.batchJobs: batch/v1 Jobs (Indexed ones annotated podgroup-sync.io/gang="true"
# are gangs; the others are kept as metadata only).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch"]
{{- end }}
# Kueue's Workloads (when Kueue is installed): what Kueue admitted for each job (SPEC §12).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch"]
# Volcano's HyperNodes (when installed): the number of each tier a job names by its node label
# (SPEC §13). Only their tier and tier name are kept.
- apiGroups: ["topology.volcano.sh"]
  resources: ["hypernodes"]
  verbs: ["list", "watch"]
# Namespaces carry the enablement and backend annotations.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
# LimitRange defaults fill container requests the templates leave out (minResources).
- apiGroups: [""]
  resources: ["limitranges"]
  verbs: ["list", "watch"]
# PriorityClasses order the replica types when minResources counts pods.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["list", "watch"]
# RuntimeClass overhead is added to each pod's request.
- apiGroups: ["node.k8s.io"]
  resources: ["runtimeclasses"]
  verbs: ["list", "watch"]
# ValidatingAdmissionPolicies and their bindings, watched for their changes only: a PodGroup a
# policy refused is sent again at once when one changes (otherwise after a backoff).
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
  verbs: ["list", "watch"]
# The PodGroups it owns, for every backend (scheduler-plugins, Volcano, and Kubernetes' own
# scheduling.k8s.io/v1beta1 on 1.37+; no Workload objects): watched (read from the cache only);
# created and updated with server-side apply (an apply that creates an object needs create as
# well as patch); deleted with a UID precondition.
- apiGroups: ["scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Events on the jobs: create; patch to count a repeat in the Event's series instead of
# publishing it again; list at start-up and on taking the lead, to remember the Events an
# earlier instance or the previous leader published.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["list", "create", "patch"]
{{- if and .Values.webhook.enabled .Values.webhook.certificate.controller }}
# With webhook.certificate.controller: the caBundle of its own webhook configuration, which it
# writes when it makes or renews its CA.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["mutatingwebhookconfigurations"]
  resourceNames: [{{ include "podgroup-sync.fullname" . | quote }}]
  verbs: ["get", "update"]
{{- end }}
{{- if .Values.controller.gangFeasibility }}
# With the feasibility check: Nodes (allocatable, taints, unschedulable are kept) and Volcano
# Queues (their state is kept), to report gangs that can never be placed. Never written.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["queues"]
  verbs: ["list", "watch"]
{{- end }}
{{- if .Values.webhook.enabled }}
# With the pod-link webhook: the metadata of the operators' pods, to find pods created while
# the webhook was unreachable and report them on their job (PodsNotLinked). Never written.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/* The leader-election permissions, in the release namespace only. */}}
{{- define "podgroup-sync.leaseRules" -}}
# A Lease cannot be named at creation, so create is granted without resourceNames.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ include "podgroup-sync.leaseName" . | quote }}]
  verbs: ["get", "update"]
{{- end }}

{{/* The webhook's Service, Secret and Certificate names. */}}
{{- define "podgroup-sync.webhookService" -}}
{{ include "podgroup-sync.fullname" . }}-webhook
{{- end }}
{{- define "podgroup-sync.webhookSecret" -}}
{{ include "podgroup-sync.fullname" . }}-webhook-tls
{{- end }}
