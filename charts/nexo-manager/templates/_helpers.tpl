{{/* The chart's name: nameOverride, else the chart's. */}}
{{- define "nexo-manager.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of every object of the release. */}}
{{- define "nexo-manager.fullname" -}}
{{- $name := include "nexo-manager.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selects the Manager's pods; never changes within a release.
app.kubernetes.io/name stays nexo-manager whatever nameOverride says: the
Manager knows its own objects by it (docs/protocol.md, "Ownership"), and no
command may write over one of them. */}}
{{- define "nexo-manager.selectorLabels" -}}
app.kubernetes.io/name: nexo-manager
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Every object's labels: the kustomize base's, and Helm's two. */}}
{{- define "nexo-manager.labels" -}}
{{ include "nexo-manager.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "nexo-manager.connectTokenSecret" -}}
{{- if .Values.connectToken.existingSecret -}}
{{- .Values.connectToken.existingSecret -}}
{{- else -}}
{{- .Values.connectToken.secretName -}}
{{- end -}}
{{- end -}}

{{/* The managed namespaces: the list, or the release namespace. */}}
{{- define "nexo-manager.managedNamespaces" -}}
{{- if .Values.managedNamespaces -}}
{{- .Values.managedNamespaces | uniq | toJson -}}
{{- else -}}
{{- list .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "nexo-manager.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- include "nexo-manager.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The chart's Manager image: repository@digest when a digest is given,
else repository:tag (the tag defaulting to appVersion). */}}
{{- define "nexo-manager.chartImage" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* What the Manager runs, as JSON {"image", "bundle"}: the chart's, unless
self-upgrade is on and the live Deployment records a self-upgrade (the
nexo.io/upgraded-bundle annotation the upgrade command writes) to a newer
bundle than this chart (SemVer precedence: a pre-release is older than its
release, build metadata counts for nothing), whose image and bundle are then
kept, so that a helm upgrade never takes the Manager back (README.md,
"Self-upgrade and Helm"). With selfUpgrade=false the chart's image always
wins: the operator's way back from any self-upgrade. lookup finds nothing in
helm template and client dry runs: the chart's then. */}}
{{- define "nexo-manager.running" -}}
{{- $running := dict "image" (include "nexo-manager.chartImage" .) "bundle" .Chart.Version -}}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (include "nexo-manager.fullname" .) -}}
{{- $upgraded := "" -}}
{{- if and $live .Values.selfUpgrade -}}
{{- $upgraded = index ($live.metadata.annotations | default dict) "nexo.io/upgraded-bundle" | default "" -}}
{{- end -}}
{{- if and (regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+(-[0-9A-Za-z.-]+)?(\\+[0-9A-Za-z.-]+)?$" $upgraded) ((semver $upgraded).GreaterThan (semver .Chart.Version)) -}}
{{- range $live.spec.template.spec.containers -}}
{{- if eq .name "manager" -}}
{{- $_ := set $running "image" .image -}}
{{- $_ := set $running "bundle" $upgraded -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $running | toJson -}}
{{- end -}}

{{/* Whether the pods' UID is the platform's to assign (runAsUser). */}}
{{- define "nexo-manager.platformUid" -}}
{{- if eq .Values.runAsUser "platform" -}}
true
{{- else if and (eq .Values.runAsUser "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1") -}}
true
{{- end -}}
{{- end -}}

{{/* What the Manager may do in a managed namespace: read, and impersonate
  that namespace's executor (manifests/rbac.yaml explains each rule). */}}
{{- define "nexo-manager.managedRules" -}}
- apiGroups: ["nexo.io"]
  resources: ["nexoproxies"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["nexo.io"]
  resources: ["nexopipelines"]
  verbs: ["get", "list"]
- apiGroups: [""]
  resources: ["configmaps", "secrets", "services"]
  verbs: ["get", "list"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  resourceNames: [{{ .Values.executor.name | quote }}]
  verbs: ["impersonate"]
{{- end -}}

{{/* What a command may write in a managed namespace, as its executor. */}}
{{- define "nexo-manager.executorRules" -}}
- apiGroups: ["nexo.io"]
  resources: ["nexoproxies", "nexopipelines"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps", "secrets"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "create", "patch", "delete"]
{{- end -}}

{{/* The pod's securityContext: the restricted profile, with the user's
podSecurityContext merged over it. values.schema.json refuses what would
loosen it (runAsNonRoot false, root, another seccomp profile than
RuntimeDefault or Localhost), so a merge can only tighten or add. */}}
{{- define "nexo-manager.podSecurityContext" -}}
{{- $restricted := dict "runAsNonRoot" true "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- if not (include "nexo-manager.platformUid" .) -}}
{{- $_ := set $restricted "runAsUser" 65532 -}}
{{- $_ := set $restricted "runAsGroup" 65532 -}}
{{- end -}}
{{- mergeOverwrite $restricted (deepCopy .Values.podSecurityContext) | toYaml -}}
{{- end -}}

{{/* The container's securityContext: the restricted profile, with the
user's securityContext merged over it; values.schema.json refuses what
would loosen it (privileged, privilege escalation, a writable root, an
added capability, root). */}}
{{- define "nexo-manager.securityContext" -}}
{{- $restricted := dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "capabilities" (dict "drop" (list "ALL")) -}}
{{- mergeOverwrite $restricted (deepCopy .Values.securityContext) | toYaml -}}
{{- end -}}

{{/* The image pull Secrets: global.imagePullSecrets (an umbrella chart's)
and imagePullSecrets, each name once. */}}
{{- define "nexo-manager.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat ((.Values.global).imagePullSecrets | default list) .Values.imagePullSecrets -}}
{{- $name := . -}}
{{- if kindIs "map" . -}}
{{- $name = .name -}}
{{- end -}}
{{- if not (has $name $names) -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- end -}}
{{- range $names }}
- name: {{ . }}
{{- end -}}
{{- end -}}
