#!/usr/bin/env bash
# launch/local/pretrain_gpt.sh: the same job as launch/slurm/pretrain_gpt.sbatch,
# on this machine through mpiexec. Every argument after the launcher's own
# options goes to pretrain_gpt unchanged:
#
#   launch/local/pretrain_gpt.sh -n 4 --config configs/gpt_tiny.cfg --mock-data \
#       --tensor-model-parallel-size 2 --zero-stage 2
#   NP=8 launch/local/pretrain_gpt.sh --config ... --ranks-per-node 4   # 2 pretend nodes of 4
#
# Launcher options (first, before the training flags):
#   -n N, --np N    ranks (default: $NP, else the number of cores; with --hostfile, its slots)
#   --hostfile FILE the machines to run on, as DeepSpeed's hostfile ("worker-1 slots=8" a line) or
#                   MPICH's ("worker-1:8"); '#' starts a comment. Every host gets the same number
#                   of ranks (TP groups sit inside a node), passed on as --ranks-per-node; ranks
#                   fill the hosts in the file's order. Other hosts are reached by mpiexec over
#                   ssh and need this build at the same path (a shared file system).
#   --dry-run-launch  print the mpiexec command and exit
# Environment knobs:
#   NP                 ranks when -n is not given
#   MZ_ROOT            repository root (default: this script's ../..)
#   MZ_PRETRAIN_GPT    the executable (default: $MZ_ROOT/build/examples/pretrain_gpt)
#   MZ_MPIEXEC         the launcher (default: mpiexec); MZ_MPIEXEC_ARGS: extra launcher options
#   MZ_RANKS_PER_NODE  pass --ranks-per-node (pretend nodes on one machine; default: MPI detects 1 node)
#   MZ_COLLECTIVE_TIMEOUT  --collective-timeout unless the flags have it (watchdog, exit 4)
#   MZ_RESUME          auto (default): with --save DIR and no --load, add --load DIR when DIR has a
#                      checkpoint ('latest'); 1: always; 0: never
#   OMP_NUM_THREADS    math threads per rank (default: cores / ranks, at least 1)
# Exit code: pretrain_gpt's (0 done, 2 bad input, 3 internal error, 4 watchdog,
# 5 stopped by SIGTERM/SIGUSR1 with a checkpoint saved when --save is given;
# see docs/LAUNCH.md). SIGUSR1/SIGTERM (and SIGINT, as SIGTERM) sent to this
# script reach the ranks: `kill -USR1 <this pid>` stops the job at the next step
# boundary with a checkpoint (exit 5).
set -uo pipefail

die() { echo "launch/local/pretrain_gpt.sh: error: $*" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MZ_ROOT=${MZ_ROOT:-$(cd "$here/../.." && pwd)}
MZ_PRETRAIN_GPT=${MZ_PRETRAIN_GPT:-$MZ_ROOT/build/examples/pretrain_gpt}
MZ_MPIEXEC=${MZ_MPIEXEC:-mpiexec}
MZ_RESUME=${MZ_RESUME:-auto}

np=${NP:-}
print_only=0
hostfile=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-np|--np) [ $# -ge 2 ] || die "$1 needs a number"; np=$2; shift 2 ;;
    -n*) np=${1#-n}; shift ;;
    --np=*) np=${1#--np=}; shift ;;
    --hostfile) [ $# -ge 2 ] || die "--hostfile needs a file"; hostfile=$2; shift 2 ;;
    --hostfile=*) hostfile=${1#--hostfile=}; shift ;;
    --dry-run-launch) print_only=1; shift ;;
    *) break ;;
  esac
