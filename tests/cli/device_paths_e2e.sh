#!/usr/bin/env bash
# device_paths_e2e.sh PRETRAIN_GPT CONVERT_CHECKPOINT CONFIG DEVICE: every user
# path of a run on DEVICE (cpu-isolated in CI: a GPU's rule that host code
# never touches device memory; cuda in tools/gpu_session.sh paths), 2 ranks
# sharing the device over MPI, each step checked:
#  1. save -> resume is exact (the printed losses and loss scales, bit for bit)
#     in fp32, bf16 and fp16 with dynamic loss scaling;
#  2. ZeRO stages 0-3, each saved mid-run and resumed exactly;
#     2b: --optimizer-cpu-offload (ZeRO-Offload) trains the same bits with
#     less device memory and resumes a device-state checkpoint exactly;
#  3. a DEVICE checkpoint resumes on the CPU and on another layout (TP 2, stage
#     3), and a CPU checkpoint resumes on DEVICE (to 1e-4; bit for bit where
#     DEVICE runs the CPU kernels), and DEVICE's validation loss is the CPU's;
#     3b: --eod-mask-loss (and --calculate-per-token-loss) trains as on the CPU;
#  4. SIGTERM (what scancel and Slurm's time limit send) saves at the next step
#     boundary, exits 5, and the resumed run continues exactly; a rank stopped
#     with SIGSTOP ends the job through the collective watchdog (exit 4);
#  5. --device-arena with saves (and --log-params-norm, --log-num-zeros-in-grad): no arena misses, and the
#     save works from it;
#     5b: block recompute (with Pa+cpu, MD, the arena) and selective recompute
#     train with no recompute's losses, bit for bit;
#  6. export -> import -> export on DEVICE: identical files, identical logits,
#     and DEVICE's logits match the CPU's (1e-4 of the largest); 6b: generate_text
#     on DEVICE draws the CPU's greedy tokens, with the key/value cache as without;
#     6c: and split over 2 ranks (TP 2), one rank's first greedy token; 6d: beam search's best hypothesis
#     as on the CPU, and at TP 2;
#  7. the memory pre-flight refuses a model the device cannot hold (exit 2 on
#     every rank alike, printed once, planned vs free bytes and the flags that
#     fit) and reports the plan when it fits;
#  8. (before 7) the Llama-style model with sequence parallelism at TP 2 saves
#     and resumes exactly on DEVICE, with the CPU's losses without SP.
set -u
train=$1 convert=$2 cfg=$3 device=$4
work=$(mktemp -d /tmp/mz-device-paths-XXXXXX)
trap 'rm -rf "$work"' EXIT
tiny=(--config "$cfg" --mock-data --vocab-size 256 --log-interval 1 --eval-iters 1)
. "$(dirname "$0")/e2e_common.sh"  # run_timeout, watchdog, wait_for_line
run() {  # run NAME RANKS ARGS...: output in $work/NAME.log, exit code in $work/NAME.rc
  local name=$1 ranks=$2; shift 2
  local w=("${watchdog[@]}")
  [[ " $* " == *" --collective-timeout "* ]] && w=()
  timeout "$run_timeout" mpiexec -n "$ranks" "$train" "${tiny[@]}" "${w[@]}" "$@" >"$work/$name.log" 2>&1
  echo $? >"$work/$name.rc"
}
rc() { cat "$work/$1.rc"; }
# "iteration loss loss-scale" per logged iteration.
losses() { grep -E "^ iteration" "$work/$1.log" | sed -E 's/^ iteration +([0-9]+)\/.*lm loss ([0-9.E+-]+) \| loss scale ([0-9.]+).*/\1 \2 \3/'; }
fail() { echo "device_paths_e2e ($device): FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 12 "$f"; done >&2; exit 1; }
ok() { [ "$(rc "$1")" = 0 ] || fail "$1 exited with $(rc "$1")"; }
same_tail() {  # same_tail STRAIGHT RESUMED: the resumed run's lines equal the straight run's last ones
  local n; n=$(losses "$2" | wc -l)
  [ "$n" -gt 0 ] || fail "$2 logged no iterations"
  diff <(losses "$1" | tail -n "$n") <(losses "$2") >/dev/null ||
    fail "$2 differs from $1: $(paste -d'|' <(losses "$1" | tail -n "$n") <(losses "$2") | tr '\n' ' ')"
}
close_tail() {  # close_tail STRAIGHT RESUMED TOL: relative difference of the losses below TOL
  local n; n=$(losses "$2" | wc -l)
  [ "$n" -gt 0 ] || fail "$2 logged no iterations"
  paste -d' ' <(losses "$1" | tail -n "$n") <(losses "$2") |
    awk -v tol="$3" '{ d = $2 - $5; if (d < 0) d = -d; if ($1 != $4 || d > tol * $2) bad = 1 } END { exit bad }' ||
    fail "$2 is not within $3 of $1: $(paste -d'|' <(losses "$1" | tail -n "$n") <(losses "$2") | tr '\n' ' ')"
}
# Where DEVICE runs the CPU's kernels, crossing to the CPU changes no bit.
if [ "$device" = cpu-isolated ] || [ "$device" = cpu ]; then cross=same_tail; else cross="close_tail_1e4"; fi
close_tail_1e4() { close_tail "$1" "$2" 1e-4; }

# A directory holding only iteration ITER of a run's checkpoints (the run kept
# going past it with the same --train-iters, so the LR schedule is the same).
only() {  # only SAVE_DIR ITER NEW_DIR
  mkdir -p "$3" && cp -r "$1/iter_$(printf %07d "$2")" "$3/" || fail "no checkpoint at iteration $2 in $1"
}

# 1. save -> resume, exact, in every precision.
for prec in fp32 bf16 fp16; do
  flags=(--device "$device" --zero-stage 1 --train-iters 6)
  [ "$prec" = fp32 ] || flags+=(--"$prec")
  [ "$prec" = fp16 ] && flags+=(--initial-loss-scale 65536 --loss-scale-window 2)
  run "straight_$prec" 2 "${flags[@]}" --save "$work/all_$prec" --save-interval 3
  ok "straight_$prec"
  only "$work/all_$prec" 3 "$work/ck_$prec"
  run "resumed_$prec" 2 "${flags[@]}" --load "$work/ck_$prec"
  ok "resumed_$prec"
  grep -q "loaded checkpoint .*iter_0000003" "$work/resumed_$prec.log" || fail "the $prec run did not load iteration 3"
  same_tail "straight_$prec" "resumed_$prec"
done
[ "$(losses straight_fp16 | awk '{ print $3 }' | sort -u | wc -l)" -gt 1 ] ||
  fail "the fp16 loss scale never changed: the scaler's state was not exercised"
echo "device_paths_e2e ($device): save -> resume exact in fp32, bf16 and fp16 (loss scale included)"

# 2. ZeRO stages 0-3, each resumed from a mid-run checkpoint.
for stage in 0 1 2 3; do
  run "z${stage}_straight" 2 --device "$device" --zero-stage "$stage" --train-iters 4 --bf16 --save "$work/z${stage}_all" \
    --save-interval 2
  ok "z${stage}_straight"
  only "$work/z${stage}_all" 2 "$work/z$stage"
  run "z${stage}_resumed" 2 --device "$device" --zero-stage "$stage" --train-iters 4 --bf16 --load "$work/z$stage"
  ok "z${stage}_resumed"
  same_tail "z${stage}_straight" "z${stage}_resumed"
done
echo "device_paths_e2e ($device): ZeRO stages 0-3 on 2 ranks sharing the device: checkpoint and exact resume"

# 2b. ZeRO-Offload (--optimizer-cpu-offload): the master and Adam's moments in
# host memory, AdamW on the host: the losses of step 2's runs on DEVICE, bit
# for bit (one AdamW formula everywhere), less device memory at its peak; an
# offloaded resume of step 2's checkpoint continues exactly. Stage 3 offloads
# the 16-bit parameter partition too (--param-cpu-offload).
peak() { sed -nE 's/^ iteration .*peak memory \(max over ranks\) ([0-9.]+) MiB.*/\1/p' "$work/$1.log" | tail -n 1; }
for stage in 1 3; do
  params=(); [ "$stage" = 3 ] && params=(--param-cpu-offload)
  run "off${stage}" 2 --device "$device" --zero-stage "$stage" --train-iters 4 --bf16 --optimizer-cpu-offload ${params[@]+"${params[@]}"}
  ok "off${stage}"
  grep -q "^ZeRO-Offload: fp32 master weights and Adam moments" "$work/off${stage}.log" || fail "no ZeRO-Offload line"
  same_tail "z${stage}_straight" "off${stage}"
  awk -v a="$(peak "off${stage}")" -v b="$(peak "z${stage}_straight")" 'BEGIN { exit !(a > 0 && a < b) }' ||
    fail "stage $stage: offloaded peak $(peak "off${stage}") MiB, not below $(peak "z${stage}_straight") MiB"
  run "off${stage}_resumed" 2 --device "$device" --zero-stage "$stage" --train-iters 4 --bf16 --optimizer-cpu-offload \
    --load "$work/z$stage"
  ok "off${stage}_resumed"
  same_tail "z${stage}_straight" "off${stage}_resumed"
done
echo "device_paths_e2e ($device): --optimizer-cpu-offload at stages 1 and 3 (with --param-cpu-offload): the same losses, a lower device peak ($(peak off1) against $(peak z1_straight) MiB at stage 1), exact resume"

# 3. Across devices and layouts (fp32, from step 1's checkpoint at iteration 3).
run cpu_straight 2 --device cpu --zero-stage 1 --train-iters 6 --save "$work/all_cpu" --save-interval 3
ok cpu_straight
run to_cpu 2 --device cpu --zero-stage 1 --train-iters 6 --load "$work/ck_fp32"
ok to_cpu
grep -q "loaded checkpoint .*iter_0000003" "$work/to_cpu.log" || fail "the CPU run did not load the $device checkpoint"
$cross cpu_straight to_cpu
run relayout 2 --device "$device" --tensor-model-parallel-size 2 --zero-stage 3 --train-iters 6 --load "$work/ck_fp32"
ok relayout
grep -q "saved at TP 1 x DP 2, ZeRO stage 1" "$work/relayout.log" || fail "no resharding report"
close_tail straight_fp32 relayout 1e-4
only "$work/all_cpu" 3 "$work/ck_cpu"
run from_cpu 2 --device "$device" --zero-stage 1 --train-iters 6 --load "$work/ck_cpu"
ok from_cpu
$cross straight_fp32 from_cpu
# Evaluation on DEVICE: the same validation loss as the CPU's run of the same flags.
val() { sed -nE 's/^ validation loss at iteration ([0-9]+): ([0-9.]+) .*/\1 \2/p' "$work/$1.log"; }
[ -n "$(val straight_fp32)" ] || fail "no validation loss on $device"
if [ "$cross" = same_tail ]; then
  [ "$(val straight_fp32)" = "$(val cpu_straight)" ] || fail "validation on $device: $(val straight_fp32), CPU: $(val cpu_straight)"
else
  paste -d' ' <(val straight_fp32) <(val cpu_straight) |
    awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-4 * $4) bad = 1 } END { exit bad }' ||
    fail "validation on $device: $(val straight_fp32), CPU: $(val cpu_straight)"
