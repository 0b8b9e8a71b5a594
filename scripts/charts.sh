#!/usr/bin/env bash
# `make charts`: the Helm charts packaged for a release, pinned to the image `make
# image` built: appVersion (and the chart version) = the workspace version, and the
# default image.tag = "<version>@sha256:<digest>", so a cluster runs exactly the image
# that was built and tested, from whichever registry image.hub names.
#
# Usage: scripts/charts.sh
# Environment: IMAGE_OUT (default target/image), CHARTS_OUT (default target/charts),
#   CHARTS_URL (the URL index.yaml gives for the archives; default the project's
#   GitHub Pages site).
# Output (CHARTS_OUT): <chart>-<version>.tgz for each chart, base (the CRDs) included
#   (`helm push <tgz> oci://<registry>/<path>` as they are), and index.yaml (a classic
#   Helm repository: serve the directory).
#
# Only values.yaml's image.tag changes in the packaged copy: the charts'
# values.schema.json already accepts the <tag>@sha256:<digest> form (the template
# writes `<hub>/<name>:<tag>`, which is then `...:<version>@sha256:...`); this script
# checks that it does. Chart base runs no image and is packaged as it is.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export LC_ALL=C
image_out="${IMAGE_OUT:-$root/target/image}"
out="${CHARTS_OUT:-$root/target/charts}"
url="${CHARTS_URL:-https://ambient-rs.github.io/ambient-rs/charts}"
HELM="${HELM:-helm}"
# In install order: base (the CRDs) first. image_charts run the image.
charts=(base istiod-lite cni ztunnel)
image_charts=(istiod-lite cni ztunnel)

[ -f "$image_out/image.env" ] || {
  echo "charts: no image in $image_out: run make image first" >&2
  exit 1
}
# shellcheck disable=SC1091
. "$image_out/image.env"
command -v "$HELM" >/dev/null || {
  echo "charts: helm not found (scripts/install-chart-tools.sh)" >&2
  exit 1
}

rm -rf "$out"
stage="$out/.stage"
mkdir -p "$stage"
runs_image() {
  local c
  for c in "${image_charts[@]}"; do [ "$c" = "$1" ] && return 0; done
  return 1
}
for chart in "${charts[@]}"; do
  cp -a "manifests/charts/$chart" "$stage/$chart"
  if ! runs_image "$chart"; then
    # The chart must agree with the workspace version, as the others.
    grep -qE "^appVersion: \"?$IMAGE_VERSION\"?\$" "$stage/$chart/Chart.yaml" || {
      echo "charts: $chart/Chart.yaml appVersion is not the workspace version $IMAGE_VERSION" >&2
      exit 1
    }
    "$HELM" lint --strict "$stage/$chart" >/dev/null
    "$HELM" package "$stage/$chart" --version "$IMAGE_VERSION" --app-version "$IMAGE_VERSION" \
      --destination "$out" >/dev/null
    continue
  fi
  python3 - "$stage/$chart" "$IMAGE_VERSION" "$IMAGE_DIGEST" <<'PY'
import json, re, sys
chart, version, digest = sys.argv[1:]
if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
    sys.exit(f"charts: {digest!r} is no sha256 digest")
# Chart.yaml: the release's appVersion (helm package --app-version sets it too; this
# checks the chart agreed with the workspace before).
meta = open(f"{chart}/Chart.yaml").read()
app = re.search(r'^appVersion:\s*"?([^"\n]+)"?\s*$', meta, re.M)
if not app or app.group(1) != version:
    sys.exit(f"charts: {chart}/Chart.yaml appVersion {app and app.group(1)!r} is not "
             f"the workspace version {version!r}")
# values.yaml: the image block's tag, pinned. A line edit keeps the comments.
values = open(f"{chart}/values.yaml").read()
pinned, n = re.subn(r'^(image:\n(?:  .*\n|\s*#.*\n)*?  tag: )""$',
                    rf'\g<1>"{version}@{digest}"', values, count=1, flags=re.M)
if n != 1:
    sys.exit(f"charts: no image.tag: \"\" in {chart}/values.yaml")
pinned = pinned.replace(
    f'  # Empty: the chart\'s appVersion.\n  tag: "{version}@',
    f'  # Pinned by make charts: the image this release was built and tested as.\n  tag: "{version}@', 1)
open(f"{chart}/values.yaml", "w").write(pinned)
# values.schema.json, unchanged: its image.tag pattern must accept the pinned tag
# (helm lint --strict below checks the packaged values against it too).
schema = json.load(open(f"{chart}/values.schema.json"))
pattern = schema["properties"]["image"]["properties"]["tag"].get("pattern", "")
if not re.search(pattern, f"{version}@{digest}"):
    sys.exit(f"charts: {chart}'s image.tag pattern {pattern!r} refuses "
             f"{version}@{digest}: allow <tag>@sha256:<hex> in values.schema.json")
PY
  "$HELM" lint --strict "$stage/$chart" >/dev/null
  "$HELM" package "$stage/$chart" --version "$IMAGE_VERSION" --app-version "$IMAGE_VERSION" \
    --destination "$out" >/dev/null
  # The packaged chart renders the pinned image.
  rendered="$("$HELM" template x "$out/$chart-$IMAGE_VERSION.tgz" | grep -m1 'image: ')"
  want="$IMAGE_REPOSITORY:$IMAGE_VERSION@$IMAGE_DIGEST"
  case "$rendered" in
    *"\"$want\""*) ;;
    *)
      echo "charts: $chart renders $rendered, not $want" >&2
      exit 1
      ;;
  esac
done
rm -rf "$stage"
"$HELM" repo index "$out" --url "$url"
for chart in "${charts[@]}"; do
  if runs_image "$chart"; then
    echo "charts: $out/$chart-$IMAGE_VERSION.tgz (image $IMAGE_REPOSITORY:$IMAGE_VERSION@$IMAGE_DIGEST)"
  else
    echo "charts: $out/$chart-$IMAGE_VERSION.tgz"
  fi
done
echo "charts: $out/index.yaml"
