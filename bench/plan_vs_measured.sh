#!/usr/bin/env bash
# The planner's step-time estimate against real training on this machine: for a
# few small models and layouts on 1 and 2 ranks, runs pretrain_gpt for real
# (mock data) and the planner with the same flags (--dry-run --world-size N
# --hardware PROFILE), and prints measured vs predicted seconds per iteration.
#
#   bench/plan_vs_measured.sh [--build DIR] [--hardware FILE|NAME] [--iters K] [--repeat R]
#                             [--only NAME] [--threading] [--no-wait] [--markdown]
#
#   --build DIR      build directory (default $BUILD_DIR or build)
#   --hardware       profile (default configs/hardware/this-machine.json, the file
#                    the built-in "this-machine" is made from; a name means
#                    configs/hardware/NAME.json)
#   --iters K        training iterations per run (default 4); measured = median
#                    of iterations 2..K (iteration 1 pays page faults and the
#                    first-step bookkeeping), max over ranks as pretrain_gpt logs it
#   --repeat R       measure every row R times (all rows, then again: the runs of a row
#                    are minutes apart) and summarize the median and range
#   --only NAME      only the rows whose config name contains NAME
#   --threading      also the runs with more math threads than cores per rank
#                    (1 rank x 2 threads, 2 ranks x 2 threads: pretrain_gpt's default
#                    without MEGAZERO_NUM_THREADS), which the one-rank-per-core
#                    profile does not describe
#   --no-wait        measure even while other processes keep the CPUs busy
#   --markdown       print the summary table (Markdown) also when --repeat is 1
#
# Ranks run with MEGAZERO_NUM_THREADS=1 (one rank per core, as the profile
# assumes). A one-rank run is planned with a copy of the profile that says
# devices_per_node 1 (a world of 1 cannot fill a 2-device node; nothing else
# differs: one rank has no communication). Each run waits until the CPUs are idle
# and is repeated if other processes took more than 5% of them meanwhile.
# About 4 minutes per repeat on 2 cores (5 with --threading) when the machine is quiet.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-build}
hardware="$repo/configs/hardware/this-machine.json"
iters=4
repeat=1
only=""
threading=0
wait_quiet=1
markdown=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --hardware) hardware=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --threading) threading=1; shift ;;
    --no-wait) wait_quiet=0; shift ;;
    --markdown) markdown=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "plan_vs_measured.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$build" = /* ]] || build="$repo/$build"
[[ -f "$hardware" ]] || hardware="$repo/configs/hardware/$hardware.json"
[[ -f "$hardware" ]] || { echo "plan_vs_measured.sh: no profile file $hardware" >&2; exit 1; }
[[ -x "$build/examples/pretrain_gpt" ]] || { echo "plan_vs_measured.sh: build $build/examples/pretrain_gpt first" >&2; exit 1; }
(( iters >= 2 )) || { echo "plan_vs_measured.sh: --iters must be at least 2" >&2; exit 2; }

export MZ_PVM_REPO="$repo" MZ_PVM_BUILD="$build" MZ_PVM_HW="$hardware" MZ_PVM_ITERS="$iters" MZ_PVM_ONLY="$only" \
  MZ_PVM_REPEAT="$repeat" MZ_PVM_THREADING="$threading" MZ_PVM_WAIT="$wait_quiet" MZ_PVM_MD="$markdown"
exec python3 - <<'PY'
import json, os, resource, statistics, subprocess, sys, tempfile, time

REPO, BUILD, HW = os.environ["MZ_PVM_REPO"], os.environ["MZ_PVM_BUILD"], os.environ["MZ_PVM_HW"]
ITERS, ONLY = int(os.environ["MZ_PVM_ITERS"]), os.environ["MZ_PVM_ONLY"]
REPEAT = int(os.environ["MZ_PVM_REPEAT"])
THREADING, WAIT, MD = (os.environ[k] == "1" for k in ("MZ_PVM_THREADING", "MZ_PVM_WAIT", "MZ_PVM_MD"))
PRETRAIN = os.path.join(BUILD, "examples/pretrain_gpt")
NCORES = len(os.sched_getaffinity(0))
HZ = os.sysconf("SC_CLK_TCK")
TMP = tempfile.mkdtemp(prefix="mz-pvm-")
os.chdir(REPO)

# name, model flags, [(ranks, layout flags, math threads per rank)]
SMALL6 = ("--num-layers 6 --hidden-size 512 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256 "
          "--vocab-size 8192 --micro-batch-size 2 --global-batch-size 4")
GPT124_S128 = ("--config configs/gpt2_124m.cfg --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 "
               "--global-batch-size 2")
LONG = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 1024 --max-position-embeddings 1024 "
        "--vocab-size 8192 --micro-batch-size 1 --global-batch-size 2")
TP1 = "--tensor-model-parallel-size 1"
TP2 = "--tensor-model-parallel-size 2"
CONFIGS = [
    ("gpt_tiny", "--config configs/gpt_tiny.cfg", [
        (1, "--zero-stage 0", 1), (2, f"{TP1} --zero-stage 0", 1), (2, f"{TP1} --zero-stage 2", 1),
        (2, f"{TP2} --zero-stage 0", 1)]),
    ("6L-h512-s256", SMALL6, [
        (1, "--zero-stage 0", 1), (2, f"{TP1} --zero-stage 0", 1), (2, f"{TP1} --zero-stage 2", 1),
        (2, f"{TP2} --zero-stage 0", 1)]),
    ("124M-s128", GPT124_S128, [
        (1, "--zero-stage 0", 1), (2, f"{TP1} --zero-stage 2", 1), (2, f"{TP2} --zero-stage 0", 1)]),
    ("4L-h256-s1024", LONG, [
        (1, "--zero-stage 0", 1), (2, f"{TP1} --zero-stage 2", 1), (2, f"{TP2} --zero-stage 0", 1)]),
]
if THREADING:
    CONFIGS.append(("6L-h512-s256", SMALL6, [(1, "--zero-stage 0", 2), (2, f"{TP1} --zero-stage 0", 2)]))


def cpu_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def wait_quiet(max_wait=900):
    t0 = time.time()
    while True:
        b1, t1 = cpu_busy_jiffies(); time.sleep(2); b2, t2 = cpu_busy_jiffies()
        busy = (b2 - b1) / max(1, t2 - t1)
        if busy < 0.10 or not WAIT or time.time() - t0 > max_wait:
            return
        print(f"    CPUs {busy:.0%} busy (load {open('/proc/loadavg').read().split()[0]}): waiting 15 s", flush=True)
        time.sleep(15)


def run_clean(cmd, env, tries=3, tol=0.05):
    for attempt in range(tries):
        wait_quiet()
        load = float(open("/proc/loadavg").read().split()[0])
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN); b0, _ = cpu_busy_jiffies(); w0 = time.time()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN); b1, _ = cpu_busy_jiffies(); wall = time.time() - w0
        if p.returncode != 0:
            sys.exit(f"plan_vs_measured.sh: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        mine = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        foreign = max(0.0, ((b1 - b0) / HZ - mine) / (wall * NCORES))
        if foreign <= tol or not WAIT or attempt == tries - 1:
            return load, foreign
        print(f"    other processes took {foreign:.0%} of the CPUs meanwhile: repeating", flush=True)


profile = json.load(open(HW))
one_rank_profile = f"{TMP}/one-rank.json"
json.dump(dict(profile, devices_per_node=1), open(one_rank_profile, "w"))


def predict(flags, ranks):
    out = f"{TMP}/plan.json"
    hw = one_rank_profile if ranks == 1 else HW
    subprocess.run([PRETRAIN, *flags, "--dry-run", "--world-size", str(ranks), "--hardware", hw, "--plan-json", out],
                   check=True, capture_output=True, text=True)
    return json.load(open(out))["estimate"]


def measure(flags, ranks, threads):
    metrics = f"{TMP}/metrics.jsonl"
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ, MEGAZERO_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    cmd = [PRETRAIN, *flags, "--log-interval", "1", "--metrics-file", metrics]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks)] + cmd
    load, foreign = run_clean(cmd, env)
    recs = [json.loads(l) for l in open(metrics)][1:]
    med = lambda k: statistics.median(r[k] for r in recs) / 1000
    return dict(step=med("ms_per_iteration"), fb=statistics.median((r["forward_ms"] + r["backward_ms"]) / 1000 for r in recs),
                opt=med("optimizer_ms"), dp=med("exposed_dp_comm_ms"), load=load, foreign=foreign)


def layout_name(ranks, layout):
    tp = 2 if "--tensor-model-parallel-size 2" in layout else 1
    z = layout.split("--zero-stage")[1].split()[0]
    return f"TP{tp} DP{ranks // tp} ZeRO {z}"


print(f"profile {HW}\n{NCORES} cores; {ITERS} iterations per run, measured = median of iterations 2..{ITERS}\n")
hdr = (f"{'config':<15} {'ranks':>5} {'thr':>3} {'layout':<16} {'measured':>9} {'predicted':>9} {'ratio':>6} | "
       f"{'meas f+b':>8} {'pred cmp':>8} {'meas opt':>8} {'pred opt':>8} {'meas dp':>7} {'pred dp':>7} "
       f"{'pred tp':>7} {'ratio*':>6} | {'load':>4} {'other':>5}")
print(hdr)
print("-" * len(hdr), flush=True)
t0 = time.time()
todo = []
for name, model, layouts in CONFIGS:
    if ONLY and ONLY not in name:
        continue
    for ranks, layout, threads in layouts:
        todo.append((name, ranks, threads, layout_name(ranks, layout),
                     (model + " --mock-data --eval-iters 0 --train-iters " + str(ITERS) + " " + layout).split()))
meas = {i: [] for i in range(len(todo))}
pred = {}
for rep in range(REPEAT):
    if REPEAT > 1:
        print(f"-- round {rep + 1}/{REPEAT}", flush=True)
    for i, (name, ranks, threads, lay, flags) in enumerate(todo):
        e = pred.setdefault(i, predict(flags, ranks))
        m = measure(flags, ranks, threads)
        meas[i].append(m)
        ratio = e["step_s"] / m["step"]
        ratio_opt = (e["step_s"] - e["optimizer_s"] + m["opt"]) / m["step"]
        print(f"{name:<15} {ranks:>5} {threads:>3} {lay:<16} {m['step']:>9.3f} {e['step_s']:>9.3f} "
              f"{ratio:>6.2f} | {m['fb']:>8.3f} {e['compute_s']:>8.3f} {m['opt']:>8.3f} {e['optimizer_s']:>8.3f} "
              f"{m['dp']:>7.3f} {e['dp_exposed_s']:>7.3f} {e['tp_comm_s']:>7.3f} {ratio_opt:>6.2f} | {m['load']:>4.2f} "
              f"{m['foreign']:>5.0%}", flush=True)
print(f"\nratio = predicted / measured (s per iteration). meas f+b: forward + backward timers (max over ranks), "
      f"which include TP all-reduces; pred cmp: GEMMs + elementwise (TP communication is 'pred tp'). "
      f"meas opt: the optimizer timer (gradient norm, AdamW, parameter publish incl. the stage 1-2 all-gather); "
      f"pred opt: AdamW only. dp: exposed DP communication. ratio*: the ratio with the predicted optimizer "
      f"replaced by the measured one (what the rest of the model gets right). load: 1-min load average before the run "
      f"(it counts this script's previous runs); other: CPU share other processes took during it. {time.time() - t0:.0f} s.")
if REPEAT > 1 or MD:
    print(f"\nsummary: measured = median of {REPEAT} run(s) (range)")
    print("| config | ranks | threads/rank | layout | measured s/step | predicted s/step | ratio | ratio* |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (name, ranks, threads, lay, flags) in enumerate(todo):
        e, ms = pred[i], meas[i]
        step = statistics.median(m["step"] for m in ms)
        opt = statistics.median(m["opt"] for m in ms)
        rng = f" ({min(m['step'] for m in ms):.2f}-{max(m['step'] for m in ms):.2f})" if len(ms) > 1 else ""
        print(f"| {name} | {ranks} | {threads} | {lay} | {step:.2f}{rng} | {e['step_s']:.2f} | {e['step_s'] / step:.2f} | "
              f"{(e['step_s'] - e['optimizer_s'] + opt) / step:.2f} |")
PY
