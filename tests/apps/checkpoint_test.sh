#!/usr/bin/env bash
# Checkpoint and resume, end to end (issue 18, "Done when"):
#  - a run of N iterations, and a run stopped at K < N then resumed to N, end with bit-identical
#    parameters (--deterministic): --cache oracle and lru, 1 and 2 trainers embedded, and under
#    mpirun with T = 2, S = 2; also when the stop is a SIGTERM in the middle of an iteration, and
#    when rank 0 is SIGKILLed right after a checkpoint started (the previous one is used);
#  - a second signal exits at once;
#  - each refusal (checksum, truncation, format version, options, another job's directory) has
#    its message and overwrites nothing; a damaged byte in any checkpoint file is detected.
# Usage: checkpoint_test.sh BAGPIPE_BINARY [MPIEXEC]
set -u
BAGPIPE=$1
MPIEXEC=${2:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
SYN="synthetic:samples=30000,tables=6,scale=0.001,alpha=1.05,seed=3"
# Every run names --batch-size, --trainers and --cache itself (CLI11 refuses repeated options).
COMMON=(--data "$SYN" --cache-rows 1500 --optimizer adagrad --lookahead 4 --metrics-interval 5
        --deterministic --quiet)
B=(--batch-size 256 --dim 8)
N=24
K=10
failures=0
source "$(dirname "$0")/did_its_work.sh"
fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}

# field FILE PATH: a field of a JSON file ("a.b" for nested ones).
field() {
  python3 -c "
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split('.'):
    v = v[k]
print(v)" "$1" "$2" 2>/dev/null
}
sha() { field "$1/summary.json" params_sha256; }

# train NAME ARGS...: runs bagpipe train (embedded), output in $WORK/NAME.log; returns its status.
train() {
  local name=$1
  shift
  "$BAGPIPE" train "${COMMON[@]}" "$@" >"$WORK/$name.log" 2>&1
}
mpi_train() {
  local name=$1 np=$2
  shift 2
  timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$BAGPIPE" train "${COMMON[@]}" "$@" \
    >"$WORK/$name.log" 2>&1
}

# same NAME RUN REF: RUN's parameters are bit-identical to REF's, and RUN resumed (not a rerun).
same() {
  local name=$1 run=$2 ref=$3 first=${4:-}
  if [[ -z "$(sha "$run")" || "$(sha "$run")" != "$(sha "$ref")" ]]; then
    fail "$name: parameters differ from the uninterrupted run ($(sha "$run") vs $(sha "$ref"))"
    tail -5 "$WORK/$name.log" 2>/dev/null
    return
  fi
  if [[ -n $first && "$(field "$run/summary.json" first_iteration)" != "$first" ]]; then
    fail "$name: expected the run to resume at iteration $first, it started at $(field "$run/summary.json" first_iteration)"
    return
  fi
  if ! did_its_work "$run/summary.json"; then
    fail "$name: the resumed run did not do its work (the test would not see a wrong cache)"
    return
  fi
  echo "ok   $name: $(sha "$run")"
}

# --- stop at K (end of a run with a checkpoint dir), resume to N: embedded ------------------
for T in 1 2; do
  ref="$WORK/ref_T$T"
  train "ref_T$T" "${B[@]}" --iterations $N --trainers "$T" --cache off --out "$ref" ||
    { fail "reference T=$T"; tail -5 "$WORK/ref_T$T.log"; }
  for mode in oracle lru; do
    ck="$WORK/ck_${mode}_T$T"
    run="$WORK/run_${mode}_T$T"  # both runs write here: the metrics file continues
    if ! train "stop_${mode}_T$T" "${B[@]}" --iterations $K --trainers "$T" --cache "$mode" \
        --checkpoint-dir "$ck" --checkpoint-every 4 --out "$run"; then
      fail "run to $K with checkpoints ($mode, T=$T)"; tail -5 "$WORK/stop_${mode}_T$T.log"
      continue
    fi
    # Every 4 iterations and at the end: 4, 8, 10; the newest two are kept.
    if [[ "$(ls "$ck" | tr '\n' ' ')" != "ckpt-10 ckpt-8 " ]]; then
      fail "$mode T=$T: expected ckpt-8 and ckpt-10 in $ck, found: $(ls "$ck" | tr '\n' ' ')"
    fi
    if ! train "resumed_${mode}_T$T" "${B[@]}" --iterations $N --trainers "$T" --cache "$mode" \
        --resume "$ck" --out "$run"; then
      fail "resume ($mode, T=$T)"; tail -5 "$WORK/resumed_${mode}_T$T.log"; continue
    fi
    same "embedded --cache $mode T=$T: $N iterations == $K + resumed to $N" "$run" "$ref" $K
  done
