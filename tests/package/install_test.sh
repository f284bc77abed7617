#!/usr/bin/env bash
# Installs the build into a fresh prefix and builds and runs examples/cpp_loop against it, as a
# user of the package would. Checks the installed layout, `bagpipe --version`, that a version
# outside the package's compatibility range is refused, that C++-only and C + C++ projects both
# find it, and the example's output: three epochs whose loss falls, and a cache that hits.
# Components are accepted by name (an unknown one is refused by name), a failed find leaves the
# caller's CMAKE_MODULE_PATH as it was, and the Python package (where built) is installed and
# imports from the prefix with its version.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR CMAKE GENERATOR VERSION C_COMPILER CXX_COMPILER
#        python=[PYTHON]   (empty: the build has no Python package)
set -euo pipefail
build=$1 src=$2 cmake=$3 generator=$4 version=$5 cc=$6 cxx=$7 python=${8#python=}
work=$(mktemp -d "${TMPDIR:-/tmp}/bagpipe_package_test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install"; }
for f in bin/bagpipe include/trainer_hooks/trainer.h include/core/version.h \
         include/oracle/planner.h; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
config=$(find "$prefix" -name BagpipeConfig.cmake)
[ -n "$config" ] || fail "no BagpipeConfig.cmake under $prefix"
[ -n "$(find "$prefix" -name 'libbagpipe_trainer_hooks.a')" ] || fail "no component library"
"$prefix/bin/bagpipe" --version | tee "$work/version.txt"
grep -q "^bagpipe $version " "$work/version.txt" || fail "bagpipe --version does not say $version"

configure() {  # configure DIR [cmake args...]
  local dir=$1; shift
  "$cmake" -S "$dir" -B "$work/$(basename "$dir")-build" -G "$generator" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_PREFIX_PATH="$prefix" "$@"
}

# A version the package does not claim to be compatible with is refused.
mkdir -p "$work/wrong_version"
cat >"$work/wrong_version/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(wrong_version LANGUAGES CXX)
find_package(Bagpipe 99.0 CONFIG REQUIRED)
CMAKE
if configure "$work/wrong_version" >"$work/wrong_version.log" 2>&1; then
  fail "find_package(Bagpipe 99.0) succeeded"
fi
grep -q "Bagpipe" "$work/wrong_version.log" || { cat "$work/wrong_version.log"; fail "no message"; }

# A project with C enabled finds MPI through its C component (the example below is C++ only).
mkdir -p "$work/with_c"
cat >"$work/with_c/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(with_c LANGUAGES C CXX)
find_package(Bagpipe CONFIG REQUIRED COMPONENTS trainer_hooks oracle)
add_library(with_c INTERFACE)
target_link_libraries(with_c INTERFACE Bagpipe::trainer_hooks)
CMAKE
configure "$work/with_c" >"$work/with_c.log" 2>&1 || { cat "$work/with_c.log"; fail "C + C++ project"; }

# An unknown component is named; a dependency not found leaves CMAKE_MODULE_PATH as it was.
mkdir -p "$work/unknown_component"
cat >"$work/unknown_component/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(unknown_component LANGUAGES CXX)
find_package(Bagpipe CONFIG REQUIRED COMPONENTS trainer_hooks nosuch)
CMAKE
if configure "$work/unknown_component" >"$work/unknown_component.log" 2>&1; then
  fail "find_package(Bagpipe COMPONENTS nosuch) succeeded"
fi
grep -q "Bagpipe has no component 'nosuch' (components: core, data" "$work/unknown_component.log" ||
  { cat "$work/unknown_component.log"; fail "unknown component: no message naming it"; }
mkdir -p "$work/module_path"
cat >"$work/module_path/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(module_path LANGUAGES CXX)
set(CMAKE_MODULE_PATH "${CMAKE_SOURCE_DIR}/mine")
find_package(Bagpipe CONFIG QUIET)
message(STATUS "found=${Bagpipe_FOUND} module path=${CMAKE_MODULE_PATH}")
CMAKE
configure "$work/module_path" -DCMAKE_DISABLE_FIND_PACKAGE_ISAL=TRUE >"$work/module_path.log" 2>&1 ||
  { cat "$work/module_path.log"; fail "module_path project"; }
grep -Eq "found=(0|FALSE) module path=$work/module_path/mine$" "$work/module_path.log" ||
  { cat "$work/module_path.log"; fail "a failed find_package(Bagpipe) changed CMAKE_MODULE_PATH"; }

if [ -n "$python" ]; then
  site=$prefix/lib/python3/dist-packages
  [ -e "$site/bagpipe/__init__.py" ] || fail "the Python package is not installed in $site"
  (cd "$work" && PYTHONPATH=$site "$python" -c "import bagpipe; print(bagpipe.__version__)") \
    >"$work/python.txt" 2>&1 || { cat "$work/python.txt"; fail "import bagpipe from $site"; }
  [ "$(cat "$work/python.txt")" = "$version" ] ||
    fail "bagpipe.__version__ is '$(cat "$work/python.txt")', expected $version"
  # The sources' python/ (no extension there) is named as such, not as a circular import.
  if (cd "$work" && PYTHONPATH=$src/python "$python" -c "import bagpipe") >"$work/src.txt" 2>&1; then
    fail "import bagpipe from the sources' python/ succeeded"
  fi
  grep -q "compiled extension (_core) cannot be imported" "$work/src.txt" ||
    { cat "$work/src.txt"; fail "importing the sources' python/: unclear message"; }
  echo "python package: $site (bagpipe $version)"
fi

# The example project, outside this build, against the installed package only.
configure "$src/examples/cpp_loop"
"$cmake" --build "$work/cpp_loop-build"
"$work/cpp_loop-build/cpp_loop" "$src/tests/fixtures/movielens_small.csv" | tee "$work/out.txt"

grep -q "^cpp_loop (Bagpipe $version)" "$work/out.txt" || fail "no banner with the version"
mapfile -t losses < <(sed -n 's/^epoch [0-9]*: mean training loss \([0-9.]*\)$/\1/p' "$work/out.txt")
[ "${#losses[@]}" -eq 3 ] || fail "expected 3 epoch losses, got ${#losses[@]}"
awk -v a="${losses[0]}" -v c="${losses[2]}" 'BEGIN { exit !(c < a && c > 0) }' ||
  fail "the loss did not fall: ${losses[*]}"
mapfile -t hits < <(sed -n 's/^trainer [0-9]*: [0-9]* iterations, hit rate \([0-9.]*\)%.*/\1/p' "$work/out.txt")
[ "${#hits[@]}" -eq 2 ] || fail "expected 2 trainers, got ${#hits[@]}"
for h in "${hits[@]}"; do
  awk -v h="$h" 'BEGIN { exit !(h > 50) }' || fail "hit rate $h% is not above 50%"
done
echo "package install test: OK"
