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
{{- /* RUNNER_NATS_REPLICAS: what the provisioning step creates streams and
buckets with. JetStream allows at most 3 replicas per stream. */ -}}
{{- define "telorunner.streamReplicas" -}}
{{- if .Values.nats.streamReplicas -}}{{ .Values.nats.streamReplicas | int64 }}
{{- else if .Values.nats.url -}}1
{{- else -}}{{ min (.Values.nats.replicas | int64) 3 }}
{{- end -}}
{{- end -}}
{{- define "telorunner.credentialsSecret" -}}
{{- .Values.auth.secretName | default (printf "%s-nats-credentials" .Release.Name) -}}
{{- end -}}
{{- /* The bus roles that hold a seed in the release (the subscriber's is for
other systems) and the component each one belongs to. */ -}}
{{- define "telorunner.roleOf" -}}
{{- get (dict "api-edge" "edge" "pod-driver" "driver" "supervisor" "supervisor" "workspace-proxy" "workspace-proxy" "provision" "provisioner") . -}}
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
{{- /* Env every bus client gets: where NATS is and its own seed file. */ -}}
{{- define "telorunner.commonEnv" -}}
- {name: RUNNER_NATS_URL, value: {{ include "telorunner.natsURL" .root | quote }}}
- {name: RUNNER_NATS_NKEY_FILE, value: /var/run/secrets/telorunner/nats/{{ .role }}.nk}
- {name: RUNNER_NATS_REPLICAS, value: {{ include "telorunner.streamReplicas" .root | quote }}}
- {name: LOG_LEVEL, value: {{ .root.Values.logLevel | quote }}}
- {name: LOG_FORMAT, value: {{ .root.Values.logFormat | quote }}}
{{- end -}}
{{- /* The volume holding exactly one role's seed; mounted read-only. */ -}}
{{- define "telorunner.credentialsVolume" -}}
- name: nats-credentials
  secret:
    secretName: {{ include "telorunner.credentialsSecret" .root }}
    defaultMode: 288   # 0440: the pod's fsGroup reads it
    items: [{key: {{ .role }}.nk, path: {{ .role }}.nk}]
{{- end -}}
{{- define "telorunner.credentialsMount" -}}
- {name: nats-credentials, mountPath: /var/run/secrets/telorunner/nats, readOnly: true}
{{- end -}}
{{- define "telorunner.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}
{{- /* nats.conf of the in-chart NATS (see nats.yaml). toJson escapes
>, < and & as \u00XX, which NATS's parser refuses: put them back. */ -}}
{{- define "telorunner.natsConf" -}}
{{- $n := .root.Values.nats -}}
server_name: $POD_NAME
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
jetstream {
  store_dir: /data
  sync_interval: {{ if eq (toString $n.syncInterval) "always" }}always{{ else }}{{ $n.syncInterval | quote }}{{ end }}
}
{{- if gt .replicas 1 }}
cluster {
  name: {{ .name }}
  listen: 0.0.0.0:6222
  routes: [
    {{- range $i := until (int .replicas) }}
    nats://{{ $.name }}-{{ $i }}.{{ $.name }}-headless.{{ $.root.Release.Namespace }}.svc:6222
    {{- end }}
  ]
}
{{- end }}
authorization {
  users: [
    {{- range .roles }}
    {nkey: $NKEY_{{ . | upper | replace "-" "_" }}, permissions: {{ get $.perms . | toJson | replace "\\u003e" ">" | replace "\\u003c" "<" | replace "\\u0026" "&" }}}
    {{- end }}
  ]
}
{{- end -}}