done
# The metrics of the resumed run continue the stopped run's (lines up to K kept, none twice),
# each line with the number of iterations it covers.
its=$(python3 -c "
import json, sys
print(' '.join('%d:%d' % (m['iteration'], m['iterations'])
               for m in map(json.loads, open(sys.argv[1]))))" \
  "$WORK/run_oracle_T2/metrics.jsonl" 2>/dev/null)
if [[ "$its" != "5:5 10:5 15:5 20:5 24:4" ]]; then
  fail "resumed metrics: iterations '$its'"
fi
# Nothing is missing, and no warning says so.
if grep -q "has no line for iterations" "$WORK"/resumed_*.log; then
  fail "a resume into the stopped run's --out warned of missing metrics lines"
fi

# --- SIGTERM in the middle of an iteration (embedded, T = 2) --------------------------------
# A long run stops at some iteration S; resumed to S + 20 it equals a plain run of S + 20.
S64=(--batch-size 64 --dim 8)
# stopped_at LOG: the iteration of the resume line, or empty.
stopped_at() {
  grep -Eo "stopped by SIGTERM at iteration [0-9]+; resume with --resume" "$1" | grep -Eo "[0-9]+"
}
# wait_for_metrics DIR: until training is under way (the first metrics line).
wait_for_metrics() {
  for _ in $(seq 1 600); do
    [[ -s "$1/metrics.jsonl" ]] && return
    sleep 0.05
  done
}
ck="$WORK/ck_term"
"$BAGPIPE" train "${COMMON[@]}" "${S64[@]}" --iterations 1000000 --trainers 2 --cache oracle \
  --checkpoint-dir "$ck" --out "$WORK/term" >"$WORK/term.log" 2>&1 &
pid=$!
wait_for_metrics "$WORK/term"
kill -TERM $pid
wait $pid
rc=$?
S=$(stopped_at "$WORK/term.log")
if [[ $rc -ne 75 || -z $S ]]; then
  fail "SIGTERM: expected exit 75 and a resume line, got exit $rc:"; tail -5 "$WORK/term.log"
else
  echo "ok   SIGTERM: exit 75, '$(grep -m1 'stopped by' "$WORK/term.log")'"
  if [[ -e "$WORK/term/summary.json" ]]; then fail "SIGTERM: a stopped run wrote summary.json"; fi
  M=$((S + 20))
  train term_resumed "${S64[@]}" --iterations $M --trainers 2 --cache lru --resume "$ck" \
    --out "$WORK/term_resumed" || { fail "resume after SIGTERM"; tail -5 "$WORK/term_resumed.log"; }
  train ref_term "${S64[@]}" --iterations $M --trainers 2 --cache off --out "$WORK/ref_term" ||
    fail "SIGTERM reference"
  same "SIGTERM mid-run at $S, resumed with --cache lru to $M" "$WORK/term_resumed" \
    "$WORK/ref_term" "$S"
fi

# A second signal ends the process at once (128 + 15). The emulated slow link keeps the first
# stop busy (it runs the iterations already planned) long enough for the second to land.
"$BAGPIPE" train "${COMMON[@]}" "${S64[@]}" --iterations 1000000 --trainers 2 --cache oracle \
  --server-link "10Mbit/s,20ms" --out "$WORK/twice" >"$WORK/twice.log" 2>&1 &
pid=$!
wait_for_metrics "$WORK/twice"
kill -TERM $pid
sleep 0.3
kill -TERM $pid
wait $pid
rc=$?
if [[ $rc -ne 143 ]]; then
  fail "second SIGTERM: exit $rc (expected 143, at once)"; tail -3 "$WORK/twice.log"
else
  echo "ok   second SIGTERM: exited at once (exit 143)"
fi

# --- SIGKILL right after a checkpoint started: the previous one is used ---------------------
ck="$WORK/ck_kill"
BAGPIPE_TEST_KILL_IN_CHECKPOINT=20 "$BAGPIPE" train "${COMMON[@]}" "${B[@]}" --iterations 30 --trainers 2 \
  --cache oracle --checkpoint-dir "$ck" --checkpoint-every 10 --out "$WORK/kill" \
  >"$WORK/kill.log" 2>&1
rc=$?
if [[ $rc -ne 137 || ! -e "$ck/ckpt-10/MANIFEST" || -e "$ck/ckpt-20/MANIFEST" ]]; then
  fail "SIGKILL in checkpoint 20: exit $rc, $(ls -R "$ck" | tr '\n' ' ')"
fi
if [[ -n "$(find "$ck" -name '.*tmp*')" ]]; then fail "SIGKILL left temporaries: $(find "$ck" -name '.*tmp*')"; fi
train "kill_resumed" "${B[@]}" --iterations 30 --trainers 2 --cache lru --resume "$ck" \
  --out "$WORK/kill_resumed" || { fail "resume after SIGKILL"; tail -5 "$WORK/kill_resumed.log"; }
train "ref_30" "${B[@]}" --iterations 30 --trainers 2 --cache off --out "$WORK/ref_30" || fail "ref 30"
same "SIGKILL in checkpoint 20, resumed from ckpt-10" "$WORK/kill_resumed" "$WORK/ref_30" 10
if [[ ! -e "$ck/ckpt-30/MANIFEST" || -e "$ck/ckpt-20" && ! -e "$ck/ckpt-20/MANIFEST" ]]; then
  fail "after the resume: $(ls "$ck" | tr '\n' ' ') (expected ckpt-20 rewritten or pruned, ckpt-30)"
fi

# --- refusals: message, non-zero exit, nothing overwritten ------------------------------------
good="$WORK/ck_oracle_T2"
latest=$(ls "$good" | sort -t- -k2 -n | tail -1)  # ckpt-24
snapshot() {  # every file's checksum under the given directories (not the jobs' lock files,
  # which hold the pid of the last job that locked the directory: core/dir_lock.h)
  find "$@" -type f ! -name '.bagpipe-*.lock' -exec md5sum {} + 2>/dev/null | sort
}
# refuse NAME REGEX ARGS...: train fails with REGEX and changes no file.
refuse() {
  local name=$1 regex=$2
  shift 2
  local out="$WORK/refused_out"
  mkdir -p "$out"
  echo '{"old": true}' >"$out/summary.json"
  echo '{"iteration": 1}' >"$out/metrics.jsonl"
  local before
  before=$(snapshot "$out" "$WORK"/ck_*)
  train "$name" --iterations "${ITERATIONS:-$N}" --cache oracle --out "$out" --dump-params "$out" "$@"
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    fail "$name: succeeded (expected an error matching '$regex')"
  elif ! grep -Eq -- "$regex" "$WORK/$name.log"; then
    fail "$name: exit $rc, message does not match '$regex':"; tail -3 "$WORK/$name.log"
  elif [[ "$before" != "$(snapshot "$out" "$WORK"/ck_*)" ]]; then
    fail "$name: refused but changed files"
  else
    echo "ok   $name (exit $rc: $(grep -Em1 -- "$regex" "$WORK/$name.log" | cut -c1-160))"
  fi
}
T2=("${B[@]}" --trainers 2)
refuse option_dim "option --dim is 8 in the checkpoint and 16 here" --batch-size 256 --dim 16 \
  --trainers 2 --resume "$good"
refuse option_batch "option --batch-size is 256 in the checkpoint and 512 here" \
  --resume "$good" --batch-size 512 --dim 8 --trainers 2
refuse option_lr "option (dense|embedding) optimizer: lr is 0\.05[0-9]* in the checkpoint and 0\.1[0-9]* here" \
  "${T2[@]}" --resume "$good" --lr 0.1
# The dense optimizer's eps changes the training too (the job's dense optimizer is adagrad).
refuse option_dense_eps "option dense optimizer: eps is 9\.9[0-9e.-]* in the checkpoint and 0\.1[0-9]* here" \
  "${T2[@]}" --resume "$good" --dense-eps 0.1
refuse option_trainers "option --trainers is 2 in the checkpoint and 1 here" \
  "${B[@]}" --resume "$good" --trainers 1
refuse another_job "holds another job's checkpoints: .*option --dim" \
  --batch-size 256 --dim 16 --trainers 2 --checkpoint-dir "$good"
refuse same_job_fresh "already holds checkpoints of this job" "${T2[@]}" --checkpoint-dir "$good"
mkdir -p "$WORK/ck_foreign" && echo hi >"$WORK/ck_foreign/notes.txt"
refuse foreign_files "holds files that are not checkpoints of this job \(e.g. 'notes.txt'\)" \
  "${T2[@]}" --checkpoint-dir "$WORK/ck_foreign"
refuse no_checkpoint "holds no complete checkpoint" "${T2[@]}" --resume "$WORK/ck_foreign"
# A checkpoint past --iterations: refused before the stream is read (the job would train
# nothing); one at --iterations (a finished job started again) runs no iteration, with a warning.
ITERATIONS=$K refuse past_iterations \
  "checkpoint .*$latest is at iteration $N, past this job's last iteration $K \(--iterations\)" \
  "${T2[@]}" --resume "$good"
if train at_iterations "${T2[@]}" --iterations $N --cache oracle --resume "$good" \
  --out "$WORK/at_iterations" &&
  grep -q "is at iteration $N, this job's last (--iterations): no iteration is left" \
    "$WORK/at_iterations.log" &&
  [[ "$(field "$WORK/at_iterations/summary.json" iterations)" == 0 ]] &&
  [[ "$(field "$WORK/at_iterations/summary.json" train_loss)" == None ]] &&
  grep -q "train loss - (no iteration trained)" "$WORK/at_iterations.log"; then
  echo "ok   at_iterations (exit 0, no iteration, no training loss, a warning)"
else
  fail "at_iterations: $(tail -3 "$WORK/at_iterations.log")"
fi
# The same into the --out of the run that trained to N: its summary (the training figures) and
# its metrics stay as they were.
finished="$WORK/run_oracle_T2"
before=$(snapshot "$finished")
if train at_iterations_own_out "${T2[@]}" --iterations $N --cache oracle --resume "$good" \
  --out "$finished" &&
  grep -q "summary.json kept: the summary of the run that trained to iteration $N" \
    "$WORK/at_iterations_own_out.log" &&
  [[ "$before" == "$(snapshot "$finished")" ]] &&
  [[ "$(field "$finished/summary.json" iterations)" == $((N - K)) ]]; then
  echo "ok   at_iterations_own_out (exit 0, the finished run's summary and metrics kept)"
else
  fail "at_iterations_own_out: $(tail -3 "$WORK/at_iterations_own_out.log")"
fi
# A FIFO where the summary would go is not read (that would wait for a writer forever).
mkfifo "$WORK/summary.fifo"
timeout 120 "$BAGPIPE" train "${COMMON[@]}" "${T2[@]}" --iterations $N --cache oracle \
  --resume "$good" --summary-json "$WORK/summary.fifo" >"$WORK/at_iterations_fifo.log" 2>&1
rc=$?
if [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q "FIFO" "$WORK/at_iterations_fifo.log"; then
  echo "ok   at_iterations_fifo (exit $rc: $(grep -m1 FIFO "$WORK/at_iterations_fifo.log" | cut -c1-120))"
else
  fail "at_iterations_fifo: exit $rc: $(tail -2 "$WORK/at_iterations_fifo.log")"
fi

# A resume from an older checkpoint into a directory holding newer ones (another run's) is
# refused before the stream is read: the runs' checkpoints would mix.
refuse older_checkpoint \
  "holds $latest, newer than the checkpoint this job resumes from \(ckpt-20\).*--resume $good" \
  "${T2[@]}" --resume "$good/ckpt-20"
# A resume whose --out holds another run's metrics (here one line of iteration 1): keeping its
# lines up to the checkpoint would splice the two runs' metrics into one file.
refuse another_runs_metrics "metrics file .* holds another run's metrics: its first line is none the checkpointed run wrote" \
  "${T2[@]}" --resume "$good/ckpt-20" --checkpoint-dir "$WORK/other_run_ck"
# Resumed into another directory, the job checkpoints as often as the checkpoint's did (every 4).
if train moved "${T2[@]}" --iterations 30 --cache oracle --resume "$good" \
  --checkpoint-dir "$WORK/ck_moved" --out "$WORK/moved" &&
  [[ "$(ls "$WORK/ck_moved" | tr '\n' ' ')" == "ckpt-28 ckpt-30 " ]]; then
  echo "ok   moved (resumed into another directory: every 4 as before)"
else
  fail "moved: checkpoints $(ls "$WORK/ck_moved" | tr '\n' ' '): $(tail -3 "$WORK/moved.log")"
fi

# The same job however its options are written: a --max-samples at the stream's size (a bin:
# file's header says it) selects what none does, and --bottom names the default (DENSE-64-DIM)
# the checkpointed run left out. Fewer samples or other layers are another job.
"$BAGPIPE" convert --data "$SYN" --out "$WORK/syn.bin" >"$WORK/convert.log" 2>&1 ||
  fail "convert: $(tail -1 "$WORK/convert.log")"
bin_train() {  # bin_train NAME ARGS...
  local name=$1
  shift
  "$BAGPIPE" train --data "bin:$WORK/syn.bin" "${B[@]}" --trainers 1 --cache oracle \
    --cache-rows 1500 --optimizer adagrad --deterministic --quiet "$@" >"$WORK/$name.log" 2>&1
}
if ! bin_train bin_all --iterations 4 --max-samples 30000 --checkpoint-dir "$WORK/bin_ck"; then
  fail "bin_all: $(tail -1 "$WORK/bin_all.log")"
elif bin_train bin_fewer --iterations 8 --max-samples 29999 --resume "$WORK/bin_ck" ||
  ! grep -q "option --max-samples is 30000 in the checkpoint and 29999 here" \
    "$WORK/bin_fewer.log"; then
  fail "bin_fewer: $(tail -1 "$WORK/bin_fewer.log")"
elif bin_train bin_layers --iterations 8 --bottom 13-32-8 --resume "$WORK/bin_ck" ||
  ! grep -q 'option --bottom is "13-64-8" in the checkpoint and "13-32-8" here' \
    "$WORK/bin_layers.log"; then
  fail "bin_layers: $(tail -1 "$WORK/bin_layers.log")"
elif ! bin_train bin_same --iterations 8 --bottom 13-64-8 --resume "$WORK/bin_ck"; then
  fail "bin_same: $(tail -1 "$WORK/bin_same.log")"
else
  echo "ok   same job: --max-samples 30000 of 30000 and --bottom 13-64-8 resume a run without"
fi
# A file of fewer samples whose first batches are the same (the first 29000 of the stream): the
# job that wrote the newest checkpoint (bin_same, no --max-samples) read 30000 an epoch, so
# neither the same options nor a --max-samples at its size continue it.
"$BAGPIPE" convert --data "$SYN" --max-samples 29000 --out "$WORK/syn_short.bin" \
  >"$WORK/convert_short.log" 2>&1 || fail "convert: $(tail -1 "$WORK/convert_short.log")"
short_train() {  # short_train NAME ARGS...
  local name=$1
  shift
  "$BAGPIPE" train --data "bin:$WORK/syn_short.bin" "${B[@]}" --trainers 1 --cache oracle \
    --cache-rows 1500 --optimizer adagrad --deterministic --quiet --iterations 8 \
    --resume "$WORK/bin_ck" "$@" >"$WORK/$name.log" 2>&1
}
shorter="its job trained on 30000 samples an epoch and this one would train on 29000"
if short_train bin_short || ! grep -q "$shorter" "$WORK/bin_short.log"; then
  fail "bin_short: $(tail -1 "$WORK/bin_short.log")"
elif short_train bin_short_n --max-samples 30000 || ! grep -q "$shorter" "$WORK/bin_short_n.log"; then
  fail "bin_short_n: $(tail -1 "$WORK/bin_short_n.log")"
else
  echo "ok   a shorter file with the same first batches does not continue the job"
fi

# The data before the checkpoint: a change in any batch is refused (here one label of the first
# batch; the last batch's CRC32C alone missed it), and a checkpoint past the end of this job's
# data (fewer --epochs) is named as such.
head -n 3001 "$(dirname "$0")/../fixtures/movielens_small.csv" >"$WORK/ml.csv"  # 12 batches
sed '2s/,3$/,5/' "$WORK/ml.csv" >"$WORK/ml_changed.csv"
cmp -s "$WORK/ml.csv" "$WORK/ml_changed.csv" && fail "ml_changed: the data did not change"
ml() {  # ml NAME FILE ARGS...
  local name=$1 file=$2
  shift 2
  "$BAGPIPE" train --data "csv:$file" --batch-size 256 --dim 8 --trainers 1 --cache oracle \
    --schema 'label=rating>3.5; dense=year; sparse=userId,movieId,split(genres,|)' \
    --deterministic --quiet "$@" >"$WORK/$name.log" 2>&1
}
expect_ml() {  # expect_ml NAME RC REGEX: the run's exit status and a line of its log
  local rc
  rc=$(tail -1 "$WORK/$1.rc")
  if [[ "$rc" == "$2" ]] && grep -Eq -- "$3" "$WORK/$1.log"; then
    echo "ok   $1 (exit $rc: $(grep -Em1 -- "$3" "$WORK/$1.log" | cut -c1-160))"
  else
    fail "$1: exit $rc (expected $2 and '$3'): $(tail -2 "$WORK/$1.log")"
  fi
}
ml ml_run "$WORK/ml.csv" --iterations 8 --checkpoint-dir "$WORK/ck_ml" --out "$WORK/ml_run" || fail "ml_run"
before=$(snapshot "$WORK/ck_ml")
ml ml_changed "$WORK/ml_changed.csv" --iterations 10 --resume "$WORK/ck_ml" --out "$WORK/ml_changed"
echo $? >"$WORK/ml_changed.rc"
expect_ml ml_changed 1 "does not match this job's data: .* the batches before the last one differ"
[[ "$before" == "$(snapshot "$WORK/ck_ml")" ]] || fail "ml_changed: the refusal changed the checkpoints"
ml ml_same "$WORK/ml.csv" --iterations 10 --resume "$WORK/ck_ml" --out "$WORK/ml_same"
echo $? >"$WORK/ml_same.rc"
expect_ml ml_same 0 "resumed from .*ckpt-8 at iteration 8"
ml ml_epochs "$WORK/ml.csv" --epochs 2 --iterations 16 --checkpoint-dir "$WORK/ck_ml2" \
  --out "$WORK/ml_epochs" || fail "ml_epochs"
ml ml_one_epoch "$WORK/ml.csv" --epochs 1 --resume "$WORK/ck_ml2" --out "$WORK/ml_one_epoch"
echo $? >"$WORK/ml_one_epoch.rc"
expect_ml ml_one_epoch 1 "is at iteration 16, past the end of this job's data: it ends after 12 batches .*raise --epochs"
ml ml_end "$WORK/ml.csv" --epochs 1 --checkpoint-dir "$WORK/ck_ml3" --out "$WORK/ml_end" || fail "ml_end"
ml ml_end_again "$WORK/ml.csv" --epochs 1 --resume "$WORK/ck_ml3" --out "$WORK/ml_end"
echo $? >"$WORK/ml_end_again.rc"
expect_ml ml_end_again 0 "the data end at the checkpoint resumed from \(iteration 12\): no iteration is left"

# Damaged copies of the good checkpoint: a flipped byte anywhere, a truncation, another format.
damaged() {  # damaged NAME: a fresh copy of the latest checkpoint in $WORK/ck_dmg_NAME
  rm -rf "$WORK/ck_dmg_$1"
  mkdir -p "$WORK/ck_dmg_$1"
  cp -r "$good/$latest" "$WORK/ck_dmg_$1/"
  echo "$WORK/ck_dmg_$1/$latest"
}
for file in MANIFEST trainer.bin server-0-of-1.bin; do
  size=$(stat -c %s "$good/$latest/$file")
  for at in 0 9 20 $((size / 2)) $((size - 17)) $((size - 1)); do
    c=$(damaged "${file}_$at")
    python3 -c "
import sys
p, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, 'rb').read()); b[at] ^= 0x10; open(p, 'wb').write(bytes(b))" "$c/$file" "$at"
    refuse "flip_${file}_$at" "corrupt|truncated|damaged|is not a" "${T2[@]}" --resume "$c"
  done
