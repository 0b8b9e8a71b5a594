#!/usr/bin/env bash
# Assembles the ambient-rs image's root filesystem in a directory, from Debian
# bookworm's packages and the release binaries. `make image` (scripts/image/build.sh)
# and the Dockerfile's rootfs stage both run it, so both images hold the same files.
#
# Usage: scripts/image/rootfs.sh OUT_DIR BIN_DIR [APT_DIR]
#   OUT_DIR  the root filesystem to write (emptied first)
#   BIN_DIR  where the release binaries are (target/release)
#   APT_DIR  apt's private lists and .deb cache (default OUT_DIR.apt); kept between
#            builds, so a rebuild downloads only what changed
# Environment: DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR (e.g. a snapshot.debian.org URL
# for a build pinned in time), SOURCE_DATE_EPOCH (every file's mtime; default 0),
# IMAGE_APT_OFFLINE=1 (no download: APT_DIR's lists and .debs as they are).
#
# Not debootstrap: the image holds no shell and no package manager, so the packages
# are only unpacked (dpkg-deb -x) and what their maintainer scripts would do is done
# here (update-alternatives links, the CA bundle, merged /usr). apt, in a private
# state directory, resolves the dependencies; the host's own apt state is untouched.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/image/contents.sh
. "$here/contents.sh"

out="${1:?usage: rootfs.sh OUT_DIR BIN_DIR [APT_DIR]}"
bin_dir="${2:?usage: rootfs.sh OUT_DIR BIN_DIR [APT_DIR]}"
apt_dir="${3:-$out.apt}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security_mirror="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
epoch="${SOURCE_DATE_EPOCH:-0}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
export LC_ALL=C

for b in "${BINARIES[@]}"; do
  [ -x "$bin_dir/$b" ] || {
    echo "rootfs.sh: $bin_dir/$b is missing (cargo build --release --bins)" >&2
    exit 1
  }
done
[ -f "$keyring" ] || {
  echo "rootfs.sh: $keyring missing (apt-get install debian-archive-keyring)" >&2
  exit 1
}

# ---------------------------------------------------------------- resolve and download
mkdir -p "$apt_dir"/{etc/apt.conf.d,etc/preferences.d,lists/partial,archives/partial,cache}
: >"$apt_dir/status"
cat >"$apt_dir/etc/sources.list" <<EOF
deb [signed-by=$keyring] $mirror $SUITE main
deb [signed-by=$keyring] $mirror $SUITE-updates main
deb [signed-by=$keyring] $security_mirror $SUITE-security main
EOF
apt_opts=(
  -o "Dir::Etc=$apt_dir/etc"
  -o "Dir::Etc::sourcelist=$apt_dir/etc/sources.list"
  -o "Dir::Etc::sourceparts=-"
  -o "Dir::Etc::parts=$apt_dir/etc/apt.conf.d"
  -o "Dir::Etc::preferencesparts=$apt_dir/etc/preferences.d"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::State::status=$apt_dir/status"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::Cache::archives=$apt_dir/archives"
  -o "APT::Architecture=$ARCH"
  -o "APT::Architectures=$ARCH"
  -o "APT::Install-Recommends=false"
  -o "APT::Install-Suggests=false"
  -o "Debug::NoLocking=true"
)
# IMAGE_APT_OFFLINE=1: the lists and .debs already in APT_DIR, as they are (a rebuild
# from exactly the same packages, e.g. the reproducibility test's).
if [ "${IMAGE_APT_OFFLINE:-}" != 1 ]; then
  apt-get "${apt_opts[@]}" -qq update
fi
# The dependency closure as apt would install it on an empty system, with the version
# of each (Essential packages are assumed, as everywhere: none is in the closure).
declare -A version_of=()
closure=()
while read -r p v; do
  closure+=("$p")
  version_of[$p]="$v"
done < <(apt-get "${apt_opts[@]}" -s install -y "${PACKAGES[@]}" |
  awk '$1 == "Inst" { gsub(/[()]/, "", $3); print $2, $3 }' | sort)
if [ "${IMAGE_APT_OFFLINE:-}" != 1 ]; then
  apt-get "${apt_opts[@]}" -qq install --download-only -y "${PACKAGES[@]}" >/dev/null
fi

selected=()
for p in "${closure[@]}"; do
  skip=false
  for x in "${EXCLUDED[@]}"; do [ "$p" = "$x" ] && skip=true; done
  $skip || selected+=("$p")
done
for x in "${EXCLUDED[@]}"; do
  printf '%s\n' "${closure[@]}" | grep -qx "$x" || {
    echo "rootfs.sh: $x is excluded but no longer a dependency: update contents.sh" >&2
    exit 1
  }
done

