#!/usr/bin/env bash
# launch/sweep/sweep.sh: a scaling sweep of pretrain_gpt over rank count, TP
# degree, ZeRO stage and model size, strong and/or weak scaling. Each point is
# one job: `sbatch` of launch/slurm/pretrain_gpt.sbatch (waited for) with
# --backend slurm, or launch/local/pretrain_gpt.sh (mpiexec) with --backend local.
# Results go to one directory that a re-run resumes: points already done are
# skipped. Output (docs/LAUNCH.md explains every column):
#   OUT/results.csv                one row per point (ok/oom/failed/timeout + metrics)
#   OUT/throughput_per_rank.png    tokens/s and TFLOP/s per rank vs ranks
#   OUT/memory_per_rank.png        peak memory per rank vs ranks
#   OUT/scaling_efficiency.png     per-rank throughput relative to the smallest run
#   OUT/env.json, OUT/env.txt      host, CPU, MPI/Slurm versions, git commit, date, flags
#   OUT/points/ID/                 each point: point.json, cmd.txt, out.log, metrics.jsonl, result.json
#
# Usage: launch/sweep/sweep.sh --backend local|slurm --out DIR [grid options] [-- pretrain_gpt flags]
# Grid (comma-separated lists; every combination is a point; impossible ones are listed and skipped):
#   --ranks 1,2,4           world sizes (default 1,2)
#   --tp 1,2                tensor-parallel degrees (default 1)
#   --zero 0,1,2,3          ZeRO stages (default 1)
#   --model L:H:A,...       models as layers:hidden:heads (default 2:128:4, configs/gpt_tiny.cfg's)
#   --scaling strong,weak   strong: global batch fixed (--global-batch);
#                           weak: global batch = --global-batch x ranks / smallest ranks (default strong)
# Per-point settings:
#   --micro-batch N (4)  --global-batch N (16)  --seq N (64)  --iters N (5)  --vocab N (256, mock data)
#   --config FILE (configs/gpt_tiny.cfg: the rest of the settings)  --data PREFIX (default: --mock-data)
#   --timeout S          per point, seconds (default 900): local `timeout`, Slurm --time (rounded up to minutes)
#   --ranks-per-node N   Slurm: tasks per node (default 8; runs below N ranks use one node)
#   --sbatch-args "..."  Slurm: extra sbatch options (partition, account, --gpus-per-node, ...)
#   --max-pending S      Slurm: cancel a point's job pending longer than S seconds (default 0: wait;
#                        jobs pending for a reason that never clears, e.g. PartitionNodeLimit, are cancelled at once)
#   --exe PATH           pretrain_gpt (default $MZ_PRETRAIN_GPT, else build/examples/pretrain_gpt)
#   --retry-failed       re-run points whose status is not ok
#   --plan               print the points and exit
# Exit code: 0 when the sweep ran (points may have failed: see the CSV), 2 bad usage,
# 1 the sweep itself broke (no python, cannot write DIR). Per-point metrics are the
# mean of the --metrics-file records after the first (warm-up) iteration.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MZ_ROOT=${MZ_ROOT:-$(cd "$here/../.." && pwd)}
PY=${MZ_PYTHON:-/usr/bin/python3}
REPORT="$here/sweep_report.py"
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "sweep: error: $*" >&2; exit 2; }
say() { echo "sweep: $*"; }