fi
echo "device_paths_e2e ($device): $device -> CPU, CPU -> $device and TP 1 stage 1 -> TP 2 stage 3 resumes; validation as on the CPU"

# 3b. --eod-mask-loss (one token in 256 masked; the loss weights made on the
# host and uploaded) on DEVICE trains and evaluates as on the CPU: each
# micro-batch's mean at TP 1 (the one-pass cross-entropy), the global batch's
# (--calculate-per-token-loss) at TP 2 (the vocabulary-split kernels).
for tp in 1 2; do
  per=(); [ "$tp" = 2 ] && per=(--calculate-per-token-loss)
  mask=(--zero-stage 2 --train-iters 4 --tensor-model-parallel-size "$tp" --eod-mask-loss --eod-token-id 7 ${per[@]+"${per[@]}"})
  run "mask${tp}_dev" 2 --device "$device" "${mask[@]}"
  ok "mask${tp}_dev"
  grep -q "no loss where the input is token 7" "$work/mask${tp}_dev.log" || fail "no loss-mask line"
  run "mask${tp}_cpu" 2 --device cpu "${mask[@]}"
  ok "mask${tp}_cpu"
  $cross "mask${tp}_cpu" "mask${tp}_dev"
done
echo "device_paths_e2e ($device): --eod-mask-loss (per micro-batch at TP 1, per token at TP 2) trains as on the CPU"

