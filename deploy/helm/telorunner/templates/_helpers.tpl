{{- define "telorunner.name" -}}{{ .Release.Name }}{{- end -}}
{{- define "telorunner.labels" -}}
app.kubernetes.io/name: telorunner
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "telorunner.image" -}}
{{ .root.Values.image.repository }}/{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}
{{- define "telorunner.natsURL" -}}
{{- if .Values.nats.url -}}{{ .Values.nats.url }}{{- else -}}nats://{{ include "telorunner.name" . }}-nats:4222{{- end -}}
{{- end -}}
{{- define "telorunner.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  fsGroup: 1000   # a fresh PersistentVolume (NATS's /data) is root-owned otherwise
  seccompProfile: {type: RuntimeDefault}
{{- end -}}
{{- define "telorunner.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end -}}
{{- define "telorunner.commonEnv" -}}
- {name: RUNNER_NATS_URL, value: {{ include "telorunner.natsURL" . | quote }}}
- {name: LOG_LEVEL, value: {{ .Values.logLevel | quote }}}
{{- end -}}
