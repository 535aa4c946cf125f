#!/usr/bin/env python3
"""Sums an `ncu --print-summary per-kernel --csv` report by kernel name: total
GPU time, calls and share, largest first, and where the report has
dram__bytes.sum too, each kernel's DRAM bytes over its time (GB/s), the first
thing to read against the GPU's bandwidth (tools/gpu_session.sh profile,
profile-gpt)."""
import csv
import re
import sys
from collections import defaultdict

TIME_SCALE = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
BYTE_SCALE = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1.0}

with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
time_ms = defaultdict(float)
calls = defaultdict(int)
dram = defaultdict(float)
for r in csv.DictReader(lines):
    name = r.get("Kernel Name") or r.get("Function Name") or ""
    metric = r.get("Metric Name", "")
    if metric not in ("gpu__time_duration.sum", "dram__bytes.sum"):
        continue
    unit = r.get("Metric Unit", "")
    try:
        value = float(str(r.get("Sum") or r.get("Average") or r.get("Metric Value")).replace(",", ""))
        n = int(str(r.get("Invocations") or 1).replace(",", ""))
    except ValueError:
        continue
    if not r.get("Sum"):
        value *= n
    short = re.sub(r"\(.*", "", name)[:90]
    if metric == "gpu__time_duration.sum":
        time_ms[short] += value * TIME_SCALE.get(unit, 1e-6)
        calls[short] += n
    else:
        dram[short] += value * BYTE_SCALE.get(unit, 1.0)
grand = sum(time_ms.values()) or 1.0
with_bw = bool(dram)
print(f"{'ms':>9} {'calls':>6} {'share':>6}" + (f" {'GB/s':>7}" if with_bw else "") + "  kernel")
for n, ms in sorted(time_ms.items(), key=lambda kv: -kv[1]):
    bw = f" {dram[n] / (ms * 1e6):7.0f}" if with_bw and ms > 0 and n in dram else (f" {'':>7}" if with_bw else "")
    print(f"{ms:9.3f} {calls[n]:6d} {100 * ms / grand:5.1f}%{bw}  {n}")
print(f"{grand:9.3f} total (all profiled launches, warm-up step included)")
