#!/usr/bin/env bash
# Checks the Helm charts under manifests/charts (CI runs it; so can anyone):
#   1. helm lint --strict, for every chart and every value combination below;
#   2. the default renders (and ztunnel's local-discovery render) equal the golden
#      files in testdata/;
#   3. every combination renders, and every object in it validates strictly against
#      the Kubernetes 1.33 OpenAPI schemas (kubernetes-validate), plus our invariants
#      (namespaces, labels, hardened containers, no Secret on a node, CRDs the API
#      server accepts: structural, list-map keys, valid defaults, approval annotation)
#      and the expectations listed with the combination;
#   4. the base chart's CRD files are plain YAML (no template syntax), every document
#      a CRD that the chart renders; samples of every kind (AuthorizationPolicy,
#      PeerAuthentication, the Gateway API) validate against the CRDs it renders, and
#      broken ones do not;
#   5. the default ztunnel and istiod-lite renders fit together (CA and xDS address,
#      xDS node identity, token audience, trusted node account, cluster id, trust
#      domain, who reads the Kubernetes API);
#   6. bad values fail with the schema error that names them (values.schema.json), or
#      with the chart's own error for what a schema cannot express (cross-field rules).
#
# Usage: manifests/check.sh [--update] [--install]
#   --update   rewrite the golden files from the current charts, then check the rest.
#   --install  install missing tools first (scripts/install-chart-tools.sh).
# Tools: helm v4 and the PyPI package kubernetes-validate; scripts/install-chart-tools.sh
# installs both (this script runs it itself when they are missing and CI is set).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cd "$here"

KUBE_VERSION=1.33.0
NAMESPACE=istio-system
HELM="${HELM:-helm}"
PYTHON="${PYTHON:-python3}"

update=false
install=false
for arg in "$@"; do
  case "$arg" in
    --update) update=true ;;
    --install) install=true ;;
    -h | --help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$here/check.sh"
      exit 0
      ;;
    *)
      echo "check.sh: unknown argument $arg (try --help)" >&2
      exit 2
      ;;
  esac
done

tools_ok() {
  command -v "$HELM" >/dev/null 2>&1 &&
    "$HELM" version --short 2>/dev/null | grep -q '^v[34]\.' &&
    "$PYTHON" -c 'import kubernetes_validate' >/dev/null 2>&1
}
if ! tools_ok; then
  if [ "$install" = true ] || [ -n "${CI:-}" ]; then
    bash "$root/scripts/install-chart-tools.sh"
    hash -r
  fi
  if ! tools_ok; then
    echo "check.sh: needs helm and the Python package kubernetes-validate;" \
      "run scripts/install-chart-tools.sh (or check.sh --install)" >&2
    exit 2
  fi
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
failures=()
indent() { sed 's/^/      /'; }
pass() {
  passed=$((passed + 1))
  echo "ok    $1"
}
fail() {
  failed=$((failed + 1))
  failures+=("$1")
  echo "FAIL  $1"
}

# helm template with the release name, namespace and Kubernetes version every render
# here uses. $1 = chart (base | cni | ztunnel | istiod-lite), the rest = value arguments.
render() {
  local chart="$1"
  shift
  local release
  case "$chart" in
    base) release=istio-base ;;
    cni) release=istio-cni ;;
    ztunnel) release=ztunnel ;;
    istiod-lite) release=istiod ;;
  esac
  "$HELM" template "$release" "charts/$chart" --namespace "$NAMESPACE" \
    --kube-version "$KUBE_VERSION" "$@"
}

# ---------------------------------------------------------------- 1. lint
for chart in base cni ztunnel istiod-lite; do
  if out="$("$HELM" lint --strict "charts/$chart" --namespace "$NAMESPACE" \
    --kube-version "$KUBE_VERSION" 2>&1)"; then
    pass "lint $chart"
  else
    indent <<<"$out"
    fail "lint $chart"
  fi
done

# ---------------------------------------------------------------- 2. golden renders
# name | chart | value arguments
goldens=(
  "base|base|"
  "cni|cni|"
  "ztunnel|ztunnel|"
  "ztunnel-local|ztunnel|--set discovery.source=local"
  "istiod-lite|istiod-lite|"
)
for entry in "${goldens[@]}"; do
  IFS='|' read -r name chart args <<<"$entry"
  golden="testdata/$name.golden.yaml"
  # shellcheck disable=SC2086 # args are words
  if ! render "$chart" $args >"$work/$name.yaml" 2>"$work/$name.err"; then
    indent <"$work/$name.err"
    fail "golden $name: render failed"
    continue
  fi
  if [ "$update" = true ]; then
    cp "$work/$name.yaml" "$golden"
    pass "golden $name (rewritten)"
  elif [ ! -f "$golden" ]; then
    fail "golden $name: $golden missing (run manifests/check.sh --update)"
  elif diff -u "$golden" "$work/$name.yaml" >"$work/$name.diff"; then
    pass "golden $name"
  else
    indent <"$work/$name.diff" | head -n 80
    fail "golden $name: render differs from $golden (if intended: manifests/check.sh --update)"
  fi
done