# 4. SIGTERM mid-run: checkpoint at the step boundary, exit 5, exact resume.
run term_straight 2 --device "$device" --zero-stage 2 --train-iters 150
ok term_straight
( run term 2 --device "$device" --zero-stage 2 --train-iters 150 --save "$work/ck_term" ) &
bg=$!
wait_for_line "$work/term.log" "^ iteration +1/" $bg
pkill -TERM -f "^$train .*$work/ck_term"
wait $bg
[ "$(rc term)" = 5 ] || fail "exit code $(rc term) after SIGTERM, expected 5"
stopped=$(sed -nE 's/^stopping after iteration ([0-9]+) on a stop signal.*/\1/p' "$work/term.log")
[ -n "$stopped" ] && [ "$stopped" -lt 150 ] || fail "no stop at a step boundary"
[ -f "$work/ck_term/iter_$(printf %07d "$stopped")/manifest.json" ] || fail "no checkpoint at iteration $stopped"
run term_resumed 2 --device "$device" --zero-stage 2 --train-iters 150 --load "$work/ck_term"
ok term_resumed
same_tail term_straight term_resumed
echo "device_paths_e2e ($device): SIGTERM -> checkpoint at iteration $stopped, exit 5, exact resume"

# 4b. A rank that stops answering (SIGSTOP) mid-run: the other rank's collective
# watchdog ends the job with exit 4 and a report, not a hang.
# (3 s of watchdog on the CPU; 10 s on a GPU, whose ranks may start seconds apart.)
hang_timeout=3
[ "$device" = cuda ] && hang_timeout=10
( run hang 2 --device "$device" --zero-stage 2 --train-iters 100000 --collective-timeout "$hang_timeout" \
    --save "$work/ck_hang" --save-interval 100000 ) &
