#!/usr/bin/env python3
"""tools/gpu_session.sh against tools/gpu_bundle.sh, without a GPU: every
program a phase runs from the bundle ($B/name, or a `for t in ...` list run as
$B/$t) is one the bundle packs, every phase a documented command line names
exists, and the documented short runbook is the same in the script and in
docs/PERFORMANCE.md. A program missing from the bundle would fail its phase on
a lent GPU, which a session gets one short call of."""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
session = (root / "tools/gpu_session.sh").read_text()
bundle = (root / "tools/gpu_bundle.sh").read_text()
perf = (root / "docs/PERFORMANCE.md").read_text()
failures = []

targets_block = re.search(r"targets=\((.*?)\)", bundle, re.S)
packed = set(targets_block.group(1).split()) if targets_block else set()
if not packed:
    failures.append("no targets=(...) list in tools/gpu_bundle.sh")

used = set(re.findall(r"\$B/([A-Za-z0-9_]+)", session))
# Loops whose body runs "$B/$t": every word of their list is a program.
for m in re.finditer(r"for t in ((?:[^;\n]|\\\n)*);\s*do(.*?)done", session, re.S):
    if re.search(r"\$B/\$t", m.group(2)):
        used |= {w for w in m.group(1).replace("\\\n", " ").split() if re.fullmatch(r"[A-Za-z0-9_]+", w)}
for name in sorted(used - packed):
    failures.append(f"gpu_session.sh runs $B/{name}, which gpu_bundle.sh does not pack")

phases = set(re.findall(r"^\s{4}([a-z0-9|-]+)\)\s*$", session, re.M))
phases = {p for group in phases for p in group.split("|")}
runbooks = re.findall(r"MZ_BUDGET_S=\d+ tools/gpu_session\.sh ([a-z0-9 -]+)", session + perf)
if not runbooks:
    failures.append("no MZ_BUDGET_S=... tools/gpu_session.sh runbook line found")
for line in runbooks:
    for phase in line.split():
        if phase not in phases:
            failures.append(f"the runbook names phase '{phase}', which gpu_session.sh does not have")
if len({line.strip() for line in runbooks}) > 1:
    failures.append("the runbook differs between gpu_session.sh and docs/PERFORMANCE.md: " + " / ".join(sorted(set(runbooks))))

for f in failures:
    print("gpu_session_consistent: FAIL:", f)
if failures:
    sys.exit(1)
print(f"gpu_session_consistent: {len(used)} programs, all packed; phases {sorted(phases)}; runbook '{runbooks[0].strip()}'")
