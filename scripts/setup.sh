#!/usr/bin/env bash
# Installs the Debian packages Bagpipe needs to build and test, only those missing.
# Idempotent; non-interactive. Usage: scripts/setup.sh [--with-plots]
#   --with-plots  also installs python3-matplotlib for scripts/plot_*.py
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config procps
  libtbb-dev libabsl-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libopenblas-dev libssl-dev libxxhash-dev libisal-dev
)
# The end-to-end tests and bench scripts read JSON with python3 (any python3 will do).
command -v python3 >/dev/null 2>&1 || packages+=(python3)
for arg in "$@"; do
  case "$arg" in
    --with-plots) packages+=(python3-matplotlib) ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

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

echo "setup.sh: installing ${missing[*]}"
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
