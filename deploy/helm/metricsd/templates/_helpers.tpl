{{/* The prefix of every object: the release name, so `helm install metricsd` gives the names of deploy/kubernetes/. */}}
{{- define "metricsd.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component: (dict "root" $ "component" "store"). Immutable once installed. */}}
{{- define "metricsd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "metricsd.fullname" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every object's labels: the selector labels plus Helm's. */}}
{{- define "metricsd.labels" -}}
{{ include "metricsd.selectorLabels" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "metricsd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* In-cluster DNS name of one of the release's Services: (dict "root" $ "service" "proxy"). */}}
{{- define "metricsd.svc" -}}
{{ include "metricsd.fullname" .root }}-{{ .service }}.{{ .root.Release.Namespace }}.svc
{{- end -}}

{{- define "metricsd.etcdEndpoint" -}}
{{- if .Values.etcd.enabled -}}
{{ include "metricsd.svc" (dict "root" . "service" "etcd") }}:2379
{{- else -}}
{{ required "etcd.externalEndpoint is required when etcd.enabled is false" .Values.etcd.externalEndpoint }}
{{- end -}}
{{- end -}}

{{/* system:serviceaccount:<namespace>:<release>-<component>, the user TokenReview names. */}}
{{- define "metricsd.saUser" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ include "metricsd.fullname" .root }}-{{ .component }}
{{- end -}}

{{/* Stores and proxies listen off loopback only with TLS: refuse to render without it. */}}
{{- define "metricsd.requireTLS" -}}
{{- if not .Values.tls.enabled -}}
{{- fail "tls.enabled=false: stores and proxies refuse to listen on the pod network without TLS and tokens; create the Secret tls.secretName (README: Helm) or keep tls.certManager.enabled" -}}
{{- end -}}
{{- end -}}

{{- define "metricsd.tlsVolume" -}}
- name: tls
  secret: {secretName: {{ .Values.tls.secretName }}}
{{- end -}}

{{- define "metricsd.tokenArgs" -}}
{{- if .Values.auth.tokensSecret }}
- --tokens-file=/etc/metricsd/tokens/tokens
{{- end }}
{{- end -}}
