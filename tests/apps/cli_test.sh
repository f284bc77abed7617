#!/usr/bin/env bash
# End-to-end checks of the bagpipe command: real datasets train end to end, runs compare, and bad
# input fails with a clear message and a non-zero exit.
# Usage: cli_test.sh BAGPIPE_BINARY SOURCE_DIR
set -u
BAGPIPE=$1
SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CRITEO="criteo:$SRC/tests/fixtures/criteo_kaggle_sample_100.tsv"
MOVIELENS="csv:$SRC/tests/fixtures/movielens_small.csv"
MOVIELENS_SCHEMA='label=rating>3.5; dense=year; sparse=userId,movieId,split(genres,|)'
failures=0
source "$SRC/tests/apps/did_its_work.sh"

# expect_ok NAME ARGS...: the command succeeds.
expect_ok() {
  local name=$1
  shift
  if ! "$BAGPIPE" "$@" >"$WORK/$name.out" 2>&1; then
    echo "FAIL $name: exit $? (expected success)"
    sed 's/^/    /' "$WORK/$name.out" | tail -20
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

# expect_error NAME REGEX ARGS...: the command fails (non-zero) and prints REGEX.
expect_error() {
  local name=$1 regex=$2
  shift 2
  "$BAGPIPE" "$@" >"$WORK/$name.out" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "FAIL $name: succeeded (expected an error matching '$regex')"
    failures=$((failures + 1))
  elif ! grep -Eq -- "$regex" "$WORK/$name.out"; then
    echo "FAIL $name: exit $rc but the message does not match '$regex':"
    sed 's/^/    /' "$WORK/$name.out" | tail -10
    failures=$((failures + 1))
  else
    echo "ok   $name (exit $rc: $(grep -Em1 -- "$regex" "$WORK/$name.out"))"
  fi
}

# json_field FILE KEY: a top-level field of a JSON file.
json_field() {
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"
}

# --- real data, end to end -----------------------------------------------------------------
expect_ok criteo_train train --data "$CRITEO" --batch-size 16 --epochs 3 --dim 8 \
  --eval-fraction 0.2 --cache oracle --cache-rows 600 --quiet --out "$WORK/criteo"
expect_ok movielens_train train --data "$MOVIELENS" --schema "$MOVIELENS_SCHEMA" \
  --batch-size 2048 --iterations 30 --dim 8 --eval-fraction 0.1 --cache lru --cache-rows 4000 \
  --trainers 2 --quiet --out "$WORK/movielens"
# The Criteo reader's refill size is a tunable: 4 KiB refills (most lines straddle two) read the
# same data.
BAGPIPE_READER_CHUNK_BYTES=4096 expect_ok criteo_small_chunks train --data "$CRITEO" \
  --batch-size 16 --epochs 3 --dim 8 --eval-fraction 0.2 --cache oracle --cache-rows 600 --quiet \
  --out "$WORK/criteo_small_chunks"
if [[ "$(json_field "$WORK/criteo_small_chunks/summary.json" params_sha256)" != \
      "$(json_field "$WORK/criteo/summary.json" params_sha256)" ]]; then
  echo "FAIL criteo_small_chunks: 4 KiB reader refills trained different parameters"
  failures=$((failures + 1))
fi
if ! BAGPIPE_READER_CHUNK_BYTES=4096 "$BAGPIPE" tunables | grep -q "BAGPIPE_READER_CHUNK_BYTES *4096 "; then
  echo "FAIL tunables: BAGPIPE_READER_CHUNK_BYTES=4096 is not listed as the current value"
  failures=$((failures + 1))
fi
for key in params_sha256 samples_per_s hit_rate eval; do
  if ! grep -q "\"$key\"" "$WORK/movielens/summary.json" 2>/dev/null; then
    echo "FAIL movielens summary: no '$key' in summary.json"
    failures=$((failures + 1))
  fi
done
if [[ $(grep -c '"kind":"train"' "$WORK/movielens/metrics.jsonl" 2>/dev/null) -lt 1 ]]; then
  echo "FAIL movielens metrics: no training lines in metrics.jsonl"
  failures=$((failures + 1))
fi

# --- oracle and off agree bit for bit; compare says so ----------------------------------------
SYN="synthetic:samples=20000,tables=8,scale=0.001,alpha=1.05,seed=2"
for mode in oracle off; do
  expect_ok "syn_$mode" train --data "$SYN" --batch-size 512 --iterations 25 --cache $mode \
    --cache-rows 3000 --deterministic --quiet --out "$WORK/$mode" --dump-params "$WORK/$mode"
done
# The planner splitting its tables into parts changes slots, not the training.
expect_ok syn_split train --data "$SYN" --batch-size 512 --iterations 25 --cache oracle \
  --cache-rows 3000 --oracle-split-parts 4 --oracle-split-min-rows 100 --deterministic --quiet \
  --out "$WORK/split" --dump-params "$WORK/split"
for run in off oracle split; do
  if ! did_its_work "$WORK/$run/summary.json"; then failures=$((failures + 1)); fi
done
for run in oracle split; do
  expect_ok "compare_$run" compare "$WORK/off" "$WORK/$run"
  if ! grep -q "parameters bit-identical: yes" "$WORK/compare_$run.out"; then
    echo "FAIL compare: $run and off parameters differ"
    sed 's/^/    /' "$WORK/compare_$run.out"
    failures=$((failures + 1))
  fi
done

# --- bad input ---------------------------------------------------------------------------
expect_error missing_file "no_such_file.tsv" train --data "criteo:$WORK/no_such_file.tsv" --quiet
gzip -c "$SRC/tests/fixtures/criteo_kaggle_sample_100.tsv" >"$WORK/day_0.gz"
expect_error gzip_input "criteo:.*day_0.gz: the file is gzip-compressed .*decompress it first.*gzip -dc FILE \\| bagpipe convert --data criteo:/dev/stdin" \
  train --data "criteo:$WORK/day_0.gz" --quiet
printf '1\t2\t3\n' >"$WORK/short.tsv"
expect_error short_line "short.tsv:1:.*fields" train --data "criteo:$WORK/short.tsv" --quiet
expect_error bad_schema "nosuchcolumn" train --data "$MOVIELENS" \
  --schema 'label=rating>3.5; sparse=nosuchcolumn' --quiet
expect_error bad_cache_mode "belady2" train --data "$SYN" --cache belady2 --quiet
expect_error bad_bottom "bottom" train --data "$SYN" --dim 8 --bottom 13-64-16 --quiet
# What --top and --bottom say on their own is refused before the data are opened (a large file's
# scan takes minutes): here the data file does not even exist.
expect_error top_before_data "top layers: last size 2 must be 1" train \
  --data "criteo:$WORK/not_read.tsv" --top 64-2 --quiet
expect_error criteo_bottom_before_data "first size 10 must equal the number of dense features 13" \
  train --data "criteo:$WORK/not_read.tsv" --bottom 10-64-16 --quiet
expect_error tiny_cache "error:.*(capacity|cache)" train --data "$SYN" --batch-size 512 --iterations 5 \
  --cache oracle --cache-rows 10 --quiet
# A path's control characters are escaped in messages (a terminal would act on ESC).
expect_error escaped_path "criteo: cannot open '.*/no\\\\nsuch\\\\x1b\\[31m.tsv'" train \
  --data "criteo:$WORK/no"$'\n'"such"$'\e'"[31m.tsv" --quiet
if grep -q $'\e' "$WORK/escaped_path.out"; then
  echo "FAIL escaped_path: the message holds a raw ESC"
  failures=$((failures + 1))
fi
# Integers are decimal and within 64 bits (CLI11 would clamp or wrap a larger one); specs take
# decimal numbers too; an empty path (an unset variable) is refused, not taken for "not given".
expect_error huge_integer "--batch-size: '18446744073709551615' is out of range" data-stats \
  --data "$SYN" --batch-size 18446744073709551615
expect_error fraction_integer "--iterations: '0.0' is not an integer" train --data "$SYN" \
  --iterations 0.0 --quiet
expect_error negative_seed "synthetic: seed=-1 is not an integer in \[0, 2\^64 - 1\]" train \
  --data "synthetic:samples=512,seed=-1" --iterations 1 --quiet
expect_error hex_in_spec "--server-link '0x1p3Gbit/s,1us': bandwidth" train --data "$SYN" \
  --server-link 0x1p3Gbit/s,1us --iterations 1 --quiet
expect_error empty_resume "--resume: an empty value \(an unset variable\?\) names nothing" train \
  --data "$SYN" --resume "" --quiet
# A summary path that cannot be written fails before the training, naming why.
touch "$WORK/decoy.txt"
expect_error summary_not_dir "cannot write --summary-json '.*decoy.txt/sub': '.*decoy.txt' is not a directory" \
  train --data "$SYN" --iterations 1 --summary-json "$WORK/decoy.txt/sub" --quiet
# A dense model that cannot fit is refused before it is allocated.
expect_error huge_mlp "--bottom 4-100000000-8 .*more than half of this machine's" train \
  --data "synthetic:samples=512,tables=2,rows=100,dense=4" --dim 8 --bottom 4-100000000-8 \
  --iterations 1 --quiet
# A usage error echoes the value given with its control characters escaped.
"$BAGPIPE" train --data "$SYN" --lr $'\e[31m' >"$WORK/usage_escape.out" 2>&1
if [[ $? -ne 2 ]] || grep -q $'\e' "$WORK/usage_escape.out" ||
   ! grep -qF -- '--lr = \x1b[31m' "$WORK/usage_escape.out"; then
  echo "FAIL usage_escape: not exit 2 with the value escaped"
  failures=$((failures + 1))
fi
# A resume reading another stream than the checkpointed job's is refused; DIR/ckpt-K/ with a
# trailing slash resumes as DIR/ckpt-K does.
SMALL="synthetic:samples=512,tables=2,rows=100"
expect_ok identity_first train --data "$SMALL" --batch-size 32 --dim 4 --iterations 2 \
  --checkpoint-dir "$WORK/identity_ck" --quiet
expect_error resume_other_data "option --data: samples is 512 in the checkpoint and 64 here" train \
  --data "synthetic:samples=64,tables=2,rows=100" --batch-size 32 --dim 4 --iterations 6 \
  --resume "$WORK/identity_ck" --quiet
expect_error resume_other_max_samples "option --max-samples is -1 in the checkpoint and 64 here" \
  train --data "$SMALL" --batch-size 32 --dim 4 --iterations 6 --max-samples 64 \
  --resume "$WORK/identity_ck" --quiet
expect_ok resume_trailing_slash train --data "$SMALL" --batch-size 32 --dim 4 --iterations 4 \
  --resume "$WORK/identity_ck/ckpt-2/" --quiet
# A refused resume creates nothing: no new --checkpoint-dir (nor its lock).
expect_error resume_refused_creates_nothing "does not match this job" train --data "$SMALL" \
  --batch-size 32 --dim 8 --iterations 6 --resume "$WORK/identity_ck" \
  --checkpoint-dir "$WORK/never_made/ck" --quiet
if [[ -e "$WORK/never_made" ]]; then
  echo "FAIL resume_refused_creates_nothing: it created $(find "$WORK/never_made" | tr '\n' ' ')"
  failures=$((failures + 1))
fi
# The same stream spelled another way (key order, the first tables' rows named) resumes.
expect_ok identity_respelled_first train --data "synthetic:samples=512,tables=2,seed=5" \
  --batch-size 32 --dim 4 --iterations 2 --checkpoint-dir "$WORK/respelled_ck" --quiet
expect_ok identity_respelled_resume train --data "synthetic:seed=5,rows=1460/583,samples=512" \
  --batch-size 32 --dim 4 --iterations 4 --resume "$WORK/respelled_ck" --quiet
# A CSV --schema spelled another way (spaces, clause order) resumes.
expect_ok identity_schema_first train --data "$MOVIELENS" --max-samples 2000 --batch-size 256 --dim 4 \
  --schema "label=rating>3.5; dense=year; sparse=userId,movieId" --iterations 2 \
  --checkpoint-dir "$WORK/schema_ck" --quiet
expect_ok identity_schema_resume train --data "$MOVIELENS" --max-samples 2000 --batch-size 256 --dim 4 \
  --schema "sparse = userId, movieId; label = rating > 3.50; dense = year" --iterations 4 \
  --resume "$WORK/schema_ck" --quiet
expect_error identity_schema_other "option --schema: label is \"rating>3.5\" in the checkpoint" train \
  --data "$MOVIELENS" --max-samples 2000 --batch-size 256 --dim 4 --iterations 4 \
  --schema "label=rating>4; dense=year; sparse=userId,movieId" --resume "$WORK/schema_ck" --quiet
# A resume keeps the checkpoint's --checkpoint-every unless given, 0 included.
expect_ok every_first train --data "$SMALL" --batch-size 32 --dim 4 --iterations 4 \
  --checkpoint-every 2 --keep-checkpoints 0 --checkpoint-dir "$WORK/every_ck" --quiet
expect_ok every_inherited train --data "$SMALL" --batch-size 32 --dim 4 --iterations 8 \
  --keep-checkpoints 0 --resume "$WORK/every_ck" --quiet
expect_ok every_zero train --data "$SMALL" --batch-size 32 --dim 4 --iterations 12 \
  --checkpoint-every 0 --keep-checkpoints 0 --resume "$WORK/every_ck" --quiet
every_list=$(cd "$WORK/every_ck" && ls -d ckpt-* | sort -t- -k2 -n | tr '\n' ' ')
if [[ "$every_list" == "ckpt-2 ckpt-4 ckpt-6 ckpt-8 ckpt-12 " ]]; then
  echo "ok   every_zero_checkpoints ($every_list)"
else
  echo "FAIL every_zero_checkpoints: $every_list (expected ckpt-2 ckpt-4 ckpt-6 ckpt-8 ckpt-12)"
  failures=$((failures + 1))
fi
# SGD ignores --eps and --initial-accumulator (with a warning): a resume naming them continues.
expect_ok identity_sgd_first train --data "synthetic:samples=512,tables=2" --optimizer sgd \
  --batch-size 32 --dim 4 --iterations 2 --checkpoint-dir "$WORK/sgd_ck" --quiet
expect_ok identity_sgd_resume train --data "synthetic:samples=512,tables=2" --optimizer sgd \
  --eps 1e-6 --initial-accumulator 0.5 --batch-size 32 --dim 4 --iterations 4 \
  --resume "$WORK/sgd_ck" --quiet
expect_error keep_without_dir "--keep-checkpoints 3 needs --checkpoint-dir" train --data "$SYN" \
  --keep-checkpoints 3 --quiet
expect_error bad_eval_fraction "eval-fraction" train --data "$SYN" --eval-fraction 1.5 --quiet
# Numbers are decimal: an empty value (an unset shell variable) is not 0, 010 is not octal 8 and
# 0x10 not 16.
expect_error empty_number "--lr: an empty value is not a number" train --data "$SYN" --lr "" --quiet
expect_error octal_number "--batch-size: '010': a leading 0 would read as octal" train \
  --data "$SYN" --batch-size 010 --quiet
expect_error hex_number "--lr: '0x10' is not a decimal number" train --data "$SYN" --lr 0x10 \
  --quiet
"$BAGPIPE" train --data "$SYN" --no-such-flag >/dev/null 2>&1
if [[ $? -ne 2 ]]; then
  echo "FAIL usage_error_status: an unknown flag did not exit 2"
  failures=$((failures + 1))
fi
expect_ok float_zero_exponent train --data "$SYN" --iterations 1 --lr 0e0 --dense-lr 0E-3 --quiet
expect_error stats_empty_number "--max-samples: an empty value is not a number" data-stats \
  --data "$SYN" --max-samples ""
expect_error bad_link "server-link|link" train --data "$SYN" --server-link "fast" --quiet
expect_error compare_missing "summary.json|No such" compare "$WORK/nothing" "$WORK/off"
mkdir -p "$WORK/not_a_run" && echo '{}' >"$WORK/not_a_run/summary.json"
expect_error compare_not_a_summary "not_a_run/summary.json: not a run summary \(no .params_sha256." \
  compare "$WORK/off" "$WORK/not_a_run"
# Two outputs naming one file would overwrite each other: refused before anything runs.
expect_error params_vs_summary "--summary-json and --dump-params name the same file" train \
  --data "$SYN" --iterations 2 --quiet --dump-params "$WORK/clash" \
  --summary-json "$WORK/clash/params.bin"
expect_error params_vs_metrics "--metrics-out and --dump-params name the same file" train \
  --data "$SYN" --iterations 2 --quiet --dump-params "$WORK/clash" \
  --metrics-out "$WORK/clash/params.bin"
# A fresh run into an earlier run's --out that fails leaves no summary its metrics contradict:
# either it failed before its metrics file started (the earlier run's files stay as they were)
# or the earlier summary and parameters went with the earlier metrics (the oracle's error here
# races with the trainer's start, so both happen).
expect_ok stale_first train --data "$SYN" --iterations 3 --quiet --out "$WORK/stale" \
  --dump-params "$WORK/stale"
cp "$WORK/stale/metrics.jsonl" "$WORK/stale_first_metrics.jsonl"
expect_error stale_second "error:" train --data "$SYN" --iterations 3 --quiet --out "$WORK/stale" \
  --dump-params "$WORK/stale" --cache oracle --cache-rows 10
if [[ -e "$WORK/stale/summary.json" || -e "$WORK/stale/params.bin" ]] &&
   ! cmp -s "$WORK/stale/metrics.jsonl" "$WORK/stale_first_metrics.jsonl"; then
  echo "FAIL stale_outputs: the failed run left the earlier run's summary or parameters" \
    "beside metrics of its own"
  failures=$((failures + 1))
fi
# Paths and column names that are not UTF-8 (Latin-1 names): trained and summarised (JSON gets
# U+FFFD for those bytes), not aborted once the training is done.
cp "$SRC/tests/fixtures/criteo_kaggle_sample_100.tsv" "$WORK/latin1_"$'\xe9'".tsv"
expect_ok latin1_path train --data "criteo:$WORK/latin1_"$'\xe9'".tsv" --batch-size 16 \
  --iterations 3 --quiet --out "$WORK/latin1_"$'\xe9'"_out"
printf 'y,ann\xe9e,i\n1,1999,a\n0,2001,b\n' >"$WORK/latin1.csv"
expect_ok latin1_column convert --quiet --data "csv:$WORK/latin1.csv" \
  --schema "label=y; dense=ann"$'\xe9'"e; sparse=i" -o "$WORK/latin1.bin"
expect_ok latin1_column_stats data-stats --data "bin:$WORK/latin1.bin" --json
# Flags out of range, NaN, or beyond what the machine can run: refused up front, naming the flag
# and its value (and the estimate where the limit depends on the machine).
SHORT=(--data "$SYN" --batch-size 512 --iterations 2 --quiet)
expect_error huge_device_cache "--cache device: the tables' [0-9]+ rows exceed a cache's 2\^31 - 1 slots" \
  train --data "$CRITEO" --cache device --row-budget 99999999999 --iterations 1 --quiet
expect_error huge_lookahead "--lookahead 1000000000: the oracle's window would take about [0-9.]+ TB" \
  train "${SHORT[@]}" --lookahead 1000000000
expect_error many_servers "--servers 100000: an embedded job runs every server as a thread" \
  train "${SHORT[@]}" --servers 100000
expect_error slow_link "--server-link .*: one iteration's rows .* would take" \
  train "${SHORT[@]}" --server-link 1bit/s
expect_error late_link "--server-link .*: a latency of 1000h reaches half the peer timeout" \
  train "${SHORT[@]}" --server-link 10Gbit/s,1000h
expect_error negative_max_samples "--max-samples -5: must be >= 0" \
  train "${SHORT[@]}" --max-samples -5
expect_error nan_eval_fraction "--eval-fraction nan: must be in" \
  train "${SHORT[@]}" --eval-fraction nan
expect_error nan_peer_timeout "--peer-timeout nan: must be a positive, finite" \
  train "${SHORT[@]}" --peer-timeout nan
expect_error zero_peer_timeout "--peer-timeout 0: must be a positive, finite" \
  train "${SHORT[@]}" --peer-timeout 0
# Positive, but below what a duration holds: named as given, not as 0.
expect_error tiny_peer_timeout "--peer-timeout 1e-300: below the nanosecond" \
  train "${SHORT[@]}" --peer-timeout 1e-300
# An integer option's value that is no integer is called that before any range check.
expect_error fraction_trainers "--trainers: '1.5' is not an integer" train "${SHORT[@]}" -T 1.5
expect_error nan_dim "--dim: 'nan' is not an integer" train "${SHORT[@]}" --dim nan
# Options the configuration ignores are accepted with a warning naming them.
expect_ok ignored_options train --data "$SYN" --batch-size 512 --iterations 2 --quiet \
  --cache device --cache-rows 100 --optimizer sgd --eps 1e-3 --initial-accumulator 0.5
for warning in "--cache device keeps whole tables on every trainer: --cache-rows 100 is ignored" \
               "--eps is an Adagrad setting, and no optimizer here is Adagrad" \
               "--initial-accumulator is an Adagrad setting"; do
  if ! grep -q -- "$warning" "$WORK/ignored_options.out"; then
    echo "FAIL ignored_options: no warning '$warning'"
    failures=$((failures + 1))
  fi
done
# --eps is the dense Adagrad's default: used, so no warning.
expect_ok eps_for_dense train --data "$SYN" --batch-size 512 --iterations 2 --quiet \
  --optimizer sgd --dense-optimizer adagrad --eps 1e-3
if grep -q -- "--eps is an Adagrad setting" "$WORK/eps_for_dense.out"; then
  echo "FAIL eps_for_dense: --eps reaches the dense Adagrad, yet a warning says it is ignored"
  failures=$((failures + 1))
fi
expect_error zero_batch "--batch-size: 0 must be > 0" train "${SHORT[@]}" --batch-size 0
expect_error negative_iterations "--iterations: -1 must be >= 0" train "${SHORT[@]}" --iterations -1
expect_error word_dim "--dim: 'abc' is not an integer" train "${SHORT[@]}" --dim abc
# The model and its layer lists are checked as flags (Python's parse_train_args shares them).
expect_error unknown_model "--model: nope not in \{dlrm,logreg\}" train "${SHORT[@]}" --model nope
expect_error bad_layers "--bottom: .*1-2-x" train "${SHORT[@]}" --bottom 1-2-x
expect_error twice_lr "--lr: At Most 1 required but received 2" train "${SHORT[@]}" --lr 0.1 --lr 0.2
expect_error twice_synthetic_key "synthetic: 'samples' is given twice" \
  train --data "synthetic:samples=10,samples=20" --quiet
# Data without dense features: the DLRM refuses it by name (its bottom MLP needs one); the
# embedding-only model trains on it.
NO_DENSE_SCHEMA='label=rating>3.5; sparse=userId,movieId'
expect_error no_dense_dlrm "--model dlrm: .* has no dense features.*--model logreg" \
  train --data "$MOVIELENS" --schema "$NO_DENSE_SCHEMA" --quiet
expect_ok no_dense_logreg train --data "$MOVIELENS" --schema "$NO_DENSE_SCHEMA" --model logreg \
  --batch-size 2048 --iterations 10 --dim 8 --cache oracle --cache-rows 4000 --trainers 2 \
  --quiet --out "$WORK/no_dense"
if [[ -f "$WORK/no_dense/summary.json" ]] && ! did_its_work "$WORK/no_dense/summary.json"; then
  failures=$((failures + 1))
fi
# --model logreg has no MLPs: --bottom and --top (even a malformed one) are ignored with a
# warning, and its summary names no MLP.
expect_ok logreg_ignores_mlps train --data "$MOVIELENS" --schema "$NO_DENSE_SCHEMA" --model logreg \
  --batch-size 2048 --iterations 2 --dim 8 --bottom 3-4-8 --top 5-3-1 --quiet \
  --out "$WORK/logreg_mlps"
if ! grep -q -- "--model logreg has no MLPs: --bottom and --top are ignored" \
     "$WORK/logreg_ignores_mlps.out" ||
   ! python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(0 if s["model"] == "logreg" and "top" not in s and "bottom" not in s else 1)' \
     "$WORK/logreg_mlps/summary.json"; then
  echo "FAIL logreg_ignores_mlps: no warning, or the summary names an MLP"
  failures=$((failures + 1))
fi
expect_error schema_with_criteo "--schema applies to csv: sources only; 'criteo:'" \
  train --data "$CRITEO" --schema "label=x" --quiet
expect_error row_budget_with_csv "--row-budget applies to criteo: sources only; 'csv:'" \
  train --data "$MOVIELENS" --schema "label=rating>3.5; sparse=userId" --row-budget 10 --quiet
expect_error data_without_kind "data source '.*criteo_kaggle_sample_100.tsv' has no kind" \
  data-stats --data "${CRITEO#criteo:}" --quiet
expect_error metrics_is_summary "--metrics-out and --summary-json name the same file '.*/same.json'" \
  train "${SHORT[@]}" --metrics-out "$WORK/same.json" --summary-json "$WORK/./same.json"

# --- one validated set of options ------------------------------------------------------------
expect_error split_with_trainers "--oracle-split-parts 4.*--trainers 2" train --data "$SYN" \
  --oracle-split-parts 4 --trainers 2 --quiet
expect_error split_with_device "--oracle-split-parts 2.*--cache device" train --data "$SYN" \
  --oracle-split-parts 2 --cache device --quiet
expect_error zero_eps "--eps 0.*adagrad" train --data "$SYN" --optimizer adagrad --eps 0 --quiet
expect_error negative_dense_lr "--dense-lr -1" train --data "$SYN" --dense-lr -1 --quiet
expect_error negative_accumulator "--initial-accumulator -2" train --data "$SYN" \
  --initial-accumulator -2 --quiet
# --dense-lr 0 means 0 (not "use --lr"): the dense model stays where it started, so the dense
# optimizer makes no difference; eps and the accumulator reach summary.json.
for opt in sgd adagrad; do
  expect_ok "dense_lr0_$opt" train --data "$SYN" --batch-size 512 --iterations 5 --quiet \
    --dense-optimizer $opt --dense-lr 0 --eps 1e-10 --initial-accumulator 0.1 --deterministic \
    --out "$WORK/dl0_$opt" --dump-params "$WORK/dl0_$opt"
done
expect_ok compare_dense_lr0 compare "$WORK/dl0_sgd" "$WORK/dl0_adagrad"
if ! grep -q "max |a - b|: dense 0," "$WORK/compare_dense_lr0.out"; then
  echo "FAIL --dense-lr 0: the dense parameters moved"
  sed 's/^/    /' "$WORK/compare_dense_lr0.out" | head -5
  failures=$((failures + 1))
fi
# Runs of different models (another --dim) compare their throughput and losses, not their values.
expect_ok dim8 train --data "$SYN" --batch-size 512 --iterations 5 --quiet --dim 8 \
  --deterministic --out "$WORK/dim8" --dump-params "$WORK/dim8"
expect_ok compare_dims compare "$WORK/dl0_sgd" "$WORK/dim8"
if ! grep -q "different models: .* values not compared" "$WORK/compare_dims.out" ||
   grep -q "max |a - b|" "$WORK/compare_dims.out"; then
  echo "FAIL compare of different --dim: values compared across models"
  sed 's/^/    /' "$WORK/compare_dims.out" | head -5
  failures=$((failures + 1))
fi
for key in dense_lr:0.0 eps:1e-10 initial_accumulator:0.1; do
  value=$(json_field "$WORK/dl0_adagrad/summary.json" "${key%%:*}" 2>/dev/null)
  if ! python3 -c "import sys; sys.exit(abs(float('$value') - ${key#*:}) > 1e-6 * abs(${key#*:}) + 1e-12)" 2>/dev/null; then
    echo "FAIL summary.json: ${key%%:*} is '$value', expected ${key#*:}"
    failures=$((failures + 1))
  fi
done
# --- hostile input: a clear error naming the file and line (or flag), never a crash or hang ----
CSV_SPEC='label=a; dense=b; sparse=c'
printf 'a,b,c\n' >"$WORK/header_only.csv"
expect_error csv_header_only "header_only.csv' has a header but no data lines" train \
  --data "csv:$WORK/header_only.csv" --schema "$CSV_SPEC" --quiet
printf 'a,b,c\n1,2,x\n0,inf,y\n' >"$WORK/inf.csv"
expect_error csv_inf "inf.csv:3:3: dense column 'b': 'inf' is not a finite float" train \
  --data "csv:$WORK/inf.csv" --schema "$CSV_SPEC" --quiet
printf 'a,b,c\n7,2,x\n' >"$WORK/label7.csv"
expect_error csv_label_7 "label7.csv:2:1: label column 'a': 7 is outside \\[0, 1\\]" train \
  --data "csv:$WORK/label7.csv" --schema "$CSV_SPEC" --quiet
expect_error csv_dev_zero "/dev/zero:1: line longer than" data-stats --data csv:/dev/zero \
  --schema 'label=a' --quiet
expect_error criteo_dev_zero "/dev/zero:1: line longer than" sim --data criteo:/dev/zero \
  --cache-rows 10 --quiet
expect_error criteo_directory "is a directory" data-stats --data "criteo:$WORK" --quiet
expect_error data_stats_empty "synthetic .* yields no samples" data-stats \
  --data "synthetic:samples=0" --quiet
expect_error bin_directory "is a directory" train --data "bin:$WORK" --quiet
expect_error diverged "training diverged: the loss .* is .*nan" train --data "$SYN" --lr 1e30 \
  --batch-size 256 --iterations 5 --quiet
# Diverged before a checkpoint: refused, so that no checkpoint nothing can train on from is left
# as the newest one.
# (The loop may see the non-finite loss before the checkpoint sees the non-finite parameters.)
expect_error diverged_checkpoint \
  "(saving the loop state for checkpoint [0-9]+: training diverged: dense parameter [0-9]+ of|training diverged: the loss at iteration [0-9]+ is)" \
  train --data "$SYN" --lr 1e30 --batch-size 256 --iterations 6 --metrics-interval 100 \
  --checkpoint-dir "$WORK/diverged_ck" --checkpoint-every 2 --quiet
if compgen -G "$WORK/diverged_ck/ckpt-*/MANIFEST" >/dev/null; then
  echo "FAIL diverged_checkpoint: a checkpoint was completed: $(ls "$WORK"/diverged_ck/ckpt-*/MANIFEST)"
  failures=$((failures + 1))
fi
expect_error convert_no_dir "cannot .*no/such/x.bin" convert --data "$CRITEO" --out "$WORK/no/such/x.bin" \
  --quiet
# Sizes no machine holds: refused up front with the figure, not ended by std::bad_alloc.
expect_error sim_huge_lookahead "--lookahead 2147483647: the oracle's window would take" sim \
  --data "$SYN" --batch-size 16 --cache-rows 100 --lookahead 2147483647 --policies oracle --quiet
expect_error sim_huge_cache "--cache-rows 9223372036854775807: at most 2\\^31 - 1 rows" sim \
  --data "$SYN" --batch-size 16 --cache-rows 9223372036854775807 --quiet
# --cache device holds every row: its memory is estimated from them, not from the --cache-rows
# it ignores (more rows than 32-bit slots: huge_device_cache above).
expect_error device_memory "--cache device \\(a cache of all 2000000000 rows\\)" \
  train --data "synthetic:tables=2,rows=1000000000" --cache device --cache-rows 10 --quiet
expect_error dim_too_large "--dim 2147483647: must be in \\[1, 2\\^20\\]" train --data "$SYN" \
  --dim 2147483647 --quiet
# A damaged params.bin: shorter than its header says, then one flipped body byte. The run's own
# params.bin is compared, whatever path its summary.json recorded (left pointing at the original
# here).
cp -r "$WORK/off" "$WORK/damaged"
size=$(stat -c %s "$WORK/damaged/params.bin")
truncate -s $((size - 4)) "$WORK/damaged/params.bin"
expect_error compare_truncated_params "params.bin' is truncated for its header" compare \
  "$WORK/off" "$WORK/damaged"
cp "$WORK/off/params.bin" "$WORK/damaged/params.bin"
printf '\x55' | dd of="$WORK/damaged/params.bin" bs=1 seek=$((size - 3)) conv=notrunc 2>/dev/null
expect_error compare_damaged_params "params.bin' is corrupt: SHA-256" compare "$WORK/off" \
  "$WORK/damaged"
# Hand-edited run files: wrong types are errors naming the file and line; a null loss is shown.
cp -r "$WORK/off" "$WORK/edited"
rm -f "$WORK/edited/params.bin"
sed -i '/"params"/d' "$WORK/edited/summary.json"
echo '{"kind":"train","iteration":1000,"loss":null}' >>"$WORK/edited/metrics.jsonl"
expect_ok compare_null_loss compare "$WORK/off" "$WORK/edited"
echo '{"kind":"train","iteration":"late","loss":1}' >>"$WORK/edited/metrics.jsonl"
lines=$(wc -l <"$WORK/edited/metrics.jsonl")
expect_error compare_bad_metrics "metrics.jsonl:$lines: metrics line: .iteration. is a string" \
  compare "$WORK/off" "$WORK/edited"
# A new run in an --out whose params.bin another run dumped removes it with the old summary: its
# own summary names no dump, and compare goes by the fingerprints (the stale file made compare
# refuse the run).
expect_ok stale_dump_first train --data "$SYN" --batch-size 512 --iterations 5 --quiet \
  --out "$WORK/stale_dump" --dump-params "$WORK/stale_dump"
expect_ok stale_dump_second train --data "$SYN" --batch-size 512 --iterations 6 --quiet \
  --out "$WORK/stale_dump"
if [[ -e "$WORK/stale_dump/params.bin" ]]; then
  echo "FAIL stale_dump_second: the earlier run's params.bin stayed in --out"
  failures=$((failures + 1))
fi
expect_ok compare_stale_dump compare "$WORK/stale_dump" "$WORK/off"
grep -q "no params.bin in run A: compared the SHA-256 fingerprints only" "$WORK/compare_stale_dump.out" ||
  { echo "FAIL compare_stale_dump: $(head -4 "$WORK/compare_stale_dump.out")"; failures=$((failures + 1)); }
# A dump outside --out, given as a relative path: compare finds it from any directory.
(cd "$WORK" && "$BAGPIPE" train --data "$SYN" --batch-size 512 --iterations 5 --quiet \
  --out rel_run --dump-params rel_dump) >"$WORK/rel_run.out" 2>&1 ||
  { echo "FAIL rel_run: $(tail -2 "$WORK/rel_run.out")"; failures=$((failures + 1)); }
if (cd / && "$BAGPIPE" compare "$WORK/rel_run" "$WORK/rel_run") >"$WORK/rel_compare.out" 2>&1 &&
  grep -q "parameters bit-identical: yes" "$WORK/rel_compare.out" &&
  grep -q "max |a - b|: dense 0" "$WORK/rel_compare.out"; then
  echo "ok   rel_compare (the dump a relative --dump-params named, compared from /)"
else
  echo "FAIL rel_compare: $(head -4 "$WORK/rel_compare.out")"
  failures=$((failures + 1))
fi
# A summary that names a dump of other parameters (another run's, moved beside it) is refused:
# the fingerprints differ.
cp -r "$WORK/off" "$WORK/moved"
rm -f "$WORK/moved/params.bin"
python3 -c "
import json, sys
p = sys.argv[1]; s = json.load(open(p)); s['params'] = sys.argv[2]; json.dump(s, open(p, 'w'))" \
  "$WORK/moved/summary.json" "$WORK/dim8/params.bin"
expect_error compare_other_params "dim8/params.bin' holds other parameters \(sha256 [0-9a-f]+\) than the run '.*moved' finished with" \
  compare "$WORK/off" "$WORK/moved"

# Options and files a user can get wrong.
expect_error seed_negative "--seed: '-1' is out of range \(\[0, 2\^64 - 1\]\)" train \
  --data "$SYN" --seed=-1 --quiet
expect_error seed_overflow "--seed: '18446744073709551616' is out of range" train --data "$SYN" \
  --seed 18446744073709551616 --quiet
cp "${CRITEO#criteo:}" "$WORK/same.tsv"
expect_error convert_onto_input "--out '.*same.tsv' is the input file of --data" convert \
  --data "criteo:$WORK/same.tsv" --out "$WORK/same.tsv"
if ! cmp -s "${CRITEO#criteo:}" "$WORK/same.tsv"; then
  echo "FAIL convert_onto_input: the input file changed"
  failures=$((failures + 1))
fi
expect_error sim_empty_capacity "--cache-rows '40,,50': expected positive row counts" sim \
  --data "$SYN" --cache-rows 40,,50 --quiet
expect_error sim_mrc_nowhere "--mrc '$WORK/none/mrc.csv': no directory '$WORK/none'" sim \
  --data "$SYN" --cache-rows 5000 --mrc "$WORK/none/mrc.csv" --quiet
expect_error sim_no_policy "--policies ',' names no policy" sim --data "$SYN" --cache-rows 5000 \
  --policies , --quiet
# The default cache holds at most every row (here the fixture's); the window is what cannot fit.
expect_error batch_too_large "--lookahead 20: the oracle's window would take about .* a batch of 99999999999 samples" \
  train --data "$CRITEO" --batch-size 99999999999 --quiet
# --skip-bad-lines reports what it skipped: 20 of the 100 lines have an extra tab or label 2,
# counted once though the dictionary scan, 3 epochs and the evaluation range read them again.
python3 -c "
import sys
lines = open(sys.argv[1]).read().split('\n')[:-1]
for i, line in enumerate(lines):
    if i % 10 == 3:
        line = line.replace('\t', '\t\t', 1)
    elif i % 10 == 5:
        line = '2' + line[1:]
    print(line)" "${CRITEO#criteo:}" >"$WORK/somebad.tsv"
expect_ok skip_bad_lines_train train --data "criteo:$WORK/somebad.tsv" --skip-bad-lines \
  --batch-size 16 --epochs 3 --eval-fraction 0.2 --dim 4 --quiet --out "$WORK/somebad"
if ! grep -q "skipped 20 bad lines of the data; the first: .*somebad.tsv:4:" \
     "$WORK/skip_bad_lines_train.out" ||
   [[ "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['oracle']['data']['skipped_lines'])" \
         "$WORK/somebad/summary.json")" != 20 ]]; then
  echo "FAIL skip_bad_lines_train: $(tail -2 "$WORK/skip_bad_lines_train.out")"
  failures=$((failures + 1))
fi
expect_ok skip_bad_lines_sim sim --data "criteo:$WORK/somebad.tsv" --skip-bad-lines \
  --batch-size 16 --cache-rows 500 --quiet
if ! grep -q "skipped 20 bad lines; the first: .*somebad.tsv:4:" "$WORK/skip_bad_lines_sim.out"; then
  echo "FAIL skip_bad_lines_sim: $(tail -2 "$WORK/skip_bad_lines_sim.out")"
  failures=$((failures + 1))
fi
expect_ok skip_bad_lines_stats data-stats --data "criteo:$WORK/somebad.tsv" --skip-bad-lines \
  --batch-size 16 --quiet
if ! grep -q "skipped 20 bad lines; the first: .*somebad.tsv:4:" "$WORK/skip_bad_lines_stats.out"; then
  echo "FAIL skip_bad_lines_stats: $(tail -2 "$WORK/skip_bad_lines_stats.out")"
  failures=$((failures + 1))
fi

# A file-size limit (ulimit -f) is a write error naming the file, not a death by SIGXFSZ.
(
  ulimit -f 1000
  "$BAGPIPE" convert --data "synthetic:samples=200000,tables=8,scale=0.01" \
    --out "$WORK/too_large.bin" --quiet >"$WORK/file_size_limit.out" 2>&1
  echo "exit $?" >>"$WORK/file_size_limit.out"
)
if grep -q "File too large" "$WORK/file_size_limit.out" && grep -q "^exit 1$" "$WORK/file_size_limit.out"; then
  echo "ok   file_size_limit"
else
  echo "FAIL file_size_limit: $(tail -2 "$WORK/file_size_limit.out")"
  failures=$((failures + 1))
fi

# Two jobs on one --out or --checkpoint-dir: the second is refused while the first runs (it used
# to pass the directory checks and replace the first one's files).
"$BAGPIPE" train --data "$SYN" --batch-size 256 --iterations 1000000 --quiet \
  --out "$WORK/locked" --checkpoint-dir "$WORK/locked_ck" >"$WORK/locked.out" 2>&1 &
first=$!
for _ in $(seq 100); do
  [[ -s "$WORK/locked/.bagpipe-run.lock" && -s "$WORK/locked_ck/.bagpipe-checkpoints.lock" ]] && break
  sleep 0.1
done
expect_error out_in_use "--out $WORK/locked is in use by another job \(pid $first holds the lock" \
  train --data "$SYN" --batch-size 256 --iterations 5 --quiet --out "$WORK/locked"
expect_error checkpoint_dir_in_use "--checkpoint-dir $WORK/locked_ck is in use by another job \(pid $first" \
  train --data "$SYN" --batch-size 256 --iterations 5 --quiet --checkpoint-dir "$WORK/locked_ck"
kill -INT $first
wait $first
if [[ $? -ne 75 ]]; then
  echo "FAIL locked: the first job did not stop with status 75: $(tail -2 "$WORK/locked.out")"
  failures=$((failures + 1))
fi

# Outputs inside the checkpoint directory would make every later --resume refuse it; a mistyped
# --resume path is refused without creating it (it became a stray directory there).
expect_error out_in_checkpoint_dir "--out $WORK/same lies in the checkpoint directory $WORK/same" \
  train --data "$SYN" --batch-size 256 --iterations 2 --quiet --checkpoint-dir "$WORK/same" \
  --out "$WORK/same"
expect_error dump_in_checkpoint_dir "--dump-params $WORK/ck2/p lies in the checkpoint directory" \
  train --data "$SYN" --batch-size 256 --iterations 2 --quiet --checkpoint-dir "$WORK/ck2" \
  --dump-params "$WORK/ck2/p"
expect_ok typo_first train --data "$SYN" --batch-size 256 --iterations 2 --quiet \
  --checkpoint-dir "$WORK/typo"
expect_error resume_typo "--resume $WORK/typo/ckpt2: no such directory" \
  train --data "$SYN" --batch-size 256 --iterations 4 --quiet --resume "$WORK/typo/ckpt2"
touch "$WORK/typo_file"
expect_error resume_file "--resume $WORK/typo_file: not a directory" \
  train --data "$SYN" --batch-size 256 --iterations 4 --quiet --resume "$WORK/typo_file"
if [[ -e "$WORK/typo/ckpt2" ]]; then
  echo "FAIL resume_typo: the refused --resume path was created"
  failures=$((failures + 1))
fi
expect_ok resume_after_typo train --data "$SYN" --batch-size 256 --iterations 4 --quiet \
  --resume "$WORK/typo"

# A pipe is read once: a dictionary-encoded pipe is refused before it is read, and convert (one
# pass) turns it into a file that trains.
if piped=$(cat "${CRITEO#criteo:}" | "$BAGPIPE" train --data criteo:/dev/stdin --quiet 2>&1); then
  echo "FAIL pipe_dictionary: trained from a pipe that needs two passes"
  failures=$((failures + 1))
elif ! grep -q "not a regular file (a pipe, FIFO or device is read once), and criteo: data without --row-budget are dictionary-encoded" <<<"$piped"; then
  echo "FAIL pipe_dictionary: $piped"
  failures=$((failures + 1))
else
  echo "ok   pipe_dictionary"
fi
# So is one that --epochs 2 would read twice (refused before the first epoch trains).
if piped=$(cat "${CRITEO#criteo:}" | "$BAGPIPE" train --data criteo:/dev/stdin --row-budget 1000 \
     --epochs 2 --batch-size 16 --quiet 2>&1); then
  echo "FAIL pipe_epochs: trained two epochs from a pipe"
  failures=$((failures + 1))
elif ! grep -q "not a regular file (a pipe, FIFO or device is read once), and --epochs 2 reads it 2 times" <<<"$piped"; then
  echo "FAIL pipe_epochs: $piped"
  failures=$((failures + 1))
else
  echo "ok   pipe_epochs"
fi
if cat "${CRITEO#criteo:}" | "$BAGPIPE" convert --data criteo:/dev/stdin --out "$WORK/piped.bin" \
     --quiet >"$WORK/piped.out" 2>&1; then
  expect_ok pipe_converted train --data "bin:$WORK/piped.bin" --batch-size 16 --dim 4 --quiet
else
  echo "FAIL pipe_converted: $(tail -3 "$WORK/piped.out")"
  failures=$((failures + 1))
fi

# One job's outputs are not written by another: a --metrics-out another job appends to, or a
# --dump-params, --out or --checkpoint-dir in a running job's --out or --checkpoint-dir, is
# refused naming the holder (the lines of two jobs interleaved in one metrics file).
"$BAGPIPE" train --data "$SYN" --batch-size 64 --epochs 100000 --quiet --metrics-interval 1 \
  --out "$WORK/holder" --checkpoint-dir "$WORK/holder_ck" \
  --metrics-out "$WORK/shared_metrics.jsonl" >"$WORK/holder.log" 2>&1 &
holder=$!
for _ in $(seq 1 600); do
  [[ -s "$WORK/shared_metrics.jsonl" ]] && break
  sleep 0.1
done
expect_error shared_metrics \
  "--metrics-out $WORK/shared_metrics.jsonl is in use by another job \(pid $holder holds" \
  train --data "$SYN" --batch-size 64 --iterations 3 --quiet --metrics-out "$WORK/shared_metrics.jsonl"
expect_error dump_into_running_out "--dump-params $WORK/holder is in use by another job \(pid $holder" \
  train --data "$SYN" --batch-size 64 --iterations 3 --quiet --dump-params "$WORK/holder"
expect_error out_into_running_checkpoints "--out $WORK/holder_ck is in use by another job \(pid $holder" \
  train --data "$SYN" --batch-size 64 --iterations 3 --quiet --out "$WORK/holder_ck"
expect_error checkpoints_into_running_out \
  "--checkpoint-dir $WORK/holder is in use by another job \(pid $holder" \
  train --data "$SYN" --batch-size 64 --iterations 3 --quiet --checkpoint-dir "$WORK/holder"
kill -TERM "$holder" 2>/dev/null
wait "$holder"
# The holder ran alone: every iteration once in its metrics.
if ! python3 -c "
import json, sys
its = [json.loads(l)['iteration'] for l in open(sys.argv[1])]
sys.exit(0 if its and its == list(range(1, len(its) + 1)) else 1)" "$WORK/shared_metrics.jsonl"; then
  echo "FAIL shared_metrics: the holder's metrics are not its own iterations once each"
  failures=$((failures + 1))
fi

# The plot scripts check their inputs before they need matplotlib: a message naming the file and
# line, exit 1, no traceback.
PLOT_PYTHON=/usr/bin/python3
[[ -x $PLOT_PYTHON ]] || PLOT_PYTHON=python3
plot_error() {  # plot_error NAME REGEX SCRIPT ARGS...
  local name=$1 regex=$2 script=$3
  shift 3
  "$PLOT_PYTHON" "$SRC/scripts/$script" "$@" >"$WORK/$name.out" 2>&1
  local rc=$?
  if [[ $rc -eq 1 ]] && grep -Eq -- "$regex" "$WORK/$name.out" &&
     ! grep -q Traceback "$WORK/$name.out"; then
    echo "ok   $name"
  else
    echo "FAIL $name: exit $rc: $(tail -3 "$WORK/$name.out")"
    failures=$((failures + 1))
  fi
}
mkdir -p "$WORK/plot_line" "$WORK/plot_summary"
echo '[1]' >"$WORK/plot_line/metrics.jsonl"
plot_error plot_line_not_object "plot_line/metrics.jsonl:1: not a JSON object" plot_runs.py \
  "$WORK/plot_line" --out "$WORK/plot"
cp "$WORK/off/metrics.jsonl" "$WORK/plot_summary/"
echo '[]' >"$WORK/plot_summary/summary.json"
plot_error plot_summary_not_object "plot_summary/summary.json: not a JSON object" plot_runs.py \
  "$WORK/plot_summary" --out "$WORK/plot"
printf 'policy,capacity,miss_ratio\noracle,100,nan\n' >"$WORK/bad_mrc.csv"
plot_error plot_mrc_nan "line 2: capacity must be a finite count and miss_ratio in \[0, 1\]" \
  plot_mrc.py "$WORK/bad_mrc.csv" --out "$WORK/mrc.png"

# --- long work shows progress ----------------------------------------------------------------
# Without --quiet, stderr (a file here, not a terminal) gets plain progress lines: the first and
# the last of each bar at least. --epochs over a file has a total (the scan counted the samples:
# 3750 training samples, 15 batches of 256 per epoch), and each pass over the data has its line:
# the count for --eval-fraction, the training (its total known from the count) and the
# evaluation.
for _ in $(seq 50); do cat "$SRC/tests/fixtures/criteo_kaggle_sample_100.tsv"; done \
  >"$WORK/progress.tsv"  # 1.2 MB: smaller files get no bar
expect_ok progress_epochs train --data "criteo:$WORK/progress.tsv" --batch-size 256 --epochs 2 \
  --dim 4 --eval-fraction 0.25 --cache oracle --cache-rows 1300
expect_ok progress_quiet train --data "criteo:$WORK/progress.tsv" --batch-size 256 --epochs 2 \
  --dim 4 --eval-fraction 0.25 --cache oracle --cache-rows 1300 --quiet
# A synthetic stream's size is in its configuration: 1000 samples, 10 batches per epoch.
expect_ok progress_synthetic train --data "synthetic:samples=1000,tables=2,rows=50" \
  --batch-size 100 --epochs 3 --dim 4 --cache-rows 100
check_progress() {
  local name=$1 regex=$2
  if grep -Eq -- "$regex" "$WORK/$name.out"; then
    echo "ok   $name shows '$regex'"
  else
    echo "FAIL $name: no progress line matching '$regex' in:"
    sed 's/^/    /' "$WORK/$name.out" | tail -20
    failures=$((failures + 1))
  fi
}
check_progress progress_epochs '^scanning for table sizes \[#+\] 1/1 MB 100%'
check_progress progress_epochs '^counting the samples for --eval-fraction \[#+\] 5000/5000 samples'
check_progress progress_epochs '^train \[#+\] 30/30 100% .* in [0-9]'
check_progress progress_epochs '^train \[[#.]+\] [0-9]+/30 .* eta '
check_progress progress_epochs '^evaluating \[#+\] 5/5 batches 100%'
check_progress progress_synthetic '^train \[#+\] 30/30 100%'
if grep -Eq '\[[#.]+\]' "$WORK/progress_quiet.out"; then
  echo "FAIL progress_quiet: --quiet drew a bar"
  failures=$((failures + 1))
else
  echo "ok   progress_quiet draws no bar"
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