done
c=$(damaged truncated)
truncate -s -100 "$c/server-0-of-1.bin"
refuse truncated_shard "checkpoint shard .* is truncated or damaged" "${T2[@]}" --resume "$c"
c=$(damaged version)
python3 - "$c/MANIFEST" <<'EOF'
import struct, sys
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF
path = sys.argv[1]
b = bytearray(open(path, 'rb').read())
b[8:12] = struct.pack('<I', 99)  # another format version, with a valid checksum
b[-8:-4] = struct.pack('<I', crc32c(bytes(b[:-16])))
open(path, 'wb').write(bytes(b))
EOF
refuse other_version "has format version 99; this build reads version 1" "${T2[@]}" \
  --resume "$c"

# --cache device writes checkpoints (resumed with another cache mode) but cannot resume one.
ck="$WORK/ck_device"
train device_stop "${T2[@]}" --iterations $K --cache device --checkpoint-dir "$ck" \
  --out "$WORK/device_stop" || fail "device run with checkpoints"
train device_resumed "${T2[@]}" --iterations $N --cache oracle --resume "$ck" \
  --out "$WORK/device_resumed" || fail "resume of a device checkpoint with --cache oracle"
same "--cache device checkpoint resumed with --cache oracle" "$WORK/device_resumed" \
  "$WORK/ref_T2" $K
