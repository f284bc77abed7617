#!/usr/bin/env bash
# Everything that needs a GPU, in one command: builds with CUDA, runs every CUDA test, the
# Python package's suites with the machine's PyTorch (test_cuda.py trains torch.nn models on the
# GPU through bagpipe), the end-to-end job on the GPU with each cache mode, the
# gather-versus-device-copy bandwidth benchmark and the paper-shape cache-mode comparison, and
# prints one table (bench/README.md says how to read it). Meant for a machine with an NVIDIA GPU
# and 16 cores: about 5 minutes on an H100 with 16 cores (configure 6 s, build 38 s, CUDA tests
# 73 s, each Python suite that passed 21 s, the rest 58 s).
#
# Usage: scripts/gpu-check.sh [OPTIONS]
#   --dry-run            print the commands it would run, run nothing (CI runs this)
#   --debs DIR           unpack the Debian packages in DIR (*.deb) into the build's prefix
#                        first, for a machine whose package manager cannot reach a registry
#                        (default: .device/debs when it exists); a package the system already
#                        has (its header or library is there) is not unpacked
#   --fetch-debs DIR     on a machine with a Debian registry: download the packages a GPU
#                        machine usually lacks (oneTBB, Abseil, GoogleTest, Google Benchmark,
#                        CLI11, nlohmann-json, ISA-L, xxHash, OpenBLAS, the DLPack header) into
#                        DIR, then exit
#   --arch LIST          CUDA architectures (default 90: H100/H200; 80 for A100)
#   --build-dir DIR      (default build-gpu)
#   --out DIR            logs and results (default build-gpu/gpu-check)
#   --paper-iterations N iterations of each mode of the paper-shape run (default 50)
#   --skip-build         use an existing build in --build-dir
#   --all-targets        build every target (default: only what the checks run: bagpipe, the
#                        test programs with CUDA or NCCL cases, cache_bench)
#   --step-timeout S     stop a step that runs longer than S seconds (default 900)
#   --time-limit S       finish within S seconds: each step gets at most what is left, a step
#                        with under 10 s left is skipped, and the table is always printed
# Exit status: 0 when every check passed, 1 when one failed, 2 on usage.
#
# Typical use from a machine without a GPU (the GPU machine has no registry):
#   scripts/gpu-check.sh --fetch-debs .device/debs    # here: ~2.5 MB of .deb files
#   (copy the checkout, .device/ included, to the GPU machine)
#   scripts/gpu-check.sh                               # there
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu-check.sh: $*" >&2; exit 2; }

dry_run=0 debs="" fetch_debs="" arch=90 build_dir=build-gpu out_dir="" paper_iterations=50
skip_build=0 all_targets=0 step_timeout=900 time_limit=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift ;;
    --skip-build) skip_build=1; shift ;;
    --all-targets) all_targets=1; shift ;;
    --debs|--fetch-debs|--arch|--build-dir|--out|--paper-iterations|--step-timeout|--time-limit)
      [ $# -ge 2 ] || die "option $1 needs a value (see --help)"
      case "$1" in
        --debs) debs="$2" ;;
        --fetch-debs) fetch_debs="$2" ;;
        --arch) arch="$2" ;;
        --build-dir) build_dir="$2" ;;
        --out) out_dir="$2" ;;
        --paper-iterations) paper_iterations="$2" ;;
        --step-timeout) step_timeout="$2" ;;
        --time-limit) time_limit="$2" ;;
      esac
      shift 2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ "$paper_iterations" =~ ^[1-9][0-9]*$ ]] || die "--paper-iterations must be a positive integer"
[[ "$step_timeout" =~ ^[1-9][0-9]*$ ]] || die "--step-timeout must be a positive number of seconds"
[[ "$time_limit" =~ ^[0-9]+$ ]] || die "--time-limit must be a number of seconds (0: none)"
[[ "$arch" =~ ^[0-9]+(\;[0-9]+)*$ ]] || die "--arch must name architectures, e.g. 90 or 80;90"
out_dir="$(realpath -m "${out_dir:-$build_dir/gpu-check}")"
build_dir="$(realpath -m "$build_dir")"

