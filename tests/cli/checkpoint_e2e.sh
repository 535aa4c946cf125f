#!/usr/bin/env bash
# checkpoint_e2e.sh PRETRAIN_GPT CONFIG [DEVICE]: checkpoints through the real
# executable on 4 ranks (TP 2 x DP 2, ZeRO stage 2) on DEVICE (--device: cpu by
# default; cpu-isolated in CI proves every path below never touches device
# memory from host code; cuda on a GPU), each step checked:
#  1. kill -9 of one rank in the middle of a save: the job ends, the previous
#     checkpoint and `latest` are intact, and --load resumes from it with the
#     losses of the uninterrupted run, bit for bit (as printed);
#  2. the same checkpoint loads at TP 1 x DP 4 with ZeRO stage 3 and trains on
#     with the same losses (to the printed precision, 1e-4 relative); the
#     weights alone (--no-save-optim) load with --finetune (at another layout)
#     or --no-load-optim and are refused by a plain --load;
#  3. a flipped bit in the newest checkpoint: reported by file name, the
#     previous one is used;
#  4. SIGUSR1 to one rank (Slurm's pre-timeout signal): checkpoint at the next
#     step boundary, exit code 5; --load continues exactly;
#  5. a NaN loss stops the run (exit 2, the message names the iteration), or
#     is counted and skipped with --on-nan-loss skip;
#  6. kill -9 of one rank in the middle of training: every rank is gone within
#     seconds, with a message naming the dead rank, and a non-zero exit.
set -u
exe=$1 cfg=$2 device=${3:-cpu}
work=$(mktemp -d /tmp/mz-ckpt-e2e-XXXXXX)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/e2e_common.sh"  # run_timeout, watchdog, wait_for_line
run() {  # run NAME ARGS...: output in $work/NAME.log, exit code in $work/NAME.rc
  local name=$1; shift
  timeout "$run_timeout" mpiexec -n 4 "$exe" --config "$cfg" --mock-data --vocab-size 256 --train-iters "${ITERS:-6}" \
    --log-interval 1 --eval-iters 1 --device "$device" "${watchdog[@]}" "$@" >"$work/$name.log" 2>&1
  echo $? >"$work/$name.rc"
}
losses() { grep -E "^ iteration" "$work/$1.log" | sed -E 's/^ iteration +([0-9]+)\/.*lm loss ([0-9.E+-]+).*/\1 \2/'; }
fail() { echo "checkpoint_e2e ($device): FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done >&2; exit 1; }
rc() { cat "$work/$1.rc"; }
L22="--tensor-model-parallel-size 2 --zero-stage 2"

run straight $L22
[ "$(rc straight)" = 0 ] || fail "the uninterrupted run failed"
losses straight >"$work/straight.losses"
[ "$(wc -l <"$work/straight.losses")" = 6 ] || fail "expected 6 loss lines"

# 1. kill -9 in the middle of the save of iteration 4.
MEGAZERO_TEST_KILL_IN_SAVE=1@4 run killed $L22 --save "$work/ck" --save-interval 2
[ "$(rc killed)" != 0 ] || fail "the job survived the death of a rank"
grep -q "rank 1 killed while saving" "$work/killed.log" || fail "the fault was not injected"
[ "$(cat "$work/ck/latest")" = iter_0000002 ] || fail "latest moved to a checkpoint that was never completed"
[ -f "$work/ck/iter_0000002/manifest.json" ] || fail "the previous checkpoint is damaged"
[ ! -e "$work/ck/iter_0000004" ] || fail "a half-written checkpoint is in place"
run resumed $L22 --load "$work/ck" --save "$work/ck"
[ "$(rc resumed)" = 0 ] || fail "the resumed run failed"
grep -q "loaded checkpoint .*iter_0000002: iteration 2, consumed samples 32" "$work/resumed.log" || fail "did not load iteration 2"
losses resumed >"$work/resumed.losses"
diff <(tail -n 4 "$work/straight.losses") "$work/resumed.losses" >/dev/null ||
  fail "resumed losses differ: $(paste -d' ' <(tail -n 4 "$work/straight.losses") "$work/resumed.losses")"
[ -f "$work/ck/iter_0000006/manifest.json" ] || fail "no final checkpoint"
echo "checkpoint_e2e: kill -9 mid-save, resume: losses of iterations 3-6 identical"

# 2. Another layout: TP 1 x DP 4, stage 3, from the iteration-2 checkpoint.
mkdir -p "$work/ck2" && cp -r "$work/ck/iter_0000002" "$work/ck2/"
run relayout --tensor-model-parallel-size 1 --zero-stage 3 --load "$work/ck2"
[ "$(rc relayout)" = 0 ] || fail "loading at TP 1 x DP 4 stage 3 failed"
grep -q "saved at TP 2 x DP 2, ZeRO stage 2" "$work/relayout.log" || fail "no resharding report"
losses relayout >"$work/relayout.losses"
paste -d' ' <(tail -n 4 "$work/straight.losses") "$work/relayout.losses" |
  awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-4 * $2) bad = 1 } END { exit bad }' ||
  fail "losses after a layout change differ"