bg=$!
wait_for_line "$work/hang.log" "^ iteration +2/" $bg || fail "the hang run ended before iteration 2: rc $(rc hang)"
victim=$(pgrep -f "^$train .*$work/ck_hang" | head -n 1)
[ -n "$victim" ] || fail "the hang run is not running"
kill -STOP "$victim"
wait $bg
[ "$(rc hang)" = 4 ] || fail "exit code $(rc hang) with a stopped rank, expected 4 (the watchdog)"
grep -qE "watchdog: rank [0-9]+ .*has not completed after" "$work/hang.log" || fail "no watchdog report"
echo "device_paths_e2e ($device): a stopped rank -> watchdog report, exit 4"

# 5. --device-arena: saves from it, and what the arena served resumes exactly.
run arena 2 --device "$device" --zero-stage 3 --device-arena --train-iters 4 --save "$work/arena_all" --save-interval 2 \
  --log-params-norm --log-num-zeros-in-grad
ok arena
grep -qE "iteration +4/ +4 .*arena misses 0 \|" "$work/arena.log" || fail "arena misses with saves"
grep -qE "iteration +4/ +4 .*\| params norm [0-9]+\.[0-9]{3} \|" "$work/arena.log" || fail "no params norm logged"
grep -qE "iteration +4/ +4 .*\| num zeros [0-9]+ \|" "$work/arena.log" || fail "no number of zeros in the grad logged"
only "$work/arena_all" 2 "$work/ck_arena"
run arena_resumed 2 --device "$device" --zero-stage 3 --device-arena --train-iters 4 --load "$work/ck_arena"
ok arena_resumed
same_tail arena arena_resumed
echo "device_paths_e2e ($device): --device-arena saves (no misses) and resumes exactly"

# 5b. Megatron's recompute choices on DEVICE give no-recompute's losses bit for
# bit: the first of 2 layers recomputing with Pa+cpu and MD in the planned
# arena (no misses), and selective recompute.
run rc_none 2 --device "$device" --tensor-model-parallel-size 2 --zero-stage 2 --train-iters 3
run rc_block 2 --device "$device" --tensor-model-parallel-size 2 --zero-stage 2 --train-iters 3 \
  --recompute-activations --recompute-method block --recompute-num-layers 1 --partition-activations \
  --cpu-checkpointing --contiguous-memory-optimization --device-arena
run rc_selective 2 --device "$device" --tensor-model-parallel-size 2 --zero-stage 2 --train-iters 3 \
  --recompute-granularity selective