# The packages a GPU machine image usually lacks (it has CUDA, NCCL, Open MPI, OpenSSL, CMake and
# Ninja; seen on an H200 machine's Ubuntu 24.04 image: no oneTBB, Abseil, GoogleTest, Google
# Benchmark, CLI11, nlohmann-json, ISA-L, xxHash headers or OpenBLAS).
deb_packages=(libtbb12 libtbb-dev libtbbmalloc2 libtbbbind-2-5 libabsl20220623 libabsl-dev
              libgtest-dev libgmock-dev libbenchmark1debian libbenchmark-dev libcli11-dev
              nlohmann-json3-dev libisal2 libisal-dev libxxhash0 libxxhash-dev libopenblas0
              libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5
              libdlpack-dev)

# Unpacks every package of $1 into $2, except those the system already provides (the file that
# shows it): a system library is never shadowed by a second copy.
unpack_debs() {
  local from="$1" into="$2" f package have
  mkdir -p "$into"
  for f in "$from"/*.deb; do
    package="$(dpkg-deb -f "$f" Package)"
    case "$package" in
      libisal*) have=/usr/include/isa-l/crc.h ;;
      libxxhash*) have=/usr/include/xxhash.h ;;
      libopenblas*) have="$(compgen -G '/usr/include/*/cblas.h' || compgen -G '/usr/include/*/*/cblas.h' ||
                             compgen -G /usr/include/cblas.h || true)" ;;
      libgfortran5) have=/usr/lib/x86_64-linux-gnu/libgfortran.so.5 ;;
      libdlpack-dev) have=/usr/include/dlpack/dlpack.h ;;
      *) have="" ;;
    esac
    if [ -n "$have" ] && [ -e "${have%%$'\n'*}" ]; then
      echo "$package: the system has it (${have%%$'\n'*})"
    else
      dpkg -x "$f" "$into" && echo "$package: unpacked"
    fi
  done
}

if [ -n "$fetch_debs" ]; then
  if [ "$dry_run" -eq 1 ]; then
    echo "+ (cd $fetch_debs && apt-get download ${deb_packages[*]})"
    exit 0
  fi
  mkdir -p "$fetch_debs"
  (cd "$fetch_debs" && { apt-get download "${deb_packages[@]}" >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get download "${deb_packages[@]}"; }; })
  ls -1 "$fetch_debs"
  exit 0
fi
if [ -z "$debs" ] && [ -d .device/debs ]; then debs=.device/debs; fi
if [ -n "$debs" ] && [ "$dry_run" -eq 0 ]; then
  compgen -G "$debs/*.deb" >/dev/null || die "--debs $debs: no .deb files there"
fi

# Every step: its name, then its command (one string, run by bash). --dry-run prints them.
steps=()
add_step() { steps+=("$1" "$2"); }

prefix="$out_dir/deps"
if [ -n "$debs" ]; then
  add_step "unpack packages" "unpack_debs '$debs' '$prefix'"
fi
# The Python package is built for the python3 on PATH when it has PyTorch and pybind11 (the GPU
# machine's image: a recent PyTorch with CUDA, whose pybind11 comes from pip).
python_options=""
python3_path="$(command -v python3 || true)"
if [ -n "$python3_path" ] && "$python3_path" -c "import torch, pybind11" 2>/dev/null; then
  python_options="-DPython_EXECUTABLE='$python3_path' \
-Dpybind11_DIR='$("$python3_path" -m pybind11 --cmakedir)'"
fi
if [ "$skip_build" -eq 0 ]; then
  add_step "configure" "cmake -S . -B '$build_dir' -G Ninja -DCMAKE_BUILD_TYPE=Release \
-DBAGPIPE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES='$arch' -DBAGPIPE_BUILD_TESTS=ON \
-DBAGPIPE_BUILD_BENCHMARKS=ON $python_options"
  # The programs the steps below run; ctest's CUDA and NCCL cases all live in these.
  targets="--target bagpipe embedding_cache_cuda_test nccl_communicator_test nccl_mpi_test \
dense_model_test core_test dlrm_loop_test cache_bench"
  [ "$all_targets" -eq 1 ] && targets=""
  add_step "build" "cmake --build '$build_dir' -j \$(nproc) $targets"
