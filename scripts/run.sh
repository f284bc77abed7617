#!/usr/bin/env bash
# The main job on the embedded default (no cluster needed): sets up, builds `bagpipe`, then
# trains a small DLRM on seeded synthetic Criteo-like data twice — with the Bagpipe cache
# (--cache oracle) and without it (--cache off: every embedding row fetched from the servers
# every iteration) — with the servers behind an emulated 1 Gbit/s, 200 us link, and compares the runs:
# throughput, hit rate, final loss and held-out AUC, and whether the parameters are
# bit-identical (they must be: the cache does not change the training).
# Usage: scripts/run.sh [extra bagpipe train flags]   (OUT=dir keeps the runs, default runs/)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target bagpipe

out=${OUT:-runs}
rm -rf "$out/oracle" "$out/off"
data="synthetic:samples=800000,tables=26,scale=0.01,alpha=1.05,seed=1"
common=(--data "$data" --batch-size 4096 --iterations 150 --dim 16 --bottom 13-64-16
        --top 64-32-1 --optimizer adagrad --lr 0.05 --trainers 2 --servers 1
        --server-link "1Gbit/s,200us" --eval-fraction 0.05 --metrics-interval 10
        --deterministic --seed 1)
for mode in oracle off; do
  echo
  echo "== bagpipe train --cache $mode"
  "$build_dir/bagpipe" train "${common[@]}" --cache "$mode" --cache-rows 120000 --lookahead 20 \
    --out "$out/$mode" --dump-params "$out/$mode" "$@"
done
echo
echo "== bagpipe compare $out/off $out/oracle"
"$build_dir/bagpipe" compare "$out/off" "$out/oracle"
echo
echo "Runs are in $out/ (metrics.jsonl, summary.json, params.bin)."
echo "Plots: scripts/setup.sh --with-plots && python3 scripts/plot_runs.py $out/oracle $out/off --out $out/plot"
