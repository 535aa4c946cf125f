#!/usr/bin/env python3
"""Sums an `ncu --print-summary per-kernel --csv` report by kernel name:
total GPU time, calls and share, largest first (tools/gpu_session.sh profile)."""
import csv
import re
import sys
from collections import defaultdict

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    name = r.get("Kernel Name") or r.get("Function Name") or ""
    metric = r.get("Metric Name", "")
    if metric != "gpu__time_duration.sum":
        continue
    unit = r.get("Metric Unit", "ns")
    try:
        value = float(str(r.get("Sum") or r.get("Average") or r.get("Metric Value")).replace(",", ""))
        calls = int(str(r.get("Invocations") or 1).replace(",", ""))
    except ValueError:
        continue
    scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(unit, 1e-6)
    if not r.get("Sum"):
        value *= calls
    short = re.sub(r"\(.*", "", name)[:90]
    rows.append((short, value * scale, calls))
total = defaultdict(lambda: [0.0, 0])
for n, ms, c in rows:
    total[n][0] += ms
    total[n][1] += c
grand = sum(v[0] for v in total.values()) or 1.0
print(f"{'ms':>9} {'calls':>6} {'share':>6}  kernel")
for n, (ms, c) in sorted(total.items(), key=lambda kv: -kv[1][0]):
    print(f"{ms:9.3f} {c:6d} {100 * ms / grand:5.1f}%  {n}")
print(f"{grand:9.3f} total (all profiled launches, warm-up step included)")