# ---------------------------------------------------------------- unpack
rm -rf "$out"
mkdir -p "$out"
mkdir -p "$out/var/lib/dpkg/status.d"
: >"$out.packages"
for p in "${selected[@]}"; do
  # The one .deb of the version apt chose.
  version="${version_of[$p]}"
  deb="$(find "$apt_dir/archives" -maxdepth 1 -name "${p}_${version//:/%3a}_*.deb" | head -n1)"
  [ -n "$deb" ] || {
    echo "rootfs.sh: no .deb of $p $version in $apt_dir/archives" >&2
    exit 1
  }
  dpkg-deb -x "$deb" "$out"
  # What scanners (syft, trivy) read in distroless images: one control file per package.
  dpkg-deb -f "$deb" >"$out/var/lib/dpkg/status.d/$p"
  source_pkg="$(dpkg-deb -f "$deb" Source | sed 's/ .*//')"
  printf '%s\t%s\t%s\t%s\n' "$p" "$version" "$(dpkg-deb -f "$deb" Architecture)" \
    "${source_pkg:-$p}" >>"$out.packages"
done

# ---------------------------------------------------------------- what maintainer scripts do
# Merged /usr, as bookworm's debootstrap makes it (relative links: the root is also
# read from outside by the kubelet stand-in).
for d in bin sbin lib lib32 lib64 libx32; do
  if [ -d "$out/$d" ] && [ ! -L "$out/$d" ]; then
    mkdir -p "$out/usr/$d"
    cp -a "$out/$d/." "$out/usr/$d/"
    rm -rf "${out:?}/$d"
  fi
done
for d in bin sbin lib lib64; do
  mkdir -p "$out/usr/$d"
  ln -s "usr/$d" "$out/$d"
done

# iptables' postinst: update-alternatives, with Debian's default (nft, priority 20 over
# legacy's 10). The agent itself runs the backend-named binaries.
mkdir -p "$out/etc/alternatives"
for t in iptables ip6tables; do
  for s in "" -save -restore; do
    ln -s "/usr/sbin/$t-nft$s" "$out/etc/alternatives/$t$s"
    ln -s "../../etc/alternatives/$t$s" "$out/usr/sbin/$t$s"
  done
done

# ca-certificates' postinst (update-ca-certificates): the bundle of every certificate
# the package ships, in the order of /etc/ca-certificates.conf.
(
  cd "$out/usr/share/ca-certificates"
  find . -name '*.crt' | sed 's|^\./||' | sort >"$out/etc/ca-certificates.conf"
  while read -r crt; do
    cat "$crt"
    # update-ca-certificates ends every certificate with a newline.
    [ -z "$(tail -c1 "$crt")" ] || echo
  done <"$out/etc/ca-certificates.conf"
) >"$out/etc/ssl/certs/ca-certificates.crt"

# The users the charts run as: root (the agent, ztunnel) and 1337 (istiod-lite, as
# Istio's istio-proxy user).
cat >"$out/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
istio-proxy:x:1337:1337:istio-proxy:/nonexistent:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
EOF
cat >"$out/etc/group" <<'EOF'
root:x:0:
istio-proxy:x:1337:
nogroup:x:65534:
EOF
chmod 0644 "$out/etc/passwd" "$out/etc/group"
cp "$out/usr/lib/os-release" "$out/etc/os-release" 2>/dev/null || true

# Directories a runtime mounts over, and the FHS ones programs expect.
install -d -m 0755 "$out"/{dev,proc,sys,run,etc,var/lib,usr/local/bin}
install -d -m 1777 "$out/tmp"
install -d -m 0700 "$out/root"
ln -s ../run "$out/var/run"

# Not needed at run time: documentation (the copyright files stay: the licenses),
# manual pages, locales, lintian overrides, shell completions, and glibc's iconv
# modules (nothing here converts character sets).
find "$out/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
find "$out/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$out"/usr/share/{man,info,locale,lintian,bash-completion,pixmaps} \
  "$out/usr/lib/$ARCH_TRIPLET/gconv"

# ---------------------------------------------------------------- the binaries
# Without their DWARF line tables (three quarters of a release binary: the release
# profile keeps them for local backtraces); the symbols stay, so a panic's backtrace
# still names its functions.
for b in "${BINARIES[@]}"; do
  strip --strip-debug -o "$out/usr/local/bin/$b" "$bin_dir/$b"
  chmod 0755 "$out/usr/local/bin/$b"
done

# Every mtime the same, so a tar or a COPY of the tree is the same every time.
find "$out" -exec touch -h -d "@$epoch" {} +
sort -o "$out.packages" "$out.packages"
echo "rootfs: $out ($(du -sh "$out" | cut -f1)), ${#selected[@]} packages ($out.packages)"