backend="" out="" ranks_list=1,2 tp_list=1 zero_list=1 model_list=2:128:4 scaling_list=strong
micro=4 global=16 seq=64 iters=5 vocab=256 config="$MZ_ROOT/configs/gpt_tiny.cfg" data=""
timeout_s=900 rpn=8 sbatch_args="" max_pending=0 exe=${MZ_PRETRAIN_GPT:-$MZ_ROOT/build/examples/pretrain_gpt}
retry=0 plan_only=0 extra=()
argv_all="$*"
need() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) need "$@"; backend=$2; shift 2 ;;
    --out) need "$@"; out=$2; shift 2 ;;
    --ranks) need "$@"; ranks_list=$2; shift 2 ;;
    --tp) need "$@"; tp_list=$2; shift 2 ;;
    --zero) need "$@"; zero_list=$2; shift 2 ;;
    --model) need "$@"; model_list=$2; shift 2 ;;
    --scaling) need "$@"; scaling_list=$2; shift 2 ;;
    --micro-batch) need "$@"; micro=$2; shift 2 ;;
    --global-batch) need "$@"; global=$2; shift 2 ;;
    --seq) need "$@"; seq=$2; shift 2 ;;
    --iters) need "$@"; iters=$2; shift 2 ;;
    --vocab) need "$@"; vocab=$2; shift 2 ;;
    --config) need "$@"; config=$2; shift 2 ;;
    --data) need "$@"; data=$2; shift 2 ;;
    --timeout) need "$@"; timeout_s=$2; shift 2 ;;
    --ranks-per-node) need "$@"; rpn=$2; shift 2 ;;
    --max-pending) need "$@"; max_pending=$2; shift 2 ;;
    --sbatch-args) [ $# -ge 2 ] || die "--sbatch-args needs a value"; sbatch_args=$2; shift 2 ;;
    --exe) need "$@"; exe=$2; shift 2 ;;
    --retry-failed) retry=1; shift ;;
    --plan) plan_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$1' (pretrain_gpt flags go after --; see --help)" ;;
  esac
done

case "$backend" in local|slurm) ;; "") die "--backend local|slurm is required" ;; *) die "--backend must be local or slurm, got '$backend'" ;; esac
[ -n "$out" ] || die "--out DIR is required (a re-run with the same DIR resumes)"
posint() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }
for v in "--micro-batch:$micro" "--global-batch:$global" "--seq:$seq" "--iters:$iters" "--vocab:$vocab" \
         "--timeout:$timeout_s" "--ranks-per-node:$rpn"; do posint "${v%%:*}" "${v#*:}"; done
IFS=, read -r -a RANKS <<<"$ranks_list"; IFS=, read -r -a TPS <<<"$tp_list"
IFS=, read -r -a ZEROS <<<"$zero_list"; IFS=, read -r -a MODELS <<<"$model_list"
IFS=, read -r -a SCALINGS <<<"$scaling_list"
[[ "$max_pending" =~ ^[0-9]+$ ]] || die "--max-pending must be seconds, got '$max_pending'"
for r in "${RANKS[@]}"; do posint --ranks "$r"; done
for t in "${TPS[@]}"; do posint --tp "$t"; done
for z in "${ZEROS[@]}"; do [[ "$z" =~ ^[0-3]$ ]] || die "--zero stages are 0-3, got '$z'"; done
for m in "${MODELS[@]}"; do [[ "$m" =~ ^[1-9][0-9]*:[1-9][0-9]*:[1-9][0-9]*$ ]] || die "--model wants layers:hidden:heads, got '$m'"; done
for s in "${SCALINGS[@]}"; do case "$s" in strong|weak) ;; *) die "--scaling is strong and/or weak, got '$s'" ;; esac; done
[ -x "$PY" ] || { echo "sweep: error: $PY not found (the CSV and charts need Debian's python3; set MZ_PYTHON)" >&2; exit 1; }
[ -x "$exe" ] || die "pretrain_gpt not found at '$exe' (build it, or pass --exe)"
[ -f "$config" ] || die "--config '$config' does not exist"
if [ "$backend" = slurm ]; then
  for p in sbatch scontrol scancel; do command -v $p >/dev/null || die "$p not found: --backend slurm needs the Slurm client commands"; done
  sbatch_script="$MZ_ROOT/launch/slurm/pretrain_gpt.sbatch"
  [ -f "$sbatch_script" ] || die "$sbatch_script is missing"
else
  local_launcher="$MZ_ROOT/launch/local/pretrain_gpt.sh"
