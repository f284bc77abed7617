#!/usr/bin/env bash
# Distributed training under mpirun on one machine (issue 6, "Done when"):
#  - T = 2, S = 1 and T = 3, S = 2 jobs with --cache oracle and --cache lru end with parameters
#    bit-identical (--deterministic) to the single-process --cache off run of the same
#    configuration (same global batches split into the same T shards);
#  - a trainer killed mid-run, and a trainer or a server that hangs, end the job with a clear
#    error naming the silent rank within the peer timeout instead of hanging; so does a rank
#    stopped during the job's set-up (in MPI_Init, before the transport, once it is up; rank 0
#    too, named by the others) or inside its shutdown barrier (then the others' MPI_Finalize is
#    bounded); a rank failing alone before the start ends the job at once,
#    naming it and its error;
#  - only rank 0 reads the data: ranks without the data file train as if they had it.
# Usage: mpi_train_test.sh BAGPIPE_BINARY MPIEXEC
set -u
BAGPIPE=$1
MPIEXEC=${2:-mpirun}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
SYN="synthetic:samples=40000,tables=8,scale=0.001,alpha=1.05,seed=5"
COMMON=(--data "$SYN" --batch-size 600 --iterations 30 --cache-rows 2500 --dim 8
        --optimizer adagrad --deterministic --quiet)
failures=0
source "$(dirname "$0")/did_its_work.sh"

sha() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['params_sha256'])" "$1"; }

for layout in "2 1" "3 2"; do
  read -r T S <<<"$layout"
  ref="$WORK/off_T${T}_S${S}"
  if ! "$BAGPIPE" train "${COMMON[@]}" --cache off --trainers "$T" --servers "$S" \
      --out "$ref" >"$ref.log" 2>&1; then
    echo "FAIL embedded off T=$T S=$S"; cat "$ref.log"; failures=$((failures + 1)); continue
  fi
  for mode in oracle lru; do
    run="$WORK/mpi_${mode}_T${T}_S${S}"
    np=$((1 + S + T))
    if ! timeout 300 "$MPIEXEC" -np "$np" --oversubscribe "$BAGPIPE" train "${COMMON[@]}" \
        --cache "$mode" --servers "$S" --out "$run" >"$run.log" 2>&1; then
      echo "FAIL mpirun -np $np $mode T=$T S=$S"; tail -20 "$run.log"
      failures=$((failures + 1)); continue
    fi
    if [[ "$(sha "$run/summary.json")" != "$(sha "$ref/summary.json")" ]]; then
      echo "FAIL $mode T=$T S=$S under mpirun: parameters differ from the embedded off run"
      failures=$((failures + 1))
    elif ! did_its_work "$run/summary.json" || ! did_its_work "$ref/summary.json"; then
      echo "FAIL $mode T=$T S=$S under mpirun: a compared run did not do its work"
      failures=$((failures + 1))
    else
      echo "ok   mpirun -np $np --cache $mode (T=$T, S=$S) == embedded --cache off: $(sha "$run/summary.json")"
    fi
  done
done

# A wrong world size is refused with the layout spelled out.
"$MPIEXEC" -np 3 --oversubscribe "$BAGPIPE" train "${COMMON[@]}" --servers 2 \
  >"$WORK/layout.log" 2>&1
if [[ $? -eq 0 ]] || ! grep -q "leaves no trainer" "$WORK/layout.log"; then
  echo "FAIL wrong world size: expected an error naming the layout"; cat "$WORK/layout.log"
  failures=$((failures + 1))
else
  echo "ok   wrong world size: $(grep -m1 -i 'error' "$WORK/layout.log")"
fi

# An explicit --trainers that contradicts the world size is refused, naming both.
"$MPIEXEC" -np 4 --oversubscribe "$BAGPIPE" train "${COMMON[@]}" --servers 1 --trainers 3 \
  >"$WORK/trainers.log" 2>&1
if [[ $? -eq 0 ]] || ! grep -q -- "--trainers 3, but mpirun started 4 ranks" "$WORK/trainers.log"; then
  echo "FAIL --trainers against the world size: expected an error naming both"
  cat "$WORK/trainers.log"; failures=$((failures + 1))
else
  echo "ok   --trainers 3 under mpirun -np 4 --servers 1: refused"
fi

