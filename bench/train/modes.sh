#!/usr/bin/env bash
# Side-by-side benchmark of the cache modes (issue 5): runs `bagpipe train` once per mode on the
# same data, seed and model, and prints a Markdown table of ms/iteration, samples/s, hit rate,
# fetched MB, the ratio to `device` (tables in trainer memory: the upper bound), the speed-up over
# `off` (every row fetched every iteration) and the per-iteration time breakdown. With
# --deterministic it also checks that every mode ends with bit-identical parameters.
#
# Usage: bench/train/modes.sh [OPTIONS] [-- EXTRA bagpipe train ARGS]
#   --data SPEC          data source (default: small synthetic Criteo-like stream)
#   --batch-size N       global batch size (default 1024; --paper: 16384)
#   --iterations N       iterations per mode (default 100; --paper: 200 on cuda, 10 on cpu)
#   --cache-rows N       rows per trainer's cache (default: 20000 with the default data, else
#                        the binary's: a fifth of all rows, at least four local batches,
#                        at most all rows)
#   --lookahead L        oracle window in batches (default: the binary's, 20)
#   --server-link LINK   emulated link to the servers, e.g. "10Gbit/s,100us" (default none)
#   --trainers T         trainers (default 1)       --servers S   servers (default 1)
#   --device cpu|cuda    (default cpu; --paper: cuda)
#   --dim D --bottom A-B-..-D --top X-..-1   model shape (default: the binary's small model)
#   --paper              the Bagpipe paper's DLRM: dim 48, bottom 13-512-256-64-48, top
#                        1024-1024-1024-256-128-1, 26 tables at Criteo Kaggle size (~34M rows;
#                        on --device cpu the tables are scaled to 0.05 to fit), batch 16384;
#                        SGD for the dense MLPs (Adagrad from a zero accumulator moves every
#                        weight by --lr in its first step, which makes this deep a model's loss
#                        jump to ~10^6 before it recovers) unless the arguments after -- name
#                        --dense-optimizer
#   --modes LIST         comma-separated modes (default device,oracle,lru,off)
#   --deterministic      bit-identical runs; checks params_sha256 across modes
#   --no-convert         read synthetic data directly instead of converting it once to the
#                        binary format (generation then competes with training for the CPU)
#   --seed S             parameter seed (default 1)
#   --metrics-interval N iterations per metrics line (default: a tenth of --iterations)
#   --warmup N           iterations left out of the "steady samples/s" column (default: a fifth
#                        of --iterations): the oracle's first iterations wait for its lookahead
#                        window to fill, which dominates short runs
#   --out DIR            keep the run directories DIR/<mode> and write DIR/modes.md and
#                        DIR/modes.json (default: a temporary directory, removed at exit)
# Environment: BAGPIPE = the bagpipe binary (default <repo>/build/bagpipe).
# Exit status: 0; 1 if a run failed or, with --deterministic, the parameters differ; 2 on usage.
#
# Example (the network cost of remote tables, on one machine):
#   bench/train/modes.sh --iterations 100 --server-link "10Gbit/s,100us" --deterministic
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bagpipe="${BAGPIPE:-${repo_root}/build/bagpipe}"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "modes.sh: $*" >&2; exit 2; }

data="" batch_size="" iterations="" cache_rows="" lookahead="" server_link=""
trainers=1 servers=1 device="" dim="" bottom="" top="" paper=0 deterministic=0 seed=1
modes="device,oracle,lru,off" out_dir="" metrics_interval="" warmup="" convert=1
extra=()
while [ $# -gt 0 ]; do
  opt="$1"
  case "$opt" in
    -h|--help) usage; exit 0 ;;
    --paper) paper=1; shift; continue ;;
    --deterministic) deterministic=1; shift; continue ;;
    --no-convert) convert=0; shift; continue ;;
    --) shift; extra=("$@"); break ;;
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
  esac
  [ $# -ge 2 ] || die "option $opt needs a value (see --help)"
  value="$2"
  case "$opt" in
    --data) data="$value" ;;
    --batch-size) batch_size="$value" ;;
    --iterations) iterations="$value" ;;
    --cache-rows) cache_rows="$value" ;;
    --lookahead) lookahead="$value" ;;
    --server-link) server_link="$value" ;;
    --trainers) trainers="$value" ;;
    --servers) servers="$value" ;;
    --device) device="$value" ;;
    --dim) dim="$value" ;;
    --bottom) bottom="$value" ;;
    --top) top="$value" ;;
    --modes) modes="$value" ;;
    --seed) seed="$value" ;;
    --metrics-interval) metrics_interval="$value" ;;
    --warmup) warmup="$value" ;;
    --out) out_dir="$value" ;;
    *) die "unknown option '$opt' (see --help)" ;;
  esac
  shift 2