fi
min_ranks=$(printf '%s\n' "${RANKS[@]}" | sort -n | head -n 1)

# ---- the plan ----
ids=() skipped=()
declare -A P_R P_TP P_DP P_Z P_L P_H P_A P_GB P_SC P_NODES P_TPN
for sc in "${SCALINGS[@]}"; do
  for m in "${MODELS[@]}"; do
    IFS=: read -r L H A <<<"$m"
    for r in "${RANKS[@]}"; do
      for t in "${TPS[@]}"; do
        for z in "${ZEROS[@]}"; do
          gb=$global
          if [ "$sc" = weak ]; then
            if (( global * r % min_ranks != 0 )); then skipped+=("$sc $m r$r tp$t z$z: weak global batch $global x $r / $min_ranks is not whole"); continue; fi
            gb=$(( global * r / min_ranks ))
          fi
          id="${sc}_L${L}H${H}A${A}_r${r}_tp${t}_z${z}_mb${micro}_gb${gb}_s${seq}"
          if (( r % t != 0 )); then skipped+=("$id: TP $t does not divide $r ranks"); continue; fi
          if (( A % t != 0 )); then skipped+=("$id: $A heads not divisible by TP $t"); continue; fi
          dp=$(( r / t ))
          if (( gb % (micro * dp) != 0 )); then skipped+=("$id: global batch $gb not a multiple of micro $micro x DP $dp"); continue; fi
          nodes=1 tpn=$r
          if [ "$backend" = slurm ] && (( r > rpn )); then
            if (( r % rpn != 0 )); then skipped+=("$id: $r ranks is not a whole number of $rpn-rank nodes"); continue; fi
            nodes=$(( r / rpn )) tpn=$rpn
          fi
          if (( t > tpn )); then skipped+=("$id: TP $t spans nodes of $tpn ranks"); continue; fi
          ids+=("$id")
          P_R[$id]=$r P_TP[$id]=$t P_DP[$id]=$dp P_Z[$id]=$z P_L[$id]=$L P_H[$id]=$H P_A[$id]=$A
          P_GB[$id]=$gb P_SC[$id]=$sc P_NODES[$id]=$nodes P_TPN[$id]=$tpn
        done
      done
    done
  done