if train device_resume "${T2[@]}" --iterations $N --cache device --resume "$ck" \
    --out "$WORK/device_refused" || ! grep -q "cache device cannot resume" "$WORK/device_resume.log"; then
  fail "--cache device --resume: expected a refusal"; tail -3 "$WORK/device_resume.log"
else
  echo "ok   --cache device --resume refused: $(grep -m1 -o 'cache device cannot resume[^;]*' "$WORK/device_resume.log")"
fi

# A checkpoint that fails part-way (a file size limit stands in for a full disk: the server's
# shard of the second checkpoint is over it) is removed, the complete one before it is kept.
ck="$WORK/ck_full"
(
  trap '' XFSZ
  ulimit -f 2500
  "$BAGPIPE" train --data synthetic:samples=20000,tables=4 --batch-size 256 --iterations 20 \
    --dim 64 --checkpoint-dir "$ck" --checkpoint-every 10 --keep-checkpoints 0 --quiet
) >"$WORK/full.log" 2>&1
rc=$?
left=$(cd "$ck" 2>/dev/null && ls | tr '\n' ' ')
if [[ $rc -ne 0 ]] && grep -q "ckpt-20/server-0-of-1.bin': File too large" "$WORK/full.log" &&
  [[ "$left" == "ckpt-10 " && -f "$ck/ckpt-10/MANIFEST" ]]; then
  echo "ok   failed checkpoint removed (exit $rc, left: $left)"
