#!/usr/bin/env bash
# Measures this machine and writes a hardware profile for the planner's time
# model (megazero/plan/time_model.h; fields as in configs/hardware/*.json).
#
#   tools/calibrate_hardware.sh [--out FILE] [--build DIR] [--name NAME] [--rounds N] [--no-wait]
#
#   --out FILE   where to write the profile (default configs/hardware/this-machine.json;
#                re-run cmake afterwards so the built-in "this-machine" picks it up)
#   --build DIR  build directory with bench/bench_gemm, bench/bench_collectives and
#                examples/pretrain_gpt (default $BUILD_DIR or build)
#   --name NAME  the profile's name (default this-machine)
#   --rounds N   repeat the measurements N times, spread over the run, and keep
#                the medians (default 3: this VM's speed drifts by 10-20% within
#                minutes, so a single round can catch a slow or a fast moment)
#   --no-wait    measure even while other processes keep the CPUs busy
#
# One megazero rank per core: devices_per_node = the cores this process may use,
# and every per-rank number is measured with one math thread per rank
# (MEGAZERO_NUM_THREADS=1) while all cores run one copy each, as in a run with
# one rank per core. What is measured and how (each value's "how" also goes into
# the profile's "source"):
#   peak_tflops        bench_gemm --threads 1, one copy per core at once; the best
#                      megazero gemm() rate over square 1024..2048, per dtype
#                      (bf16/fp16 run widened to fp32 on CPUs without native
#                      16-bit matmul; bench_gemm says which path ran)
#   gemm_efficiency    the GEMMs of real training steps: pretrain_gpt (one rank,
#                      calibration models, see CAL_CONFIGS) under `perf record`;
#                      time in the BLAS libraries vs the time the planner's GEMM
#                      list (same flags, meta device) takes at the peak. Without
#                      perf: bench_gemm's 512^3 rate / peak.
#   kernel_overhead_us bench_gemm at 8^3 and 16^3: time minus FLOPs at the peak
#   memory_bandwidth   numpy c = a + b on 128 MiB fp32 arrays (STREAM "add",
#                      3 arrays counted), one process per core at once, per process
#   elementwise_traffic_factor
#                      the same perf'd steps: (forward + backward time) - (BLAS
#                      time) is what megazero's non-GEMM kernels take (layernorm,
#                      GeLU, softmax, dropout, cross-entropy, bias, residual,
#                      copies, allocation); factor = that time x memory bandwidth
#                      / activation bytes the planner counts for the same step
#   intra_node         bench_collectives at one rank per core: latency per ring
#                      step from messages <= 4 KiB, bus bandwidth from 64-256 MiB
#                      (the gradient buckets: --reduce-bucket-size 50M elements is
#                      100-200 MB), all-reduce, reduce-scatter and all-gather together
#                      (their time summed: one bandwidth prices all three)
#   inter_node         a single machine has none: set to the intra-node values
#   host_link_gbps     numpy copy (memcpy) of 128 MiB, bytes copied per second,
#                      one process per core at once (Pa+cpu copies are memcpys here)
#   memory_gib         MemTotal / cores
#   kernels            "cpu" (the planner emulates megazero's CPU kernels); other
#                      fields already in --out FILE are kept
# Runtime about 2 minutes on 2 cores (3 rounds) when the machine is quiet, plus any waiting. Every
# measurement waits until the CPUs are idle (< 10% busy over 2 s) and is repeated
# if other processes took more than 5% of the CPUs while it ran.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/configs/hardware/this-machine.json"
build=${BUILD_DIR:-build}
name=this-machine
wait_quiet=1
rounds=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --no-wait) wait_quiet=0; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "calibrate_hardware.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$build" = /* ]] || build="$repo/$build"
for b in bench/bench_gemm bench/bench_collectives examples/pretrain_gpt; do
  [[ -x "$build/$b" ]] || { echo "calibrate_hardware.sh: $build/$b not built (make -C $build bench_gemm bench_collectives pretrain_gpt)" >&2; exit 1; }
done
command -v mpiexec >/dev/null || { echo "calibrate_hardware.sh: mpiexec not found" >&2; exit 1; }
# An interpreter with numpy (Debian's python3-numpy lives under /usr/bin/python3).
py=""
for c in python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import numpy' 2>/dev/null; then py=$c; break; fi
done
[[ -n "$py" ]] || { echo "calibrate_hardware.sh: needs python3 with numpy (apt-get install python3-numpy)" >&2; exit 1; }

export MZ_CAL_ROUNDS="$rounds" MZ_CAL_REPO="$repo" MZ_CAL_BUILD="$build" MZ_CAL_OUT="$out" MZ_CAL_NAME="$name" MZ_CAL_WAIT="$wait_quiet" MZ_CAL_PY="$py"
exec "$py" - <<'PY'
import json, os, re, resource, shutil, statistics, subprocess, sys, tempfile, time

REPO, BUILD, OUT, NAME = (os.environ[k] for k in ("MZ_CAL_REPO", "MZ_CAL_BUILD", "MZ_CAL_OUT", "MZ_CAL_NAME"))
WAIT = os.environ["MZ_CAL_WAIT"] == "1"
PY = os.environ["MZ_CAL_PY"]
PRETRAIN = os.path.join(BUILD, "examples/pretrain_gpt")
NCORES = len(os.sched_getaffinity(0))
HZ = os.sysconf("SC_CLK_TCK")
ENV1 = dict(os.environ, MEGAZERO_NUM_THREADS="1", OMP_NUM_THREADS="1")  # one math thread per rank
TMP = tempfile.mkdtemp(prefix="mz-calibrate-")
T_START = time.time()

# Calibration models: not the models bench/plan_vs_measured.sh validates on. One
# is dominated by the cross-entropy over a large vocabulary, one by attention
# (softmax and dropout over seq^2 per head), both have layernorm/GeLU/bias/residual.
CAL_CONFIGS = [
    ("vocab-heavy", "--num-layers 2 --hidden-size 192 --num-attention-heads 3 --seq-length 128 "
                    "--max-position-embeddings 128 --vocab-size 32768 --micro-batch-size 4 --global-batch-size 8 "
                    "--hidden-dropout 0 --attention-dropout 0"),
    ("attention-heavy", "--num-layers 3 --hidden-size 384 --num-attention-heads 6 --seq-length 512 "
                        "--max-position-embeddings 512 --vocab-size 4096 --micro-batch-size 1 --global-batch-size 2"),
]
CAL_ITERS = 3
ROUNDS = int(os.environ["MZ_CAL_ROUNDS"])


def log(msg):
    print(f"[{time.time() - T_START:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- quiet machine
def cpu_busy_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def wait_quiet(max_wait=900):
    t0 = time.time()
    while True:
        b1, t1 = cpu_busy_jiffies(); time.sleep(2); b2, t2 = cpu_busy_jiffies()
        busy = (b2 - b1) / max(1, t2 - t1)
        if busy < 0.10 or not WAIT:
            return busy
        if time.time() - t0 > max_wait:
            log(f"  still busy ({busy:.0%}) after {max_wait} s: measuring anyway")
            return busy
        log(f"  CPUs {busy:.0%} busy (load {open('/proc/loadavg').read().split()[0]}): waiting 15 s for a quiet machine")
        time.sleep(15)


LOADS = []  # (what, load average before, foreign CPU fraction)


def run_clean(what, cmd, env=ENV1, tries=3, tol=0.05, shell=False):
    """Runs cmd on a quiet machine; repeats it when other processes took more than tol of the CPUs meanwhile."""
    for attempt in range(tries):
        wait_quiet()
        load = float(open("/proc/loadavg").read().split()[0])
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN); b0, _ = cpu_busy_jiffies(); w0 = time.time()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, shell=shell)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN); b1, _ = cpu_busy_jiffies(); wall = time.time() - w0
        if p.returncode != 0:
            sys.exit(f"calibrate_hardware.sh: {what} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        mine = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        foreign = max(0.0, ((b1 - b0) / HZ - mine) / (wall * NCORES))
        if foreign <= tol or not WAIT or attempt == tries - 1:
            LOADS.append((what, load, foreign))
            return p.stdout
        log(f"  other processes took {foreign:.0%} of the CPUs during {what}: repeating")


def concurrently(cmd):
    """A shell line that runs cmd once per core at the same time, each output in its own file."""
    return " & ".join(f"{cmd} > {TMP}/out.{i} 2>&1" for i in range(NCORES)) + " & wait"


def outputs():
    return [open(f"{TMP}/out.{i}").read() for i in range(NCORES)]


# ---------------------------------------------------------------- plans (meta device, no measurement)
PROBE_GFLOPS = 100.0  # any fixed numbers: the planner's times scale with them exactly


def plan(flags, ovh=0.0, huge_bw=False):
    prof = {"name": "calibration-probe", "description": "", "source": "", "kernels": "cpu", "devices_per_node": 1,
            "memory_gib": 1e6,
            "peak_tflops": {d: PROBE_GFLOPS / 1000 for d in ("fp32", "bf16", "fp16")}, "gemm_efficiency": 1,
            "kernel_overhead_us": ovh, "memory_bandwidth_gbps": 1e6 if huge_bw else 1.0,
            "elementwise_traffic_factor": 1, "intra_node": {"bus_bandwidth_gbps": 1, "latency_us": 1},
            "inter_node": {"node_bandwidth_gbps": 1, "latency_us": 1}, "host_link_gbps": 1}
    with open(f"{TMP}/probe.json", "w") as f:
        json.dump(prof, f)
    out = f"{TMP}/plan.json"
    subprocess.run([PRETRAIN, *flags.split(), "--mock-data", "--train-iters", "1", "--eval-iters", "0", "--dry-run",
                    "--world-size", "1", "--hardware", f"{TMP}/probe.json", "--plan-json", out],
                   check=True, capture_output=True)
    return json.load(open(out))


CAL = []
for cname, flags in CAL_CONFIGS:
    g0 = plan(flags, 0.0, huge_bw=True)["estimate"]["gemm_s"]        # compute at PROBE_GFLOPS, no roofline
    g1 = plan(flags, 1.0, huge_bw=True)["estimate"]["gemm_s"]
    p1 = plan(flags)
    CAL.append(dict(name=cname, flags=flags, gemm_probe=g0, calls=round((g1 - g0) / 1e-6),
                    act_bytes=p1["estimate"]["elementwise_s"] * 1e9, psi=p1["plan"]["psi"]))

have_perf = shutil.which("perf") is not None
if have_perf:
    have_perf = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-o", f"{TMP}/chk.data", "true"],
                               capture_output=True).returncode == 0

bench_gemm = os.path.join(BUILD, "bench/bench_gemm")
bench_coll = os.path.join(BUILD, "bench/bench_collectives")
BW_SCRIPT = r"""
import numpy as np, time
n = 32 * 1024 * 1024
a = np.ones(n, np.float32); b = np.full(n, 2, np.float32); c = np.zeros(n, np.float32)
def best(fn, reps=6):
    fn(); t = 1e9
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); t = min(t, time.perf_counter() - t0)
    return t
print("copy", a.nbytes / best(lambda: np.copyto(c, a)) / 1e9)
print("add", 3 * a.nbytes / best(lambda: np.add(a, b, out=c)) / 1e9)
"""
with open(f"{TMP}/bw.py", "w") as f:
    f.write(BW_SCRIPT)
p = NCORES
ring = {"all_reduce": (2 * (p - 1) / p, 2 * (p - 1)), "reduce_scatter": ((p - 1) / p, p - 1),
        "all_gather": ((p - 1) / p, p - 1)}

log(f"{NCORES} cores: one rank per core, 1 math thread per rank; {ROUNDS} rounds, medians kept "
    f"(this machine's speed drifts by 10-20% within minutes)")
R = []  # one dict per round
for rnd in range(ROUNDS):
    r = {}
    log(f"round {rnd + 1}/{ROUNDS}")
    # GEMM peak: one bench_gemm per core at once, one math thread each.
    run_clean("bench_gemm (peak)", concurrently(f"{bench_gemm} --threads 1 --sizes 512,1024,2048 --reps 3"), shell=True)
    rates = {}
    r["path"] = ""
    for text in outputs():
        for line in text.splitlines():
            m = re.match(r"\s*1\s+(\d+)\s+(\w+)\s+megazero gemm\(\)\s+([\d.]+)", line)
            if m:
                rates.setdefault((int(m.group(1)), m.group(2)), []).append(float(m.group(3)))
            if line.startswith("path:"):
                r["path"] = line[5:].strip()
    r["rate"] = {k: statistics.mean(v) for k, v in rates.items()}
    r["peak"] = {d: max(r["rate"][(sz, d)] for sz in (1024, 2048)) for (_, d) in r["rate"]}
    log("  GEMM GFLOP/s per rank at 512/1024/2048^3: " + "; ".join(
        f"{d} " + "/".join(f"{r['rate'][(sz, d)]:.1f}" for sz in (512, 1024, 2048)) for d in sorted(r["peak"])))
    # Memory: numpy add and copy, one process per core at once.
    run_clean("memory bandwidth", concurrently(f"{PY} {TMP}/bw.py"), shell=True)
    bw = {}
    for text in outputs():
        for line in text.splitlines():
            k, v = line.split()
            bw.setdefault(k, []).append(float(v))
    r["add"], r["copy"] = statistics.mean(bw["add"]), statistics.mean(bw["copy"])
    log(f"  memory: add {r['add']:.2f} GB/s per process (2 reads + 1 write counted), memcpy {r['copy']:.2f} GB/s copied")
    # Collectives at one rank per core.
    text = run_clean("bench_collectives", ["mpiexec", "-n", str(NCORES), bench_coll, "--min-bytes", "256",
                                           "--max-bytes", str(256 << 20), "--iters", "7"])
    r["coll"] = {}
    for line in text.splitlines():
        m = re.match(r"(all_reduce|reduce_scatter|all_gather)\s+(\d+)\s+([\d.]+)", line)
        if m:
            r["coll"][(m.group(1), int(m.group(2)))] = float(m.group(3)) * 1e-6
    # Real training steps of the calibration models: one one-rank copy per core at once.
    r["cal"] = []
    for c in CAL:
        run = (f"{PRETRAIN} {c['flags']} --mock-data --train-iters {CAL_ITERS} --log-interval 1 --eval-iters 0 "
               f"--metrics-file {TMP}/metrics.IDX")
        line = " & ".join(run.replace("IDX", str(i)) + f" > {TMP}/out.{i} 2>&1" for i in range(NCORES)) + " & wait"
        blas_s = None
        if have_perf:
            run_clean(f"calibration run {c['name']}", ["perf", "record", "-q", "-e", "cpu-clock", "-c", "1000000",
                                                         "-o", f"{TMP}/perf.data", "--", "sh", "-c", line])
            rep = subprocess.run(["perf", "report", "-i", f"{TMP}/perf.data", "--no-children", "--sort", "dso",
                                  "-F", "sample,dso", "--stdio"], capture_output=True, text=True).stdout
            blas_ms = 0
            for l in rep.splitlines():
                m = re.match(r"\s*(\d+)\s+(\S+)", l)
                if m and not l.lstrip().startswith("#") and re.search(r"openblas|blas|dnnl", m.group(2)):
                    blas_ms += int(m.group(1))  # one sample per ms of CPU time
            blas_s = blas_ms / 1000.0 / (NCORES * CAL_ITERS)
        else:
            run_clean(f"calibration run {c['name']}", ["sh", "-c", line])
        recs = []
        for i in range(NCORES):
            rs = [json.loads(l) for l in open(f"{TMP}/metrics.{i}")]
            recs += rs[1:] if len(rs) > 1 else rs
        fb = statistics.median(x["forward_ms"] + x["backward_ms"] for x in recs) / 1000
        opt = statistics.median(x["optimizer_ms"] for x in recs) / 1000
        if blas_s is None:  # no perf: the GEMMs at bench_gemm's 512^3 rate
            blas_s = c["gemm_probe"] * PROBE_GFLOPS / r["rate"][(512, "fp32")]
        r["cal"].append(dict(fb=fb, gemm=blas_s, opt=opt))
        log(f"  {c['name']}: forward+backward {fb:.3f} s, of it GEMMs {blas_s:.3f} s; optimizer {opt:.3f} s")
    R.append(r)

med = statistics.median
dtypes = sorted(R[0]["peak"])
peak = {d: med(r["peak"][d] for r in R) for d in dtypes}
rate = {k: med(r["rate"][k] for r in R) for k in R[0]["rate"]}
path = R[0]["path"]

log("GEMM per-call overhead: bench_gemm 8^3 and 16^3, one copy")
text = run_clean("bench_gemm (small)", [bench_gemm, "--threads", "1", "--sizes", "8,16", "--reps", "200"])
over = []
for line in text.splitlines():
    m = re.match(r"\s*1\s+(\d+)\s+fp32\s+megazero gemm\(\)\s+([\d.]+)", line)
    if m:
        n, rr = int(m.group(1)), float(m.group(2))
        flops = 2.0 * n ** 3
        over.append((flops / (rr * 1e9) - flops / (peak["fp32"] * 1e9)) * 1e6)
overhead_us = max(0.0, min(over))

mem_bw = med(r["add"] for r in R)
host_link = med(r["copy"] for r in R)
times = {k: med(r["coll"][k] for r in R) for k in R[0]["coll"]}
lat = med(t / ring[op][1] for (op, b), t in times.items() if b <= 4096)


def busbw_of(sel):
    return sum(ring[op][0] * b for op, b, t in sel) / sum(t for op, b, t in sel) / 1e9


big = [(op, b, t) for (op, b), t in times.items() if b >= (64 << 20)]
busbw = sum(ring[op][0] * b for op, b, t in big) / sum(max(t - ring[op][1] * lat, 1e-9) for op, b, t in big) / 1e9
busbw_mid = busbw_of([(op, b, t) for (op, b), t in times.items() if (256 << 10) <= b <= (4 << 20)])
at256 = {op: busbw_of([(o, b, t) for (o, b), t in times.items() if o == op and b == (256 << 20)]) for op in ring}

# The model's GEMM time at the peak vs the measured BLAS time (per round: the
# peak and the steps of one round saw the same machine speed).
gemm_at_peak = sum(c["gemm_probe"] for c in CAL) * PROBE_GFLOPS / peak["fp32"]
calls = sum(c["calls"] for c in CAL)
gemm_meas = med(sum(x["gemm"] for x in r["cal"]) for r in R) - calls * overhead_us * 1e-6
eff = min(1.0, gemm_at_peak / gemm_meas)
elem = med(sum(x["fb"] - x["gemm"] for x in r["cal"]) for r in R)
act = sum(c["act_bytes"] for c in CAL)
factor = elem * mem_bw * 1e9 / act
adam_ns = med(x["opt"] / c["psi"] * 1e9 for r in R for x, c in zip(r["cal"], CAL))
spread = lambda vals: f"{min(vals):.3g}-{max(vals):.3g}"
details = "; ".join(
    f"{c['name']}: forward+backward {med(r['cal'][i]['fb'] for r in R):.3f} s, BLAS {med(r['cal'][i]['gemm'] for r in R):.3f} s "
    f"({c['calls']} GEMM calls, {c['gemm_probe'] * PROBE_GFLOPS / peak['fp32']:.3f} s at the peak), "
    f"{c['act_bytes'] / 1e6:.0f} MB of activations" for i, c in enumerate(CAL))
log(f"medians: GEMM peak " + ", ".join(f"{d} {peak[d]:.1f}" for d in dtypes) + f" GFLOP/s (fp32 rounds "
    f"{spread([r['peak']['fp32'] for r in R])}); overhead {overhead_us:.2f} us; add {mem_bw:.2f} GB/s "
    f"({spread([r['add'] for r in R])}); memcpy {host_link:.2f} GB/s")
log(f"  collectives: latency {lat * 1e6:.1f} us per ring step; bus bandwidth {busbw:.2f} GB/s at 64-256 MiB "
    f"({busbw_mid:.2f} GB/s at 256 KiB-4 MiB, not used); at 256 MiB " +
    ", ".join(f"{op} {v:.2f}" for op, v in at256.items()) + " GB/s")
log(f"  {details}")
log(f"  -> gemm_efficiency {eff:.3f} ({gemm_at_peak:.3f} s at the peak / {gemm_meas:.3f} s measured), "
    f"elementwise_traffic_factor {factor:.2f} (non-GEMM kernels move {act / elem / 1e9:.2f} GB/s of activations)")
log(f"  optimizer step (grad norm + AdamW + publish) {adam_ns:.1f} ns per parameter; the model prices AdamW at "
    f"32 B / {mem_bw:.1f} GB/s = {32 / mem_bw:.1f} ns (fp32)")

# ---------------------------------------------------------------- write
mem_total = 0
for l in open("/proc/meminfo"):
    if l.startswith("MemTotal:"):
        mem_total = int(l.split()[1]) * 1024
cpu_model = ""
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"):
        cpu_model = l.split(":", 1)[1].strip()
        break
r3 = lambda x, n=3: float(f"{x:.{n}g}")
when = time.strftime("%Y-%m-%d")
loads = ", ".join(f"{w} {l:.2f}" for w, l, _ in LOADS)
foreign = max(f for _, _, f in LOADS)
coretype = os.environ.get("OPENBLAS_CORETYPE", "unset")
source = (
    f"Measured {when} by tools/calibrate_hardware.sh (medians of {ROUNDS} rounds) on {cpu_model}, {NCORES} cores, one rank per core, "
    f"MEGAZERO_NUM_THREADS=1 (OPENBLAS_CORETYPE {coretype}); every per-rank number with all {NCORES} cores running one copy. "
    f"peak_tflops: best megazero gemm() rate of bench_gemm --threads 1 at 1024^3/2048^3; "
    + "; ".join(f"{d} " + "/".join(f"{rate[(sz, d)]:.1f}" for sz in (512, 1024, 2048)) + " GFLOP/s at 512/1024/2048^3" for d in dtypes)
    + f" (16-bit path: {path}). gemm_efficiency: the GEMMs of real one-rank training steps of two calibration models "
    f"({', '.join(n for n, _ in CAL_CONFIGS)}; {'BLAS time by perf record' if have_perf else 'no perf: bench_gemm 512^3 rate'}) "
    f"vs the planner's GEMM list at the peak: {gemm_at_peak:.3f} s / {gemm_meas:.3f} s. "
    f"kernel_overhead_us: bench_gemm 8^3/16^3 time minus FLOPs at the peak. "
    f"memory_bandwidth_gbps: numpy c = a + b on 128 MiB fp32 arrays per process (STREAM add convention). "
    f"elementwise_traffic_factor: (forward+backward - GEMM time) of those steps x memory bandwidth / the planner's "
    f"activation bytes: " + details + ". "
    f"intra_node: bench_collectives at {NCORES} ranks, latency per ring step = median of messages <= 4 KiB, "
    f"bus bandwidth over 64-256 MiB, the gradient-bucket sizes (all-reduce, reduce-scatter, all-gather together; at 256 MiB "
    + ", ".join(f"{op} {v:.2f}" for op, v in at256.items()) + f" GB/s; 256 KiB-4 MiB messages reach {busbw_mid:.2f} GB/s). "
    f"inter_node: one machine, none; copies intra_node. host_link_gbps: numpy copy (memcpy), bytes copied per second "
    f"per process. memory_gib: MemTotal / cores. Not in the model: the optimizer step takes {adam_ns:.1f} ns per "
    f"parameter here (scalar fp64 AdamW + gradient norm), the model prices AdamW at {32 / mem_bw:.1f} ns (fp32, memory bound). "
    f"1-min load average before each measurement (it counts this script's previous steps): {loads}; other processes "
    f"took at most {foreign:.0%} of the CPUs while they ran."
)
profile = {
    "name": NAME,
    "description": f"This {NCORES}-core machine ({cpu_model}), one megazero rank per core with one math thread "
                   f"(CPU device, MPICH shared memory)",
    "source": source,
    "kernels": "cpu",  # the planner emulates megazero's CPU kernels (e.g. the 16-bit GEMM workspace)
    "devices_per_node": NCORES,
    "memory_gib": round(mem_total / NCORES / 2 ** 30, 1),
    "peak_tflops": {d: round(peak[d] / 1000, 4) for d in dtypes},
    "gemm_efficiency": round(eff, 3),
    "kernel_overhead_us": round(overhead_us, 2),
    "memory_bandwidth_gbps": round(mem_bw, 2),
    "elementwise_traffic_factor": round(factor, 2),
    "intra_node": {"bus_bandwidth_gbps": round(busbw, 3), "latency_us": round(lat * 1e6, 1)},
    "inter_node": {"node_bandwidth_gbps": round(busbw, 3), "latency_us": round(lat * 1e6, 1)},
    "host_link_gbps": round(host_link, 2),
}
# Keep fields of an existing profile that this script does not measure.
try:
    old_profile = json.load(open(OUT))
except (OSError, ValueError):
    old_profile = {}
if isinstance(old_profile, dict):
    profile.update({k: v for k, v in old_profile.items() if k not in profile})
os.makedirs(os.path.dirname(os.path.abspath(OUT)), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(profile, f, indent=2)
    f.write("\n")
shutil.rmtree(TMP, ignore_errors=True)
log(f"wrote {OUT}:")
print(json.dumps({k: v for k, v in profile.items() if k != "source"}, indent=2))
if os.path.abspath(OUT).startswith(os.path.join(REPO, "configs/hardware")):
    print("re-run cmake (and rebuild pretrain_gpt) so that the built-in profile picks it up")
PY
