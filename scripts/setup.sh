#!/usr/bin/env bash
# Installs the Debian packages Bagpipe needs to build and test, only those missing, after
# printing their names. Idempotent; non-interactive; needs root or password-less sudo.
# Usage: scripts/setup.sh [--with-plots] [--with-sanitizers]
#   --with-plots      also installs python3-matplotlib for scripts/plot_*.py
#   --with-sanitizers also installs dpkg-dev (scripts/sanitize.sh unpacks Abseil's source package)
#                     and lld (it links the sanitizer builds)
# Environment:
#   BAGPIPE_NO_APT=1  install nothing, for machines where you manage packages yourself: print the
#                     Debian packages that are missing (if dpkg exists) and exit 0, so that the
#                     build goes ahead with whatever provides them; CMake then stops with the
#                     name of any dependency it cannot find.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config procps
  libtbb-dev libabsl-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libopenblas-dev libssl-dev libxxhash-dev libisal-dev
  # The Python package (python/) and its tests: Debian's /usr/bin/python3 with these.
  python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-numpy python3-pytest python3-torch
  clang libclang-rt-dev  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes
)
# The end-to-end tests and bench scripts read JSON with python3 (any python3 will do).
command -v python3 >/dev/null 2>&1 || packages+=(python3)
for arg in "$@"; do
  case "$arg" in
    --with-plots) packages+=(python3-matplotlib) ;;
    --with-sanitizers) packages+=(dpkg-dev lld) ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

no_apt=${BAGPIPE_NO_APT:-0}
if ! command -v dpkg-query >/dev/null 2>&1; then
  if [ "$no_apt" = 1 ]; then
    echo "setup.sh: BAGPIPE_NO_APT=1 and no dpkg: not checking packages (needed: ${packages[*]})"
    exit 0
  fi
  echo "setup.sh: dpkg-query is not available (not Debian?). Install the equivalents of:" >&2
  echo "  ${packages[*]}" >&2
  echo "then run with BAGPIPE_NO_APT=1." >&2
  exit 1
fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#packages[@]} packages present"
  exit 0
fi
if [ "$no_apt" = 1 ]; then
  echo "setup.sh: BAGPIPE_NO_APT=1: not installing; these Debian packages are missing:"
  echo "  ${missing[*]}"
  echo "setup.sh: going on; the build needs what they provide (CMake names what it cannot find)"
  exit 0
fi

echo "setup.sh: will install ${#missing[@]} missing Debian package(s) with apt-get:"
echo "  ${missing[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup.sh: apt-get is not available; install these packages with your package manager:" >&2
  echo "  ${missing[*]}" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo)
  else
    echo "setup.sh: not root and no password-less sudo; as root run:" >&2
    echo "  apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup.sh: done"
