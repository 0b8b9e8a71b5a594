{{/* Names are fixed (Istio's), not derived from the release: ztunnel reaches the CA
     at istiod.<namespace>.svc:15012, and the serving certificate names that host. */}}
{{- define "istiod.name" -}}istiod{{- end }}
{{- define "istiod.caCertsDir" -}}/etc/cacerts{{- end }}

{{- define "istiod.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object: Istio's app/istio labels, so Istio's tooling and
     dashboards find istiod. No istio.io/rev: this mesh is revision-free. */}}
{{- define "istiod.labels" -}}
app: {{ include "istiod.name" . }}
istio: pilot
app.kubernetes.io/name: {{ include "istiod.name" . }}
app.kubernetes.io/part-of: istio
app.kubernetes.io/component: control-plane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "istiod.chart" . }}
{{- end }}

{{- define "istiod.selectorLabels" -}}
app: {{ include "istiod.name" . }}
{{- end }}

{{/* <hub>/<name>:<tag>, the tag defaulting to appVersion; <hub>/<name>@sha256:<hex> for a
     bare digest (image.tag sha256:<hex>); <tag>@sha256:<hex> pins a tag to its digest. */}}
{{- define "istiod.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- .Values.image.hub }}/{{ .Values.image.name }}{{ ternary "@" ":" (hasPrefix "sha256:" $tag) }}{{ $tag }}
{{- end }}

{{/* CA_TRUSTED_NODE_ACCOUNTS: <namespace>/<service account> of ztunnel. */}}
{{- define "istiod.trustedNodeAccounts" -}}
{{ .Values.trustedZtunnelNamespace | default .Release.Namespace }}/{{ .Values.trustedZtunnelName }}
{{- end }}

{{/* The fewest pods the Deployment runs: autoscaleMin under the HPA, else replicaCount. */}}
{{- define "istiod.minReplicas" -}}
{{ if .Values.autoscaleEnabled }}{{ int .Values.autoscaleMin }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{/* "true" when the PodDisruptionBudget is rendered: enabled, and at least two pods
     guaranteed (over a single pod, minAvailable: 1 would block every drain of its node,
     and maxUnavailable would protect nothing). */}}
{{- define "istiod.pdbEnabled" -}}
{{ if and .Values.podDisruptionBudget.enabled (gt (int (include "istiod.minReplicas" .)) 1) }}true{{ end }}
{{- end }}

{{/* The Lease whose holder publishes the root ConfigMaps (Istio's name; the binary
     names it too, it is not configurable). */}}
{{- define "istiod.leaderLease" -}}istio-namespace-controller-election{{- end }}
