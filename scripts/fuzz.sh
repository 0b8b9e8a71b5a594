#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets, one crate for all of them) for
# FUZZ_SECS seconds each (default 60), starting from its checked-in seed corpus.
# New inputs go to target/fuzz-corpus, so the checked-in seeds stay as reviewed.
# A crash fails the run (after every target has had its turn); libFuzzer saves the
# input under fuzz/artifacts/<target>/.
# FUZZ_BUILD passes build options to cargo fuzz: CI uses `--dev`, which builds in a
# fraction of the time and still runs every seed; real fuzzing wants the default release.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECS:-60}"
read -r -a build <<<"${FUZZ_BUILD:-}"

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain (cargo fuzz needs one): rustup toolchain install nightly" >&2
  exit 1
fi
./scripts/install-cargo-tools.sh

export CARGO_TARGET_DIR="$PWD/target/fuzz"
fuzz_dir=fuzz
# Every target first, in one cargo run: they share one dependency build.
cargo +nightly fuzz build "${build[@]}" --fuzz-dir "$fuzz_dir"
summary=()
failed=0
for target in $(cargo +nightly fuzz list --fuzz-dir "$fuzz_dir"); do
  work="target/fuzz-corpus/$target"
  mkdir -p "$work"
  echo "fuzz: $target for ${secs}s"
  log="target/fuzz-corpus/$target.log"
  if ! cargo +nightly fuzz run "${build[@]}" --fuzz-dir "$fuzz_dir" "$target" \
      "$work" "$fuzz_dir/corpus/$target" \
      -- -max_total_time="$secs" -print_final_stats=1 2>"$log"; then
    grep -A12 -m1 'panicked at\|ERROR: libFuzzer' "$log" >&2 || tail -40 "$log" >&2
    summary+=("$target: FAILED, input saved under $fuzz_dir/artifacts/$target/")
    failed=1
    continue
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  edges=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  summary+=("$target: $runs runs, $edges edges, no crash")
done
printf 'fuzz: %s\n' "${summary[@]}"
exit "$failed"
