#!/usr/bin/python3
"""sweep_report.py: the bookkeeping half of launch/sweep/sweep.sh.

Subcommands (sweep.sh calls them; `report` is also useful by hand):
  env      --out DIR --backend B --root R --exe E --argv S   write DIR/env.json and DIR/env.txt
  classify --point-dir D --rc N --state S --wall W --timeout T [--job-id J]
           read D/point.json, D/metrics.jsonl and D/out.log; write D/result.json
  status   --result F        print the point's status
  summary  --result F        print a one-line summary of the point
  csv      --out DIR         (re)write DIR/results.csv from every DIR/points/*/result.json
  report   --out DIR         csv + the PNG charts + a table on stdout

Status of a point: ok (exit 0 and metrics), oom (out of memory: the program's
memory pre-flight refusal or "out of ... memory" message, std::bad_alloc, CUDA OOM, Slurm OUT_OF_MEMORY, or
a SIGKILL that was not the timeout: the kernel's OOM killer), timeout (the
per-point limit), failed (anything else; exit_code and error say why).
Metrics: the mean over the --metrics-file records after the first (warm-up)
iteration, or the only record; peak memory is the maximum over records.
Uses only the standard library; the charts need matplotlib (python3-matplotlib).
"""
import argparse
import csv
import datetime
import glob
import json
import os
import platform
import re
import socket
import subprocess
import sys

COLUMNS = [
    "point_id", "backend", "scaling", "status", "exit_code", "ranks", "nodes", "ranks_per_node", "tp", "dp",
    "zero_stage", "num_layers", "hidden_size", "num_attention_heads", "micro_batch", "global_batch", "seq_length",
    "train_iters", "iterations_measured", "tokens_per_s", "tokens_per_s_per_rank", "tflops_per_rank", "mfu",
    "peak_memory_mib_per_rank", "exposed_dp_comm_ms", "ms_per_iteration", "loss", "wall_s", "job_id", "slurm_state",
    "error", "log",
]

OOM_PATTERNS = re.compile(
    r"out of (host |device |GPU |CUDA )?memory|memory pre-flight: .*plan needs|std::bad_alloc|Cannot allocate memory|CUDA error: out of memory|"
    r"cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|oom-kill|OUT_OF_MEMORY|Out Of Memory",
    re.IGNORECASE)
ERROR_LINE = re.compile(r"error|abort|killed|fatal|BAD TERMINATION|CANCELLED|DUE TO TIME LIMIT", re.IGNORECASE)


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- env ----
def cmd_env(a):
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = "%.1f GiB" % (int(line.split()[1]) / 1048576.0)
                    break
    except OSError:
        pass
    fields = dict((x.split(":", 1)[0].strip(), x.split(":", 1)[1].strip())
                  for x in run(["mpichversion"]).splitlines() if ":" in x)
    mpi = ("MPICH %s (device %s)" % (fields.get("MPICH Version", "?"), fields.get("MPICH Device", "?"))
           if fields else "")
    if not mpi:
        mpi = (run(["mpiexec", "--version"]).splitlines() or [""])[0]
    commit = run(["git", "-C", a.root, "rev-parse", "HEAD"])
    dirty = bool(run(["git", "-C", a.root, "status", "--porcelain", "--untracked-files=no"]))
    try:
        import matplotlib
        mpl = matplotlib.__version__
    except ImportError:
        mpl = "missing (apt-get install python3-matplotlib)"
    env = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "backend": a.backend,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "kernel": platform.release(),
        "os": (run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]) or platform.platform()),
        "mpi": mpi,
        "slurm": run(["sinfo", "--version"]) if a.backend == "slurm" else "",
        "git_commit": commit,
        "git_dirty": dirty,
        "pretrain_gpt": a.exe,
        "sweep_argv": a.argv,
        "python": sys.version.split()[0],
        "matplotlib": mpl,
        "environment": {k: os.environ[k] for k in sorted(os.environ)
                        if k in ("OMP_NUM_THREADS", "MEGAZERO_NUM_THREADS", "OPENBLAS_CORETYPE", "SLURM_CONF",
                                 "MZ_SRUN_MPI", "MZ_SRUN_ARGS", "MZ_COLLECTIVE_TIMEOUT")
                        or k.startswith("NCCL_") or k.startswith("UCX_")},
        "note": ("timings with more ranks than cores are oversubscribed (not performance data)"
                 if a.backend == "local" else ""),
    }
    write_json(os.path.join(a.out, "env.json"), env)
    with open(os.path.join(a.out, "env.txt"), "w") as f:
        for k, v in env.items():
            f.write("%s: %s\n" % (k, json.dumps(v) if isinstance(v, dict) else v))
    with open(os.path.join(a.out, "env_history.jsonl"), "a") as f:
        f.write(json.dumps(env) + "\n")
    return 0