for r in rc_none rc_block rc_selective; do ok $r; done
grep -qE "iteration +3/ +3 .*arena misses 0 \|" "$work/rc_block.log" || fail "arena misses with block recompute"
same_tail rc_none rc_block
same_tail rc_none rc_selective
echo "device_paths_e2e ($device): block recompute (Pa+cpu, MD, arena) and selective recompute: no recompute's losses"

# 6. Hugging Face export -> import -> export, and logits, on DEVICE.
tokens=0,5,199,17,42,255,3,100,7,7,7,150,198,1
conv() {  # conv NAME ARGS...: one process, no mpiexec
  local name=$1; shift
  timeout "$run_timeout" "$convert" "$@" >"$work/$name.log" 2>&1 || fail "$name exited with $?"
}
conv export export --load "$work/ck_fp32" --output "$work/hf"
conv logits logits --load "$work/ck_fp32" --tokens $tokens --output "$work/logits.txt" --device "$device"
conv logits_cpu logits --load "$work/ck_fp32" --tokens $tokens --output "$work/logits_cpu.txt" --device cpu
conv import import --input "$work/hf" --save "$work/imported" --device "$device"
conv export2 export --load "$work/imported" --output "$work/hf2"
cmp -s "$work/hf/model.safetensors" "$work/hf2/model.safetensors" || fail "export(import(x)) differs from x"
conv logits2 logits --load "$work/imported" --tokens $tokens --output "$work/logits2.txt" --device "$device"
cmp -s "$work/logits.txt" "$work/logits2.txt" || fail "the imported checkpoint computes other logits on $device"
paste -d' ' <(tail -n +2 "$work/logits.txt" | tr ' ' '\n') <(tail -n +2 "$work/logits_cpu.txt" | tr ' ' '\n') |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; a = $2 < 0 ? -$2 : $2; if (a > big) big = a }
       END { exit !(m <= 1e-4 * big) }' || fail "$device's logits differ from the CPU's"
echo "device_paths_e2e ($device): export -> import -> export identical, logits identical, and the CPU's"

# 6b. generate_text on DEVICE: greedy, the CPU's tokens (all of them where DEVICE runs the CPU's kernels; on
# a GPU the first, as a near tie between fp32 logits may turn a later one), and sampling seeded alike.
generate=$(dirname "$convert")/generate_text
gen() {  # gen NAME DEVICE ARGS...: the drawn ids
  local name=$1 dev=$2; shift 2
  timeout "$run_timeout" "$generate" --load "$work/ck_fp32" --prompt-tokens $tokens --device "$dev" "$@" \
    >"$work/$name.log" 2>&1 || fail "$name exited with $?"
  sed -nE 's/^generate_text: [0-9]+ tokens in .*: ([0-9,]+)$/\1/p' "$work/$name.log"
}
g_dev=$(gen gen_dev "$device" --greedy --no-stop --max-new-tokens 8)
g_cpu=$(gen gen_cpu cpu --greedy --no-stop --max-new-tokens 8)
[ "$(echo "$g_dev" | tr ',' '\n' | wc -l)" = 8 ] || fail "generate_text on $device drew '$g_dev', not 8 tokens"
if [ "$cross" = same_tail ]; then
  [ "$g_dev" = "$g_cpu" ] || fail "greedy tokens on $device ($g_dev) differ from the CPU's ($g_cpu)"
else
  [ "${g_dev%%,*}" = "${g_cpu%%,*}" ] || fail "the first greedy token on $device (${g_dev%%,*}) is not the CPU's (${g_cpu%%,*})"
fi
[ "$(gen gen_s1 "$device" --top-p 0.9 --seed 5 --no-stop)" = "$(gen gen_s2 "$device" --top-p 0.9 --seed 5 --no-stop)" ] ||
  fail "the same seed drew other tokens on $device"
# The key/value cache (the default) against running the whole sequence each step, on DEVICE.
g_full=$(gen gen_full "$device" --greedy --no-stop --max-new-tokens 8 --no-kv-cache)
[ "${g_full%%,*}" = "${g_dev%%,*}" ] || fail "--no-kv-cache's first greedy token on $device (${g_full%%,*}) is not the cache's (${g_dev%%,*})"
[ "$cross" != same_tail ] || [ "$g_full" = "$g_dev" ] ||
  fail "greedy tokens with the key/value cache ($g_dev) differ from --no-kv-cache's ($g_full) on $device"