else
  fail "failed checkpoint: exit $rc, left '$left': $(tail -2 "$WORK/full.log")"
fi

# A stop while a resume reads the data up to its checkpoint (seconds for millions of samples)
# ends the job there: exit 75, nothing trained or written.
ck="$WORK/ck_replay"
LONG=(--data synthetic:samples=5000000,tables=4 --batch-size 512 --quiet)
"$BAGPIPE" train "${LONG[@]}" --iterations 4000 --checkpoint-dir "$ck" >"$WORK/replay0.log" 2>&1
before=$(snapshot "$ck")
"$BAGPIPE" train "${LONG[@]}" --iterations 5000 --resume "$ck" >"$WORK/replay.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
  grep -q "resuming from" "$WORK/replay.log" && break
  sleep 0.05
done
kill -INT $pid
wait $pid
rc=$?
if [[ $rc -eq 75 ]] && grep -q "stopped by SIGINT while the data were read up to .*nothing was trained" \
  "$WORK/replay.log" && [[ "$before" == "$(snapshot "$ck")" ]]; then
  echo "ok   stop during the replay (exit 75, checkpoints unchanged)"
else
  fail "stop during the replay: exit $rc: $(tail -2 "$WORK/replay.log")"
fi

# --- under mpirun: T = 2, S = 2 -----------------------------------------------------------------
if [[ -n $MPIEXEC ]]; then
  ref="$WORK/ref_T2S2"
  train ref_T2S2 "${B[@]}" --iterations $N --trainers 2 --servers 2 --cache off --out "$ref" ||
    fail "reference T=2 S=2"
  for mode in oracle lru; do
    ck="$WORK/mpi_ck_$mode"
    if ! mpi_train "mpi_stop_$mode" 5 "${B[@]}" --iterations $K --servers 2 --cache "$mode" \
        --checkpoint-dir "$ck" --checkpoint-every 4 --out "$WORK/mpi_stop_$mode"; then
      fail "mpirun run to $K ($mode)"; tail -5 "$WORK/mpi_stop_$mode.log"; continue
    fi
    if [[ ! -e "$ck/ckpt-10/server-1-of-2.bin" ]]; then fail "mpirun: no shard of server 1"; fi
    if ! mpi_train "mpi_resumed_$mode" 5 "${B[@]}" --iterations $N --servers 2 --cache "$mode" \
        --resume "$ck" --out "$WORK/mpi_resumed_$mode"; then
      fail "mpirun resume ($mode)"; tail -5 "$WORK/mpi_resumed_$mode.log"; continue
    fi
    same "mpirun T=2 S=2 --cache $mode: $N == $K + resumed" "$WORK/mpi_resumed_$mode" "$ref" $K
  done
  # SIGTERM to mpirun: Open MPI 4.1 forwards it to every rank odls_base_sigkill_timeout seconds
  # later; the ranks agree on one stop iteration and are killed about as long after that
  # (mpirun's own exit status is 1). 10 s: under AddressSanitizer on a loaded 2-core machine 3 s
  # was once too short for the ranks to end. docs/checkpoints.md recommends SIGUSR1 instead.
  ck="$WORK/mpi_ck_term"
  "$MPIEXEC" -np 5 --oversubscribe --mca odls_base_sigkill_timeout 10 "$BAGPIPE" train \
    "${COMMON[@]}" "${S64[@]}" \
    --iterations 1000000 --servers 2 --cache oracle --checkpoint-dir "$ck" \
    --out "$WORK/mpi_term" >"$WORK/mpi_term.log" 2>&1 &
  pid=$!
  wait_for_metrics "$WORK/mpi_term"
  kill -TERM $pid
  wait $pid
  rc=$?
  S=$(stopped_at "$WORK/mpi_term.log")
  if [[ -z $S ]]; then
    fail "mpirun SIGTERM: exit $rc and no resume line:"; tail -8 "$WORK/mpi_term.log"
  else
    echo "ok   mpirun SIGTERM: exit $rc, $(grep -m1 'stopped by' "$WORK/mpi_term.log" | cut -c1-120)"
    M=$((S + 20))
    mpi_train mpi_term_resumed 5 "${S64[@]}" --iterations $M --servers 2 --cache lru \
      --resume "$ck" --out "$WORK/mpi_term_resumed" || fail "mpirun resume after SIGTERM"
    train ref_term_T2S2 "${S64[@]}" --iterations $M --trainers 2 --servers 2 --cache off \
      --out "$WORK/ref_term_T2S2" || fail "reference T=2 S=2 after SIGTERM"
    same "mpirun SIGTERM mid-run at $S, resumed to $M" "$WORK/mpi_term_resumed" \
      "$WORK/ref_term_T2S2" "$S"
  fi
  # SIGUSR1 to mpirun: forwarded to every rank, and the job ends by itself (exit status 75).
  "$MPIEXEC" -np 5 --oversubscribe "$BAGPIPE" train "${COMMON[@]}" "${S64[@]}" \
    --iterations 1000000 --servers 2 --cache oracle --checkpoint-dir "$WORK/mpi_ck_usr1" \
    --out "$WORK/mpi_usr1" >"$WORK/mpi_usr1.log" 2>&1 &
  pid=$!
  wait_for_metrics "$WORK/mpi_usr1"
  kill -USR1 $pid
  wait $pid
  rc=$?
  if [[ $rc -ne 75 ]] || ! grep -Eq "stopped by SIGUSR1 at iteration [0-9]+; resume" "$WORK/mpi_usr1.log" ||
      [[ -z "$(ls "$WORK/mpi_ck_usr1")" ]]; then
    fail "mpirun SIGUSR1: exit $rc"; tail -5 "$WORK/mpi_usr1.log"
  else
    echo "ok   mpirun SIGUSR1: exit 75, $(grep -Eo 'stopped by SIGUSR1 at iteration [0-9]+' "$WORK/mpi_usr1.log")"
  fi
  # SIGKILL of rank 0 in a checkpoint under mpirun.
  ck="$WORK/mpi_ck_kill"
  # The variable goes to the ranks with `-x`, or through mca_base_env_list when that is set
  # (scripts/sanitize.sh sets it): Open MPI refuses to start a job given both.
  kill_env=(-x BAGPIPE_TEST_KILL_IN_CHECKPOINT=20)
  if [[ -n ${OMPI_MCA_mca_base_env_list:-} ]]; then
    kill_env=(--mca mca_base_env_list "$OMPI_MCA_mca_base_env_list;BAGPIPE_TEST_KILL_IN_CHECKPOINT=20")
  fi
  timeout 300 "$MPIEXEC" -np 5 --oversubscribe "${kill_env[@]}" "$BAGPIPE" \
    train "${COMMON[@]}" "${B[@]}" --iterations 30 --servers 2 --cache oracle --checkpoint-dir "$ck" \
    --checkpoint-every 10 --out "$WORK/mpi_kill" >"$WORK/mpi_kill.log" 2>&1
  if [[ ! -e "$ck/ckpt-10/MANIFEST" || -e "$ck/ckpt-20/MANIFEST" ]]; then
    fail "mpirun SIGKILL in checkpoint 20: $(ls -R "$ck" | tr '\n' ' ')"
  fi
  mpi_train mpi_kill_resumed 5 "${B[@]}" --iterations 30 --servers 2 --cache oracle --resume "$ck" \
    --out "$WORK/mpi_kill_resumed" || fail "mpirun resume after SIGKILL"
  train ref_30_T2S2 "${B[@]}" --iterations 30 --trainers 2 --servers 2 --cache off \
    --out "$WORK/ref_30_T2S2" || fail "reference 30 T=2 S=2"
  same "mpirun SIGKILL in checkpoint 20, resumed from ckpt-10" "$WORK/mpi_kill_resumed" \
    "$WORK/ref_30_T2S2" 10

  # A checkpoint directory the server rank does not share with rank 0 (each rank started in its
  # own directory, the server's holding a ckpt-5 to write into): an error when it is written,
  # not a manifest naming a shard that no resume can read.
  mkdir -p "$WORK/wa" "$WORK/wb/ck/ckpt-5"
  (cd "$WORK" && timeout 300 "$MPIEXEC" -np 1 -wdir "$WORK/wa" "$BAGPIPE" train "${COMMON[@]}" \
    "${B[@]}" --iterations 5 --servers 1 --cache oracle --checkpoint-dir ck --checkpoint-every 5 : \
    -np 1 -wdir "$WORK/wb" "$BAGPIPE" train "${COMMON[@]}" "${B[@]}" --iterations 5 --servers 1 \
    --cache oracle --checkpoint-dir ck --checkpoint-every 5 : \
    -np 1 -wdir "$WORK/wa" "$BAGPIPE" train "${COMMON[@]}" "${B[@]}" --iterations 5 --servers 1 \
    --cache oracle --checkpoint-dir ck --checkpoint-every 5) >"$WORK/unshared.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]] || ! grep -q "which rank 0 cannot see .*--checkpoint-dir must be a directory every server rank and rank 0 share" "$WORK/unshared.log" ||
      [[ -e "$WORK/wa/ck/ckpt-5/MANIFEST" ]]; then
    fail "unshared --checkpoint-dir: exit $rc"; tail -5 "$WORK/unshared.log"
  else
    echo "ok   unshared --checkpoint-dir refused (exit $rc)"
  fi
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