# ---------------------------------------------------------------- 3. value combinations
# Every documented value combination: chart | value arguments | expectations (';'-
# separated, the forms of validate.py --help). Value files are relative to manifests/.
cni_ds='DaemonSet/istio-cni-node:spec.template.spec'
cni_ctr="$cni_ds.containers[name=install-cni]"
cni_cm='ConfigMap/istio-cni-config:data'
zt_ds='DaemonSet/ztunnel:spec.template.spec'
zt_ctr="$zt_ds.containers[name=istio-proxy]"
zt_mounts="$zt_ctr.volumeMounts"
crd_ap='CustomResourceDefinition/authorizationpolicies.security.istio.io'
crd_pa='CustomResourceDefinition/peerauthentications.security.istio.io'
crd_gc='CustomResourceDefinition/gatewayclasses.gateway.networking.k8s.io'
crd_gw='CustomResourceDefinition/gateways.gateway.networking.k8s.io'
crd_hr='CustomResourceDefinition/httproutes.gateway.networking.k8s.io'
crd_gr='CustomResourceDefinition/grpcroutes.gateway.networking.k8s.io'
crd_rg='CustomResourceDefinition/referencegrants.gateway.networking.k8s.io'
crd_tcp='CustomResourceDefinition/tcproutes.gateway.networking.k8s.io'
# A Gateway API CRD of the v1.3.0 bundle, channel $2 (standard | experimental).
gw_bundle() {
  echo "$1:metadata.annotations.gateway\\.networking\\.k8s\\.io/bundle-version=v1.3.0; $1:metadata.annotations.gateway\\.networking\\.k8s\\.io/channel=$2; $1:metadata.annotations.api-approved\\.kubernetes\\.io=https://github.com/kubernetes-sigs/gateway-api/pull/3328; $1:metadata.annotations.helm\\.sh/resource-policy=keep; $1:spec.names.categories.0=gateway-api"
}
# Istio's security CRD $1: v1 served, v1beta1 served and stored, Istio's labels.
istio_crd() {
  echo "$1:spec.versions.0.name=v1; $1:spec.versions[name=v1].served=true; $1:spec.versions[name=v1].storage=false; $1:spec.versions[name=v1beta1].served=true; $1:spec.versions[name=v1beta1].storage=true; $1:spec.versions[name=v1].subresources.status; $1:metadata.labels.app=istio-pilot; $1:metadata.labels.istio=security; $1:metadata.labels.app\\.kubernetes\\.io/part-of=istio; $1:metadata.annotations.helm\\.sh/resource-policy=keep; $1:spec.names.categories.0=istio-io; $1:spec.names.categories.1=security-istio-io; $1:spec.scope=Namespaced"
}
gw_standard="$(gw_bundle "$crd_gc" standard); $(gw_bundle "$crd_gw" standard); $(gw_bundle "$crd_hr" standard); $(gw_bundle "$crd_gr" standard); $(gw_bundle "$crd_rg" standard)"
no_gateway_api="!$crd_gc; !$crd_gw; !$crd_hr; !$crd_gr; !$crd_rg; !$crd_tcp"
digest="sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
cp_pod='Deployment/istiod:spec.template.spec'
cp_ctr="$cp_pod.containers[name=discovery]"
cp_env="$cp_ctr.env"
cp_role='ClusterRole/istiod:rules'
cp_lease='Role/istiod:rules'
cp_pdb='PodDisruptionBudget/istiod:spec'
cp_hpa='HorizontalPodAutoscaler/istiod:spec'
cp_anti="$cp_pod.affinity.podAntiAffinity"
# istiod-lite's replicas: the default preferred spread over nodes, by the Deployment's
# selector labels.
cp_spread="$cp_anti.preferredDuringSchedulingIgnoredDuringExecution.0.weight=100; $cp_anti.preferredDuringSchedulingIgnoredDuringExecution.0.podAffinityTerm.topologyKey=kubernetes.io/hostname; $cp_anti.preferredDuringSchedulingIgnoredDuringExecution.0.podAffinityTerm.labelSelector.matchLabels.app=istiod; !$cp_anti.requiredDuringSchedulingIgnoredDuringExecution"
# ztunnel's xDS node identity: downward API, in every mode.
zt_node_env="$zt_ctr.env[name=POD_NAME].valueFrom.fieldRef.fieldPath=metadata.name; $zt_ctr.env[name=POD_NAMESPACE].valueFrom.fieldRef.fieldPath=metadata.namespace; $zt_ctr.env[name=INSTANCE_IP].valueFrom.fieldRef.fieldPath=status.podIP"
# ztunnel never talks to the Kubernetes API: no RBAC, no API token, in every mode.
zt_no_api="!ClusterRole/ztunnel; !ClusterRoleBinding/ztunnel; !Role/ztunnel; !RoleBinding/ztunnel; ServiceAccount/ztunnel:automountServiceAccountToken=false"
combos=(
  # --- base
  "base||$(istio_crd "$crd_ap"); $(istio_crd "$crd_pa"); $crd_ap:spec.names.shortNames.0=ap; $crd_pa:spec.names.shortNames.0=pa; $crd_ap:spec.versions[name=v1].additionalPrinterColumns[name=Action].jsonPath=.spec.action; $crd_pa:spec.versions[name=v1beta1].additionalPrinterColumns[name=Mode].jsonPath=.spec.mtls.mode; $crd_pa:spec.versions[name=v1].schema.openAPIV3Schema.properties.spec.properties.mtls.properties.mode.enum.3=STRICT; $crd_pa:spec.versions[name=v1].schema.openAPIV3Schema.properties.status.x-kubernetes-preserve-unknown-fields=true; $gw_standard; !$crd_tcp; $crd_gc:spec.scope=Cluster; $crd_gc:spec.names.shortNames.0=gc; $crd_gw:spec.names.shortNames.0=gtw; $crd_gc:spec.versions[name=v1].storage=true; $crd_gc:spec.versions[name=v1beta1].served=true; $crd_gc:spec.versions[name=v1beta1].storage=false; $crd_gc:spec.versions[name=v1].additionalPrinterColumns[name=Description].priority=1; $crd_gw:spec.versions[name=v1].storage=true; $crd_gw:spec.versions[name=v1beta1].served=true; $crd_gw:spec.versions[name=v1].additionalPrinterColumns[name=Programmed].jsonPath=.status.conditions[?(@.type==\"Programmed\")].status; $crd_hr:spec.versions[name=v1].storage=true; $crd_hr:spec.versions[name=v1beta1].storage=false; $crd_hr:spec.versions[name=v1].additionalPrinterColumns[name=Hostnames].jsonPath=.spec.hostnames; $crd_hr:spec.versions[name=v1].schema.openAPIV3Schema.properties.spec.properties.rules.items.properties.matches.items.properties.path.default.value=/; $crd_hr:spec.versions[name=v1].schema.openAPIV3Schema.properties.spec.properties.rules.items.properties.matches.items.properties.path.default.type=PathPrefix; $crd_hr:spec.versions[name=v1].schema.openAPIV3Schema.properties.spec.properties.parentRefs.items.properties.kind.default=Gateway; $crd_hr:spec.versions[name=v1].schema.openAPIV3Schema.properties.spec.properties.rules.items.properties.backendRefs.items.properties.weight.default=1; $crd_gw:spec.versions[name=v1].schema.openAPIV3Schema.properties.spec.properties.listeners.items.properties.allowedRoutes.properties.namespaces.properties.from.default=Same; $crd_gr:spec.versions.0.name=v1; !$crd_gr:spec.versions.1; $crd_rg:spec.versions.0.name=v1beta1; $crd_rg:spec.versions.0.storage=true; !$crd_rg:spec.versions.1; !$crd_rg:spec.versions.0.subresources.status"
  "base|--set gatewayAPI.enabled=false|$(istio_crd "$crd_ap"); $(istio_crd "$crd_pa"); $no_gateway_api"
  "base|--set gatewayAPI.experimental=true|$gw_standard; $(gw_bundle "$crd_tcp" experimental); $crd_tcp:spec.versions.0.name=v1alpha2; $crd_tcp:spec.versions.0.storage=true; !$crd_tcp:spec.versions.1; $crd_ap"
  "base|--set gatewayAPI.enabled=false --set gatewayAPI.experimental=true|$no_gateway_api; $crd_ap; $crd_pa"
  "base|--set excludedCRDs={grpcroutes.gateway.networking.k8s.io,peerauthentications.security.istio.io}|!$crd_gr; !$crd_pa; $crd_ap; $crd_hr; $crd_gw"
  "base|--set gatewayAPI.experimental=true --set excludedCRDs={tcproutes.gateway.networking.k8s.io}|!$crd_tcp; $crd_hr"
  # --- cni
  "cni||!$cni_cm.LOG_FORMAT; $cni_cm.NATIVE_NFTABLES=false; $cni_cm.ISTIO_OWNED_CNI_CONFIG=true; $cni_cm.ISTIO_OWNED_CNI_CONFIG_FILENAME=02-istio-cni.conflist; $cni_cm.CNI_UNINSTALL_ON_EXIT=false; $cni_ctr.env[name=CNI_AGENT_RUN_DIR].value=/var/run/istio-cni; $cni_ctr.env[name=CNI_NET_DIR].value=/host/etc/cni/net.d; $cni_ctr.env[name=CNI_BIN_DIR].value=/host/opt/cni/bin; $cni_cm.EXCLUDE_NAMESPACES=kube-system; $cni_cm.CNI_PLUGIN_PEER_UID=0; $cni_cm.ZTUNNEL_PEER_UID=0; $cni_ctr.env[name=CNI_NETNS_DIR].value=/var/run/netns; $cni_ds.volumes[name=cni-run-dir].hostPath.type=DirectoryOrCreate; $cni_ds.hostNetwork=true; $cni_ds.volumes[name=cni-bin-dir].hostPath.path=/opt/cni/bin; $cni_ds.volumes[name=cni-net-dir].hostPath.path=/etc/cni/net.d; $cni_ctr.volumeMounts[name=cni-netns-dir].mountPropagation=HostToContainer; $cni_ctr.securityContext.capabilities.add.3=SYS_PTRACE; !$cni_ctr.securityContext.capabilities.add.4; $cni_ctr.env[name=ZTUNNEL_UDS_ADDRESS].value=/var/run/ztunnel/ztunnel.sock; $cni_ctr.livenessProbe.httpGet.path=/healthz; $cni_ctr.readinessProbe.httpGet.port=8000; DaemonSet/istio-cni-node:spec.updateStrategy.rollingUpdate.maxUnavailable=1"
  "cni|--set chained=true|$cni_cm.ISTIO_OWNED_CNI_CONFIG=false"
  "cni|--set chained=false --set istioOwnedCNIConfigFileName=01-mesh.conflist|$cni_cm.ISTIO_OWNED_CNI_CONFIG_FILENAME=01-mesh.conflist"
  "cni|--set uninstallOnExit=true|$cni_cm.CNI_UNINSTALL_ON_EXIT=true"
  "cni|--set ambient.ipv6=false|$cni_cm.AMBIENT_IPV6=false"
  "cni|--set nativeNftables=true|$cni_cm.NATIVE_NFTABLES=true"
  "cni|--set global.nativeNftables=true|$cni_cm.NATIVE_NFTABLES=true"
  "cni|--set ambient.dnsCapture=false|$cni_cm.AMBIENT_DNS_CAPTURE=false"
  "cni|--set ambient.reconcileIptablesOnStartup=true|$cni_cm.AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=true"
  "cni|--set ambient.enabled=false|$cni_cm.AMBIENT_ENABLED=false; !$cni_ctr.securityContext.capabilities.add; !$cni_ds.volumes[name=cni-host-procfs]; !$cni_ctr.env[name=ZTUNNEL_UDS_ADDRESS]"
  "cni|--set ambient.enabled=false --set extraCapabilities={DAC_OVERRIDE}|$cni_ctr.securityContext.capabilities.add.0=DAC_OVERRIDE"
  "cni|--set extraCapabilities={DAC_OVERRIDE}|$cni_ctr.securityContext.capabilities.add.4=DAC_OVERRIDE"
  "cni|--set excludeNamespaces={kube-system,monitoring}|$cni_cm.EXCLUDE_NAMESPACES=kube-system,monitoring"
  "cni|--set logLevel=debug --set pluginLogLevel=debug|$cni_cm.RUST_LOG=debug; $cni_cm.PLUGIN_LOG_LEVEL=debug"
  "cni|--set image.hub=registry.example.com/mesh --set image.tag=dev-1|$cni_ctr.image=registry.example.com/mesh/ambient-rs:dev-1"
  "cni|--set env.FOO=bar --set podAnnotations.team=net --set nodeSelector.pool=mesh|$cni_ctr.env[name=FOO].value=bar; $cni_ds.nodeSelector.pool=mesh; $cni_ds.nodeSelector.kubernetes\\.io/os=linux"
  "cni|--set seccompProfile=null --set appArmorProfile=null|!$cni_ctr.securityContext.seccompProfile; !$cni_ctr.securityContext.appArmorProfile"
  "cni|-f platforms/k3s.yaml|$cni_ds.volumes[name=cni-bin-dir].hostPath.path=/var/lib/rancher/k3s/data/cni; $cni_ds.volumes[name=cni-net-dir].hostPath.path=/var/lib/rancher/k3s/agent/etc/cni/net.d; $cni_ctr.env[name=CNI_NET_DIR].value=/host/etc/cni/net.d"
  "cni|-f platforms/k3d.yaml|$cni_ds.volumes[name=cni-bin-dir].hostPath.path=/var/lib/rancher/k3s/data/cni"
  "cni|-f platforms/k3d.yaml --set cniBinDir=/bin|$cni_ds.volumes[name=cni-bin-dir].hostPath.path=/bin"
  "cni|-f platforms/minikube.yaml|$cni_ds.volumes[name=cni-netns-dir].hostPath.path=/var/run/docker/netns; $cni_ctr.volumeMounts[name=cni-netns-dir].mountPath=/var/run/docker/netns; $cni_ctr.env[name=CNI_NETNS_DIR].value=/var/run/docker/netns"
  "cni|--set pluginPeerUid=1001|$cni_cm.CNI_PLUGIN_PEER_UID=1001; $cni_cm.ZTUNNEL_PEER_UID=0; $cni_ctr.securityContext.capabilities.add.4=CHOWN"
  "cni|--set ambient.ztunnelPeerUid=1337|$cni_cm.ZTUNNEL_PEER_UID=1337; $cni_cm.CNI_PLUGIN_PEER_UID=0; $cni_ctr.securityContext.capabilities.add.4=CHOWN"
  "cni|--set ambient.enabled=false --set ambient.ztunnelPeerUid=1337|!$cni_cm.ZTUNNEL_PEER_UID; !$cni_ctr.securityContext.capabilities.add"
  "cni|-f platforms/microk8s.yaml|$cni_ds.volumes[name=cni-net-dir].hostPath.path=/var/snap/microk8s/current/args/cni-network"
  "cni|--set logAsJson=true|$cni_cm.LOG_FORMAT=json"
  "cni|--set image.tag=$digest|$cni_ctr.image=ghcr.io/ambient-rs/ambient-rs@$digest"
  # --- ztunnel
  "ztunnel||!$crd_ap; !$crd_pa; !$zt_ctr.env[name=LOG_FORMAT]; $zt_ctr.env[name=DISCOVERY_SOURCE].value=xds; !$zt_ctr.env[name=LOCAL_XDS_PATH]; !$zt_ds.volumes[name=local-config]; !ConfigMap/ztunnel-local-config; $zt_no_api; $zt_ctr.env[name=PROXY_MODE].value=shared; $zt_ctr.env[name=XDS_ADDRESS].value=istiod.istio-system.svc:15012; !$zt_ctr.env[name=XDS_ROOT_CA]; !$zt_ctr.env[name=AUTH_TOKEN]; $zt_node_env; $zt_ctr.env[name=INPOD_UDS].value=/var/run/ztunnel/ztunnel.sock; $zt_ctr.env[name=TERMINATION_GRACE_PERIOD].value=25s; !$zt_ds.volumes[name=cacerts]; !$zt_mounts[name=cacerts]; !$zt_ctr.env[name=CA_CERTS_DIR]; $zt_ds.volumes[name=istio-token].projected.sources.0.serviceAccountToken.audience=istio-ca; $zt_ds.volumes[name=istio-token].projected.sources.0.serviceAccountToken.expirationSeconds=43200; $zt_ds.volumes[name=istio-token].projected.sources.0.serviceAccountToken.path=istio-token; $zt_mounts[name=istio-token].mountPath=/var/run/secrets/tokens; $zt_ds.volumes[name=istiod-ca-cert].configMap.name=istio-ca-root-cert; $zt_mounts[name=istiod-ca-cert].mountPath=/var/run/secrets/istio; $zt_ctr.env[name=CA_ADDRESS].value=istiod.istio-system.svc:15012; $zt_ctr.env[name=SECRET_TTL].value=24h; !$zt_ctr.env[name=WORKLOAD_CERT_TTL]; $zt_ctr.env[name=CLUSTER_ID].value=Kubernetes; $zt_ctr.env[name=ISTIO_META_CLUSTER_ID].value=Kubernetes; $zt_ds.serviceAccountName=ztunnel; $zt_ctr.readinessProbe.httpGet.path=/healthz/ready; $zt_ctr.ports[name=ztunnel-stats].containerPort=15020; DaemonSet/ztunnel:spec.updateStrategy.rollingUpdate.maxSurge=1; DaemonSet/ztunnel:spec.updateStrategy.rollingUpdate.maxUnavailable=0; $zt_ds.terminationGracePeriodSeconds=30; DaemonSet/ztunnel:spec.template.metadata.labels.app=ztunnel"
  "ztunnel|--set discovery.source=xds|$zt_ctr.env[name=DISCOVERY_SOURCE].value=xds; $zt_ctr.env[name=XDS_ADDRESS].value=istiod.istio-system.svc:15012; !$zt_ctr.env[name=LOCAL_XDS_PATH]; $zt_node_env; $zt_no_api"
  "ztunnel|--set discovery.source=local|$zt_ctr.env[name=DISCOVERY_SOURCE].value=local; $zt_ctr.env[name=XDS_ADDRESS].value=; $zt_ctr.env[name=LOCAL_XDS_PATH].value=/etc/ztunnel/local/config.yaml; $zt_mounts[name=local-config].mountPath=/etc/ztunnel/local; $zt_ds.volumes[name=local-config].configMap.name=ztunnel-local-config; ConfigMap/ztunnel-local-config:data.config\\.yaml; $zt_no_api; $zt_ds.volumes[name=istio-token].projected.sources.0.serviceAccountToken.audience=istio-ca; $zt_ctr.env[name=CA_ADDRESS].value=istiod.istio-system.svc:15012; $zt_node_env"
  "ztunnel|--set logAsJson=true|$zt_ctr.env[name=LOG_FORMAT].value=json"
  "ztunnel|--set image.tag=0.1.0@$digest|$zt_ctr.image=ghcr.io/ambient-rs/ambient-rs:0.1.0@$digest"
  "ztunnel|--set image.tag=$digest|$zt_ctr.image=ghcr.io/ambient-rs/ambient-rs@$digest"
  "ztunnel|--set trustDomain=example.org --set clusterId=east --set workloadCertTTL=12h|$zt_ctr.env[name=TRUST_DOMAIN].value=example.org; $zt_ctr.env[name=CLUSTER_ID].value=east; $zt_ctr.env[name=ISTIO_META_CLUSTER_ID].value=east; $zt_ctr.env[name=SECRET_TTL].value=12h"
  "ztunnel|--set istioNamespace=mesh-control|$zt_ctr.env[name=CA_ADDRESS].value=istiod.mesh-control.svc:15012; $zt_ctr.env[name=XDS_ADDRESS].value=istiod.mesh-control.svc:15012"
  "ztunnel|--set caAddress=https://ca.example.org:15012 --set istioNamespace=mesh-control|$zt_ctr.env[name=CA_ADDRESS].value=https://ca.example.org:15012; $zt_ctr.env[name=XDS_ADDRESS].value=https://ca.example.org:15012"
  "ztunnel|--set caAddress=https://ca.example.org:15012 --set discovery.source=local|$zt_ctr.env[name=CA_ADDRESS].value=https://ca.example.org:15012; $zt_ctr.env[name=XDS_ADDRESS].value="
  "ztunnel|--set terminationGracePeriodSeconds=3 --set workerThreads=4 --set logLevel=info\\,ztunnel::proxy=debug|$zt_ctr.env[name=TERMINATION_GRACE_PERIOD].value=1s; $zt_ctr.env[name=ZTUNNEL_WORKER_THREADS].value=4; $zt_ctr.env[name=RUST_LOG].value=info,ztunnel::proxy=debug"
  "ztunnel|--set discovery.source=local --set-file discovery.localConfig=testdata/local-config.yaml|ConfigMap/ztunnel-local-config:data.config\\.yaml~=- !Exact cluster.local/ns/shop/sa/client"
  "ztunnel|--set env.PACKET_MARK=1337 --set image.pullPolicy=Always|$zt_ctr.env[name=PACKET_MARK].value=1337; $zt_ctr.imagePullPolicy=Always"
  # --- istiod-lite
  "istiod-lite||!$cp_env[name=LOG_FORMAT]; Deployment/istiod:spec.replicas=2; $cp_pdb.minAvailable=1; !$cp_pdb.maxUnavailable; $cp_pdb.selector.matchLabels.app=istiod; !HorizontalPodAutoscaler/istiod; $cp_spread; $cp_env[name=POD_NAME].valueFrom.fieldRef.fieldPath=metadata.name; $cp_env[name=LEADER_ELECTION_LEASE_DURATION].value=15s; $cp_lease.0.apiGroups.0=coordination.k8s.io; $cp_lease.0.resources.0=leases; $cp_lease.0.resourceNames.0=istio-namespace-controller-election; !$cp_lease.0.resourceNames.1; $cp_lease.0.verbs.0=get; $cp_lease.0.verbs.1=update; !$cp_lease.0.verbs.2; $cp_lease.1.apiGroups.0=coordination.k8s.io; $cp_lease.1.resources.0=leases; $cp_lease.1.verbs.0=create; !$cp_lease.1.verbs.1; !$cp_lease.1.resourceNames; !$cp_lease.2; RoleBinding/istiod:roleRef.kind=Role; RoleBinding/istiod:roleRef.name=istiod; RoleBinding/istiod:subjects[name=istiod].namespace=istio-system; Deployment/istiod:metadata.labels.app=istiod; Deployment/istiod:metadata.labels.istio=pilot; Deployment/istiod:spec.template.metadata.labels.app=istiod; Deployment/istiod:spec.template.metadata.labels.istio=pilot; Deployment/istiod:spec.template.metadata.annotations.prometheus\\.io/scrape=true; Deployment/istiod:spec.template.metadata.annotations.prometheus\\.io/port=15014; $cp_ctr.image=ghcr.io/ambient-rs/ambient-rs:0.1.0; $cp_ctr.command.0=istiod-lite; $cp_ctr.ports[name=tls-xds].containerPort=15012; $cp_ctr.ports[name=http-monitoring].containerPort=15014; $cp_ctr.ports[name=http-debug].containerPort=8080; $cp_ctr.readinessProbe.httpGet.path=/ready; $cp_ctr.readinessProbe.httpGet.port=8080; $cp_env[name=POD_NAMESPACE].valueFrom.fieldRef.fieldPath=metadata.namespace; $cp_env[name=TRUST_DOMAIN].value=cluster.local; $cp_env[name=CLUSTER_ID].value=Kubernetes; $cp_env[name=DOMAIN_SUFFIX].value=cluster.local; $cp_env[name=TOKEN_AUDIENCES].value=istio-ca; $cp_env[name=CA_TRUSTED_NODE_ACCOUNTS].value=istio-system/ztunnel; $cp_env[name=MAX_WORKLOAD_CERT_TTL].value=2160h; $cp_env[name=DEFAULT_WORKLOAD_CERT_TTL].value=24h; $cp_env[name=CA_CERTS_DIR].value=/etc/cacerts; !$cp_env[name=ISTIOD_CUSTOM_HOST]; $cp_env[name=RUST_LOG].value=info; $cp_pod.volumes[name=cacerts].secret.secretName=cacerts; $cp_pod.volumes[name=cacerts].secret.defaultMode=288; $cp_ctr.volumeMounts[name=cacerts].mountPath=/etc/cacerts; $cp_ctr.volumeMounts[name=cacerts].readOnly=true; $cp_ctr.securityContext.runAsNonRoot=true; $cp_ctr.securityContext.readOnlyRootFilesystem=true; $cp_ctr.securityContext.capabilities.drop.0=ALL; !$cp_ctr.securityContext.capabilities.add; $cp_pod.serviceAccountName=istiod; !$cp_pod.priorityClassName; Service/istiod:spec.ports[name=https-dns].port=15012; Service/istiod:spec.ports[name=http-monitoring].port=15014; Service/istiod:spec.selector.app=istiod; ServiceAccount/istiod:automountServiceAccountToken=true; ClusterRole/istiod:rules.0.apiGroups.0=authentication.k8s.io; ClusterRole/istiod:rules.0.resources.0=tokenreviews; ClusterRole/istiod:rules.0.verbs.0=create; !ClusterRole/istiod:rules.0.verbs.1; $cp_role.1.resources.0=pods; $cp_role.2.resources.0=namespaces; $cp_role.3.resources.0=configmaps; !$cp_role.3.verbs.6; $cp_role.4.apiGroups.0=; $cp_role.4.resources.0=services; !$cp_role.4.resources.1; $cp_role.4.verbs.0=list; $cp_role.4.verbs.1=watch; !$cp_role.4.verbs.2; $cp_role.5.apiGroups.0=security.istio.io; !$cp_role.5.apiGroups.1; $cp_role.5.resources.0=authorizationpolicies; $cp_role.5.resources.1=peerauthentications; !$cp_role.5.resources.2; $cp_role.5.verbs.0=list; $cp_role.5.verbs.1=watch; !$cp_role.5.verbs.2; $cp_role.6.apiGroups.0=gateway.networking.k8s.io; $cp_role.6.resources.0=gatewayclasses; !$cp_role.6.resources.1; $cp_role.6.verbs.0=list; $cp_role.6.verbs.1=watch; $cp_role.6.verbs.2=create; !$cp_role.6.verbs.3; $cp_role.7.apiGroups.0=gateway.networking.k8s.io; $cp_role.7.resources.0=gatewayclasses/status; $cp_role.7.verbs.0=patch; !$cp_role.7.verbs.1; $cp_role.8.resources.0=gateways; $cp_role.8.verbs.0=list; $cp_role.8.verbs.1=watch; !$cp_role.8.verbs.2; $cp_role.9.resources.0=gateways/status; $cp_role.9.verbs.0=patch; !$cp_role.9.verbs.1; $cp_role.10.resources.0=serviceaccounts; $cp_role.10.verbs.0=patch; $cp_role.10.verbs.1=delete; !$cp_role.10.verbs.2; $cp_role.11.resources.0=services; $cp_role.11.verbs.1=delete; !$cp_role.11.verbs.2; $cp_role.12.apiGroups.0=apps; $cp_role.12.resources.0=deployments; !$cp_role.12.verbs.4; $cp_role.13.apiGroups.0=gateway.networking.k8s.io; $cp_role.13.resources.0=httproutes; $cp_role.13.resources.1=grpcroutes; $cp_role.13.resources.2=tcproutes; !$cp_role.13.resources.3; $cp_role.13.verbs.0=get; $cp_role.13.verbs.1=list; $cp_role.13.verbs.2=watch; !$cp_role.13.verbs.3; $cp_role.14.resources.0=httproutes/status; $cp_role.14.resources.1=grpcroutes/status; $cp_role.14.resources.2=tcproutes/status; $cp_role.14.verbs.0=update; $cp_role.14.verbs.1=patch; !$cp_role.14.verbs.2; !$cp_role.15; $cp_env[name=WAYPOINT_IMAGE].value=ghcr.io/ambient-rs/ambient-rs:0.1.0; ClusterRoleBinding/istiod:subjects[name=istiod].namespace=istio-system; !ConfigMap/istio-ca-root-cert"
  "istiod-lite|--set replicaCount=1|Deployment/istiod:spec.replicas=1; !PodDisruptionBudget/istiod; $cp_spread"
  "istiod-lite|--set replicaCount=3 --set podDisruptionBudget.minAvailable=50%|Deployment/istiod:spec.replicas=3; $cp_pdb.minAvailable=50%"
  "istiod-lite|--set podDisruptionBudget.maxUnavailable=1|$cp_pdb.maxUnavailable=1; !$cp_pdb.minAvailable"
  "istiod-lite|--set replicaCount=3 --set podDisruptionBudget.maxUnavailable=50% --set podDisruptionBudget.minAvailable=3|$cp_pdb.maxUnavailable=50%; !$cp_pdb.minAvailable"
  "istiod-lite|--set podDisruptionBudget.enabled=false|!PodDisruptionBudget/istiod; Deployment/istiod:spec.replicas=2"
  "istiod-lite|--set autoscaleEnabled=true|!Deployment/istiod:spec.replicas; $cp_hpa.scaleTargetRef.apiVersion=apps/v1; $cp_hpa.scaleTargetRef.kind=Deployment; $cp_hpa.scaleTargetRef.name=istiod; $cp_hpa.minReplicas=2; $cp_hpa.maxReplicas=5; $cp_hpa.metrics.0.resource.name=cpu; $cp_hpa.metrics.0.resource.target.type=Utilization; $cp_hpa.metrics.0.resource.target.averageUtilization=80; $cp_pdb.minAvailable=1; $cp_spread"
  "istiod-lite|--set autoscaleEnabled=true --set autoscaleMin=3 --set autoscaleMax=9 --set cpu.targetAverageUtilization=60 --set podDisruptionBudget.minAvailable=2|!Deployment/istiod:spec.replicas; $cp_hpa.minReplicas=3; $cp_hpa.maxReplicas=9; $cp_hpa.metrics.0.resource.target.averageUtilization=60; $cp_pdb.minAvailable=2"
  "istiod-lite|--set autoscaleEnabled=true --set autoscaleMin=1|$cp_hpa.minReplicas=1; !PodDisruptionBudget/istiod"
  "istiod-lite|-f testdata/istiod-lite-affinity.yaml|$cp_anti.requiredDuringSchedulingIgnoredDuringExecution.0.topologyKey=kubernetes.io/hostname; !$cp_anti.preferredDuringSchedulingIgnoredDuringExecution; $cp_pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.0.matchExpressions.0.key=node-role.kubernetes.io/control-plane; $cp_pdb.minAvailable=1"
  "istiod-lite|--set leaderElectionLeaseDuration=1m|$cp_env[name=LEADER_ELECTION_LEASE_DURATION].value=1m"
  "istiod-lite|--set trustDomain=example.org --set clusterId=east --set domainSuffix=corp.example|$cp_env[name=TRUST_DOMAIN].value=example.org; $cp_env[name=CLUSTER_ID].value=east; $cp_env[name=DOMAIN_SUFFIX].value=corp.example"
  "istiod-lite|--set tokenAudiences={istio-ca,mesh.example.org}|$cp_env[name=TOKEN_AUDIENCES].value=istio-ca,mesh.example.org"
  "istiod-lite|--set trustedZtunnelNamespace=kube-system|$cp_env[name=CA_TRUSTED_NODE_ACCOUNTS].value=kube-system/ztunnel"
  "istiod-lite|--set trustedZtunnelNamespace=kube-system --set trustedZtunnelName=node-proxy|$cp_env[name=CA_TRUSTED_NODE_ACCOUNTS].value=kube-system/node-proxy"
  "istiod-lite|--set maxWorkloadCertTTL=720h --set defaultWorkloadCertTTL=12h|$cp_env[name=MAX_WORKLOAD_CERT_TTL].value=720h; $cp_env[name=DEFAULT_WORKLOAD_CERT_TTL].value=12h"
  "istiod-lite|--set caSecretName=mesh-ca|$cp_pod.volumes[name=cacerts].secret.secretName=mesh-ca; $cp_env[name=CA_CERTS_DIR].value=/etc/cacerts"
  "istiod-lite|--set customHosts={istiod.east.example.org,istiod.mesh,10.0.0.12,fd00::12}|$cp_env[name=ISTIOD_CUSTOM_HOST].value=istiod.east.example.org,istiod.mesh,10.0.0.12,fd00::12"
  "istiod-lite|--set logLevel=info\\,istiod_lite::ca=debug --set env.FOO=bar|$cp_env[name=RUST_LOG].value=info,istiod_lite::ca=debug; $cp_env[name=FOO].value=bar"
  "istiod-lite|--set image.hub=registry.example.com/mesh --set image.tag=dev-1 --set image.pullPolicy=Always --set imagePullSecrets={regcred}|$cp_ctr.image=registry.example.com/mesh/ambient-rs:dev-1; $cp_ctr.imagePullPolicy=Always; ServiceAccount/istiod:imagePullSecrets[name=regcred]"
  "istiod-lite|--set priorityClassName=system-cluster-critical --set nodeSelector.pool=control --set podAnnotations.team=mesh --set podLabels.tier=control|$cp_pod.priorityClassName=system-cluster-critical; $cp_pod.nodeSelector.pool=control; $cp_pod.nodeSelector.kubernetes\\.io/os=linux; Deployment/istiod:spec.template.metadata.annotations.team=mesh; Deployment/istiod:spec.template.metadata.labels.tier=control"
  "istiod-lite|--set strategy.rollingUpdate.maxSurge=1 --set strategy.rollingUpdate.maxUnavailable=0|Deployment/istiod:spec.strategy.rollingUpdate.maxSurge=1; Deployment/istiod:spec.strategy.rollingUpdate.maxUnavailable=0"
  "istiod-lite|--set strategy.type=Recreate|Deployment/istiod:spec.strategy.type=Recreate; !Deployment/istiod:spec.strategy.rollingUpdate"
  "istiod-lite|--set seccompProfile=null|!$cp_ctr.securityContext.seccompProfile"
  "istiod-lite|--set logAsJson=true|$cp_env[name=LOG_FORMAT].value=json"
  "istiod-lite|--set image.tag=0.1.0@$digest|$cp_ctr.image=ghcr.io/ambient-rs/ambient-rs:0.1.0@$digest"
)
i=0
for entry in "${combos[@]}"; do
  i=$((i + 1))
  IFS='|' read -r chart args expectations <<<"$entry"
  label="render $chart ${args:-(defaults)}"
  out="$work/combo-$i.yaml"
  # shellcheck disable=SC2086 # args are words
  if ! render "$chart" $args >"$out" 2>"$work/combo-$i.err"; then
    indent <"$work/combo-$i.err"
    fail "$label: render failed"
    continue
  fi
  # shellcheck disable=SC2086
  if ! lint_out="$("$HELM" lint --strict "charts/$chart" --namespace "$NAMESPACE" \
    --kube-version "$KUBE_VERSION" $args 2>&1)"; then
    indent <<<"$lint_out"
    fail "$label: lint failed"
    continue
  fi
  expect_args=()
  IFS=';' read -ra exprs <<<"$expectations"
  for e in "${exprs[@]}"; do
    e="$(echo "$e" | sed 's/^ *//; s/ *$//')"
    [ -n "$e" ] && expect_args+=(--expect "$e")
  done
  if "$PYTHON" validate.py --namespace "$NAMESPACE" "${expect_args[@]}" "$out" >"$work/combo-$i.log"; then
    pass "$label"
  else
    cat "$work/combo-$i.log"
    fail "$label"
  fi