done

[ -x "$bagpipe" ] ||
  die "no bagpipe binary at '$bagpipe' (build it: ninja -C build bagpipe, or set BAGPIPE)"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read summary.json"

# Defaults: the paper's shape, or a small model and stream that runs in seconds on a laptop.
if [ "$paper" -eq 1 ]; then
  device="${device:-cuda}"
  batch_size="${batch_size:-16384}"
  dim="${dim:-48}"
  bottom="${bottom:-13-512-256-64-48}"
  top="${top:-1024-1024-1024-256-128-1}"
  if [ "$device" = cuda ]; then
    iterations="${iterations:-200}"
    paper_scale=1
  else
    iterations="${iterations:-10}"
    paper_scale=0.05
    echo "modes.sh: --paper on cpu: tables scaled to ${paper_scale} and ${iterations} iterations" \
      "(the full ~34M-row tables need a GPU-sized memory and time budget)" >&2
  fi
  paper_data="synthetic:samples=$((batch_size * iterations)),tables=26,scale=${paper_scale}"
  case " ${extra[*]} " in
    *" --dense-optimizer"*) ;;
    *) extra=(--dense-optimizer sgd "${extra[@]}") ;;
  esac
  data="${data:-${paper_data},alpha=1.05}"
else
  device="${device:-cpu}"
  batch_size="${batch_size:-1024}"
  iterations="${iterations:-100}"
  if [ -z "$data" ]; then
    # ~67.5k rows over 26 tables; a 20000-row cache (~30%) makes the policies differ (the
    # binary's default, at least four local batches, would hold every row of this stream).
    data="synthetic:samples=$((batch_size * iterations)),tables=26,scale=0.002,alpha=1.05"
    cache_rows="${cache_rows:-20000}"
  fi
fi

metrics_interval="${metrics_interval:-$(( iterations >= 10 ? iterations / 10 : 1 ))}"
warmup="${warmup:-$(( iterations / 5 ))}"

keep_out=1
if [ -z "$out_dir" ]; then
  keep_out=0
  out_dir="$(mktemp -d "${TMPDIR:-/tmp}/bagpipe_modes.XXXXXX")"
  trap 'rm -rf "$out_dir"' EXIT
fi
mkdir -p "$out_dir"

# Generating synthetic samples costs more CPU than reading them (on 2 cores it would throttle
# the data loader and hide the runtime's own costs), so the stream is converted once to the
# binary format, as a real pre-processed dataset would be, and every mode reads that.
if [ "$convert" -eq 1 ] && [[ "$data" == synthetic* ]]; then
  echo "\$ $bagpipe convert --data $data --out $out_dir/data.bin"
  "$bagpipe" convert --data "$data" --out "$out_dir/data.bin" >"$out_dir/convert.log" 2>&1 ||
    { cat "$out_dir/convert.log" >&2; exit 1; }
  data="bin:$out_dir/data.bin"
fi

common=(--data "$data" --batch-size "$batch_size" --iterations "$iterations"
        --trainers "$trainers" --servers "$servers" --device "$device" --seed "$seed"
        --metrics-interval "$metrics_interval")
[ -n "$cache_rows" ] && common+=(--cache-rows "$cache_rows")
[ -n "$lookahead" ] && common+=(--lookahead "$lookahead")
[ -n "$server_link" ] && common+=(--server-link "$server_link")
[ -n "$dim" ] && common+=(--dim "$dim")
[ -n "$bottom" ] && common+=(--bottom "$bottom")
[ -n "$top" ] && common+=(--top "$top")
[ "$deterministic" -eq 1 ] && common+=(--deterministic)

