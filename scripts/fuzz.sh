#!/usr/bin/env bash
# CI stage: builds the fuzz harnesses of tests/fuzz with clang, libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer in their own build directory (every library they link instrumented),
# then runs each harness for a bounded time on its seeds (cut from tests/fixtures and generated)
# and the committed regression inputs. Fails on any crash, sanitizer report, timeout, allocation
# over 2 GB or broken invariant; the input is kept in BUILD/findings/ (fix the bug, then commit
# the input to tests/fuzz/regressions/<harness>/ so that ctest replays it).
# Usage: scripts/fuzz.sh [SECONDS_PER_HARNESS]   (default 30; FUZZ_SECONDS also sets it)
#   FUZZ_BUILD_DIR (default build-fuzz), FUZZ_PARALLEL harnesses at a time (default: cores, max 2),
#   FUZZ_HARNESSES (default: all), CC_FUZZ / CXX_FUZZ (default clang / clang++), FUZZ_SEED
#   (libFuzzer's -seed, default 1: CI explores the same inputs run to run; pick others to explore).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
seconds=${1:-${FUZZ_SECONDS:-30}}
seed=${FUZZ_SEED:-1}
build=${FUZZ_BUILD_DIR:-build-fuzz}
harnesses=${FUZZ_HARNESSES:-"criteo csv binary params plan_codec wire checkpoint specs"}
cores=$(nproc)
parallel=${FUZZ_PARALLEL:-$((cores < 2 ? cores : 2))}

scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DBAGPIPE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBAGPIPE_BUILD_TESTS=OFF -DBAGPIPE_BUILD_BENCHMARKS=OFF \
  -DCMAKE_C_COMPILER="${CC_FUZZ:-clang}" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" >/dev/null
mkdir -p "$build"
if ! cmake --build "$build" -j "$cores" >"$build/build.log" 2>&1; then
  tail -40 "$build/build.log"
  echo "fuzz.sh: the fuzz build failed (log: $build/build.log)"
  exit 1
fi
built=$(date +%s)

bin="$build/tests/fuzz"
rm -rf "$build/seeds" "$build/findings" "$build/logs"
mkdir -p "$build/findings" "$build/logs"
"$bin/fuzz_seeds" "$build/seeds" .

# LeakSanitizer needs ptrace, which containers often lack: leaks are then not checked.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
if ! ASAN_OPTIONS=detect_leaks=1 "$bin/wire_fuzz" -runs=1 "$build/seeds/wire" \
    >"$build/logs/lsan_probe" 2>&1; then
  echo "fuzz.sh: LeakSanitizer cannot run here (no ptrace?); fuzzing without leak checks"
  export ASAN_OPTIONS=detect_leaks=0
fi

run() {
  local harness=$1
  local corpus="$build/corpus/$harness"
  local inputs=("$corpus" "$build/seeds/$harness")
  [[ -d tests/fuzz/regressions/$harness ]] && inputs+=("tests/fuzz/regressions/$harness")
  mkdir -p "$corpus"
  local max_len=16384
  [[ $harness == params ]] && max_len=80000
  if "$bin/${harness}_fuzz" -max_total_time="$seconds" -seed="$seed" -timeout=10 -rss_limit_mb=2048 \
      -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$build/findings/$harness-" \
      "${inputs[@]}" >"$build/logs/$harness" 2>&1; then
    echo "ok   $harness: $(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' \
      "$build/logs/$harness" | grep -o '[0-9]*$') inputs, coverage $(grep -o 'cov: [0-9]*' \
      "$build/logs/$harness" | tail -1 | grep -o '[0-9]*$') edges"
  else
    echo "FAIL $harness (log: $build/logs/$harness; input: $build/findings/$harness-*)"
    grep -E -m5 'ERROR|runtime error|invariant|Test unit written' "$build/logs/$harness" | sed 's/^/    /'
    return 1
  fi
}

failures=0
running=0
for harness in $harnesses; do
  run "$harness" >"$build/logs/$harness.result" &
  running=$((running + 1))
  if [[ $running -ge $parallel ]]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true
for harness in $harnesses; do
  cat "$build/logs/$harness.result"
  grep -q '^FAIL' "$build/logs/$harness.result" && failures=$((failures + 1))
done
end=$(date +%s)
echo "fuzz.sh: build $((built - start)) s, fuzzing $((end - built)) s ($seconds s per harness," \
  "$parallel at a time), total $((end - start)) s"
if [[ $failures -gt 0 ]]; then
  echo "fuzz.sh: $failures harness(es) failed"
  exit 1
fi