done

# ---------------------------------------------------------------- 4. CRDs and samples
# The CRD files stay plain YAML (tests and tools read them without Helm), every
# document a CRD the chart renders, once, when every channel is on.
render base --set gatewayAPI.experimental=true >"$work/crds.yaml"
if "$PYTHON" - "$work/crds.yaml" charts/base/files/crd-*.yaml >"$work/crd-files.log" <<'PY'; then
import sys
import yaml

render, files = sys.argv[1], sys.argv[2:]
rendered = [d["metadata"]["name"] for d in yaml.safe_load_all(open(render)) if d]
problems, names = [], []
for path in files:
    text = open(path).read()
    if "{{" in text or "}}" in text:
        problems.append(f"{path}: template syntax; the files are plain YAML")
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if doc.get("kind") != "CustomResourceDefinition":
            problems.append(f"{path}: a {doc.get('kind')}, not a CustomResourceDefinition")
            continue
        names.append(doc["metadata"]["name"])
        if doc["metadata"].get("namespace"):
            problems.append(f"{path}: {doc['metadata']['name']} has a namespace")
if sorted(names) != sorted(rendered):
    problems.append(f"the files hold {sorted(names)}, the render {sorted(rendered)}")
for p in problems:
    print(f"  {p}")
sys.exit(1 if problems else 0)
PY
  pass "base chart's CRD files are plain YAML, every CRD rendered once"