fi
# Every test that needs a GPU (CUDA kernels against the CPU reference, the dense model, NCCL,
# the job end to end on the GPU), and the core suite (device contexts and events).
add_step "cuda tests" "ctest --test-dir '$build_dir' -R 'Cuda|Nccl|nccl|DeviceTest|CpuStreams' \
-E '^cpu_streams_' --output-on-failure --timeout 600 --output-junit '$out_dir/cuda_tests.xml'"
# The Python package's suites with this machine's PyTorch, test_cuda.py (torch.nn models trained
# on the GPU through bagpipe) among them, and the checks that the extension and the programs use
# the shared libstdc++ and carry no copy of it (this machine's GCC keeps only libstdc++.a in its
# own directory: cmake/BagpipeLibstdcxx.cmake).
add_step "python tests" "if ! ninja -C '$build_dir' -t targets all | grep '^bagpipe_python:' >/dev/null; \
then echo 'no Python package in this build: see configure.log for what CMake did not find'; \
exit 1; fi; cmake --build '$build_dir' -j \$(nproc) --target bagpipe_python && \
ctest --test-dir '$build_dir' -R '^python_|libstdcxx' --output-on-failure -j 6 --timeout 300 \
--output-junit '$out_dir/python_tests.xml'"
# The job end to end on the GPU with every cache mode (small model, 26 small tables):
# parameters must be identical across modes.
add_step "e2e modes" "BAGPIPE='$build_dir/bagpipe' bench/train/modes.sh --device cuda \
--deterministic --iterations 200 --out '$out_dir/e2e'"
# Gather (and reduce, apply) kernels against a device-to-device copy of the same bytes.
add_step "bandwidth" "'$build_dir/bench/cache/cache_bench' --benchmark_filter='Cuda' \
--benchmark_format=json --benchmark_out='$out_dir/cache_bench.json' --benchmark_out_format=json"
# The Bagpipe paper's DLRM at batch 16384 with full-size tables, every cache mode.
add_step "paper modes" "BAGPIPE='$build_dir/bagpipe' bench/train/modes.sh --paper \
--iterations '$paper_iterations' --out '$out_dir/paper'"