# ---- classify ----
def read_metrics(path):
    records = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass  # a half-written last line of a killed run
    except OSError:
        pass
    return records


def aggregate(records):
    if not records:
        return {}
    use = records[1:] if len(records) >= 2 else records

    def mean(key):
        vals = [float(r[key]) for r in use if key in r]
        return sum(vals) / len(vals) if vals else None

    peak = [float(r["peak_memory_bytes"]) for r in records if "peak_memory_bytes" in r]
    return {
        "iterations_measured": len(use),
        "tokens_per_s": mean("tokens_per_s"),
        "tflops_per_rank": mean("tflops_per_rank"),
        "mfu": mean("mfu"),
        "peak_memory_mib_per_rank": max(peak) / 1048576.0 if peak else None,
        "exposed_dp_comm_ms": mean("exposed_dp_comm_ms"),
        "ms_per_iteration": mean("ms_per_iteration"),
        "loss": float(records[-1]["loss"]) if "loss" in records[-1] else None,
    }


def first_error(log):
    lines = [x.strip() for x in log.splitlines() if x.strip()]
    for x in lines:
        if OOM_PATTERNS.search(x):
            return x
    for x in lines:
        if ERROR_LINE.search(x) and not x.startswith("[pretrain_gpt.sbatch"):
            return x
    return lines[-1] if lines else ""


def cmd_classify(a):
    d = a.point_dir
    with open(os.path.join(d, "point.json")) as f:
        point = json.load(f)
    try:
        with open(os.path.join(d, "out.log"), errors="replace") as f:
            log = f.read()
    except OSError:
        log = ""
    records = read_metrics(os.path.join(d, "metrics.jsonl"))
    rc, state, wall = a.rc, a.state, a.wall
    err = ""
    try:
        with open(os.path.join(d, "note")) as f:
            note = f.read().strip()
    except OSError:
        note = ""
    if state in ("TIMEOUT", "DEADLINE") or (state == "LOCAL" and (rc == 124 or (rc == 137 and wall >= a.timeout))):
        status, err = "timeout", "over the per-point limit of %d s" % a.timeout
    elif rc == 0 and state in ("LOCAL", "COMPLETED") and records:
        status = "ok"
    elif state == "OUT_OF_MEMORY" or OOM_PATTERNS.search(log):
        status = "oom"
        err = first_error(log) or "Slurm state OUT_OF_MEMORY"
    elif rc == 137 or re.search(r"KILLED BY SIGNAL: 9|signal 9", log):
        status, err = "oom", "killed by SIGKILL (exit 137), not by the timeout: most likely the kernel's OOM killer"
    else:
        status = "failed"
        err = first_error(log)
        if note:
            err = note
        elif state.startswith("CANCELLED"):
            err = "the job was cancelled (Slurm %s)%s" % (state, ": " + err if err else "")
        elif state in ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED"):
            err = "Slurm %s%s" % (state, ": " + err if err else "")
        elif rc == 0 and not records:
            err = "exit code 0 but no metrics records"
    result = dict(point)
    result.update({
        "status": status,
        "exit_code": rc,
        "slurm_state": "" if state == "LOCAL" else state,
        "job_id": a.job_id or "",
        "wall_s": round(wall, 2),
        "error": err[:300],
        "log": os.path.join(d, "out.log"),
    })
    for k in ("iterations_measured", "tokens_per_s", "tflops_per_rank", "mfu", "peak_memory_mib_per_rank",
              "exposed_dp_comm_ms", "ms_per_iteration", "loss"):
        result[k] = None
    if status == "ok":
        result.update(aggregate(records))
        if result["tokens_per_s"] is not None:
            result["tokens_per_s_per_rank"] = result["tokens_per_s"] / point["ranks"]
    result.setdefault("tokens_per_s_per_rank", None)
    write_json(os.path.join(d, "result.json"), result)
    return 0