else
  cat "$work/crd-files.log"
  fail "base chart's CRD files are plain YAML, every CRD rendered once"
fi
# Custom objects against the CRDs the base chart renders (every channel on).
for kinds in authorizationpolicies peerauthentications gateway-api; do
  if "$PYTHON" validate.py --crds-from "$work/crds.yaml" "testdata/$kinds.yaml" >"$work/$kinds.log"; then
    pass "testdata/$kinds.yaml validates against the base chart's CRDs"
  else
    cat "$work/$kinds.log"
    fail "testdata/$kinds.yaml validates against the base chart's CRDs"
  fi
  if "$PYTHON" validate.py --expect-invalid --crds-from "$work/crds.yaml" \
    "testdata/$kinds-invalid.yaml" >"$work/$kinds-bad.log"; then
    pass "testdata/$kinds-invalid.yaml is rejected by the base chart's CRDs, object by object"
  else
    cat "$work/$kinds-bad.log"
    fail "testdata/$kinds-invalid.yaml is rejected by the base chart's CRDs, object by object"
  fi
done

# ---------------------------------------------------------------- 5. the charts fit together
# ztunnel must reach istiod-lite's Service (CA and xDS), carry a token istiod-lite
# accepts and the downward-API node identity its xDS checks, run as the account
# istiod-lite trusts for node impersonation and xDS, and agree on cluster and trust
# domain; only istiod-lite may mount the CA Secret or read the Kubernetes API, and it
# must be allowed to watch everything it turns into xDS.
render ztunnel >"$work/pair-ztunnel.yaml"
render istiod-lite >"$work/pair-istiod.yaml"
if "$PYTHON" - "$work/pair-ztunnel.yaml" "$work/pair-istiod.yaml" >"$work/pair.log" <<'PY'; then
import sys
import yaml