done
say "${#ids[@]} points (backend $backend), ${#skipped[@]} combinations skipped"
for s in "${skipped[@]}"; do say "  skip: $s"; done
if [ $plan_only = 1 ]; then printf '%s\n' "${ids[@]}"; exit 0; fi
[ ${#ids[@]} -gt 0 ] || die "no valid points in this grid"

mkdir -p "$out/points" || { echo "sweep: error: cannot create $out" >&2; exit 1; }
out=$(cd "$out" && pwd)
printf '%s\n' "${skipped[@]}" >"$out/skipped.txt"
# The settings that define what a point id means: a results directory belongs to one of them.
settings="config=$config data=${data:-mock:$vocab} iters=$iters extra=${extra[*]}"
if [ -f "$out/settings.txt" ] && [ "$(cat "$out/settings.txt")" != "$settings" ]; then
  die "$out holds a sweep with other settings ($(cat "$out/settings.txt")); this one has ($settings): use another --out"
fi
printf '%s\n' "$settings" >"$out/settings.txt"
"$PY" "$REPORT" env --out "$out" --backend "$backend" --root "$MZ_ROOT" --exe "$exe" --argv "$argv_all" ||
  say "warning: could not record the environment"

# ---- running points ----
running_pid="" running_job=""
on_interrupt() {
  say "interrupted: stopping the running point"
  [ -n "$running_pid" ] && kill -TERM "$running_pid" 2>/dev/null
  [ -n "$running_job" ] && scancel "$running_job" 2>/dev/null
  exit 130
}
trap on_interrupt INT TERM

slurm_state() {  # slurm_state JOBID: "STATE EXITCODE REASON" from scontrol, or nothing
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' |
    awk -F= '/^JobState=/ { s = $2 } /^ExitCode=/ { e = $2 } /^Reason=/ { r = $2 } END { if (s != "") print s, e, r }'
}
# Pending reasons that never clear by waiting (the request exceeds the partition,
# the account or the QOS): such a job is cancelled and its point recorded as failed.
NEVER_REASONS=" PartitionNodeLimit PartitionTimeLimit PartitionConfig BadConstraints InvalidAccount InvalidQOS
 AssocMaxNodesPerJobLimit AssocMaxCpuPerJobLimit AssocMaxWallDurationPerJobLimit QOSMaxNodePerJobLimit
 QOSMaxCpuPerJobLimit QOSMaxWallDurationPerJobLimit QOSMaxGRESPerJob "
slurm_wait() {  # slurm_wait JOBID DIR: waits until the job ends; sets st_state and st_rc
  local jid=$1 dir=$2 s state ec reason missing=0 pending_since
  pending_since=$(date +%s)
  while :; do
    s=$(slurm_state "$jid")
    if [ -z "$s" ]; then
      missing=$((missing + 1))
      [ $missing -ge 30 ] && { st_state=UNKNOWN st_rc=1; echo "job $jid vanished from scontrol" >"$dir/note"; return; }
    else
      missing=0
      read -r state ec reason <<<"$s"
      case "$state" in
        COMPLETED|FAILED|TIMEOUT|CANCELLED*|OUT_OF_MEMORY|NODE_FAIL|PREEMPTED|BOOT_FAIL|DEADLINE)
          st_state=$state
          local code=${ec%%:*} sig=${ec#*:}
          if [ "${sig:-0}" != 0 ]; then st_rc=$((128 + sig)); else st_rc=${code:-1}; fi
          return ;;
        PENDING)
          if [[ "$NEVER_REASONS" == *" ${reason:-none} "* ]] ||
             { [ "$max_pending" -gt 0 ] && [ $(( $(date +%s) - pending_since )) -gt "$max_pending" ]; }; then
            echo "pending with reason ${reason:-?}: the job cannot start here; cancelled by the sweep" >"$dir/note"
            scancel "$jid" 2>/dev/null
            st_state=UNRUNNABLE st_rc=1
            return
          fi ;;
        *) pending_since=$(date +%s) ;;
      esac
    fi
    sleep 0.5
  done
}

