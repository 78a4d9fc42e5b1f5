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
{{- /* The example key by its public half, however its private half is encoded (gsaasd refuses it too). */ -}}
{{- if contains "MCowBQYDK2VwAyEA7uPyDauzbvsSd30x3v3ejpIWDbrjs1oQ3oe7LQ8IEco=" $public -}}
{{- fail "auth.publicKey is the example key's earlier versions of this chart published: generate your own" -}}
{{- end -}}
{{- end -}}

{{/* http or https, as tls.enabled says. */}}
{{- define "gsaas.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{/* Where gsaasd reaches the agents: agent.urlTemplate, or the default for the scheme. */}}
{{- define "gsaas.agentUrlTemplate" -}}
{{- $template := .Values.agent.urlTemplate | default (printf "%s://{host}:%v" (include "gsaas.scheme" .) .Values.agent.port) -}}
{{- if and .Values.tls.enabled (not (hasPrefix "https://" $template)) -}}
{{- fail "agent.urlTemplate must be https:// with tls.enabled" -}}
{{- end -}}
{{- $template -}}
{{- end -}}

{{/* Fails the render unless TLS, when enabled, has every piece it needs. */}}
{{- define "gsaas.checkTls" -}}
{{- if .Values.tls.enabled -}}
{{- if not (contains "BEGIN CERTIFICATE" (.Values.tls.ca | default "")) -}}
{{- fail "tls.ca must be the PEM CA bundle that signed gsaasd's and the agents' certificates" -}}
{{- end -}}
{{- if not (and (contains "BEGIN CERTIFICATE" (.Values.tls.cert | default "")) (contains "PRIVATE KEY" (.Values.tls.key | default ""))) -}}
{{- fail "tls.cert and tls.key must be gsaasd's PEM certificate chain and private key" -}}
{{- end -}}
{{- range $node, $agent := .Values.agent.nodes -}}
{{- if not (and (contains "BEGIN CERTIFICATE" ($agent.tlsCert | default "")) (contains "PRIVATE KEY" ($agent.tlsKey | default ""))) -}}
{{- fail (printf "agent.nodes.%s.tlsCert and tlsKey are required with tls.enabled (the node's certificate and key)" $node) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of one node's agent (DaemonSet and Secret): readable, at most 63 characters, unique. */}}
{{- define "gsaas.agentName" -}}
{{- $node := .node | trunc 30 | trimSuffix "-" | trimSuffix "." -}}
{{- printf "%s-agent-%s-%s" (include "gsaas.fullname" .root | trunc 20 | trimSuffix "-") $node (sha256sum .node | trunc 8) -}}
{{- end -}}
