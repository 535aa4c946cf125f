#!/usr/bin/env bash
# launch_local_e2e.sh PRETRAIN_GPT SOURCE_DIR: launch/local/pretrain_gpt.sh, the
# one-machine launcher, through the real executable. Each step checked:
#  1. -n 4: TP 2 x DP 2, ZeRO 2 trains; flags pass through unchanged;
#  2. NP=2 from the environment and a misspelt flag: pretrain_gpt's exit code 2
#     comes back, the message printed once;
#  3. SIGUSR1 to the launcher: passed to the ranks, checkpoint at the step
#     boundary, exit code 5; the same command again (2 more iterations)
#     resumes (--load added because --save holds a checkpoint) and finishes;
#  4. MZ_RANKS_PER_NODE: pretend nodes (--ranks-per-node) on one machine.
set -u
exe=$1 src=$2
launcher="$src/launch/local/pretrain_gpt.sh"
work=$(mktemp -d /tmp/mz-launch-local-XXXXXX)
trap 'rm -rf "$work"' EXIT
export MZ_PRETRAIN_GPT=$exe OMP_NUM_THREADS=1
tiny=(--config "$src/configs/gpt_tiny.cfg" --mock-data --vocab-size 256 --seq-length 32 --max-position-embeddings 32
      --hidden-size 64 --global-batch-size 8 --log-interval 1 --eval-iters 1)
fail() { echo "launch_local_e2e: FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done >&2; exit 1; }
has() { grep -qE -- "$2" "$work/$1.log" || fail "$1: no line matching /$2/"; }

timeout 120 "$launcher" -n 4 "${tiny[@]}" --tensor-model-parallel-size 2 --zero-stage 2 --train-iters 2 >"$work/np4.log" 2>&1
rc=$?
[ $rc = 0 ] || fail "-n 4: exit code $rc"
has np4 "^launch/local/pretrain_gpt.sh: 4 ranks on .*OMP_NUM_THREADS=1"
has np4 "^world 4 = TP 2 x DP 2 on 1 node of 4 ranks|^world 4 = TP 2 x DP 2 on 1 nodes of 4 ranks"
has np4 "^training done: 2 iterations"
echo "launch_local_e2e: -n 4, TP 2 x DP 2: trained"

NP=2 timeout 60 "$launcher" "${tiny[@]}" --num-layer 3 >"$work/bad.log" 2>&1
rc=$?
[ $rc = 2 ] || fail "a misspelt flag: exit code $rc, expected 2"
[ "$(grep -c -- "--num-layer is not a pretrain_gpt flag" "$work/bad.log")" = 1 ] || fail "the error is not printed once"
has bad "^launch/local/pretrain_gpt.sh: 2 ranks"
echo "launch_local_e2e: NP=2, a misspelt flag: exit code 2, one message"

iters=400
( timeout 120 "$launcher" -n 2 "${tiny[@]}" --train-iters $iters --save "$work/ckpt" >"$work/signal.log" 2>&1
  echo $? >"$work/signal.rc" ) &
for _ in $(seq 1 600); do
  grep -qE "^ iteration +1/" "$work/signal.log" 2>/dev/null && break
  sleep 0.05
done
pid=$(pgrep -f "^bash $launcher -n 2 .*$work/ckpt" | head -n 1)
[ -n "$pid" ] || pid=$(pgrep -f "pretrain_gpt.sh -n 2 .*$work/ckpt" | head -n 1)
[ -n "$pid" ] || fail "the launcher process was not found"
kill -USR1 "$pid"
wait
[ "$(cat "$work/signal.rc")" = 5 ] || fail "exit code $(cat "$work/signal.rc") after SIGUSR1, expected 5"
stopped=$(sed -nE 's/^stopping after iteration ([0-9]+) on a stop signal.*checkpoint saved.*/\1/p' "$work/signal.log")
[ -n "$stopped" ] && [ "$stopped" -lt $iters ] || fail "no stop at a step boundary"
timeout 120 "$launcher" -n 2 "${tiny[@]}" --train-iters $((stopped + 2)) --save "$work/ckpt" \
  --use-checkpoint-opt-param-scheduler >"$work/resume.log" 2>&1
rc=$?
[ $rc = 0 ] || fail "the resumed run: exit code $rc"
has resume "resuming: adding --load $work/ckpt"
has resume "loaded checkpoint $work/ckpt/iter_0*$stopped: iteration $stopped,"
has resume "^training done: 2 iterations"
echo "launch_local_e2e: SIGUSR1 to the launcher -> checkpoint at iteration $stopped, exit 5; the same command resumed"

MZ_RANKS_PER_NODE=1 timeout 60 "$launcher" -n 2 "${tiny[@]}" --dry-run >"$work/rpn.log" 2>&1 || fail "MZ_RANKS_PER_NODE run failed"
has rpn "^world 2 = TP 1 x DP 2 on 2 nodes of 1 rank"
echo "launch_local_e2e: all passed"
