#!/usr/bin/env bash
# Builds the tests with a sanitizer and runs them; exits non-zero on any report.
# Usage: scripts/sanitize.sh asan|tsan
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer over the whole ctest suite.
#   tsan  ThreadSanitizer over the threaded components (ctest label `tsan`: the CPU streams'
#         executors, transports, prefetcher, servers, trainer, embedded jobs, checkpoints, the
#         DLRM loop, the equivalence and DLRM suites again in the asynchronous CPU stream
#         modes, the MPI smoke and shutdown tests) and two short `bagpipe train` jobs (embedded
#         with an emulated link, and under mpirun), with Abseil built from Debian's source
#         package (see below).
# CI (.ci/run) runs both; docs/sanitizers.md says what each covers and suppresses, and its time.
# Both build only what the tests need (no benchmarks, no CUDA) at -O1 with line tables.
#   BUILD_DIR (default build-asan / build-tsan), JOBS (default: all cores),
#   BAGPIPE_CACHE_DIR (default ${XDG_CACHE_HOME:-~/.cache}/bagpipe: where the Abseil source and,
#   with ccache installed, the compiled objects are kept between runs) may be set.
#
# Why ThreadSanitizer needs its own Abseil: Abseil's Mutex, CondVar and Notification report
# their locking to the sanitizer only when Abseil itself is compiled with -fsanitize=thread.
# Debian's libabsl is not, so every wait on them would be invisible and every report suspect.
# The stage fetches Debian's source package of the installed libabsl-dev (`apt-get source`,
# adding a deb-src entry for the configured Debian mirror when there is none) and compiles the
# Abseil libraries the project links as part of the build, with the project's flags.
# Two other libraries synchronise threads in code the sanitizer cannot see: oneTBB's scheduler
# and OpenBLAS's thread pool. The stage runs them on one thread (the process's CPU affinity is
# one core, which oneTBB follows; OPENBLAS_NUM_THREADS=1), so that every thread the sanitizer
# watches is one of Bagpipe's own. Open MPI is not instrumented either: its calls are exempt
# (scripts/sanitizers/tsan.supp), the transport's own locking around them is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

mode=${1:-}
case "$mode" in
  asan | tsan) ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan" >&2; exit 2 ;;
esac

scripts/setup.sh --with-sanitizers
jobs=${JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
supp="$root/scripts/sanitizers"

# Kept between runs (outside the clone): Abseil's source and, where ccache exists, the compiled
# objects of both stages. Without it everything is fetched and compiled again.
cache=${BAGPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bagpipe}
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then cache=""; fi

# Debian's source package of the installed libabsl-dev, unpacked once into the cache.
abseil_source() {
  local version dir work where=${cache:-$root/$build_dir}
  version=$(dpkg-query -W -f='${Version}' libabsl-dev)
  dir="$where/abseil-$version"
  if [ -f "$dir/.complete" ]; then echo "$dir"; return; fi
  echo "sanitize.sh: fetching the source of abseil $version into $dir" >&2
  if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "sanitize.sh: apt has no deb-src entry and this is not root: add one for Debian" >&2
      return 1
    fi
    # Source entries for the mirrors already configured for binary packages.
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
        >/etc/apt/sources.list.d/bagpipe-deb-src.sources
    else
      sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >/etc/apt/sources.list.d/bagpipe-deb-src.list
    fi
    apt-get update -qq >&2
  fi
  work=$(mktemp -d "$where/abseil.XXXXXX")
  # The exact version when the mirror still has it, else the current one of the same release.
  (cd "$work" && { apt-get source -qq "abseil=$version" || apt-get source -qq abseil; }) >&2
  rm -rf "$dir"
  mv "$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'abseil-*' | head -1)" "$dir"
  rm -rf "$work"
  touch "$dir/.complete"
  echo "$dir"
}

flags="-O1 -g1"
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$flags"
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$flags" -DBAGPIPE_CUDA=OFF -DBAGPIPE_BUILD_TESTS=ON
  -DBAGPIPE_BUILD_BENCHMARKS=OFF)
# LLVM's linker (package lld, installed by setup.sh --with-sanitizers) links the instrumented
# test programs several times faster than GNU ld.
if command -v ld.lld >/dev/null 2>&1; then
  common+=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
fi

# A compiler cache where ccache is installed and none is configured already.
if [ -n "$cache" ] && command -v ccache >/dev/null 2>&1 && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CCACHE_DIR="$cache/ccache" CCACHE_BASEDIR="$root" CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
  common+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

