{{/* Names are fixed (Istio's): the node agent and tooling know the ztunnel pods by
     app=ztunnel in the system namespace, and there is one ztunnel per node. */}}
{{- define "ztunnel.name" -}}ztunnel{{- end }}
{{- define "ztunnel.localConfigMap" -}}ztunnel-local-config{{- end }}
{{- define "ztunnel.localConfigDir" -}}/etc/ztunnel/local{{- end }}

{{- define "ztunnel.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. No istio.io/rev: this data plane is revision-free. */}}
{{- define "ztunnel.labels" -}}
app: {{ include "ztunnel.name" . }}
app.kubernetes.io/name: {{ include "ztunnel.name" . }}
app.kubernetes.io/part-of: istio
app.kubernetes.io/component: ztunnel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "ztunnel.chart" . }}
{{- end }}

{{- define "ztunnel.selectorLabels" -}}
app: {{ include "ztunnel.name" . }}
{{- end }}

{{/* <hub>/<name>:<tag>, the tag defaulting to appVersion; <hub>/<name>@sha256:<hex> for a
     bare digest (image.tag sha256:<hex>); <tag>@sha256:<hex> pins a tag to its digest. */}}
{{- define "ztunnel.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- .Values.image.hub }}/{{ .Values.image.name }}{{ ternary "@" ":" (hasPrefix "sha256:" $tag) }}{{ $tag }}
{{- end }}

{{/* "true" when ztunnel reads the local config file (discovery.source local). */}}
{{- define "ztunnel.usesLocal" -}}
{{- if eq .Values.discovery.source "local" }}true{{ end }}
{{- end }}

{{/* CA_ADDRESS: caAddress, else istiod-lite's Service (Istio's default host). */}}
{{- define "ztunnel.caAddress" -}}
{{- .Values.caAddress | default (printf "istiod.%s.svc:15012" (.Values.istioNamespace | default .Release.Namespace)) }}
{{- end }}

{{/* XDS_ADDRESS: istiod-lite's delta xDS, the same address as the CA (Istio's ztunnel
     too); empty for discovery.source local (no control plane for configuration). */}}
{{- define "ztunnel.xdsAddress" -}}
{{- if eq .Values.discovery.source "xds" }}{{ include "ztunnel.caAddress" . }}{{ end }}
{{- end }}