# Ranks started with different options (an MPMD launch: two command lines) are refused before
# anything trains, on every rank, naming the options and the ranks.
MISMATCH=(--data "$SYN" --batch-size 600 --iterations 5 --cache-rows 2500 --optimizer adagrad
          --servers 1 --quiet)
"$MPIEXEC" -np 2 --oversubscribe "$BAGPIPE" train "${MISMATCH[@]}" --lr 0.05 --dim 8 --cache oracle \
  : -np 2 --oversubscribe "$BAGPIPE" train "${MISMATCH[@]}" --lr 0.1 --dim 16 --cache lru \
  >"$WORK/mismatch.log" 2>&1
rc=$?
for expected in "--lr is 0.05 on rank 0 but 0.1 on ranks 2, 3" \
    "--dim is 8 on rank 0 but 16 on ranks 2, 3" "--cache is 'oracle' on rank 0 but 'lru' on ranks 2, 3"; do
  if [[ $rc -eq 0 ]] || ! grep -qF -- "$expected" "$WORK/mismatch.log"; then
    echo "FAIL mismatched options (exit $rc): expected '$expected'"; tail -5 "$WORK/mismatch.log"
    failures=$((failures + 1))
  fi
done
[[ $rc -ne 0 ]] && echo "ok   mismatched options refused: $(grep -m1 -o 'different options.*' "$WORK/mismatch.log" | cut -c1-150)"

# setup_fault KEY PATTERN: rank 3 (rank STOP_RANK when set) stops itself (SIGSTOP, the test hook BAGPIPE_TEST_STOP_IN_SETUP)
# at set-up point KEY, before any heartbeat could name it; the job must end within a bounded
# time with a non-zero exit and an error matching PATTERN (the phase, or the stopped rank).
# DATA (default: the synthetic data) may be one the other ranks refuse: they then end, waiting in
# the transport's shutdown barrier for the stopped rank.
setup_fault() {
  local key=$1 pattern=$2 data=${3:-$SYN} victim=${STOP_RANK:-3}
  local what="rank $victim stopped at set-up point '$key'${3:+ (data refused by the others)}"
  local log="$WORK/setup_${key}_$victim${3:+_bad}.log" start=$SECONDS
  BAGPIPE_TEST_STOP_IN_SETUP="$key:$victim" timeout -k 5 60 "$MPIEXEC" -np 4 --oversubscribe \
    "$BAGPIPE" train --data "$data" --batch-size 200 --iterations 20 --cache oracle \
    --cache-rows 2500 --dim 8 --servers 1 --quiet --peer-timeout 6 >"$log" 2>&1
  local rc=$?
  if [[ $rc -eq 0 || $rc -ge 124 ]] || ! grep -Eq -- "$pattern" "$log"; then
    echo "FAIL $what: exit $rc after $((SECONDS - start)) s," \
      "expected a non-zero exit and an error matching '$pattern'"
    tail -8 "$log"; failures=$((failures + 1))
  else
    echo "ok   $what: exit $rc in $((SECONDS - start)) s:" \
      "$(grep -Eo -- "$pattern.{0,60}" "$log" | head -1)"
  fi
}
setup_fault init "rank [0-2] of 4 waited .* in the job's set-up, MPI_Init"
setup_fault transport "rank 3 of 4 did not reach the transport's set-up"
setup_fault started "rank 3( \(trainer 1\))? has sent nothing, not even its heartbeat"
setup_fault started "rank 3 has sent nothing, not even its heartbeat" "csv:$WORK/missing.csv"
# Rank 0 stopped once the transport is up, while the others open the data and wait for the
# options' verdict: they watch rank 0's heartbeats and name it (not each other).
STOP_RANK=0 setup_fault started "rank [1-3] aborts the job: rank 0 \(oracle\) has sent nothing"
if grep -Eq "has sent nothing" "$WORK/setup_started_0.log" &&
    grep "has sent nothing" "$WORK/setup_started_0.log" | grep -vq "rank 0 (oracle) has sent"; then
  echo "FAIL rank 0 stopped: a rank other than rank 0 is blamed"
  grep "has sent nothing" "$WORK/setup_started_0.log"; failures=$((failures + 1))
