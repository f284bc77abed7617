#!/usr/bin/env bash
# Replays every fuzz harness over its generated seeds and its committed regression inputs
# (regressions/<harness>/), without libFuzzer. Usage: replay.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/fuzz_seeds" "$work" "$src"
for harness in criteo csv binary params plan_codec wire checkpoint specs; do
  inputs=("$work/$harness")
  if [[ -d "$src/tests/fuzz/regressions/$harness" ]]; then
    inputs+=("$src/tests/fuzz/regressions/$harness")
  fi
  echo "== $harness"
  "$build/${harness}_replay" "${inputs[@]}" 2>"$work/$harness.log" || {
    echo "FAIL $harness: the last input replayed:"
    tail -5 "$work/$harness.log"
    exit 1
  }
done
echo "all harnesses replayed their seeds and regressions"
