#!/usr/bin/env python3
"""reproduction_is_current.py PRETRAIN_GPT REPO: the planner's reproduction of
the paper (tools/reproduce_paper.py) regenerated now must equal the committed
docs/reproduction/RESULTS.md and results.json, and every number of
docs/REPRODUCTION.md's headline table (ratios aside) must be one of
RESULTS.md's, so the published numbers cannot drift from the code."""
import pathlib
import re
import subprocess
import sys
import tempfile

exe, repo = sys.argv[1], pathlib.Path(sys.argv[2])
with tempfile.TemporaryDirectory() as out:
    subprocess.run([sys.executable, str(repo / "tools/reproduce_paper.py"), "--pretrain-gpt", exe, "--out", out],
                   check=True, stdout=subprocess.DEVNULL)
    fresh = pathlib.Path(out)
    bad = []
    for name in ("RESULTS.md", "results.json"):
        if (fresh / name).read_text() != (repo / "docs/reproduction" / name).read_text():
            bad.append(f"docs/reproduction/{name} is stale: run python3 tools/reproduce_paper.py")
    results = (fresh / "RESULTS.md").read_text()
numbers = set(re.findall(r"\d+\.\d+", results))
doc = (repo / "docs/REPRODUCTION.md").read_text()
table = doc[doc.index("| the paper says |"):doc.index("Every number in this table")]
for row in table.splitlines()[2:]:
    ours = row.split("|")[2] if row.count("|") >= 3 else ""
    for n in re.findall(r"(?<![\d.])\d+\.\d+(?![\d.]*[×%])", ours):
        if n not in numbers:
            bad.append(f"docs/REPRODUCTION.md quotes {n} ('{ours.strip()[:60]}...'), which RESULTS.md does not hold")
if bad:
    print("reproduction_is_current: FAIL:\n  " + "\n  ".join(bad))
    sys.exit(1)
print("reproduction_is_current: RESULTS.md and results.json equal a fresh run; REPRODUCTION.md's numbers are RESULTS.md's")