def load(path):
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for d in yaml.safe_load_all(open(path)) if d}


zt, cp = load(sys.argv[1]), load(sys.argv[2])
ds = zt["DaemonSet/ztunnel"]
pod = ds["spec"]["template"]["spec"]
proxy = next(c for c in pod["containers"] if c["name"] == "istio-proxy")
zenv = {e["name"]: e.get("value") for e in proxy["env"]}
zfields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
           for e in proxy["env"]}
dep = cp["Deployment/istiod"]
disc = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "discovery")
cenv = {e["name"]: e.get("value") for e in disc["env"]}
svc = cp["Service/istiod"]
problems = []
host, _, port = zenv["CA_ADDRESS"].removeprefix("https://").rpartition(":")
want_host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
if host != want_host:
    problems.append(f"CA_ADDRESS host {host} is not the Service {want_host}")
if int(port) not in [p["port"] for p in svc["spec"]["ports"]]:
    problems.append(f"CA_ADDRESS port {port} is not a port of Service/istiod")
if zenv.get("XDS_ADDRESS") != zenv["CA_ADDRESS"]:
    problems.append(f"XDS_ADDRESS {zenv.get('XDS_ADDRESS')!r} is not CA_ADDRESS {zenv['CA_ADDRESS']!r}")
if zenv.get("DISCOVERY_SOURCE") != "xds":
    problems.append(f"DISCOVERY_SOURCE is {zenv.get('DISCOVERY_SOURCE')!r}, not xds")
