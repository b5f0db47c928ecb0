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

{{- /* The user name the scheduler's client certificate carries (CN): its ServiceAccount's,
so RBAC bindings name the ServiceAccount. */ -}}
{{- define "nodeledger.schedulerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "nodeledger.fullname" . }}-scheduler
{{- end -}}

{{- define "nodeledger.tlsServerSecret" -}}
{{- if eq .Values.tls.source "secrets" -}}
{{- .Values.tls.serverSecret -}}
{{- else -}}
{{- include "nodeledger.fullname" . }}-tls
{{- end -}}
{{- end -}}

{{- define "nodeledger.tlsClientSecret" -}}
{{- if eq .Values.tls.source "secrets" -}}
{{- .Values.tls.schedulerClientSecret -}}
{{- else -}}
{{- include "nodeledger.fullname" . }}-scheduler-tls
{{- end -}}
{{- end -}}

{{- define "nodeledger.portName" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{- /* Where the scheduler finds its client certificate (tls.crt, tls.key, ca.crt). */ -}}
{{- define "nodeledger.clientTlsDir" -}}
/var/run/secrets/nodeledger/client
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
    {{- if .Values.kube.placeholders.enabled }}
    # The managed Nodes only (the extender's filter keeps pods there without placeholders),
    # and none whose placeholder pod the API server keeps refusing (its room there is not
    # the ledger's).
    pluginConfig:
      - name: NodeAffinity
        args:
          addedAffinity:
            requiredDuringSchedulingIgnoredDuringExecution:
              nodeSelectorTerms:
                - matchExpressions:
                    {{- with .Values.kube.nodeSelector }}
                    {{- include "nodeledger.selectorExpressions" . | trim | nindent 20 }}
                    {{- end }}
                    - {key: nodeledger.io/placeholder-refused, operator: DoesNotExist}
    {{- end }}
extenders:
  - urlPrefix: {{ include "nodeledger.portName" . }}://{{ include "nodeledger.fullname" . }}.{{ .Release.Namespace }}.svc:{{ .Values.service.port }}/v1/extender
    {{- if .Values.kube.placeholders.enabled }}
    # Placeholder pods carry the ledger's other holdings: the scheduler filters itself,
    # every bind is still an admission.
    bindVerb: bind
    {{- else }}
    filterVerb: filter
    prioritizeVerb: prioritize
    bindVerb: bind
    weight: 5
    {{- end }}
    {{- include "nodeledger.extenderConnection" . | nindent 4 }}
  {{- if .Values.kube.placeholders.enabled }}
  # Pods requesting GPUs by count: a placeholder cannot be resized in GPUs, the ledger filters.
  - urlPrefix: {{ include "nodeledger.portName" . }}://{{ include "nodeledger.fullname" . }}.{{ .Release.Namespace }}.svc:{{ .Values.service.port }}/v1/extender
    filterVerb: filter
    managedResources:
      - {name: {{ .Values.kube.gpuResource }}, ignoredByScheduler: false}
    {{- include "nodeledger.extenderConnection" . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "nodeledger.extenderConnection" -}}
nodeCacheCapable: true
ignorable: false
httpTimeout: 10s
{{- if .Values.tls.enabled }}
enableHTTPS: true
tlsConfig:
  insecure: false
  caFile: {{ include "nodeledger.clientTlsDir" . }}/ca.crt
  certFile: {{ include "nodeledger.clientTlsDir" . }}/tls.crt
  keyFile: {{ include "nodeledger.clientTlsDir" . }}/tls.key
{{- end }}
{{- end -}}

{{- /* Refuse combinations that install but cannot work. */ -}}
{{- define "nodeledger.validate" -}}
{{- if and .Values.scheduler.enabled (ne .Values.auth.mode "none") (not .Values.tls.enabled) -}}
{{- fail "auth.mode requires tls.enabled while scheduler.enabled: the chart's scheduler can only authenticate its bind calls with a TLS client certificate" -}}
{{- end -}}
{{- if and .Values.kube.gpuDeviceClass (not .Values.kube.gpuDrivers) -}}
{{- fail "kube.gpuDeviceClass needs kube.gpuDrivers: the bind holds only the co-managed drivers' devices" -}}
{{- end -}}
{{- if and .Values.kube.placeholders.enabled (semverCompare "<1.33-0" .Capabilities.KubeVersion.Version) -}}
{{- fail "kube.placeholders.enabled needs Kubernetes 1.33 or later (in-place pod resize); set it to false on older clusters" -}}
{{- end -}}
{{- end -}}


{{- /* A label selector's equality and existence terms ("a=b,c!=d,e,!f") as node selector
match expressions. */ -}}
{{- define "nodeledger.selectorExpressions" -}}
{{- if contains "(" . -}}
{{- fail "kube.nodeSelector: with kube.placeholders.enabled only key=value, key!=value, key and !key terms (the scheduler's node affinity is made of them)" -}}
{{- end -}}
{{- range $term := splitList "," . }}
{{- $term = trim $term }}
{{- if contains "!=" $term }}
{{- $kv := splitn "!=" 2 $term }}
- {key: {{ trim $kv._0 | quote }}, operator: NotIn, values: [{{ trim $kv._1 | quote }}]}
{{- else if contains "=" $term }}
{{- $kv := splitn "=" 2 (replace "==" "=" $term) }}
- {key: {{ trim $kv._0 | quote }}, operator: In, values: [{{ trim $kv._1 | quote }}]}
{{- else if hasPrefix "!" $term }}
- {key: {{ trimPrefix "!" $term | trim | quote }}, operator: DoesNotExist}
{{- else if $term }}
- {key: {{ $term | quote }}, operator: Exists}
{{- end }}
{{- end }}
{{- end -}}