# The machine, for the record (timings mean little without it).
machine_file="$out_dir/machine.txt"
{
  echo "host: $(uname -n), $(uname -sr)"
  echo "cpu: $(nproc) cores available, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null \
    | sed 's/.*: //' || echo unknown)"
  if command -v nvidia-smi >/dev/null 2>&1 &&
     gpus="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
       2>/dev/null)" &&
     [ -n "$gpus" ]; then
    while IFS= read -r g; do echo "gpu: $g"; done <<<"$gpus"
  else
    echo "gpu: none (no nvidia-smi or no device)"
  fi
  echo "bagpipe: $bagpipe"
  echo "git: $(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
    git -C "$repo_root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
} >"$machine_file"
cat "$machine_file"
echo

commands_file="$out_dir/commands.txt"
: >"$commands_file"
IFS=',' read -r -a mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
  run_dir="$out_dir/$mode"
  rm -rf "$run_dir"
  mkdir -p "$run_dir"
  cmd=("$bagpipe" train "${common[@]}" --cache "$mode" --quiet --out "$run_dir" "${extra[@]}")
  printf -v line '%q ' "${cmd[@]}"
  echo "${line% }" >>"$commands_file"
  echo "\$ ${line% }"
  if ! "${cmd[@]}" >"$run_dir/log.txt" 2>&1; then
    echo "modes.sh: mode '$mode' failed; the end of its log ($run_dir/log.txt):" >&2
    tail -n 20 "$run_dir/log.txt" >&2
    exit 1
  fi
  if [ ! -s "$run_dir/summary.json" ]; then
    echo "modes.sh: mode '$mode' wrote no summary.json" >&2
    exit 1
  fi
done
echo

MODES_OUT="$out_dir" MODES_LIST="$modes" MODES_DETERMINISTIC="$deterministic" \
MODES_KEEP="$keep_out" MODES_WARMUP="$warmup" python3 - <<'PY'
import json
import os
import sys

out = os.environ["MODES_OUT"]
modes = os.environ["MODES_LIST"].split(",")
deterministic = os.environ["MODES_DETERMINISTIC"] == "1"
keep = os.environ["MODES_KEEP"] == "1"
warmup = int(os.environ["MODES_WARMUP"])

summaries = {}
for mode in modes:
    with open(os.path.join(out, mode, "summary.json")) as f:
        summaries[mode] = json.load(f)