echo "device_paths_e2e ($device): generate_text greedy as on the CPU ($g_dev) and as without the key/value cache, sampling seeded"

# 6d. beam search on DEVICE (a key/value cache a sequence, reordered by copies in DEVICE's memory): the CPU's
# best hypothesis (all of it where DEVICE runs the CPU's kernels; on a GPU its first token), and split over 2
# ranks (TP 2) the same first token, printed once.
beam_best() {  # beam_best NAME LAUNCH...: hypothesis 1's ids
  local name=$1; shift
  timeout "$run_timeout" "$@" --load "$work/ck_fp32" --prompt-tokens $tokens --beam-width 3 --no-stop \
    --max-new-tokens 6 >"$work/$name.log" 2>&1 || fail "$name exited with $?"
  [ "$(grep -c '^generate_text: hypothesis 1: ' "$work/$name.log")" = 1 ] || fail "$name: hypothesis 1 not printed once"
  sed -nE 's/^generate_text: hypothesis 1: score .*: ([0-9,]+)$/\1/p' "$work/$name.log"
}
b_dev=$(beam_best beam_dev "$generate" --device "$device")
b_cpu=$(beam_best beam_cpu "$generate" --device cpu)
b_tp=$(beam_best beam_tp mpiexec -n 2 "$generate" --device "$device")
[ "$(echo "$b_dev" | tr ',' '\n' | wc -l)" = 6 ] || fail "beam search on $device gave '$b_dev', not 6 tokens"
if [ "$cross" = same_tail ]; then
  [ "$b_dev" = "$b_cpu" ] || fail "beam search's best on $device ($b_dev) differs from the CPU's ($b_cpu)"
else
  [ "${b_dev%%,*}" = "${b_cpu%%,*}" ] || fail "beam search's best first token on $device (${b_dev%%,*}) is not the CPU's (${b_cpu%%,*})"
fi
[ "${b_tp%%,*}" = "${b_dev%%,*}" ] || fail "beam search's best first token at TP 2 on $device (${b_tp%%,*}) is not one rank's"
echo "device_paths_e2e ($device): beam search's best as on the CPU ($b_dev), at TP 2 ($b_tp)"

# 6c. generate_text split over 2 ranks (TP 2, under mpiexec) on DEVICE: the one-rank model's first greedy
# token (later ones may turn on a near tie: TP sums in another order), the same sampled tokens for the
# same seed, printed once; a --tensor-model-parallel-size other than the ranks refused by name.
gen_tp() {  # gen_tp NAME ARGS...: the drawn ids
  local name=$1; shift
  timeout "$run_timeout" mpiexec -n 2 "$generate" --load "$work/ck_fp32" --prompt-tokens $tokens --device "$device" \
    "$@" >"$work/$name.log" 2>&1 || fail "$name exited with $?"
  [ "$(grep -c '^generate_text: [0-9]* tokens in' "$work/$name.log")" = 1 ] || fail "$name: not printed once"
  sed -nE 's/^generate_text: [0-9]+ tokens in .*: ([0-9,]+)$/\1/p' "$work/$name.log"
}
g_tp=$(gen_tp gen_tp --greedy --no-stop --max-new-tokens 8)
grep -q "split over 2 ranks (tensor parallel)" "$work/gen_tp.log" || fail "generate_text under mpiexec -n 2 did not split the model"
[ "${g_tp%%,*}" = "${g_dev%%,*}" ] || fail "the first greedy token at TP 2 on $device (${g_tp%%,*}) is not one rank's (${g_dev%%,*})"
[ "$(gen_tp gen_tp_s1 --top-p 0.9 --seed 5 --no-stop)" = "$(gen_tp gen_tp_s2 --top-p 0.9 --seed 5 --no-stop)" ] ||
  fail "the same seed drew other tokens at TP 2 on $device"
timeout "$run_timeout" mpiexec -n 2 "$generate" --load "$work/ck_fp32" --prompt-tokens $tokens --device "$device" \
  --tensor-model-parallel-size 4 >"$work/gen_tp_bad.log" 2>&1
rc=$?
[ "$rc" = 2 ] && [ "$(grep -c -- '--tensor-model-parallel-size 4: generate_text splits the model over all its ranks, and mpiexec started 2' "$work/gen_tp_bad.log")" = 1 ] ||
  fail "a --tensor-model-parallel-size other than the ranks was not refused once with exit 2 (rc $rc)"