run_point() {  # run_point ID: runs one point; writes its result.json
  local id=$1 dir="$out/points/$1"
  local r=${P_R[$id]} t=${P_TP[$id]} z=${P_Z[$id]} gb=${P_GB[$id]}
  local flags=(--config "$config")
  if [ -n "$data" ]; then flags+=(--data-path "$data"); else flags+=(--mock-data --vocab-size "$vocab"); fi
  flags+=(--num-layers "${P_L[$id]}" --hidden-size "${P_H[$id]}" --num-attention-heads "${P_A[$id]}"
          --seq-length "$seq" --max-position-embeddings "$seq" --micro-batch-size "$micro" --global-batch-size "$gb"
          --train-iters "$iters" --log-interval 1 --eval-iters 0 --tensor-model-parallel-size "$t" --zero-stage "$z"
          --metrics-file "$dir/metrics.jsonl" "${extra[@]}")
  local jid="" rc state="" t0 t1
  if [ "$backend" = slurm ] && [ -s "$dir/job_id" ]; then
    jid=$(cat "$dir/job_id")  # a previous sweep was stopped while this job ran: adopt it
    if [ -n "$(slurm_state "$jid")" ]; then say "  adopting job $jid of an earlier run"; else jid=""; fi
  fi
  if [ -z "$jid" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    printf '{"point_id": "%s", "backend": "%s", "scaling": "%s", "ranks": %d, "nodes": %d, "ranks_per_node": %d, "tp": %d, "dp": %d, "zero_stage": %d, "num_layers": %d, "hidden_size": %d, "num_attention_heads": %d, "micro_batch": %d, "global_batch": %d, "seq_length": %d, "train_iters": %d}\n' \
      "$id" "$backend" "${P_SC[$id]}" "$r" "${P_NODES[$id]}" "${P_TPN[$id]}" "$t" "${P_DP[$id]}" "$z" "${P_L[$id]}" \
      "${P_H[$id]}" "${P_A[$id]}" "$micro" "$gb" "$seq" "$iters" >"$dir/point.json"
  fi
  t0=$(date +%s.%N)
  if [ "$backend" = local ]; then
    printf '%q ' timeout --kill-after=10 "$timeout_s" "$local_launcher" -n "$r" "${flags[@]}" >"$dir/cmd.txt"; echo >>"$dir/cmd.txt"
    MZ_PRETRAIN_GPT=$exe MZ_RESUME=0 timeout --kill-after=10 "$timeout_s" "$local_launcher" -n "$r" "${flags[@]}" \
      >"$dir/out.log" 2>&1 </dev/null &
    running_pid=$!
    wait "$running_pid"; rc=$?
    running_pid=""
    state=LOCAL
  else
    if [ -z "$jid" ]; then
      local minutes=$(( (timeout_s + 59) / 60 + 1 ))
      # shellcheck disable=SC2206
      local sb=(sbatch --parsable --job-name "mz-sweep" -N "${P_NODES[$id]}" --ntasks-per-node="${P_TPN[$id]}"
                --time="$minutes" --no-requeue --open-mode=truncate -o "$dir/out.log" $sbatch_args)
      printf '%q ' "${sb[@]}" "$sbatch_script" "${flags[@]}" >"$dir/cmd.txt"; echo >>"$dir/cmd.txt"
      local sub
      sub=$(MZ_PRETRAIN_GPT=$exe MZ_REQUEUE=0 MZ_RESUME=0 "${sb[@]}" "$sbatch_script" "${flags[@]}" 2>&1)
      rc=$?
      if [ $rc -ne 0 ]; then
        printf 'sbatch failed (exit code %d): %s\n' "$rc" "$sub" >"$dir/out.log"
        state=SUBMIT_FAILED
      else
        jid=${sub%%;*}
        echo "$jid" >"$dir/job_id"
      fi
    fi
    if [ -n "$jid" ]; then
      running_job=$jid
      slurm_wait "$jid" "$dir"
      running_job=""
      state=$st_state rc=$st_rc
    fi
  fi
  t1=$(date +%s.%N)
  "$PY" "$REPORT" classify --point-dir "$dir" --rc "$rc" --state "$state" --job-id "${jid:-}" --timeout "$timeout_s" \
    --wall "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" ||
    { echo "sweep: error: could not record the result of $id" >&2; exit 1; }
  rm -f "$dir/job_id"
}

done_n=0 ran_n=0 i=0
for id in "${ids[@]}"; do
  i=$((i + 1))
  res="$out/points/$id/result.json"
  if [ -f "$res" ]; then
    st=$("$PY" "$REPORT" status --result "$res")
    if [ $retry = 0 ] || [ "$st" = ok ]; then
      say "[$i/${#ids[@]}] $id: done earlier ($st), skipped"
      done_n=$((done_n + 1))
      continue
    fi
  fi
  say "[$i/${#ids[@]}] $id: running (${P_R[$id]} ranks on ${P_NODES[$id]} node(s), TP ${P_TP[$id]} x DP ${P_DP[$id]}, ZeRO ${P_Z[$id]})"
  run_point "$id"
  ran_n=$((ran_n + 1))
  say "[$i/${#ids[@]}] $id: $("$PY" "$REPORT" summary --result "$res")"
  "$PY" "$REPORT" csv --out "$out" >/dev/null || say "warning: could not update the CSV"
done
trap - INT TERM
say "$ran_n points run, $done_n done earlier"
"$PY" "$REPORT" report --out "$out" || { echo "sweep: error: the report failed" >&2; exit 1; }
