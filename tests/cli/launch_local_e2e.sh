#!/usr/bin/env bash
# launch_local_e2e.sh PRETRAIN_GPT SOURCE_DIR: launch/local/pretrain_gpt.sh, the
# one-machine launcher, through the real executable. Each step checked:
#  1. -n 4: TP 2 x DP 2, ZeRO 2 trains; flags pass through unchanged;
#  2. NP=2 from the environment and a misspelt flag: pretrain_gpt's exit code 2
#     comes back, the message printed once;
#  3. SIGUSR1 to the launcher: passed to the ranks, checkpoint at the step
#     boundary, exit code 5; the same command again (2 more iterations)
#     resumes (--load added because --save holds a checkpoint) and finishes;
#  4. MZ_RANKS_PER_NODE: pretend nodes (--ranks-per-node) on one machine;
#  5. --hostfile (DeepSpeed's "HOST slots=N" and MPICH's "HOST:N"): two
#     pretend nodes (this host by name and as localhost, which mpiexec starts
#     without ssh) train as 2 nodes of 1 rank; TP across them is refused by
#     pretrain_gpt; unequal slots, a line without slots, a duplicate host and
#     a -n that disagrees are refused naming the line (exit 2).
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

printf '# two pretend nodes\n%s slots=1\nlocalhost:1   # MPICH form\n' "$(hostname)" >"$work/hosts"
timeout 60 "$launcher" --hostfile "$work/hosts" "${tiny[@]}" --train-iters 2 >"$work/hostfile.log" 2>&1 ||
  fail "--hostfile run failed"
has hostfile "^launch/local/pretrain_gpt.sh: --hostfile .*: 1 rank\\(s\\) on each of 2 host\\(s\\): $(hostname) localhost"
has hostfile "mpiexec -n 2 -f /tmp/mz-hosts-.* --ranks-per-node 1$"
has hostfile "^world 2 = TP 1 x DP 2 on 2 nodes of 1 rank"
has hostfile "^training done: 2 iterations"
[ -z "$(ls /tmp/mz-hosts-* 2>/dev/null | grep -F -f <(sed -nE 's/.* -f (\/tmp\/mz-hosts-[^ ]+) .*/\1/p' "$work/hostfile.log"))" ] ||
  fail "the launcher left its MPICH host file behind"
timeout 60 "$launcher" --hostfile "$work/hosts" "${tiny[@]}" --tensor-model-parallel-size 2 --train-iters 1 \
  >"$work/hostfile_tp.log" 2>&1
[ $? = 2 ] || fail "TP 2 over two hosts of 1 rank was not refused"
refused() {  # refused NAME REGEX HOSTFILE_TEXT [LAUNCHER_ARGS...]
  local name=$1 regex=$2 text=$3; shift 3
  printf '%b' "$text" >"$work/$name.hosts"
  timeout 30 "$launcher" "$@" --hostfile "$work/$name.hosts" "${tiny[@]}" >"$work/$name.log" 2>&1
  [ $? = 2 ] || fail "$name: not refused with exit 2"
  has "$name" "$regex"
}
refused unequal "line 2: b has 4 slots but a has 2; every host runs as many ranks" 'a slots=2\nb:4\n'
refused no_slots "line 2: 'b' gives no rank count: write 'b slots=N' \\(DeepSpeed\\) or 'b:N' \\(MPICH\\)" 'a:1\nb\n'
refused twice "line 3: a is listed twice" '# c\na:1\na slots=1\n'
refused np "-n 3 ranks, but --hostfile .* gives 2 hosts x 1 slots = 2; drop -n" 'a:1\nb:1\n' -n 3
refused empty "lists no hosts" '# nothing\n'
echo "launch_local_e2e: --hostfile: 2 pretend nodes trained; TP across hosts and bad host files refused"
echo "launch_local_e2e: all passed"
