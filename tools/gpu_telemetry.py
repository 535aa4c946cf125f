#!/usr/bin/env python3
"""The GPU's clocks and power during each run of a GPU session phase (tools/gpu_session.sh).

  gpu_telemetry.py PHASE_LOG TELEMETRY_CSV

TELEMETRY_CSV: what `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,
temperature.gpu[,clocks_event_reasons.active] --format=csv,nounits -lms 100` wrote while the
phase ran. PHASE_LOG: the phase's log, whose run headers start with "== @YYYY/MM/DD HH:MM:SS.mmm"
(the same clock as nvidia-smi's timestamps). Prints, for every run, the samples that fell inside
it (until the next header): SM clock mean / min / max, power mean / max, the hottest temperature
and the throttle reasons seen. A step-time spread that follows the SM clock is the machine's, not
the kernels'. Only the Python standard library.
"""
import csv
import re
import sys
from datetime import datetime

FMT = "%Y/%m/%d %H:%M:%S.%f"
HEADER = re.compile(r"^== @(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) (.*)$")
# nvidia-smi's clocks_event_reasons bits (nvml.h, nvmlClocksEventReason*).
REASONS = {0x1: "idle", 0x2: "app-clocks", 0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x10: "sync-boost", 0x20: "sw-thermal",
           0x40: "hw-thermal", 0x80: "hw-power-brake", 0x100: "display-clocks"}


def number(s):
    try:
        return float(s.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def samples(path):
    out = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 5 or not row[0].strip()[:1].isdigit():
                continue  # the header line, or an error nvidia-smi printed
            try:
                t = datetime.strptime(row[0].strip(), FMT)
            except ValueError:
                continue
            reasons = int(row[5].strip(), 16) if len(row) > 5 and row[5].strip().startswith("0x") else None
            out.append((t, number(row[1]), number(row[3]), number(row[4]), reasons))
    return out


def runs(path):
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            m = HEADER.match(line.rstrip("\n"))
            if m:
                out.append((datetime.strptime(m.group(1), FMT), m.group(2)))
    return out


def summary(window):
    clocks = [s[1] for s in window if s[1] is not None]
    power = [s[2] for s in window if s[2] is not None]
    temps = [s[3] for s in window if s[3] is not None]
    bits = 0
    for s in window:
        bits |= s[4] or 0
    names = [n for b, n in REASONS.items() if bits & b and b != 0x1] or ["none"]
    if not clocks:
        return f"{len(window)} samples, no SM clock read"
    text = (f"{len(window):4d} samples, SM {sum(clocks) / len(clocks):6.0f} MHz (min {min(clocks):.0f}, "
            f"max {max(clocks):.0f})")
    if power:
        text += f", power {sum(power) / len(power):5.0f} W (max {max(power):.0f})"
    if temps:
        text += f", up to {max(temps):.0f} C"
    if any(s[4] is not None for s in window):
        text += ", throttled by " + "+".join(names)
    return text


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    data, marks = samples(argv[2]), runs(argv[1])
    if not marks:
        sys.exit(f"gpu_telemetry: no '== @<time> ...' run headers in {argv[1]}")
    print(f"== GPU telemetry ({len(data)} samples)")
    for i, (start, name) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else datetime.max
        window = [s for s in data if start <= s[0] < end]
        print(f"{name[:60]:60s} {summary(window)}")


if __name__ == "__main__":
    main(sys.argv)
