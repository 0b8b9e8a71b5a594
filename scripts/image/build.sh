#!/usr/bin/env bash
# `make image`: builds ghcr.io/ambient-rs/ambient-rs:<version> offline, from Debian's
# packages and the release binaries, as an OCI image layout and an OCI archive that
# `podman load` (and `docker load`, Docker 25+) read, and `skopeo copy` pushes.
#
# Usage: scripts/image/build.sh
# Environment:
#   IMAGE_OUT         output directory (default target/image)
#   IMAGE_BIN_DIR     take the binaries from here instead of `cargo build --release`
#   IMAGE_REVISION    the revision label (default: git rev-parse HEAD)
#   IMAGE_APT_OFFLINE=1  no download: the packages already in IMAGE_OUT/apt
#   SOURCE_DATE_EPOCH every timestamp in the image (default: the last commit's time)
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR  see rootfs.sh
#
# Output (IMAGE_OUT):
#   oci/                      the OCI image layout, tagged <version>
#   ambient-rs-<version>.oci.tar  the same as one archive (podman load -i ...)
#   digest                    the image's manifest digest (sha256:...), what a registry
#                             keeps when the image is pushed with skopeo or podman
#   image.env                 NAME, VERSION, REVISION, DIGEST, sizes (sourced by
#                             scripts/charts.sh and read by the local cluster)
#   packages.tsv              the Debian packages: name, version, arch, source package
#                             (the image also keeps each one's control file in
#                             /var/lib/dpkg/status.d/, where syft and trivy look)
#
# Reproducible: the same binaries, packages and SOURCE_DATE_EPOCH give the same layer
# and manifest digests (one sorted tar, every mtime and owner fixed, gzip without a
# name or time, fixed config dates, no history of build times).
#
# The OCI writer is umoci (Debian's package): it writes layouts from files alone, with
# no daemon, no container storage and no mounts, so it runs as it is in CI and in
# the Dockerfile-free path; buildah would need a container storage (and its mounts)
# and skopeo only copies images that exist.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
# shellcheck source=scripts/image/contents.sh
. scripts/image/contents.sh
export LC_ALL=C

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "image: $1 not found (scripts/setup.sh installs it: apt-get install $2)" >&2
    exit 1
  }
}
need umoci umoci
need dpkg-deb dpkg
need apt-get apt

out="${IMAGE_OUT:-$root/target/image}"
version="$(awk -F'"' '/^\[workspace.package\]/ { p = 1 } p && /^version *=/ { print $2; exit }' Cargo.toml)"
revision="${IMAGE_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
repository="ghcr.io/ambient-rs/$IMAGE_NAME"
started=$SECONDS

if [ -n "${IMAGE_BIN_DIR:-}" ]; then
  bin_dir="$IMAGE_BIN_DIR"
else
  crates=()
  for c in "${CRATES[@]}"; do crates+=(-p "$c"); done
  cargo build --release --locked --bins "${crates[@]}"
  bin_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release"
fi

mkdir -p "$out"
work="$out/work"
rm -rf "$work" "$out/oci"
mkdir -p "$work"
scripts/image/rootfs.sh "$work/rootfs" "$bin_dir" "$out/apt"

# ---------------------------------------------------------------- the layer
# One layer: the base is a few MB, and the binaries change with every commit anyway.
# Sorted names, fixed mtimes and owners, no atime/ctime in the pax headers.
tar -C "$work/rootfs" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 \
  --numeric-owner --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$work/layer.tar" .
unpacked_bytes="$(stat -c %s "$work/layer.tar")"

# ---------------------------------------------------------------- the OCI image
oci="$out/oci"
umoci init --layout "$oci"
umoci new --image "$oci:$version"
umoci raw add-layer --image "$oci:$version" \
  --history.created "$created" --history.created_by "scripts/image/build.sh (rootfs.sh)" \
  --history.comment "Debian $SUITE packages and the ambient-rs binaries" \
  "$work/layer.tar"
labels=(
  "org.opencontainers.image.title=ambient-rs"
  "org.opencontainers.image.description=Istio ambient mode in Rust: istiod-lite, ztunnel, waypoint, cni-agent, istio-cni, istioctl-lite"
  "org.opencontainers.image.source=https://github.com/ambient-rs/ambient-rs"
  "org.opencontainers.image.url=https://github.com/ambient-rs/ambient-rs"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.vendor=ambient-rs"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.created=$created"
)
config=(--created "$created" --author "ambient-rs" --os linux --architecture "$ARCH"
  --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  --config.cmd ztunnel --config.cmd --help --no-history)
for l in "${labels[@]}"; do
  config+=(--config.label "$l" --manifest.annotation "$l")
done
umoci config --image "$oci:$version" "${config[@]}"
# Tagged with the full name: `podman load` (and containerd) name the image after it.
umoci tag --image "$oci:$version" "$repository:$version"
umoci rm --image "$oci:$version"
umoci gc --layout "$oci"

digest="$(python3 - "$oci" "$repository:$version" <<'PY'
import json, sys
oci, name = sys.argv[1:]
with open(f"{oci}/index.json") as f:
    index = json.load(f)
(m,) = [m for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == name]
print(m["digest"])
PY
)"

# The archive: the layout in one tar, as reproducible as the layer.
archive="$out/$IMAGE_NAME-$version.oci.tar"
tar -C "$oci" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 \
  --numeric-owner --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"

# ---------------------------------------------------------------- report
blob() { echo "$oci/blobs/sha256/${1#sha256:}"; }
compressed_bytes="$(python3 - "$oci" "$digest" <<'PY'
import json, os, sys
oci, digest = sys.argv[1:]
blob = lambda d: os.path.join(oci, "blobs", "sha256", d.split(":", 1)[1])
with open(blob(digest)) as f:
    m = json.load(f)
print(os.path.getsize(blob(digest)) + m["config"]["size"] + sum(l["size"] for l in m["layers"]))
PY
)"
[ -f "$(blob "$digest")" ]
cp "$work/rootfs.packages" "$out/packages.tsv"
echo "$digest" >"$out/digest"
cat >"$out/image.env" <<EOF
IMAGE_REPOSITORY=$repository
IMAGE_VERSION=$version
IMAGE_REVISION=$revision
IMAGE_DIGEST=$digest
IMAGE_CREATED=$created
IMAGE_SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH
IMAGE_COMPRESSED_BYTES=$compressed_bytes
IMAGE_UNPACKED_BYTES=$unpacked_bytes
IMAGE_ARCHIVE=$archive
EOF
rm -rf "$work"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "image: $repository:$version@$digest"
echo "image: $(mib "$compressed_bytes") compressed, $(mib "$unpacked_bytes") unpacked," \
  "$(wc -l <"$out/packages.tsv") Debian packages, built in $((SECONDS - started)) s"
echo "image: $archive (podman load -i ...), layout $oci"