fi
# Rank 0 stopped inside its own shutdown barrier, after its goodbye (the job's work is done): the
# others, waiting in theirs, go on watching its shutdown heartbeats and name it.
STOP_RANK=0 setup_fault shutdown "rank [1-3] aborts the job: rank 0 \(oracle\) said goodbye, then sent nothing"
# A trainer (rank 3) or the server (rank 1) stopped inside its shutdown barrier: the ranks whose
# barriers completed wait in MPI_Finalize, bounded by the peer timeout as well; a rank still in
# its barrier names the stopped one.
STOP_RANK=3 setup_fault shutdown "rank [0-2] of 4 waited .* in the job's shutdown, MPI_Finalize|rank 3( \([a-z]+ [0-9]+\))? said goodbye, then sent nothing"
STOP_RANK=1 setup_fault shutdown "rank [023] of 4 waited .* in the job's shutdown, MPI_Finalize|rank 1( \([a-z]+ [0-9]+\))? said goodbye, then sent nothing"

# Only rank 0 reads the data: ranks given a path their machine does not have (an MPMD launch
# gives ranks 2-3 another --data) learn the schema from rank 0 and train as if they had it.
MOVIELENS="$(dirname "$0")/../fixtures/movielens_small.csv"
ML=(--schema "label=rating>3.5; dense=year; sparse=userId,movieId" --batch-size 1000
    --iterations 10 --cache oracle --cache-rows 4000 --dim 8 --servers 1 --quiet)
timeout -k 5 120 "$MPIEXEC" -np 2 --oversubscribe "$BAGPIPE" train --data "csv:$MOVIELENS" \
  "${ML[@]}" --out "$WORK/rank0_data" \
  : -np 2 --oversubscribe "$BAGPIPE" train --data "csv:$WORK/only_here/missing.csv" "${ML[@]}" \
  --out "$WORK/rank0_data" >"$WORK/rank0_data.log" 2>&1
rc=$?
"$BAGPIPE" train --data "csv:$MOVIELENS" "${ML[@]}" --trainers 2 --out "$WORK/rank0_data_embedded" \
  >"$WORK/rank0_data_embedded.log" 2>&1
if [[ $rc -ne 0 ]] || ! cmp -s <(sha "$WORK/rank0_data/summary.json") \
     <(sha "$WORK/rank0_data_embedded/summary.json") ||
   ! did_its_work "$WORK/rank0_data/summary.json"; then
  echo "FAIL ranks without the data file: exit $rc, or parameters differ from the embedded run"
  tail -5 "$WORK/rank0_data.log"; failures=$((failures + 1))
else
  echo "ok   only rank 0 reads the data: ranks without the file train, == embedded:" \
    "$(sha "$WORK/rank0_data/summary.json")"
fi

# One rank fails alone before the job starts (an MPMD launch gives rank 2 a --trainers that
# the world size contradicts, which it finds once it has the schema). Rank 0 must not wait for its options until the agreement's timeout (an hour; the peer
# timeout here is 2 minutes, the whole job gets 60 s): the failed rank's goodbye ends the
# agreement at once, naming the rank and its error, and every rank exits.
LONE=(--batch-size 200 --iterations 20 --cache oracle --cache-rows 2500 --dim 8 --servers 1
      --quiet --peer-timeout 120)
start=$SECONDS
timeout -k 5 60 "$MPIEXEC" -np 2 --oversubscribe "$BAGPIPE" train --data "$SYN" "${LONE[@]}" \
  : -np 1 --oversubscribe "$BAGPIPE" train --data "$SYN" --trainers 7 "${LONE[@]}" \
  : -np 1 --oversubscribe "$BAGPIPE" train --data "$SYN" "${LONE[@]}" >"$WORK/lone.log" 2>&1
rc=$?
expected="rank 0 waits for a message (tag 15) from rank 2, which ended its part of the job without sending it: it ended with INVALID_ARGUMENT: --trainers 7, but mpirun started 4 ranks"
if [[ $rc -eq 0 || $rc -ge 124 ]] || ! grep -qF -- "$expected" "$WORK/lone.log"; then
  echo "FAIL one rank failing alone: exit $rc after $((SECONDS - start)) s, expected '$expected'"
  tail -8 "$WORK/lone.log"; failures=$((failures + 1))
else
  echo "ok   one rank failing alone before the start: exit $rc in $((SECONDS - start)) s:" \
    "$(grep -o 'rank 0 waits.*' "$WORK/lone.log" | head -1 | cut -c1-160)"
fi

