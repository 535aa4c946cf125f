#!/usr/bin/env python3
"""Ours against the PyTorch peers, from the JSON lines in a log (tools/gpu_session.sh peers).

  peer_ratios.py LOG...                          the ratio tables (and the #21 goals) from every
                                                 {"bench": ...} line in the logs
  peer_ratios.py --from-metrics FILE --impl NAME one {"bench": "gpt", ...} line from the last record
                                                 of pretrain_gpt's --metrics-file

JSON lines read: bench_layer's and bench/torch_layer.py's ("bench": "layer"), bench/torch_gpt.py's
and the --from-metrics lines ("bench": "gpt"). An implementation whose line is missing (a failed
or timed-out run) shows as n/a. Only the Python standard library.
"""
import argparse
import json
import sys

# What the peers phase runs; anything else found in the logs is appended.
EXPECTED = {
    "gpt": (["megazero-unfused", "megazero-fused", "megazero-cudnn"], ["torch-eager", "torch-compile"]),
    "layer": (["megazero-unfused", "megazero-fused", "megazero-cudnn"], ["torch-sdpa", "torch-sdpa-compile"]),
}
# Issue #21 [gpu-speed]: (bench, the peer compared with, speed ratio, MFU, peak memory no higher).
GOALS = {"gpt": ("torch-compile", 1.15, 0.40, True), "layer": ("torch-sdpa-compile", 1.08, 0.52, False)}


def from_metrics(path, impl):
    last = None
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        last = json.loads(line)
                    except ValueError:
                        pass
    except OSError as e:
        print(f"peer_ratios: {impl}: cannot read {path}: {e.strerror}")
        return 1
    if not last or "ms_per_iteration" not in last:
        print(f"peer_ratios: {impl}: no iteration record in {path} (the run failed?)")
        return 1
    peak = last.get("peak_memory_bytes")
    print(json.dumps({"bench": "gpt", "impl": impl, "ms": round(last["ms_per_iteration"], 4),
                      "tokens_per_s": round(last["tokens_per_s"], 1), "tflops": round(last["tflops_per_rank"], 2),
                      "mfu": round(last["mfu"], 4),
                      "peak_mib": None if peak is None else round(peak / 2**20, 1),
                      "iteration": last.get("iteration"), "loss": last.get("loss")}))
    return 0


def read_logs(paths):
    """{bench: {impl: record}}; a later line for the same implementation replaces an earlier one."""
    found = {}
    for path in paths:
        try:
            f = open(path, errors="replace")
        except OSError as e:
            print(f"peer_ratios: cannot read {path}: {e.strerror}")
            continue
        with f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(r, dict) or "bench" not in r or "impl" not in r:
                    continue
                impl = r["impl"]
                if impl == "megazero" and "attention" in r:  # bench_layer's line
                    impl = f"megazero-{r['attention']}"
                if r.get("dtype", "bf16") != "bf16":
                    impl += f"-{r['dtype']}"
                found.setdefault(r["bench"], {})[impl] = r
    return found


def num(r, key):
    v = r.get(key) if r else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def pct(v):
    return "n/a" if v is None else f"{100 * v:.1f}%"


def mean_or(r, key):
    """A GPT line's value over the mean step where it has one (bench/torch_gpt.py's mean_*: tokens/s
    over the timed steps, the statistic pretrain_gpt's window reports for ours), else its own."""
    v = num(r, "mean_" + key)
    return v if v is not None else num(r, key)


def speed(r):
    """Higher is better: tokens/s where the bench has it, else 1 / ms."""
    t = mean_or(r, "tokens_per_s")
    if t is not None:
        return t
    ms = num(r, "ms")
    return 1000.0 / ms if ms else None