if [ "$mode" = asan ]; then
  build_dir=${BUILD_DIR:-build-asan}
  # A unity build (cmake/BagpipeUnity.cmake): the heavy headers parsed once per batch of sources.
  cmake -S . -B "$build_dir" "${common[@]}" -DBAGPIPE_SANITIZE=address,undefined \
    -DCMAKE_UNITY_BUILD=ON
  cmake --build "$build_dir" -j "$jobs"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  # Processes started by mpirun only (Open MPI sets these variables in what it launches): what
  # Open MPI's plugins and PMIx allocate in MPI_Init and keep is reported at exit, after
  # MPI_Finalize unloaded them; the default (frame-pointer) unwinder stops in those
  # uninstrumented plugins, leaving a one-frame stack in an `<unknown module>` that no
  # suppression can name. The full (DWARF) unwinder follows the stack into libmpi.so, which
  # lsan.supp names. It makes every allocation slower, so only MPI ranks pay for it.
  export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0"
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  failed=0
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900 --no-tests=error \
    -LE python || failed=1
  # The Python package's suites: the interpreter is not instrumented, so the runtime is
  # preloaded for the instrumented extension module to load; CPython and PyTorch keep memory
  # until exit by design, so leaks are not checked in these processes, nor in the Python ranks
  # that test_mpi.py starts under mpirun. libstdc++ is preloaded after the runtime: CPython does
  # not link it, so when the runtime starts it finds no __cxa_throw to forward its interceptor
  # to, and the first C++ exception the module throws (an error raised to Python) would stop the
  # process in an ASan CHECK ("real___cxa_throw != 0") instead.
  if ctest --test-dir "$build_dir" -N -L python | grep -q 'Total Tests: [1-9]'; then
    LD_PRELOAD="$(${CXX:-c++} -print-file-name=libasan.so) $(${CXX:-c++} -print-file-name=libstdc++.so.6)" \
      ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
      OMPI_MCA_mca_base_env_list="ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0" \
      ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900 -L python || failed=1
  fi
  exit $failed
fi

build_dir=${BUILD_DIR:-build-tsan}
mkdir -p "$build_dir"
absl_dir=$(abseil_source)
cmake -S . -B "$build_dir" "${common[@]}" -DBAGPIPE_SANITIZE=thread \
  "-DBAGPIPE_ABSL_SOURCE_DIR=$absl_dir"
# The test programs labelled `tsan` (tests/*/CMakeLists.txt) and the bagpipe command.
targets=(bagpipe device_test transport_test mpi_smoke_test mpi_shutdown_test prefetcher_test
  embedding_server_test equivalence_test checkpoint_test dlrm_loop_test)
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"

# history_size=7: the longest access history, so that the other stack of a report is restored
# (a report whose stack is lost cannot be matched by a suppression, nor read).
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$supp/tsan.supp"
export OPENBLAS_NUM_THREADS=1
# Open MPI's TCP transport between the ranks of a machine instead of its shared-memory one
# (vader): vader's uninstrumented plugin copies message fragments through memory that every
# thread calling MPI touches, so each fragment copy is a race the sanitizer reports and the
# suppressions then drop, at a cost (symbolising both stacks) that made mpi_shutdown_test's
# 1 MiB messages take over 60 s on one core. Over TCP the bytes move by system calls; the
# transport's own threads and locks are checked the same way.
export OMPI_MCA_btl=self,tcp
one_core=(taskset -c "$(taskset -pc $$ | sed 's/.*: //; s/[,-].*//')")
# Label tsan, and the suites that run again in the asynchronous CPU stream modes (cpu_streams:
# the equivalence suite and the DLRM loop; issue 19: a missing stream wait is a race there).
"${one_core[@]}" ctest --test-dir "$build_dir" -L 'tsan|cpu_streams' -LE python \
  --output-on-failure -j "$jobs" --timeout 900 --no-tests=error

# Whole jobs: every role a thread (two trainers, two servers, an emulated link), then mpirun.
out=$(mktemp -d "${TMPDIR:-/tmp}/bagpipe-tsan.XXXXXX")
trap 'rm -rf "$out"' EXIT
train=(--data synthetic:samples=4096,tables=4,rows=2000 --batch-size 256 --iterations 12
  --cache-rows 600 --lookahead 4 --eval-fraction 0.25 --quiet)
"${one_core[@]}" "$build_dir/bagpipe" train "${train[@]}" --trainers 2 --servers 2 \
  --server-link 10Gbit/s,20us --summary-json "$out/embedded.json"
"${one_core[@]}" mpirun -np 5 --oversubscribe "$build_dir/bagpipe" train "${train[@]}" \
  --servers 2 --summary-json "$out/mpirun.json"
echo "sanitize.sh: ThreadSanitizer found nothing"
