{{- define "gsaas.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gsaas.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gsaas.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "gsaas.usesPostgres" -}}
{{- if .Values.database.url }}true{{ end -}}
{{- end -}}

{{/* Fails the render unless auth holds a real key pair (not the example earlier versions shipped). */}}
{{- define "gsaas.checkKeys" -}}
{{- $key := required "auth.signingKey is required: generate one with `openssl genpkey -algorithm ed25519`" .Values.auth.signingKey -}}
{{- if contains "MC4CAQAwBQYDK2VwBCIEIHJlcGxhY2UtbWUtd2l0aC15b3VyLW93bi1rZXktMTIz" $key -}}
{{- fail "auth.signingKey is the example key earlier versions of this chart published: generate your own" -}}
{{- end -}}
{{- if not (contains "BEGIN PRIVATE KEY" $key) -}}
{{- fail "auth.signingKey must be a PKCS#8 PEM private key (-----BEGIN PRIVATE KEY-----)" -}}
{{- end -}}
{{- $public := required "auth.publicKey is required: openssl pkey -in signing-key.pem -pubout" .Values.auth.publicKey -}}
{{- if not (contains "BEGIN PUBLIC KEY" $public) -}}
{{- fail "auth.publicKey must be a PEM public key (-----BEGIN PUBLIC KEY-----)" -}}
{{- end -}}
{{- end -}}

{{/* The name of one node's agent (DaemonSet and Secret): readable, at most 63 characters, unique. */}}
{{- define "gsaas.agentName" -}}
{{- $node := .node | trunc 30 | trimSuffix "-" | trimSuffix "." -}}
{{- printf "%s-agent-%s-%s" (include "gsaas.fullname" .root | trunc 20 | trimSuffix "-") $node (sha256sum .node | trunc 8) -}}
{{- end -}}