def table(bench, recs):
    ours_names, theirs_names = EXPECTED.get(bench, ([], []))
    ours_names = list(ours_names) + sorted(k for k in recs if k.startswith("megazero") and k not in ours_names)
    theirs_names = list(theirs_names) + sorted(k for k in recs if k.startswith("torch") and k not in theirs_names)
    title = {"gpt": "GPT end to end (one training iteration: forward, backward, clip, AdamW)",
             "layer": "one layer, forward + backward"}.get(bench, bench)
    print(f"\n== {title}")
    print("   both: the mean step (ours: pretrain_gpt's last --log-interval window; theirs: the timed "
          "iterations, or their median in a log from before bench/torch_gpt.py printed the mean); peak memory: "
          "bytes allocated (ours: megazero's accounting; theirs: max_memory_allocated)"
          if bench == "gpt" else "   both: the median after warm-up (bench_layer's JSON has no peak memory)")
    hdr = ["ours", "theirs", "ours ms", "theirs ms", "speed ours/theirs", "ours MFU", "theirs MFU"]
    if bench == "gpt":
        hdr += ["ours tokens/s", "theirs tokens/s", "ours peak MiB", "theirs peak MiB", "memory ours/theirs"]
    rows = []
    for o in ours_names:
        ro = recs.get(o)
        for t in theirs_names:
            rt = recs.get(t)
            if ro and rt and ro.get("dtype", "bf16") != rt.get("dtype", "bf16"):
                continue
            so, st = speed(ro), speed(rt)
            ratio = so / st if so and st else None
            row = [o, t, fmt(mean_or(ro, "ms"), ".2f"), fmt(mean_or(rt, "ms"), ".2f"),
                   "n/a" if ratio is None else f"{ratio:.3f}x", pct(mean_or(ro, "mfu")), pct(mean_or(rt, "mfu"))]
            if bench == "gpt":
                mo, mt = num(ro, "peak_mib"), num(rt, "peak_mib")
                row += [fmt(speed(ro), ".0f"), fmt(speed(rt), ".0f"), fmt(mo, ".0f"),
                        fmt(mt, ".0f"), fmt(mo / mt if mo is not None and mt else None, ".3f")]
            rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    for row in [hdr] + rows:
        print("   " + "  ".join(str(x).rjust(w) if i > 1 else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    goal = GOALS.get(bench)
    if goal:
        peer, want_ratio, want_mfu, check_mem = goal
        rt = recs.get(peer)
        for o in ours_names:
            ro = recs.get(o)
            so, st = speed(ro), speed(rt)
            ratio, mfu = so / st if so and st else None, num(ro, "mfu")
            oks = [None if ratio is None else ratio >= want_ratio, None if mfu is None else mfu >= want_mfu]
            parts = ["speed vs " + peer + " " + ("n/a" if ratio is None else f"{ratio:.4f}x") + f" (>= {want_ratio}x)",
                     f"MFU {pct(mfu)} (>= {100 * want_mfu:.0f}%)"]
            if check_mem:
                mo, mt = num(ro, "peak_mib"), num(rt, "peak_mib")
                oks.append(None if mo is None or mt is None else mo <= mt)
                parts.append(f"peak memory {fmt(mo, '.0f')} MiB (<= {peer}'s {fmt(mt, '.0f')})")
            verdict = "not met" if False in oks else "n/a" if None in oks else "MET"
            print(f"   goal #21, {o}: " + "; ".join(parts) + " -> " + verdict)


def main(argv=None):
    ap = argparse.ArgumentParser(description="ours vs the PyTorch peers from JSON lines")
    ap.add_argument("logs", nargs="*")
    ap.add_argument("--from-metrics", metavar="FILE")
    ap.add_argument("--impl", default="megazero")
    ap.add_argument("--bench", default="gpt,layer", help="the tables to print (comma-separated)")
    a = ap.parse_args(argv)
    if a.from_metrics:
        return from_metrics(a.from_metrics, a.impl)
    if not a.logs:
        ap.error("give the logs to read, or --from-metrics FILE")
    found = read_logs(a.logs)
    for bench in a.bench.split(","):
        table(bench, found.get(bench, {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