def load(path):
    with open(path) as f:
        return json.load(f)


def cmd_status(a):
    print(load(a.result).get("status", "unknown"))
    return 0


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def cmd_summary(a):
    r = load(a.result)
    if r["status"] == "ok":
        print("ok: %s tokens/s, %s TFLOP/s per rank, MFU %s%%, peak %s MiB per rank, %s ms/iteration (%.1f s)" % (
            fmt(r["tokens_per_s"], ".0f"), fmt(r["tflops_per_rank"], ".4f"),
            fmt(None if r["mfu"] is None else 100 * r["mfu"], ".2f"), fmt(r["peak_memory_mib_per_rank"], ".1f"),
            fmt(r["ms_per_iteration"], ".1f"), r["wall_s"]))
    else:
        print("%s (exit code %s%s): %s" % (r["status"], r["exit_code"],
                                            ", Slurm " + r["slurm_state"] if r.get("slurm_state") else "", r["error"]))
    return 0


# ---- csv / charts ----
def results(out):
    rows = []
    for p in glob.glob(os.path.join(out, "points", "*", "result.json")):
        try:
            rows.append(load(p))
        except (OSError, ValueError):
            pass
    rows.sort(key=lambda r: (r["scaling"], r["num_layers"], r["hidden_size"], r["num_attention_heads"], r["tp"],
                             r["zero_stage"], r["ranks"], r["point_id"]))
    return rows


def cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "%.6g" % v
    return v