echo "checkpoint_e2e: TP 2 x DP 2 stage 2 -> TP 1 x DP 4 stage 3: losses continue"

# 2b. The weights alone (--no-save-optim): a third of the bytes; a plain --load
# refuses them naming the flags; --finetune (at another layout) starts at
# iteration 0, --no-load-optim goes on from iteration 2.
ITERS=2 run weights $L22 --save "$work/ck5" --no-save-optim
[ "$(rc weights)" = 0 ] || fail "saving the weights alone failed"
full=$(cat "$work"/ck/iter_0000002/*.safetensors | wc -c) alone=$(cat "$work"/ck5/iter_0000002/*.safetensors | wc -c)
awk -v f="$full" -v a="$alone" 'BEGIN { exit !(a * 2.9 < f && a * 3.1 > f) }' ||
  fail "a weights-only checkpoint holds $alone bytes against $full with the optimizer state"
run weights_plain $L22 --load "$work/ck5"
[ "$(rc weights_plain)" = 2 ] || fail "a plain --load of the weights alone gave exit $(rc weights_plain), expected 2"
grep -q "without the optimizer state (saved with --no-save-optim): add --no-load-optim" "$work/weights_plain.log" ||
  fail "the refusal does not name --no-load-optim"
run weights_finetune --tensor-model-parallel-size 1 --zero-stage 3 --load "$work/ck5" --finetune
[ "$(rc weights_finetune)" = 0 ] || fail "--finetune from the weights failed"
grep -q "finetune: loaded the weights of .*iter_0000002 (iteration 2, saved at TP 2 x DP 2, ZeRO stage 2)" \
  "$work/weights_finetune.log" || fail "--finetune did not report the weights it loaded"
[ "$(losses weights_finetune | wc -l)" = 6 ] || fail "--finetune did not train 6 iterations from iteration 0"
run weights_resume $L22 --load "$work/ck5" --no-load-optim
[ "$(rc weights_resume)" = 0 ] || fail "--no-load-optim from the weights failed"
grep -q "no-load-optim: Adam's moments start at zero and count their steps from iteration 2" \
  "$work/weights_resume.log" || fail "--no-load-optim did not report the restart"
[ "$(losses weights_resume | head -n 1 | cut -d' ' -f1)" = 3 ] || fail "--no-load-optim did not go on from iteration 2"
echo "checkpoint_e2e: weights alone: $alone bytes (with the optimizer state $full); --finetune and --no-load-optim load them"

# 3. A flipped bit in the newest checkpoint (iteration 6): iteration 4 is used instead.
run series $L22 --save "$work/ck3" --save-interval 2
shard="$work/ck3/iter_0000006/shard_tp001_dp00000.safetensors"
printf '\x55' | dd of="$shard" bs=1 seek=$(( $(stat -c %s "$shard") - 5 )) conv=notrunc status=none
ITERS=8 run fallback $L22 --load "$work/ck3" --use-checkpoint-opt-param-scheduler
[ "$(rc fallback)" = 0 ] || fail "loading past a corrupt checkpoint failed"
grep -q "skipped unusable checkpoint .*iter_0000006.*shard_tp001_dp00000.safetensors' fails its checksum" "$work/fallback.log" ||
  fail "the corrupt file was not named"
grep -q "loaded checkpoint .*iter_0000004" "$work/fallback.log" || fail "did not fall back to iteration 4"
echo "checkpoint_e2e: corrupt newest checkpoint named, previous one loaded"

# 4. SIGUSR1 to one rank once training runs: save at the step boundary, exit 5.
# 200 iterations (~10 ms each here: 2 s, against ~0.1 s from the first
# iteration's line to the signal) so the signal lands mid-run; the resumed run
# is compared with an uninterrupted one as long.
ITERS=200 run straight_long $L22
[ "$(rc straight_long)" = 0 ] || fail "the uninterrupted 200-iteration run failed"
losses straight_long >"$work/straight_long.losses"
[ "$(wc -l <"$work/straight_long.losses")" = 200 ] || fail "expected 200 loss lines"
( ITERS=200 run signalled $L22 --save "$work/ck4" ) &
bg=$!
wait_for_line "$work/signalled.log" "^ iteration +1/" $bg
pid=$(pgrep -f "^$exe .*$work/ck4" | head -n 1)
[ -n "$pid" ] && kill -USR1 "$pid"
wait $bg
[ "$(rc signalled)" = 5 ] || fail "exit code $(rc signalled) after SIGUSR1, expected 5"
stopped=$(sed -nE 's/^stopping after iteration ([0-9]+) on a stop signal.*/\1/p' "$work/signalled.log")
[ -n "$stopped" ] && [ "$stopped" -lt 200 ] || fail "no stop at a step boundary"
ITERS=200 run after_signal $L22 --load "$work/ck4"
[ "$(rc after_signal)" = 0 ] || fail "the run resumed after the signal failed"
losses after_signal >"$work/after_signal.losses"
[ "$(wc -l <"$work/after_signal.losses")" = $((200 - stopped)) ] || fail "expected $((200 - stopped)) loss lines after the signal"
diff <(tail -n $((200 - stopped)) "$work/straight_long.losses") "$work/after_signal.losses" >/dev/null ||
  fail "losses after the signal-triggered checkpoint differ"
echo "checkpoint_e2e: SIGUSR1 -> checkpoint at iteration $stopped, exit 5, exact resume"

# 5. NaN loss: stop (default) or skip.
MEGAZERO_TEST_NAN_LOSS_AT=3 run nan_stop $L22
[ "$(rc nan_stop)" = 2 ] || fail "a NaN loss gave exit code $(rc nan_stop), expected 2"
[ "$(grep -c "error: the loss is nan at iteration 3" "$work/nan_stop.log")" = 1 ] || fail "no single NaN message"
MEGAZERO_TEST_NAN_LOSS_AT=3 run nan_skip $L22 --on-nan-loss skip
[ "$(rc nan_skip)" = 0 ] || fail "--on-nan-loss skip did not finish"
grep -q "iteration        6/.*number of nan iterations   1" "$work/nan_skip.log" || fail "the NaN iteration was not counted"
echo "checkpoint_e2e: NaN loss stops with exit 2, or is counted and skipped"
# 6. kill -9 of one rank mid-training.
( ITERS=200 run killed_training $L22 ) &
bg=$!
wait_for_line "$work/killed_training.log" "^ iteration +1/" $bg
pid=$(pgrep -f "^$exe .*--train-iters 200" | sed -n 2p)
[ -n "$pid" ] || fail "no rank process to kill"
start=$(date +%s.%N)
kill -9 "$pid"
wait $bg
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
[ "$(rc killed_training)" != 0 ] || fail "the job exited 0 after a rank was killed"
grep -q "BAD TERMINATION\|killed\|KILLED" "$work/killed_training.log" || fail "no message about the dead rank"
[ -z "$(pgrep -f "^$exe .*--train-iters 200")" ] || fail "ranks survived the death of a peer"
awk -v e="$elapsed" 'BEGIN { exit !(e < 30) }' || fail "the job took ${elapsed} s to end after kill -9"
echo "checkpoint_e2e: kill -9 of a rank mid-training: the job ended in ${elapsed} s, exit $(rc killed_training)"
echo "checkpoint_e2e: all passed"
