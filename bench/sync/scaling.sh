#!/usr/bin/env bash
# Distributed scaling on one machine (issue 6): `bagpipe train` under mpirun with T = 1, 2, 4
# trainer ranks (plus rank 0, the oracle, and S server ranks), the same global batch split into
# T shards. Prints a Markdown table: samples/s, ms/iteration, hit rate, the critical-path
# shared-row sync time, the gradient bytes exchanged between trainers (only rows that another
# trainer also holds) against what exchanging every touched row would cost (no private-row
# optimisation), and bytes fetched. With --deterministic it checks that every T ends with the
# parameters of the embedded single-process `--cache off` run of the same T (bit for bit).
#
# Usage: bench/sync/scaling.sh [--trainers "1 2 4"] [--servers S] [--iterations N]
#          [--batch-size B] [--cache-rows C] [--data SPEC] [--deterministic] [--out DIR]
#          [-- EXTRA bagpipe train ARGS]
# Environment: BAGPIPE (default <repo>/build/bagpipe), MPIEXEC (default mpirun).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bagpipe="${BAGPIPE:-${repo_root}/build/bagpipe}"
mpiexec="${MPIEXEC:-mpirun}"
trainer_counts="1 2 4" servers=1 iterations=200 batch_size=4096 cache_rows=60000
data="synthetic:samples=2000000,tables=26,scale=0.005,alpha=1.05,seed=1"
deterministic=0 out_dir="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --trainers) trainer_counts="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --iterations) iterations="$2"; shift 2 ;;
    --batch-size) batch_size="$2"; shift 2 ;;
    --cache-rows) cache_rows="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --deterministic) deterministic=1; shift ;;
    --out) out_dir="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scaling.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bagpipe" ] || { echo "scaling.sh: no bagpipe binary at $bagpipe (build first)" >&2; exit 2; }
if [ -z "$out_dir" ]; then
  out_dir="$(mktemp -d)"
  trap 'rm -rf "$out_dir"' EXIT
fi
mkdir -p "$out_dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

# Generating synthetic samples on rank 0 costs more CPU than reading them; convert once to the
# binary format, as a pre-processed dataset would be (modes.sh does the same).
if [[ "$data" == synthetic* ]]; then
  echo "\$ $bagpipe convert -q --data $data --out $out_dir/data.bin"
  "$bagpipe" convert -q --data "$data" --out "$out_dir/data.bin" >/dev/null
  data="bin:$out_dir/data.bin"
fi
echo "machine: $(hostname), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "commit: $(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
common=(train --data "$data" --batch-size "$batch_size" --iterations "$iterations"
        --cache oracle --cache-rows "$cache_rows" --lookahead 20 --quiet
        --metrics-interval "$(( iterations / 5 > 0 ? iterations / 5 : 1 ))")
[ "$deterministic" = 1 ] && common+=(--deterministic)
for t in $trainer_counts; do
  np=$((1 + servers + t))
  cmd=("$mpiexec" -np "$np" --oversubscribe "$bagpipe" "${common[@]}" --servers "$servers"
       --out "$out_dir/T$t" "${extra[@]}")
  echo "\$ ${cmd[*]}"
  "${cmd[@]}" >"$out_dir/T$t.log" 2>&1 || { tail -20 "$out_dir/T$t.log"; exit 1; }
  if [ "$deterministic" = 1 ]; then
    ref=("$bagpipe" "${common[@]/oracle/off}" --trainers "$t" --servers "$servers"
         --out "$out_dir/off_T$t" "${extra[@]}")
    "${ref[@]}" >"$out_dir/off_T$t.log" 2>&1 || { tail -20 "$out_dir/off_T$t.log"; exit 1; }
  fi
done

python3 - "$out_dir" "$deterministic" $trainer_counts <<'PY'
import json, sys
out, deterministic, counts = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
rows = []
print()
print("| trainers | samples/s | ms/iteration | hit rate | sync ms/it (critical path) | exchanged MB | "
      "exchanged MB without private rows | saved | fetched MB | identical to embedded off |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
base = None
for t in counts:
    s = json.load(open(f"{out}/T{t}/summary.json"))
    with_private = s["exchanged_bytes"] / 1e6
    without = s["exchanged_bytes_without_private_rows"] / 1e6
    saved = f"{100 * (1 - with_private / without):.1f}%" if without > 0 else "-"
    same = "-"
    if deterministic:
        ref = json.load(open(f"{out}/off_T{t}/summary.json"))
        same = "yes" if ref["params_sha256"] == s["params_sha256"] else "NO"
    print(f"| {t} | {s['samples_per_s']:.0f} | {s['ms_per_iteration']:.2f} | "
          f"{100 * s['hit_rate']:.1f}% | {s['sync_ms_per_iteration_mean_over_trainers']:.3f} | "
          f"{with_private:.1f} | {without:.1f} | {saved} | {s['fetched_bytes'] / 1e6:.1f} | {same} |")
PY
