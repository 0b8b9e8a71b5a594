{{- define "base.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object, as the other charts'. No istio.io/rev: this mesh is
     revision-free. */}}
{{- define "base.labels" -}}
app.kubernetes.io/name: base
app.kubernetes.io/part-of: istio
app.kubernetes.io/component: crds
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "base.chart" . }}
{{- end }}

{{/* Every CustomResourceDefinition in files/crd-*.yaml as a list of dicts, each with
     the file it came from in "file": Istio's first, then the Gateway API's standard
     and experimental channels. The files are plain multi-document YAML (tests read them as they
     are), so they are parsed here, not rendered as templates. */}}
{{- define "base.allCRDs" -}}
{{- $crds := list }}
{{- $files := .Files.Glob "files/crd-*.yaml" }}
{{- $paths := list }}
{{- range $rank := list 0 1 2 }}
{{- range $path, $_ := $files }}
{{- if eq $rank (ternary (ternary 2 1 (contains "experimental" $path)) 0 (contains "gateway-api" $path)) }}
{{- $paths = append $paths $path }}
{{- end }}
{{- end }}
{{- end }}
{{- range $path := $paths }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" ($.Files.Get $path) -1 }}
{{- $crd := fromYaml $doc }}
{{- if hasKey $crd "Error" }}
{{- fail (printf "%s: %s" $path (get $crd "Error")) }}
{{- end }}
{{- if $crd.kind }}
{{- if ne $crd.kind "CustomResourceDefinition" }}
{{- fail (printf "%s: a %s; only CustomResourceDefinitions belong in files/crd-*.yaml" $path $crd.kind) }}
{{- end }}
{{- $crds = append $crds (dict "file" $path "crd" $crd) }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $crds }}
{{- end }}

{{/* "true" when values select the CRD (a dict from base.allCRDs) for rendering:
     Gateway API CRDs only with gatewayAPI.enabled, its experimental channel only with
     gatewayAPI.experimental too, and none named in excludedCRDs. */}}
{{- define "base.selected" -}}
{{- $crd := .crd }}
{{- $values := .values }}
{{- $annotations := $crd.metadata.annotations | default dict }}
{{- $gatewayAPI := eq $crd.spec.group "gateway.networking.k8s.io" }}
{{- $experimental := eq (get $annotations "gateway.networking.k8s.io/channel") "experimental" }}
{{- if and (or (not $gatewayAPI) $values.gatewayAPI.enabled) (or (not $experimental) $values.gatewayAPI.experimental) (not (has $crd.metadata.name $values.excludedCRDs)) }}true{{ end }}
{{- end }}

{{/* "true" when the CRD named .name may be written by this release: it does not
     exist yet, or this release (name and namespace) owns it. One that Istio's base
     chart, the platform's Gateway API install or anyone else made is left alone.
     Without a cluster (helm template, lint) lookup finds nothing. */}}
{{- define "base.ours" -}}
{{- $existing := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" .name }}
{{- if not $existing }}true
{{- else }}
{{- $annotations := $existing.metadata.annotations | default dict }}
{{- if and (eq (get $annotations "meta.helm.sh/release-name") .release.Name) (eq (get $annotations "meta.helm.sh/release-namespace") .release.Namespace) }}true{{ end }}
{{- end }}
{{- end }}