if [ "$dry_run" -eq 1 ]; then
  echo "gpu-check.sh --dry-run: would run, in $repo_root:"
  [ -n "$debs" ] && echo "  (with CMAKE_PREFIX_PATH and LD_LIBRARY_PATH pointing into $prefix/usr)"
  for ((i = 0; i < ${#steps[@]}; i += 2)); do
    echo "[${steps[i]}]"
    echo "+ ${steps[i + 1]}"
  done
  echo "[table]"
  echo "+ summarise $out_dir/{cuda_tests.xml,python_tests.xml,e2e/modes.json,cache_bench.json,paper/modes.json}"
  exit 0
fi

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
  echo "gpu-check.sh: warning: nvidia-smi sees no GPU; the CUDA checks will skip or fail" >&2
mkdir -p "$out_dir"
if [ -n "$debs" ]; then
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  # Debian's OpenBLAS lives in a subdirectory (its alternatives link is not unpacked); FindBLAS
  # also searches LD_LIBRARY_PATH.
  lib="$prefix/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$lib/openblas-pthread:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

export -f unpack_debs
status_file="$out_dir/steps.tsv"
deadline=0
[ "$time_limit" -gt 0 ] && deadline=$(( $(date +%s) + time_limit ))
: >"$status_file"
failed=0
for ((i = 0; i < ${#steps[@]}; i += 2)); do
  name="${steps[i]}"
  log="$out_dir/$(echo "$name" | tr ' ' '_').log"
  echo "== $name (log: $log)"
  start=$(date +%s)
  limit=$step_timeout
  if [ "$deadline" -gt 0 ]; then
    left=$(( deadline - start ))
    if [ "$left" -lt 10 ]; then
      echo "   skipped: --time-limit ${time_limit}s reached"
      printf '%s\t%s\t%s\n' "$name" skipped 0 >>"$status_file"
      failed=1
      continue
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  if timeout "$limit" bash -c "${steps[i + 1]}" >"$log" 2>&1; then rc=0; else rc=$?; fi
  [ "$rc" -eq 124 ] && echo "(stopped after ${limit}s: --step-timeout or --time-limit)" >>"$log"
  seconds=$(( $(date +%s) - start ))
  printf '%s\t%s\t%s\n' "$name" "$rc" "$seconds" >>"$status_file"
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "   failed (exit $rc) after ${seconds}s; the end of its log:"
    tail -n 15 "$log" | sed 's/^/   | /'
    case "$name" in unpack*|configure|build) break ;; esac
  else
    echo "   ok (${seconds}s)"
  fi
done

GPU_CHECK_OUT="$out_dir" python3 - <<'PY' || failed=1
import json
import os
import subprocess
import xml.etree.ElementTree as ET

out = os.environ["GPU_CHECK_OUT"]
rows = []  # (check, result, target/notes)


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              check=True).stdout.strip().replace("\n", "; ")
    except Exception:
        return "no nvidia-smi"


with open(os.path.join(out, "steps.tsv")) as f:
    for line in f:
        name, rc, seconds = line.rstrip("\n").split("\t")
        result = {"0": "ok", "skipped": "SKIPPED (--time-limit)", "124": "STOPPED (time)"}
        rows.append((f"step: {name}", result.get(rc, f"FAILED (exit {rc})"), f"{seconds} s"))

def junit_row(file, label, skipped_note):
    junit = os.path.join(out, file)
    if not os.path.exists(junit):
        rows.append((label, "no results", f"see {label.replace(' ', '_')}.log"))
        return
    passed = failed = skipped = 0
    failed_names, skipped_names = [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failed_names.append(case.get("name"))
        elif case.find("skipped") is not None or case.get("status") == "notrun":
            skipped += 1
            skipped_names.append(case.get("name"))
        else:
            passed += 1
    more = f" and {len(skipped_names) - 4} more" if len(skipped_names) > 4 else ""
    notes = (f"skipped ({skipped_note}): " + ", ".join(skipped_names[:4]) + more
             if skipped_names else "none skipped")
    if failed_names:
        notes = "FAILED: " + ", ".join(failed_names) + "; " + notes
    rows.append((label, f"{passed} passed, {failed} failed, {skipped} skipped", notes))


junit_row("cuda_tests.xml", "CUDA tests",
          "on one GPU, the multi-GPU ones should be the only ones")
junit_row("python_tests.xml", "python tests", "none should be")


def modes_rows(path, label):
    if not os.path.exists(path):
        rows.append((label, "no results", f"see {label.replace(' ', '_')} modes log"))
        return
    with open(path) as f:
        data = json.load(f)
    for m in data["modes"]:
        syncs = None
        try:
            with open(os.path.join(os.path.dirname(path), m["mode"], "summary.json")) as f:
                summary = json.load(f)
            syncs = max(t.get("max_iteration_host_syncs", 0) for t in summary["per_trainer"])
        except Exception:
            pass
        t = m["time_ms"]
        ratio = lambda x: "-" if x is None else f"{x:.2f}x"
        rows.append((f"{label}: {m['mode']}",
                     f"{m['ms_per_iteration']:.2f} ms/it, hit {100 * (m['hit_rate'] or 0):.1f}%",
                     f"vs device {ratio(m['ratio_vs_device'])}, vs off {ratio(m['speedup_vs_off'])}; "
                     f"fwd/bwd {t['forward_backward']:.2f} ms, lookup {t['lookup']:.2f}, "
                     f"wait {t['wait']:.2f}; host syncs/it {syncs}"))
    if data.get("deterministic"):
        rows.append((f"{label}: parameters identical across modes",
                     "yes" if data.get("parameters_identical") else "NO", "must be yes"))


modes_rows(os.path.join(out, "e2e", "modes.json"), "e2e")

bench = os.path.join(out, "cache_bench.json")
results = []
if os.path.exists(bench):
    try:
        with open(bench) as f:
            results = json.load(f)["benchmarks"]
    except (ValueError, KeyError):
        rows.append(("bandwidth", "no results", "see bandwidth.log"))
    for r in results:
        name = r.get("name", "")
        if "Gather" in name or "Memcpy" in name:
            gbps = r.get("GBps") or r.get("bytes_per_second", 0) / 1e9
            ratio = r.get("vs_memcpy")
            rows.append((f"bandwidth: {name}", f"{gbps:.0f} GB/s",
                         f"{ratio:.2f} of the device copy (target >= 0.70)" if ratio else
                         "device-to-device copy"))

modes_rows(os.path.join(out, "paper", "modes.json"), "paper")

print()
print(f"GPU: {gpu_name()}")
width = max(len(r[0]) for r in rows)
print(f"| {'check'.ljust(width)} | result | notes |")
print(f"|{'-' * (width + 2)}|---|---|")
for check, result, notes in rows:
    print(f"| {check.ljust(width)} | {result} | {notes} |")
PY
exit "$failed"