# fault KIND SIGNAL VICTIM: start a long job (rank 0 oracle, rank 1 server, ranks 2-3 trainers),
# send SIGNAL to one rank after training began — VICTIM "last" (rank 3: trainer 1), "server"
# (rank 1: server 0) or "oracle" (rank 0), found by OMPI_COMM_WORLD_RANK — and require the job to end
# with a non-zero exit within the peer timeout (plus slack).
fault() {
  local kind=$1 signal=$2 which=$3
  local log="$WORK/fault_$kind.log"
  "$MPIEXEC" -np 4 --oversubscribe "$BAGPIPE" train --data "$SYN" --batch-size 200 \
    --iterations 1000000 --cache oracle --cache-rows 2500 --dim 8 --servers 1 --quiet \
    --peer-timeout 5 --metrics-out "$log.metrics" --metrics-interval 5 >"$log" 2>&1 &
  local launcher=$!
  # The ranks are the launcher's children; wait until they all run and training began.
  local ranks=""
  for _ in $(seq 1 100); do
    ranks=$(pgrep -P "$launcher" -f "$BAGPIPE" | sort -n)
    [[ $(echo "$ranks" | wc -w) -ge 4 ]] && break
    sleep 0.1
  done
  # Training began when the first metrics line is written (a fixed delay is not enough on a
  # loaded machine; a rank stopped during the set-up is setup_fault's case above).
  for _ in $(seq 1 600); do
    [[ -s "$log.metrics" ]] && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.5
  local victim="" want=3
  [[ $which == server ]] && want=1
  [[ $which == oracle ]] && want=0
  for pid in $ranks; do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$want"; then
      victim=$pid
    fi
  done
  [[ -n $victim ]] || victim=$(echo "$ranks" | tail -1)
  echo "     ($kind: SIG$signal to pid $victim of ranks $(echo $ranks))"
  local start=$SECONDS
  kill "-$signal" "$victim" 2>/dev/null
  local waited=0
  while kill -0 "$launcher" 2>/dev/null && [[ $waited -lt 60 ]]; do
    sleep 1
    waited=$((SECONDS - start))
  done
  if kill -0 "$launcher" 2>/dev/null; then
    echo "FAIL $kind: the job was still running 60 s after the rank got SIG$signal"
    kill -9 "$launcher" $ranks 2>/dev/null
    failures=$((failures + 1))
    return
  fi
  wait "$launcher"
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "FAIL $kind: the job exited 0 after a rank got SIG$signal"; tail -5 "$log"
    failures=$((failures + 1))
    return
  fi
  echo "ok   $kind: job ended in $((SECONDS - start)) s with exit $rc"
  grep -Ei "error|signal|killed|rank" "$log" | head -3 | sed 's/^/       /'
  kill -CONT $ranks 2>/dev/null
}
fault "trainer killed (SIGKILL)" KILL last
# A stopped rank is a hung peer: the others must time out, name it, and abort the job.
for kind in "trainer hung (SIGSTOP)" "server hung (SIGSTOP)" "oracle hung (SIGSTOP)"; do
  which=last
  [[ $kind == server* ]] && which=server
  [[ $kind == oracle* ]] && which=oracle
  fault "$kind" STOP "$which"
  if ! grep -Eqi "no message|timed out|waited|hung|died" "$WORK/fault_$kind.log"; then
    echo "FAIL $kind: the error does not say that a peer hung or died"
    tail -10 "$WORK/fault_$kind.log"
    failures=$((failures + 1))
  fi
done
# The stopped rank itself is named (not the peers left waiting for it).
if ! grep -q "rank 3 (trainer 1) has sent nothing" "$WORK/fault_trainer hung (SIGSTOP).log"; then
  echo "FAIL trainer hung: no error names the stopped trainer (rank 3)"
  tail -10 "$WORK/fault_trainer hung (SIGSTOP).log"
  failures=$((failures + 1))
fi
if ! grep -Eq "server 0 \(rank 1\)|rank 1 \(server 0\)" "$WORK/fault_server hung (SIGSTOP).log"; then
  echo "FAIL server hung: no error names the silent server (rank 1)"
  tail -10 "$WORK/fault_server hung (SIGSTOP).log"
  failures=$((failures + 1))
fi
# Rank 0 stopped during training: the other ranks watch its heartbeats and name it.
if ! grep -q "rank 0 (oracle) has sent nothing" "$WORK/fault_oracle hung (SIGSTOP).log"; then
  echo "FAIL oracle hung: no error names the stopped rank 0"
  tail -10 "$WORK/fault_oracle hung (SIGSTOP).log"
  failures=$((failures + 1))
fi

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
