#!/usr/bin/env bash
# Checks that a program or a Python extension uses the shared libstdc++ and carries no copy of it.
# Usage: shared_libstdcxx_test.sh BINARY           check the program or module
#        shared_libstdcxx_test.sh --self-test CXX  check that the check fails on a module with
#                                                  libstdc++.a linked in (and passes without)
#
# Bagpipe's processes hold libstdc++.so.6 (oneTBB, Abseil, and PyTorch around the extension load
# it). A binary that defines libstdc++'s own functions (std::locale, std::ios_base, the
# std::ostream inserters: strong definitions, not the weak template copies every C++ object may
# carry) makes the process use two copies of libstdc++'s state, and the first number formatted
# through a stream may crash. cmake/BagpipeLibstdcxx.cmake links the shared library first.
set -euo pipefail

die() { echo "shared_libstdcxx_test: $*" >&2; exit 1; }

# Prints the strong dynamic definitions of $1 that libstdc++.so.6 (the one the process loads,
# through the binary or its dependencies) also exports, and a line when the binary itself does
# not load libstdc++.so.6.
copies_of_libstdcxx() {
  local binary="$1" shared
  # The binary's own libraries: without a preload (the sanitizer runs preload libstdc++, which
  # ldd would list on a line of its own, as "PATH (ADDRESS)").
  # The whole outputs are read (no early exit): a reader that stops at the first match can end
  # the writer by SIGPIPE, which pipefail would report as the check's own failure.
  shared="$(env -u LD_PRELOAD ldd "$binary" |
    awk '/libstdc\+\+\.so\.6/ && !found {print ($2 == "=>" ? $3 : $1); found = 1}')"
  if [ -z "$shared" ] || [ ! -e "$shared" ]; then
    die "ldd $binary: no libstdc++.so.6 among its libraries"
  fi
  # nm -D --defined-only: "ADDRESS TYPE NAME[@VERSION]"; W/V are weak, u unique, i indirect.
  nm -D --defined-only "$binary" | awk '$2 !~ /^[WVwvui]$/ {print $3}' | sort -u >"$tmp/binary"
  nm -D --defined-only "$shared" | awk '{sub(/@.*/, "", $3); print $3}' | sort -u >"$tmp/shared"
  comm -12 "$tmp/binary" "$tmp/shared"
  readelf -d "$binary" >"$tmp/dynamic"
  grep -q 'NEEDED.*\[libstdc++\.so\.6\]' "$tmp/dynamic" ||
    echo "(and the binary does not load libstdc++.so.6 itself: readelf -d $binary)"
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

check() {
  local module="$1" found
  [ -f "$module" ] || die "$module: no such file"
  found="$(copies_of_libstdcxx "$module")"
  if [ -n "$found" ]; then
    echo "FAIL: $module carries its own copy of libstdc++ ($(echo "$found" | wc -l) symbols):"
    echo "$found" | head -n 12 | sed 's/^/  /'
    echo "  (the C++ compiler linked libstdc++.a into it; link the shared libstdc++ first)"
    return 1
  fi
  echo "ok: $module uses the shared libstdc++.so.6 and defines none of its functions"
}

if [ "${1:-}" = --self-test ]; then
  cxx="${2:?usage: $0 --self-test CXX}"
  cat >"$tmp/m.cc" <<'CC'
#include <sstream>
#include <string>
std::string format_number(long value) {
  std::ostringstream out;
  out << value;
  return out.str();
}
CC
  # The shared libstdc++ as cmake/BagpipeLibstdcxx.cmake finds it, and links it: ahead of everything.
  shared=""
  for name in libstdc++.so libstdc++.so.6; do
    shared="$("$cxx" -print-file-name=$name)"
    if [[ "$shared" == /* && -e "$shared" ]]; then break; fi
    shared=""
  done
  [ -n "$shared" ] || { echo "SKIPPED: $cxx finds no shared libstdc++"; exit 77; }
  "$cxx" -shared -fPIC -O1 -Wl,--push-state,--no-as-needed "$shared" -Wl,--pop-state \
    -o "$tmp/shared.so" "$tmp/m.cc" || die "$cxx cannot build a shared module"
  check "$tmp/shared.so" || die "the check fails on a module linked with the shared libstdc++"
  # What a toolchain whose -lstdc++ finds the archive first does: libstdc++.a, then the shared
  # library (a dependency's).
  if ! "$cxx" -shared -fPIC -O1 -o "$tmp/static.so" "$tmp/m.cc" -Wl,-Bstatic -lstdc++ \
       -Wl,-Bdynamic -Wl,--no-as-needed "$shared" 2>"$tmp/err"; then
    echo "SKIPPED: $cxx cannot link libstdc++.a into a shared module: $(head -n 1 "$tmp/err")"
    exit 77
  fi
  if check "$tmp/static.so" >"$tmp/out"; then
    cat "$tmp/out"
    die "the check passed a module with libstdc++.a linked in"
  fi
  echo "ok: the check refuses a module with libstdc++.a linked in:"
  sed 's/^/  /' "$tmp/out"
  exit 0
fi

[ $# -eq 1 ] || die "usage: $0 BINARY | --self-test CXX"
check "$1"