echo "device_paths_e2e ($device): generate_text at TP 2 draws one rank's first greedy token ($g_tp), sampling seeded"

# 8. The Llama-style model (rope, RMSNorm, SwiGLU, grouped-query attention,
#    no biases, untied output layer) with sequence parallelism at TP 2 on
#    DEVICE: saved and resumed exactly, and the CPU's losses without sequence
#    parallelism (to 1e-4: SP sums the same numbers in another order).
llama=(--config "$(dirname "$cfg")/llama_tiny.cfg" --mock-data --vocab-size 256 --log-interval 1 --eval-iters 1
       --tensor-model-parallel-size 2 --train-iters 6)
run_llama() {  # run_llama NAME ARGS...
  local name=$1; shift
  timeout "$run_timeout" mpiexec -n 2 "$train" "${llama[@]}" "${watchdog[@]}" "$@" >"$work/$name.log" 2>&1
  echo $? >"$work/$name.rc"
}
run_llama llama_sp --device "$device" --sequence-parallel --save "$work/llama_ckpt" --save-interval 3
ok llama_sp
grep -q "rope positions (base 10000), RMSNorm, SwiGLU MLP, 2 query groups, no linear biases, untied output layer.*sequence parallel on" \
  "$work/llama_sp.log" || fail "llama_sp did not run the Llama-style model with sequence parallelism"
only "$work/llama_ckpt" 3 "$work/llama_from3"
run_llama llama_sp_resumed --device "$device" --sequence-parallel --load "$work/llama_from3"
ok llama_sp_resumed
same_tail llama_sp llama_sp_resumed
run_llama llama_cpu --device cpu
ok llama_cpu
close_tail llama_cpu llama_sp 1e-4
echo "device_paths_e2e ($device): Llama-style model with sequence parallelism: exact resume, the CPU's losses without SP"

# 7. The memory pre-flight (a device with a capacity: a GPU, or the isolated
# device given one; host memory has none to check against).
if [ "$device" = cpu ]; then
  echo "device_paths_e2e: all passed (no pre-flight on host memory)"
  exit 0
fi
if [ "$device" = cuda ]; then  # GPT-3 175B on one device
  big=(--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048)
  capacity=()
else  # 12 MiB cannot hold the tiny model at stage 0 on 2 ranks (13.6 MiB planned); other settings fit
  big=()
  capacity=(env MEGAZERO_ISOLATED_DEVICE_MIB=12)
fi
"${capacity[@]}" timeout "$run_timeout" mpiexec -n 2 "$train" "${tiny[@]}" --device "$device" --train-iters 2 "${big[@]}" \
  >"$work/preflight.log" 2>&1
code=$?
[ "$code" = 2 ] || fail "a model too large for the device gave exit $code, expected 2"
[ "$(grep -cE "error: memory pre-flight: rank [0-9]+'s plan needs .* free of .*(fit|add ranks)" "$work/preflight.log")" = 1 ] ||
  fail "the pre-flight refusal was not printed once, with planned and free bytes and what fits"
if [ "$device" != cuda ]; then  # the first suggestion, taken as given, trains on the same device
  suggestion=$(sed -nE 's/.*each of these fits alone: (--[a-z-]+ [0-9]+)[ ,(].*/\1/p' "$work/preflight.log")
  [ -n "$suggestion" ] || fail "no flag suggested"
  export MEGAZERO_ISOLATED_DEVICE_MIB=12
  # shellcheck disable=SC2086
  run preflight_suggestion 2 --device "$device" --train-iters 2 $suggestion
  unset MEGAZERO_ISOLATED_DEVICE_MIB
  ok preflight_suggestion
  export MEGAZERO_ISOLATED_DEVICE_MIB=64
fi
run preflight_fits 2 --device "$device" --train-iters 2
unset MEGAZERO_ISOLATED_DEVICE_MIB
ok preflight_fits
grep -q "memory pre-flight: planned peak [0-9.]* MiB per rank" "$work/preflight_fits.log" ||
  fail "no pre-flight report when the model fits"
grep "error: memory pre-flight" "$work/preflight.log" | head -n 1 | cut -c1-400
echo "device_paths_e2e ($device): all passed"
