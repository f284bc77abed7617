#!/usr/bin/env bash
# Sets up, builds and runs every test (GoogleTest suites and the MPI suites under mpirun).
# Exits non-zero on any failure. Usage: scripts/test.sh [extra cmake -D options]
#   BUILD_DIR (default build), JOBS (default: all cores) may be set in the environment, and
#   UNITY (default ON: a unity build, cmake/BagpipeUnity.cmake, which compiles the whole tree in
#   about three quarters of the time; OFF: every source file on its own, as an IDE build does).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
# mpirun refuses to run as root without these; oversubscription lets MPI tests use more ranks
# than cores (CI has 2). vader's single-copy mechanism needs ptrace rights containers lack.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBAGPIPE_BUILD_TESTS=ON \
  -DBAGPIPE_BUILD_BENCHMARKS=ON "-DCMAKE_UNITY_BUILD=${UNITY:-ON}" "$@"
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900