for name, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                    ("INSTANCE_IP", "status.podIP")):
    if zfields.get(name) != field:
        problems.append(f"ztunnel's {name} is not the downward API's {field} (xDS node id)")
rbac_kinds = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
for ref in zt:
    if ref.split("/")[0] in rbac_kinds:
        problems.append(f"ztunnel's chart renders {ref}; ztunnel must not read the API")
sa = zt.get(f"ServiceAccount/{pod['serviceAccountName']}") or {}
if sa and sa.get("automountServiceAccountToken") is not False:
    problems.append("ztunnel's ServiceAccount mounts an API token; ztunnel never calls the API")
if pod.get("automountServiceAccountToken"):
    problems.append("ztunnel's pod mounts an API token; ztunnel never calls the API")
granted = {(g, r, v) for rule in cp["ClusterRole/istiod"]["rules"]
           for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
for group, resource in (("", "pods"), ("", "services"), ("", "namespaces"),
                        ("security.istio.io", "authorizationpolicies"),
                        ("security.istio.io", "peerauthentications")):
    for verb in ("list", "watch"):
        if (group, resource, verb) not in granted:
            problems.append(f"ClusterRole/istiod lacks {verb} on {group or 'core'}/{resource} (xDS)")
tokens = [s["serviceAccountToken"] for v in pod["volumes"]
          for s in (v.get("projected") or {}).get("sources", []) if "serviceAccountToken" in s]
audiences = cenv["TOKEN_AUDIENCES"].split(",")
if not tokens or any(t.get("audience") not in audiences for t in tokens):
    problems.append(f"ztunnel's projected token audience is not in TOKEN_AUDIENCES {audiences}")
account = f"{ds['metadata']['namespace']}/{pod['serviceAccountName']}"
if account not in cenv["CA_TRUSTED_NODE_ACCOUNTS"].split(","):
    problems.append(f"ztunnel's account {account} is not in CA_TRUSTED_NODE_ACCOUNTS")
if f"ServiceAccount/{pod['serviceAccountName']}" not in zt:
    problems.append("ztunnel's ServiceAccount is not rendered (its token is bound to it)")
for name in ("TRUST_DOMAIN", "CLUSTER_ID"):
    if zenv.get(name) != cenv.get(name):
        problems.append(f"{name}: ztunnel {zenv.get(name)!r}, istiod-lite {cenv.get(name)!r}")
if zenv.get("ISTIO_META_CLUSTER_ID") != cenv.get("CLUSTER_ID"):
    problems.append("ztunnel's ISTIO_META_CLUSTER_ID differs from istiod-lite's CLUSTER_ID")
for path, objs in ((sys.argv[1], zt), (sys.argv[2], cp)):
    for ref, obj in objs.items():
        spec = (obj.get("spec") or {}).get("template", {}).get("spec", {})
        if any("secret" in v for v in spec.get("volumes", [])) and ref != "Deployment/istiod":
            problems.append(f"{ref} mounts a Secret; only Deployment/istiod may (the CA key)")
for p in problems:
    print(f"  {p}")
sys.exit(1 if problems else 0)
PY
  pass "ztunnel and istiod-lite defaults fit together"
else
  cat "$work/pair.log"
  fail "ztunnel and istiod-lite defaults fit together"
fi

# ---------------------------------------------------------------- 6. bad values
# chart | value arguments | text the error must contain
bad=(
  "base|--set gatewayAPI.enabled=yes|/gatewayAPI/enabled"
  "base|--set gatewayAPI.experimental=1|/gatewayAPI/experimental"
  "base|--set gatewayAPI.channel=experimental|'channel' not allowed"
  "base|--set crds.enabled=true|'crds' not allowed"
  "base|--set excludedCRDs=gateways.gateway.networking.k8s.io|/excludedCRDs"
  "base|--set excludedCRDs={Gateways}|/excludedCRDs/0"
  "base|--set excludedCRDs={gateways.gateway.networking.k8s.io,gateways.gateway.networking.k8s.io}|/excludedCRDs"
  "base|--set excludedCRDs={widgets.example.com}|excludedCRDs names widgets.example.com, which this chart does not carry"
  "cni|--set chained=maybe|/chained"
  "cni|--set uninstallOnExit=1|/uninstallOnExit"
  "cni|--set cniBinDir=opt/cni/bin|/cniBinDir"
  "cni|--set cniConfDir=|/cniConfDir"
  "cni|--set cniBinDri=/opt/cni/bin|'cniBinDri' not allowed"
  "cni|--set ambient.ipv6=yes|/ambient/ipv6"
  "cni|--set ambient.dnscapture=true|'dnscapture' not allowed"
  "cni|--set excludeNamespaces=kube-system|/excludeNamespaces"
  "cni|--set excludeNamespaces={Kube_System}|/excludeNamespaces/0"
  "cni|--set image.pullPolicy=Sometimes|/image/pullPolicy"
  "cni|--set image.tag=7|/image/tag"
  "cni|--set image.tag=sha256:0123|/image/tag"
  "cni|--set logAsJson=true\\,false|/logAsJson"
  "cni|--set extraCapabilities={ALL}|/extraCapabilities/0"
  "cni|--set pluginLogLevel=verbose|/pluginLogLevel"
  "cni|--set istioOwnedCNIConfigFileName=istio.conf|/istioOwnedCNIConfigFileName"
  "cni|--set updateStrategy.type=Recreate|/updateStrategy/type"
  "cni|--set pluginPeerUid=-1|/pluginPeerUid"
  "cni|--set ambient.ztunnelPeerUid=root|/ambient/ztunnelPeerUid"
  "ztunnel|--set discovery.source=kubernetes|/discovery/source"
  "ztunnel|--set discovery.source=both|/discovery/source"
  "ztunnel|--set crds.enabled=true|'crds' not allowed"
  "ztunnel|--set logAsJson=yes|/logAsJson"
  "ztunnel|--set image.tag=latest@sha256:0123|/image/tag"
  "ztunnel|--set image.tag=@$digest|/image/tag"
  "ztunnel|--set workloadCertTTL=1d|/workloadCertTTL"
  "ztunnel|--set trustDomain=spiffe://cluster.local|/trustDomain"
  "ztunnel|--set workerThreads=0|/workerThreads"
  "ztunnel|--set caSecretName=cacerts|'caSecretName' not allowed"
  "ztunnel|--set caAddress=istiod/istio-system|/caAddress"
  "ztunnel|--set istioNamespace=Istio_System|/istioNamespace"
  "ztunnel|--set terminationGracePeriodSeconds=0|/terminationGracePeriodSeconds"
  "ztunnel|--set env.1BAD=x|'1BAD'"
  "istiod-lite|--set replicaCount=0|/replicaCount"
  "istiod-lite|--set replicaCount=two|/replicaCount"
  "istiod-lite|--set podDisruptionBudget.minAvailable={1}|/podDisruptionBudget/minAvailable"
  "istiod-lite|--set podDisruptionBudget.minAvailable=100%|/podDisruptionBudget/minAvailable"
  "istiod-lite|--set podDisruptionBudget.minAvailable=-1|/podDisruptionBudget/minAvailable"
  "istiod-lite|--set podDisruptionBudget.maxUnavailable=0|/podDisruptionBudget/maxUnavailable"
  "istiod-lite|--set podDisruptionBudget.minAvailable=null|missing property 'minAvailable'"
  "istiod-lite|--set podDisruptionBudget.maxUnavailable=0%|/podDisruptionBudget/maxUnavailable"
  "istiod-lite|--set podDisruptionBudget.enabled=yes|/podDisruptionBudget/enabled"
  "istiod-lite|--set podDisruptionBudget.minReplicas=1|'minReplicas' not allowed"
  "istiod-lite|--set podDisruptionBudget.minAvailable=2|podDisruptionBudget.minAvailable (2) must leave fewer than the 2 pods"
  "istiod-lite|--set replicaCount=4 --set podDisruptionBudget.minAvailable=80%|podDisruptionBudget.minAvailable (80%) must leave fewer than the 4 pods"
  "istiod-lite|--set autoscaleEnabled=true --set autoscaleMin=5 --set podDisruptionBudget.minAvailable=5|must leave fewer than the 5 pods"
  "istiod-lite|--set autoscaleEnabled=on|/autoscaleEnabled"
  "istiod-lite|--set autoscaleMin=0|/autoscaleMin"
  "istiod-lite|--set autoscaleMax=many|/autoscaleMax"
  "istiod-lite|--set autoscaleEnabled=true --set autoscaleMin=6|autoscaleMin (6) must not exceed autoscaleMax (5)"
  "istiod-lite|--set autoscaleEnabled=true --set resources.requests.cpu=null|autoscaleEnabled needs resources.requests.cpu"
  "istiod-lite|--set cpu.targetAverageUtilization=80%|/cpu/targetAverageUtilization"
  "istiod-lite|--set cpu.targetAverageMemory=80|'targetAverageMemory' not allowed"
  "istiod-lite|--set leaderElectionLeaseDuration=0s|/leaderElectionLeaseDuration"
  "istiod-lite|--set leaderElectionLeaseDuration=15|/leaderElectionLeaseDuration"
  "istiod-lite|--set leaderElectionLeaseDuration=1d|/leaderElectionLeaseDuration"
  "istiod-lite|--set caSecretName=CA_Certs|/caSecretName"
  "istiod-lite|--set trustDomain=spiffe://cluster.local|/trustDomain"
  "istiod-lite|--set clusterId=|/clusterId"
  "istiod-lite|--set domainSuffix=Cluster_Local|/domainSuffix"
  "istiod-lite|--set tokenAudiences=istio-ca|/tokenAudiences"
  "istiod-lite|--set tokenAudiences={istio-ca\\,extra}|/tokenAudiences/0"
  "istiod-lite|--set trustedZtunnelNamespace=Kube_System|/trustedZtunnelNamespace"
  "istiod-lite|--set trustedZtunnelName=|/trustedZtunnelName"
  "istiod-lite|--set maxWorkloadCertTTL=90d|/maxWorkloadCertTTL"
  "istiod-lite|--set defaultWorkloadCertTTL=1day|/defaultWorkloadCertTTL"
  "istiod-lite|--set customHosts=istiod.example.org|/customHosts"
  "istiod-lite|--set customHosts={https://istiod.example.org}|/customHosts/0"
  "istiod-lite|--set customHosts={*.example.org}|/customHosts/0"
  "istiod-lite|--set strategy.type=Replace|/strategy/type"
  "istiod-lite|--set priorityClassName=System_Critical|/priorityClassName"
  "istiod-lite|--set image.pullPolicy=Sometimes|/image/pullPolicy"
  "istiod-lite|--set logLevel=|/logLevel"
  "istiod-lite|--set logAsJson=json|/logAsJson"
  "istiod-lite|--set trustedNodeAccounts=istio-system/ztunnel|'trustedNodeAccounts' not allowed"
  "istiod-lite|--set env.1BAD=x|'1BAD'"
)
for entry in "${bad[@]}"; do
  IFS='|' read -r chart args want <<<"$entry"
  label="reject $chart $args"
  # shellcheck disable=SC2086
  if render "$chart" $args >/dev/null 2>"$work/bad.err"; then
    fail "$label: rendered, but the schema should reject it"
  elif grep -qF -- "$want" "$work/bad.err"; then
    pass "$label"
  else
    indent <"$work/bad.err"
    fail "$label: the error does not name $want"
  fi
done

echo
if [ "$failed" -gt 0 ]; then
  echo "failed checks:"
  printf '  %s\n' "${failures[@]}"
fi
echo "charts: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