def steady_samples_per_s(mode):
    """Samples/s between the first metrics line at or after the warm-up and the last one."""
    path = os.path.join(out, mode, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    lines = [l for l in lines if l.get("kind") == "train"]
    start = next((l for l in lines if l["iteration"] >= warmup), None)
    if start is None or start is lines[-1]:
        return None
    seconds = lines[-1]["seconds"] - start["seconds"]
    return (lines[-1]["samples"] - start["samples"]) / seconds if seconds > 0 else None


def ms(s):
    return s["ms_per_iteration"]


# Per-iteration breakdown columns: name -> summary time_ms keys summed.
breakdown = [
    ("wait", ["wait"]),
    ("boundary", ["boundary"]),
    ("lookup", ["lookup"]),
    ("forward_backward", ["forward_backward"]),
    ("reduce", ["reduce"]),
    ("allreduce+sync", ["allreduce", "sync"]),
    ("optimizer+apply", ["optimizer", "apply"]),
]

rows = []
for mode in modes:
    s = summaries[mode]
    t = s.get("time_ms", {})
    row = {
        "mode": mode,
        "ms_per_iteration": ms(s),
        "samples_per_s": s["samples_per_s"],
        "steady_samples_per_s": steady_samples_per_s(mode),
        "hit_rate": s.get("hit_rate"),
        "fetched_mb": s.get("fetched_bytes", 0) / 1e6,
        "written_back_mb": s.get("written_back_bytes", 0) / 1e6,
        "ratio_vs_device": ms(s) / ms(summaries["device"]) if "device" in summaries else None,
        "speedup_vs_off": ms(summaries["off"]) / ms(s) if "off" in summaries else None,
        "train_loss": s.get("train_loss"),
        "params_sha256": s.get("params_sha256"),
        "time_ms": {name: sum(t.get(k, 0.0) for k in keys) for name, keys in breakdown},
    }
    rows.append(row)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


header = (["mode", "ms/iteration", "samples/s", f"steady samples/s (it > {warmup})", "hit rate",
           "fetched MB", "ratio vs device", "speed-up vs off"]
          + [f"{name} ms" for name, _ in breakdown])
lines = ["| " + " | ".join(header) + " |",
         "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
for r in rows:
    cells = [r["mode"], fmt(r["ms_per_iteration"], ".2f"), fmt(r["samples_per_s"], ",.0f"),
             fmt(r["steady_samples_per_s"], ",.0f"),
             fmt(None if r["hit_rate"] is None else 100 * r["hit_rate"], ".1f") + "%",
             fmt(r["fetched_mb"], ".1f"),
             fmt(r["ratio_vs_device"], ".2f") + ("x" if r["ratio_vs_device"] else ""),
             fmt(r["speedup_vs_off"], ".2f") + ("x" if r["speedup_vs_off"] else "")]
    cells += [fmt(r["time_ms"][name], ".3f") for name, _ in breakdown]
    lines.append("| " + " | ".join(cells) + " |")
table = "\n".join(lines)

shas = {r["params_sha256"] for r in rows}
identical = len(shas) == 1 and None not in shas
if deterministic:
    sha_line = "parameters identical across modes: " + ("yes" if identical else "no")
    if not identical:
        sha_line += "\n" + "\n".join(f"  {r['mode']}: {r['params_sha256']}" for r in rows)
else:
    sha_line = "parameters identical across modes: not checked (run with --deterministic)"

# Planning figures (lookahead, cache rows) are reported best by a mode that plans.
first = next((summaries[m] for m in ("oracle", "lru", "lfu") if m in summaries),
             summaries[modes[0]])
config = (f"data: {first.get('data')}; batch {first.get('batch_size')}, "
          f"{first.get('iterations')} iterations, cache rows {first.get('cache_rows')}, "
          f"lookahead {first.get('lookahead')}, {first.get('trainers')} trainer(s), "
          f"{first.get('servers')} server(s), device {first.get('device')}, "
          f"server link {first.get('server_link', 'none')}; model dim {first.get('dim')}, "
          f"bottom {first.get('bottom')}, top {first.get('top')}; "
          f"deterministic {str(first.get('deterministic')).lower()}")
note = ("Time columns are ms per iteration as each run's summary.json reports them (time_ms); "
        "ratio vs device = ms/iteration over device's, speed-up vs off = off's ms/iteration over "
        "the mode's. Steady samples/s: from the metrics lines after the first "
        f"{warmup} iterations (the warm-up: window fill, first-touch misses).")

print(config)
print()
print(table)
print()
print(sha_line)

if keep:
    with open(os.path.join(out, "machine.txt")) as f:
        machine = f.read()
    with open(os.path.join(out, "commands.txt")) as f:
        commands = f.read()
    with open(os.path.join(out, "modes.md"), "w") as f:
        f.write("# Cache modes side by side\n\n```\n" + machine + "```\n\n" + config + "\n\n"
                + table + "\n\n" + note + "\n\n" + sha_line + "\n\nCommands:\n\n```\n"
                + commands + "```\n")
    with open(os.path.join(out, "modes.json"), "w") as f:
        json.dump({"machine": machine.splitlines(), "commands": commands.splitlines(),
                   "config": config, "deterministic": deterministic,
                   "parameters_identical": identical if deterministic else None,
                   "modes": rows}, f, indent=2)
        f.write("\n")
    print(f"\nwrote {os.path.join(out, 'modes.md')} and {os.path.join(out, 'modes.json')}")

sys.exit(1 if deterministic and not identical else 0)
PY
