{{- define "nodeledger.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodeledger.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nodeledger.labels" -}}
app.kubernetes.io/name: {{ include "nodeledger.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "nodeledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodeledger.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nodeledger.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nodeledger.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "nodeledger.usesSqlite" -}}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) -}}true{{- end -}}
{{- end -}}

{{- define "nodeledger.schedulerConfig" -}}
{{- $name := printf "%s-scheduler" (include "nodeledger.fullname" .) -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: {{ $name }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ .Values.scheduler.schedulerName }}
extenders:
  - urlPrefix: http://{{ include "nodeledger.fullname" . }}.{{ .Release.Namespace }}.svc:{{ .Values.service.port }}/v1/extender
    filterVerb: filter
    prioritizeVerb: prioritize
    bindVerb: bind
    weight: 5
    nodeCacheCapable: true
    ignorable: false
    httpTimeout: 10s
{{- end -}}