def cmd_csv(a):
    rows = results(a.out)
    tmp = os.path.join(a.out, "results.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: cell(r.get(k)) for k in COLUMNS})
    os.replace(tmp, os.path.join(a.out, "results.csv"))
    print("sweep: %s: %d points" % (os.path.join(a.out, "results.csv"), len(rows)))
    return rows


def series_key(r):
    return (r["scaling"], "L%dH%dA%d" % (r["num_layers"], r["hidden_size"], r["num_attention_heads"]), r["tp"],
            r["zero_stage"])


def series_label(k):
    return "%s %s TP%d Z%d" % (k[1], k[0], k[2], k[3])


def charts(out, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("sweep: error: matplotlib is missing: apt-get install python3-matplotlib (tools/install_deps.sh); "
              "run with Debian's /usr/bin/python3", file=sys.stderr)
        return 1
    ok = [r for r in rows if r["status"] == "ok" and r.get("tokens_per_s")]
    not_ok = [r for r in rows if r["status"] != "ok"]
    series = {}
    for r in ok:
        series.setdefault(series_key(r), []).append(r)
    for k in series:
        series[k].sort(key=lambda r: r["ranks"])
    backends = sorted({r["backend"] for r in rows})
    note = "backend %s; %d ok, %d not ok (%s)" % (
        ",".join(backends), len(ok), len(not_ok),
        ", ".join("%d %s" % (sum(1 for r in not_ok if r["status"] == s), s)
                  for s in ("oom", "timeout", "failed") if any(r["status"] == s for r in not_ok)) or "none")

    ticks = sorted({r["ranks"] for r in ok})

    def finish(fig, axes, name, title):
        fig.suptitle(title + "\n" + note, fontsize=9)
        for ax in axes:
            if ticks:
                ax.set_xscale("log", base=2)
                ax.set_xticks(ticks)
                ax.set_xticklabels([str(t) for t in ticks])
                ax.minorticks_off()
                if len(ticks) == 1:
                    ax.set_xlim(ticks[0] / 1.5, ticks[0] * 1.5)
            if ax.has_data():
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, "no successful points", ha="center", va="center", transform=ax.transAxes)
            ax.grid(True, alpha=0.3)
            ax.set_xlabel("ranks")
        fig.tight_layout()
        path = os.path.join(out, name)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        print("sweep: %s" % path)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for k, rs in series.items():
        x = [r["ranks"] for r in rs]
        a1.plot(x, [r["tokens_per_s"] / r["ranks"] for r in rs], marker="o", label=series_label(k))
        a2.plot(x, [r["tflops_per_rank"] for r in rs], marker="o", label=series_label(k))
    a1.set_ylabel("tokens/s per rank")
    a2.set_ylabel("TFLOP/s per rank")
    finish(fig, (a1, a2), "throughput_per_rank.png", "Throughput per device")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, rs in series.items():
        ax.plot([r["ranks"] for r in rs], [r["peak_memory_mib_per_rank"] or 0 for r in rs], marker="o",
                label=series_label(k))
    ax.set_ylabel("peak memory per rank (MiB, max over ranks)")
    finish(fig, (ax,), "memory_per_rank.png", "Memory per rank")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, rs in series.items():
        base = rs[0]
        base_per_rank = base["tokens_per_s"] / base["ranks"]
        ax.plot([r["ranks"] for r in rs], [(r["tokens_per_s"] / r["ranks"]) / base_per_rank for r in rs],
                marker="o", label=series_label(k))
    if series:
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_ylabel("scaling efficiency (per-rank tokens/s / smallest run's)")
    finish(fig, (ax,), "scaling_efficiency.png", "Scaling efficiency (strong: fixed global batch; weak: batch grows with ranks)")
    return 0


def cmd_report(a):
    rows = cmd_csv(a)
    print("%-52s %-7s %5s %5s %10s %10s %9s %9s" % ("point", "status", "exit", "ranks", "tokens/s", "TFLOP/s/rk",
                                                     "MiB/rank", "ms/iter"))
    for r in rows:
        print("%-52s %-7s %5s %5d %10s %10s %9s %9s" % (
            r["point_id"][:52], r["status"], r["exit_code"], r["ranks"], fmt(r["tokens_per_s"], ".0f"),
            fmt(r["tflops_per_rank"], ".4f"), fmt(r["peak_memory_mib_per_rank"], ".1f"),
            fmt(r["ms_per_iteration"], ".1f")))
    return charts(a.out, rows)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env")
    e.add_argument("--out", required=True)
    e.add_argument("--backend", required=True)
    e.add_argument("--root", required=True)
    e.add_argument("--exe", default="")
    e.add_argument("--argv", default="")
    c = sub.add_parser("classify")
    c.add_argument("--point-dir", required=True)
    c.add_argument("--rc", type=int, required=True)
    c.add_argument("--state", required=True)
    c.add_argument("--wall", type=float, required=True)
    c.add_argument("--timeout", type=float, required=True)
    c.add_argument("--job-id", default="")
    for name in ("status", "summary"):
        s = sub.add_parser(name)
        s.add_argument("--result", required=True)
    for name in ("csv", "report"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
    a = p.parse_args()
    fn = {"env": cmd_env, "classify": cmd_classify, "status": cmd_status, "summary": cmd_summary,
          "csv": lambda a: (cmd_csv(a), 0)[1], "report": cmd_report}[a.cmd]
    return fn(a)


if __name__ == "__main__":
    sys.exit(main())
