{{/* The name of every object of the release. */}}
{{- define "nexo-manager.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selects the Manager's pods; never changes within a release. */}}
{{- define "nexo-manager.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
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
