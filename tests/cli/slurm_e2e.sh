#!/usr/bin/env bash
# slurm_e2e.sh PRETRAIN_GPT SOURCE_DIR: the shipped Slurm launcher, for real, on a
# throwaway single-machine Slurm (munge + slurmctld + 2 slurmd node names, all
# under a temporary directory; tests/cli/slurm_cluster.sh). Each step checked:
#  1. sbatch -N 2 --ntasks-per-node=2 launch/slurm/pretrain_gpt.sbatch: a 4-rank
#     TP 2 x DP 2 ZeRO-2 run; the rank -> node map (2 nodes x 2, block) is printed
#     and validated, --ranks-per-node 2 comes from SLURM_NTASKS_PER_NODE, the
#     program sees 2 nodes, the job COMPLETES with exit code 0;
#  2. a misspelt flag: refused by the dry run on the batch node, exit code 2,
#     nothing launched;
#  3. pre-timeout signal: SIGUSR1 to the job (scancel --full --signal=USR1, what
#     --signal=USR1@120 and its B: variant deliver) -> checkpoint at the step
#     boundary, exit 5 -> the job requeues itself -> the requeued run adds --load
#     and finishes from the saved iteration; final state COMPLETED, Restarts=1;
#  4. launch/sweep/sweep.sh --backend slurm: 2 points (1 rank on 1 node, 2 ranks
#     on 2 nodes), CSV rows and PNG charts; a re-run skips both;
#  5. opt-in (MZ_TEST_SLURM_TIMELIMIT=1, up to a minute more): a real
#     --time=1 --signal=USR1@25 job saves and exits 5 before its limit.
# The cluster is torn down (jobs cancelled, daemons stopped by pid, files removed)
# on any exit. Missing Slurm packages or no root: FAIL with the reason.
set -u
exe=$1 src=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=slurm_cluster.sh
. "$here/slurm_cluster.sh"
t_start=$(date +%s)
fail() {
  echo "slurm_e2e: FAIL: $*" >&2
  for f in "$work"/*.out; do [ -f "$f" ] && { echo "---- $f"; tail -n 25 "$f"; }; done >&2
  slurm_cluster_log >&2
  exit 1
}
missing=$(slurm_cluster_missing)
if [ -n "$missing" ]; then
  echo "slurm_e2e: FAIL: cannot run a Slurm cluster here: $missing" >&2
  exit 1
fi
work=$(mktemp -d /tmp/mz-slurm-e2e-XXXXXX)
chmod 755 "$work"
cleanup() { slurm_cluster_down; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
slurm_cluster_up "$work/cluster" 2 8 || fail "the cluster did not come up"
cd "$work" || fail "no work dir"

export MZ_PRETRAIN_GPT=$exe OMP_NUM_THREADS=1
sbatch_script="$src/launch/slurm/pretrain_gpt.sbatch"
tiny=(--config "$src/configs/gpt_tiny.cfg" --mock-data --vocab-size 256 --seq-length 32 --max-position-embeddings 32
      --hidden-size 64 --global-batch-size 8 --log-interval 1 --eval-iters 1)
job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_state() {  # wait_state JOBID REGEX SECONDS: until JobState matches
  local s
  for _ in $(seq 1 $(($3 * 10))); do
    s=$(job_field "$1" JobState)
    [[ "$s" =~ ^($2)$ ]] && return 0
    sleep 0.1
  done
  fail "job $1 is in state '$s' after $3 s, expected $2"
}
wait_done() { wait_state "$1" "COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL" "$2"; }
submit() {  # submit NAME SBATCH-ARGS... -- TRAIN-ARGS...: prints the job id; output in $work/NAME.out
  local name=$1; shift
  local sb=()
  while [ "$1" != "--" ]; do sb+=("$1"); shift; done
  shift
  sbatch --parsable -o "$work/$name.out" "${sb[@]}" "$sbatch_script" "${tiny[@]}" "$@" || fail "sbatch of $name failed"
}
has() { grep -qE -- "$2" "$work/$1.out" || fail "$1: no line matching /$2/ in its output"; }

# 1. A 2-node x 2-task training job.
j=$(submit train -N 2 --ntasks-per-node=2 -- --tensor-model-parallel-size 2 --zero-stage 2 --train-iters 2)
wait_done "$j" 120
[ "$(job_field "$j" JobState)" = COMPLETED ] || fail "train: state $(job_field "$j" JobState), exit $(job_field "$j" ExitCode)"
[ "$(job_field "$j" ExitCode)" = 0:0 ] || fail "train: ExitCode $(job_field "$j" ExitCode)"
has train "rank +0 +node +0 +local +0 +mzn1"
has train "rank +3 +node +1 +local +1 +mzn2"
has train "rank map: 2 nodes x 2 ranks, block placement"
has train "launch: srun .*--mpi=pmi2 .*--ranks-per-node 2"
has train "^world 4 = TP 2 x DP 2 on 2 nodes of 2 ranks"
has train "^training done: 2 iterations"
has train "training finished \(exit code 0\)"
echo "slurm_e2e: 2 nodes x 2 tasks: rank map validated, trained, exit 0 ($(( $(date +%s) - t_start )) s)"

# 2. Bad input: exit 2 from the dry run, no training step.
j=$(submit bad -N 2 --ntasks-per-node=2 -- --num-layer 3)
wait_done "$j" 60
[ "$(job_field "$j" ExitCode)" = 2:0 ] || fail "bad flag: ExitCode $(job_field "$j" ExitCode), expected 2:0"
has bad "--num-layer is not a pretrain_gpt flag"
has bad "nothing was launched"
grep -q "launch: srun" "$work/bad.out" && fail "bad flag: training was launched anyway"
echo "slurm_e2e: a misspelt flag: exit code 2 before launch"

# 3. SIGUSR1 -> checkpoint, exit 5 -> requeue -> resume with --load.
# 400 iterations (~10 ms each here: 4 s, against well under a second from the
# first iteration's line through scancel and the batch shell to the ranks) so
# the signal lands mid-run.
iters=400
j=$(submit signal -N 2 --ntasks-per-node=2 -- --tensor-model-parallel-size 2 --zero-stage 2 --train-iters $iters \
    --save "$work/ckpt")
for _ in $(seq 1 600); do
  grep -qE "^ iteration +1/" "$work/signal.out" 2>/dev/null && break
  [[ "$(job_field "$j" JobState)" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$ ]] && fail "signal: the job ended early"
  sleep 0.1
done
grep -qE "^ iteration +1/" "$work/signal.out" || fail "signal: training did not start"
scancel --full --signal=USR1 "$j" || fail "scancel --signal=USR1 failed"
# Requeued: pending until the old job credentials expire (cred_expire + 1 s, 6 s
# here; 121 s with Slurm's default), then it runs again with SLURM_RESTART_COUNT=1.
for _ in $(seq 1 600); do
  [ "$(job_field "$j" Restarts)" = 1 ] && break
  [[ "$(job_field "$j" JobState)" =~ ^(COMPLETED|FAILED|CANCELLED)$ ]] && fail "signal: the job ended instead of requeueing"
  sleep 0.1
done
[ "$(job_field "$j" Restarts)" = 1 ] || fail "signal: the job was not requeued"
wait_state "$j" "COMPLETED|FAILED|CANCELLED" 120
[ "$(job_field "$j" JobState)" = COMPLETED ] && [ "$(job_field "$j" ExitCode)" = 0:0 ] ||
  fail "signal: the requeued run ended $(job_field "$j" JobState) $(job_field "$j" ExitCode)"
has signal "batch shell got SIGUSR1; forwarding it to the training step"
stopped=$(sed -nE 's/^stopping after iteration ([0-9]+) on a stop signal.*checkpoint saved; exit code 5/\1/p' "$work/signal.out")
[ -n "$stopped" ] && [ "$stopped" -lt $iters ] || fail "signal: no stop at a step boundary before iteration $iters"
has signal "exit code 5: stopped by a signal"
has signal "requeueing job $j \(restart 1\)"
has signal "restart 1: 2 nodes"
has signal "resuming: adding --load $work/ckpt \(requeued run \(restart 1\)\)"
has signal "loaded checkpoint $work/ckpt/iter_0*$stopped: iteration $stopped,"
has signal "^training done: $((iters - stopped)) iterations"
[ -f "$work/ckpt/$(printf "iter_%07d" "$iters")/manifest.json" ] || fail "signal: no final checkpoint"
echo "slurm_e2e: SIGUSR1 -> checkpoint at iteration $stopped, exit 5, requeued, resumed with --load, finished ($(( $(date +%s) - t_start )) s)"

# 4. A scaling sweep through Slurm: 2 points, then a re-run that skips them.
# 1 rank on 1 node and 2 ranks on 2 nodes of 1 task (4 oversubscribed ranks would only cost time here).
# shellcheck disable=SC2054
sweep=("$src/launch/sweep/sweep.sh" --backend slurm --out "$work/sweep" --exe "$exe" --ranks 1,2 --ranks-per-node 1
       --tp 1 --zero 1 --model 2:64:4 --seq 32 --micro-batch 4 --global-batch 8 --iters 3 --timeout 120)
"${sweep[@]}" >"$work/sweep1.out" 2>&1 || fail "the Slurm sweep failed"
csv="$work/sweep/results.csv"
[ -f "$csv" ] || fail "no results.csv"
[ "$(wc -l <"$csv")" = 3 ] || fail "results.csv has $(($(wc -l <"$csv") - 1)) rows, expected 2"
/usr/bin/python3 - "$csv" <<'EOF' || fail "results.csv content"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
need = ["point_id", "backend", "ranks", "tp", "dp", "zero_stage", "num_layers", "hidden_size", "num_attention_heads",
        "micro_batch", "global_batch", "seq_length", "status", "exit_code", "tokens_per_s", "tflops_per_rank", "mfu",
        "peak_memory_mib_per_rank", "exposed_dp_comm_ms", "ms_per_iteration", "job_id"]
missing = [c for c in need if c not in rows[0]]
assert not missing, "missing columns %s" % missing
by = {int(r["ranks"]): r for r in rows}
assert sorted(by) == [1, 2], sorted(by)
for n in (1, 2):
    r = by[n]
    assert r["backend"] == "slurm" and r["status"] == "ok" and r["exit_code"] == "0", r
    assert r["nodes"] == str(n) and r["tp"] == "1" and r["dp"] == str(n) and r["slurm_state"] == "COMPLETED", r
    for c in ("tokens_per_s", "tflops_per_rank", "mfu", "peak_memory_mib_per_rank", "ms_per_iteration"):
        assert float(r[c]) > 0, (c, r)
print("slurm_e2e: results.csv: 2 ok rows (1 rank on 1 node, 2 ranks on 2 nodes)")
EOF
for png in throughput_per_rank memory_per_rank scaling_efficiency; do
  [ "$(stat -c %s "$work/sweep/$png.png" 2>/dev/null || echo 0)" -gt 2000 ] || fail "$png.png is missing or empty"
done
grep -q '"slurm": "slurm' "$work/sweep/env.json" || fail "env.json does not record the Slurm version"
jobs_before=$(scontrol show jobs -o | grep -c JobId=)
"${sweep[@]}" >"$work/sweep2.out" 2>&1 || fail "the re-run of the sweep failed"
grep -q "0 points run, 2 done earlier" "$work/sweep2.out" || fail "the re-run did not skip the finished points"
[ "$(scontrol show jobs -o | grep -c JobId=)" = "$jobs_before" ] || fail "the re-run submitted jobs"
echo "slurm_e2e: sweep via sbatch: 2 points, CSV and charts; re-run skipped both ($(( $(date +%s) - t_start )) s)"

# 5. (opt-in, MZ_TEST_SLURM_TIMELIMIT=1: up to a minute) the real pre-timeout path:
#    --time=1 --signal=USR1@25; slurmctld checks limits every 30 s, so the signal
#    comes 5-35 s after the start, never before training has begun.
if [ "${MZ_TEST_SLURM_TIMELIMIT:-0}" = 1 ]; then
  j=$(MZ_REQUEUE=0 submit timelimit -N 2 --ntasks-per-node=2 --time=1 --signal=USR1@25 -- \
      --tensor-model-parallel-size 2 --zero-stage 1 --train-iters 100000 --save "$work/ckpt_tl")
  wait_done "$j" 90
  [ "$(job_field "$j" ExitCode)" = 5:0 ] || fail "time limit: ExitCode $(job_field "$j" ExitCode), expected 5:0"
  has timelimit "^stopping after iteration [0-9]+ on a stop signal .*checkpoint saved; exit code 5"
  has timelimit "not requeueing: MZ_REQUEUE=0"
  [ -s "$work/ckpt_tl/latest" ] || fail "time limit: no checkpoint"
  echo "slurm_e2e: --time=1 --signal=USR1@25: checkpoint and exit 5 before the limit ($(( $(date +%s) - t_start )) s)"
fi

slurm_cluster_down
for f in "$work"/cluster/run/*.pid "$work/cluster/munge/munged.pid"; do
  pid=$(cat "$f" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && fail "daemon $pid ($f) still runs after teardown"
done
echo "slurm_e2e: all passed in $(( $(date +%s) - t_start )) s"
