{{/* Names are fixed (Istio's), not derived from the release: other components look
     them up by name, and there is one node agent per cluster. */}}
{{- define "cni.name" -}}istio-cni{{- end }}
{{- define "cni.daemonset" -}}istio-cni-node{{- end }}
{{- define "cni.configmap" -}}istio-cni-config{{- end }}

{{- define "cni.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. No istio.io/rev: this data plane is revision-free. */}}
{{- define "cni.labels" -}}
app: {{ include "cni.daemonset" . }}
app.kubernetes.io/name: {{ include "cni.name" . }}
app.kubernetes.io/part-of: istio
app.kubernetes.io/component: cni
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "cni.chart" . }}
{{- end }}

{{- define "cni.selectorLabels" -}}
k8s-app: {{ include "cni.daemonset" . }}
{{- end }}

{{/* <hub>/<name>:<tag>, the tag defaulting to appVersion; <hub>/<name>@sha256:<hex> for a
     bare digest (image.tag sha256:<hex>); <tag>@sha256:<hex> pins a tag to its digest. */}}
{{- define "cni.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- .Values.image.hub }}/{{ .Values.image.name }}{{ ternary "@" ":" (hasPrefix "sha256:" $tag) }}{{ $tag }}
{{- end }}

{{/* "true" when a socket must be handed to a non-root uid (chown needs CAP_CHOWN). */}}
{{- define "cni.chownSockets" -}}
{{- if or (ne (int64 .Values.pluginPeerUid) 0) (and .Values.ambient.enabled (ne (int64 .Values.ambient.ztunnelPeerUid) 0)) -}}
true
{{- end -}}
{{- end }}

{{/* Mount points inside the container (the host paths are values). */}}
{{- define "cni.mountedBinDir" -}}/host/opt/cni/bin{{- end }}
{{- define "cni.mountedConfDir" -}}/host/etc/cni/net.d{{- end }}
{{- define "cni.hostProc" -}}/host/proc{{- end }}
{{- define "cni.runDir" -}}/var/run/istio-cni{{- end }}
{{- define "cni.ztunnelSocketDir" -}}/var/run/ztunnel{{- end }}