done
# Cores of this machine (nproc alone would answer OMP_NUM_THREADS).
cores=$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 1)
# --hostfile: the hosts and their slots, checked; MPICH's form of it for mpiexec -f.
per_node=""
if [ -n "$hostfile" ]; then
  [ -f "$hostfile" ] && [ -r "$hostfile" ] || die "--hostfile $hostfile: no such readable file"
  hosts=() lineno=0
  while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    line=${line%%#*}
    line=$(echo "$line" | sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//')
    [ -n "$line" ] || continue
    if [[ "$line" =~ ^([^[:space:]:=]+)[[:space:]]+slots=([0-9]+)$ ]] || [[ "$line" =~ ^([^[:space:]:=]+):([0-9]+)$ ]]; then
      host=${BASH_REMATCH[1]} slots=${BASH_REMATCH[2]}
    elif [[ "$line" =~ ^[^[:space:]:=]+$ ]]; then
      die "--hostfile $hostfile, line $lineno: '$line' gives no rank count: write '$line slots=N' (DeepSpeed) or '$line:N' (MPICH)"
    else
      die "--hostfile $hostfile, line $lineno: '$line' is neither 'HOST slots=N' (DeepSpeed) nor 'HOST:N' (MPICH)"
    fi
    [[ "$slots" =~ ^[1-9][0-9]*$ ]] || die "--hostfile $hostfile, line $lineno: $host has slots=$slots; give it at least 1"
    for h in ${hosts[@]+"${hosts[@]}"}; do
      [ "$h" != "$host" ] || die "--hostfile $hostfile, line $lineno: $host is listed twice; give each host one line"
    done
    if [ -n "$per_node" ] && [ "$slots" != "$per_node" ]; then
      die "--hostfile $hostfile, line $lineno: $host has $slots slots but ${hosts[0]} has $per_node; every host runs as many ranks (TP groups sit inside a node, rank r on node r / ranks-per-node): give each the same slots=N"
    fi
    per_node=$slots
    hosts+=("$host")
  done <"$hostfile"
  [ ${#hosts[@]} -gt 0 ] || die "--hostfile $hostfile lists no hosts"
  slots_total=$((per_node * ${#hosts[@]}))
  [ -n "$np" ] || np=$slots_total
  [ "$np" = "$slots_total" ] || die "-n $np ranks, but --hostfile $hostfile gives ${#hosts[@]} hosts x $per_node slots = $slots_total; drop -n or make them agree"
fi
[ -n "$np" ] || np=$cores
[[ "$np" =~ ^[1-9][0-9]*$ ]] || die "the rank count must be a positive integer, got '$np' (-n N or NP=N)"
[ $# -gt 0 ] || die "no training flags; usage: $0 [-n N] --config FILE [pretrain_gpt flags...]"
[ -x "$MZ_PRETRAIN_GPT" ] || die "pretrain_gpt not found at '$MZ_PRETRAIN_GPT': build it (tools/build.sh), or set MZ_PRETRAIN_GPT"
command -v "$MZ_MPIEXEC" >/dev/null || die "'$MZ_MPIEXEC' not found: apt-get install mpich (tools/install_deps.sh)"

args=("$@")
has_flag() {
  local a
  for a in "${args[@]}"; do
    [ "$a" = "--$1" ] || [ "${a%%=*}" = "--$1" ] && return 0
  done
  return 1
}
flag_value() {  # flag_value NAME: the value of --NAME VALUE / --NAME=VALUE on the command line (last wins)
  local i v=""
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
      "--$1") v=${args[$((i + 1))]:-} ;;
      "--$1="*) v=${args[$i]#--$1=} ;;
    esac
  done
  printf '%s' "$v"
}
added=()
launch_args=()
if [ -n "$hostfile" ]; then
  given=$(flag_value ranks-per-node)
  [ -z "$given" ] || [ "$given" = "$per_node" ] ||
    die "--ranks-per-node $given, but --hostfile $hostfile gives each host $per_node ranks; drop --ranks-per-node"
  [ -z "${MZ_RANKS_PER_NODE:-}" ] || [ "$MZ_RANKS_PER_NODE" = "$per_node" ] ||
    die "MZ_RANKS_PER_NODE=$MZ_RANKS_PER_NODE, but --hostfile $hostfile gives each host $per_node ranks; unset it"
  [ -n "$given" ] || added+=(--ranks-per-node "$per_node")
  hydra_hosts=$(mktemp /tmp/mz-hosts-XXXXXX)
  trap 'rm -f "$hydra_hosts"' EXIT
  for h in "${hosts[@]}"; do echo "$h:$per_node"; done >"$hydra_hosts"
  launch_args=(-f "$hydra_hosts")
  echo "launch/local/pretrain_gpt.sh: --hostfile $hostfile: $per_node rank(s) on each of ${#hosts[@]} host(s): ${hosts[*]}"
elif [ -n "${MZ_RANKS_PER_NODE:-}" ] && ! has_flag ranks-per-node; then
  added+=(--ranks-per-node "$MZ_RANKS_PER_NODE")
fi
if [ -n "${MZ_COLLECTIVE_TIMEOUT:-}" ] && ! has_flag collective-timeout; then
  added+=(--collective-timeout "$MZ_COLLECTIVE_TIMEOUT")
fi
save_dir=$(flag_value save)
if [ -n "$save_dir" ] && ! has_flag load; then
  if [ "$MZ_RESUME" = 1 ] || { [ "$MZ_RESUME" = auto ] && [ -e "$save_dir/latest" ]; }; then
    added+=(--load "$save_dir")
    echo "launch/local/pretrain_gpt.sh: resuming: adding --load $save_dir (MZ_RESUME=$MZ_RESUME)"
  fi
fi

threads=$(( cores / ${per_node:-$np} )); [ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
# shellcheck disable=SC2206
cmd=("$MZ_MPIEXEC" -n "$np" ${launch_args[@]+"${launch_args[@]}"} ${MZ_MPIEXEC_ARGS:-} "$MZ_PRETRAIN_GPT" "${args[@]}"
     ${added[@]+"${added[@]}"})
where=$(hostname); [ -z "$hostfile" ] || where="the hosts of $hostfile"
echo "launch/local/pretrain_gpt.sh: $np ranks on $where ($cores cores here, OMP_NUM_THREADS=$OMP_NUM_THREADS): ${cmd[*]}"
[ $print_only = 1 ] && exit 0

# mpiexec in the background so this shell can pass signals on. They go to the
# ranks directly (the pretrain_gpt processes under mpiexec), not through
# mpiexec: MPICH's hydra forwards SIGUSR1 but then sometimes exits 0 although
# every rank exited 5, and turns SIGINT into a Ctrl-C that kills the ranks
# without a checkpoint (and exits 0). SIGINT goes on as SIGTERM.
child="" interrupted=0
exe_real=$(readlink -f "$MZ_PRETRAIN_GPT")
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
forward() {
  trapped=1
  [ -n "$child" ] || return 0
  local p n=0
  for p in $(descendants "$child"); do
    if [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$exe_real" ]; then kill -"$1" "$p" 2>/dev/null && n=$((n + 1)); fi
  done
  [ $n -gt 0 ] || kill -"$1" "$child" 2>/dev/null  # ranks not started yet: tell mpiexec
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'interrupted=1; forward TERM' INT
"${cmd[@]}" &
child=$!
prev=""
while :; do
  trapped=0
  wait "$child"
  rc=$?
  if [ $rc -eq 127 ] && [ -n "$prev" ]; then rc=$prev; break; fi
  if [ "$trapped" = 1 ] && [ $rc -gt 128 ]; then prev=$rc; continue; fi
  break
done
# Interrupted, yet a clean exit: not a finished run.
[ "$interrupted" = 1 ] && [ "$rc" = 0 ] && rc=130
exit "$rc"
