#!/usr/bin/env python3
"""Reproduces the ZeRO paper's experiments with the planner: every config in
configs/paper/ planned for its rank 0 on the DGX-2 profile (memory from the real
code on the meta device, time from megazero/plan/time_model.h), the largest
models of Figures 4 and 6, and charts for Figures 2, 3, 4, 6 and 8.

    python3 tools/reproduce_paper.py [--pretrain-gpt build/examples/pretrain_gpt] [--out docs/reproduction]

Writes OUT/results.json, OUT/RESULTS.md and OUT/fig{2,3,4,6,8}.png (charts need
matplotlib; without it the tables are still written). Standard library only
otherwise; about a minute on two cores."""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
GIB = 1 << 30
# The paper's stated numbers (docs/paper/README.md, "Headline results").
PAPER = {
    "zero_100b_tflops": 38.0,        # "over 38 TFLOP/s per GPU" at 100B
    "zero_8b_100b_pflops": 15.0,     # 8B-100B average aggregate, 400 GPUs
    "baseline_40b_tflops": 5.0,      # Megatron 40B across two DGX-2 nodes
    "dp_only_zero_largest_b": 13.0,  # Figure 4, 128 GPUs
    "dp_only_baseline_largest_b": 1.4,
    "fig6_largest_b": {"C1": 40, "C2": 60, "C3": 50, "C4": 140, "C5": 150},
}


def plan(exe, cfg, gpus, *extra, hardware="dgx2-v100"):
    """Runs the dry-run planner; returns its JSON ({"plan": ..., "estimate": ...}) and stdout."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [exe, "--config", str(cfg), "--mock-data", "--dry-run", "--world-size", str(gpus),
               "--hardware", hardware, "--plan-json", f.name, *map(str, extra)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"planner failed ({' '.join(cmd)}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        text = pathlib.Path(f.name).read_text()
        return (json.loads(text) if text.strip() else None), r.stdout


def largest(exe, cfg, gpus, *extra):
    """--plan-fit-gib 32: the most layers of this shape that fit a 32 GB V100."""
    d, out = plan(exe, cfg, gpus, "--plan-fit-gib", 32, *extra)
    m = re.search(r"(\d+) layers, ([0-9.]+)B parameters", out)
    return {"layers": int(m.group(1)), "params_b": float(m.group(2)), "estimate": d and d.get("estimate")}


def parse_name(path):
    m = re.match(r"(fig\d)_([0-9p]+)B_(zero|baseline)_(.+)_(\d+)gpus_mp(\d+)", path.stem)
    fig, size, system, zc, gpus, mp = m.groups()
    return {"config": path.name, "figure": fig, "model_b": float(size.replace("p", ".")), "system": system,
            "zero_config": zc, "gpus": int(gpus), "mp": int(mp)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pretrain-gpt", default=str(ROOT / "build/examples/pretrain_gpt"))
    ap.add_argument("--out", default=str(ROOT / "docs/reproduction"))
    a = ap.parse_args()
    exe, out = a.pretrain_gpt, pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    rows = []
    for cfg in sorted((ROOT / "configs/paper").glob("*.cfg")):
        r = parse_name(cfg)
        d, _ = plan(exe, cfg, r["gpus"])
        r.update(d["estimate"])
        r["step_total_peak_gib"] = d["plan"]["step_total_peak"] / GIB
        if r["system"] == "baseline":
            # The pessimistic cross-node profile, and the MP degree below the paper's.
            one, _ = plan(exe, cfg, r["gpus"], hardware="dgx2-v100-one-nic")
            r["tflops_one_nic"] = one["estimate"]["tflops_per_gpu"]
            if r["mp"] > 1:
                mb = int(re.search(r"^micro-batch-size = (\d+)", cfg.read_text(), re.M).group(1))
                half, _ = plan(exe, cfg, r["gpus"], "--tensor-model-parallel-size", r["mp"] // 2,
                               "--global-batch-size", mb * r["gpus"] // (r["mp"] // 2), "--allow-tp-across-nodes")
                r["half_mp_gib"] = half["plan"]["step_total_peak"] / GIB
        rows.append(r)

    fig4 = {
        "zero": largest(exe, ROOT / "configs/paper/fig4_13B_zero_zero-100b_128gpus_mp1.cfg", 128),
        "baseline": largest(exe, ROOT / "configs/paper/fig4_1p16B_baseline_baseline_128gpus_mp1.cfg", 128),
    }
    fig6 = {}
    for c in ["C1", "C2", "C3", "C4", "C5"]:
        fig6[c] = largest(exe, ROOT / "configs/paper/fig2_100B_zero_zero-100b_400gpus_mp16.cfg", 400,
                          "--zero-config", c, "--micro-batch-size", 16, "--global-batch-size", 400)
    results = {"rows": rows, "fig4_largest": fig4, "fig6_largest": fig6, "paper": PAPER}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_markdown(out / "RESULTS.md", results)
    try:
        charts(out, results)
    except ImportError:
        print("matplotlib not installed: tables written, charts skipped (apt-get install python3-matplotlib)")
    print(f"wrote {out}/results.json, RESULTS.md and charts")


def by(rows, fig, system=None):
    return [r for r in rows if r["figure"] == fig and (system is None or r["system"] == system)]


def write_markdown(path, res):
    rows = res["rows"]
    L = ["# ZeRO paper experiments, planned (generated by tools/reproduce_paper.py; do not edit)", "",
         "Every configuration of configs/paper/ planned for rank 0 on the `dgx2-v100` profile (memory: the real",
         "code on the meta device; time: megazero/plan/time_model.h). TFLOP/s per GPU counts model FLOPs with",
         "recompute (Narayanan et al. eq. 3), the paper's metric. 32 GiB per GPU.", ""]
    L += ["## Figure 2: throughput vs model size, 400 GPUs (baselines 256-400)", "",
          "| model | ZeRO: MP x DP, config | GiB | TFLOP/s/GPU | PFLOP/s | Megatron baseline: MP | GiB | TFLOP/s/GPU | "
          "one-NIC TFLOP/s/GPU | GiB at half the MP |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    zero = {r["model_b"]: r for r in by(rows, "fig2", "zero")}
    base = {r["model_b"]: r for r in by(rows, "fig2", "baseline")}
    for m in sorted(zero):
        z, b = zero[m], base.get(m)
        L.append(f"| {m:g}B | {z['mp']} x {z['gpus'] // z['mp']}, {cfg_name(z)} | {z['memory_gib']:.1f} | "
                 f"{z['tflops_per_gpu']:.1f} | {z['tflops_per_gpu'] * z['gpus'] / 1000:.1f} | "
                 + (f"{b['mp']} | {b['memory_gib']:.1f} | {b['tflops_per_gpu']:.1f} | {b['tflops_one_nic']:.1f} | "
                    + (f"{b['half_mp_gib']:.1f}" if "half_mp_gib" in b else "-") + " |" if b else "| | | | |"))
    avg = [z for m, z in zero.items() if 8 <= m <= 100]
    pf = sum(z["tflops_per_gpu"] * z["gpus"] for z in avg) / len(avg) / 1000
    L += ["", f"8B-100B average: **{pf:.1f} PFLOP/s** on 400 GPUs (paper: {PAPER['zero_8b_100b_pflops']:.0f}). "
          f"100B: **{zero[100]['tflops_per_gpu']:.1f} TFLOP/s per GPU** (paper: over {PAPER['zero_100b_tflops']:.0f}). "
          f"40B Megatron across two nodes: **{base[40]['tflops_per_gpu']:.1f}** (all NICs) / "
          f"**{base[40]['tflops_one_nic']:.1f}** (one NIC) TFLOP/s per GPU (paper: about {PAPER['baseline_40b_tflops']:.0f}).", ""]
    L += ["## Figure 3: 60B, superlinear scaling (MP 16)", "", "| GPUs | batch per replica | GiB | TFLOP/s/GPU | PFLOP/s |",
          "|---|---|---|---|---|"]
    for r in sorted(by(rows, "fig3"), key=lambda r: r["gpus"]):
        L.append(f"| {r['gpus']} | {r['samples_per_s'] * r['step_s'] / (r['gpus'] // r['mp']):.0f} | {r['memory_gib']:.1f} | "
                 f"{r['tflops_per_gpu']:.1f} | {r['tflops_per_gpu'] * r['gpus'] / 1000:.2f} |")
    f4 = res["fig4_largest"]
    L += ["", "## Figure 4: data parallelism only, 128 GPUs", "", "| model | system | GiB | TFLOP/s/GPU |", "|---|---|---|---|"]
    for r in sorted(by(rows, "fig4"), key=lambda r: r["model_b"]):
        L.append(f"| {r['model_b']:g}B | {'ZeRO (' + cfg_name(r) + ')' if r['system'] == 'zero' else 'baseline DP'} | "
                 f"{r['memory_gib']:.1f} | {r['tflops_per_gpu']:.1f} |")
    L += ["", f"Largest that fits 32 GiB: ZeRO **{f4['zero']['params_b']:.1f}B** ({f4['zero']['layers']} layers of the 13B "
          f"row's shape; paper: {PAPER['dp_only_zero_largest_b']:g}B), plain DP **{f4['baseline']['params_b']:.2f}B** "
          f"({f4['baseline']['layers']} layers of the 1.16B row's shape; paper: {PAPER['dp_only_baseline_largest_b']:g}B).", ""]
    L += ["## Figure 6: largest model per configuration (400 GPUs, MP 16, batch 16 per replica, hidden 8192)", "",
          "| config | paper | ours | layers |", "|---|---|---|---|"]
    for c, v in res["fig6_largest"].items():
        L.append(f"| {c} | {PAPER['fig6_largest_b'][c]}B | {v['params_b']:.1f}B | {v['layers']} |")
    L += ["", "## Figures 7 and 8: memory and throughput per configuration C1-C5", "",
          "| figure | model | GPUs | config | batch per replica | GiB | fits | TFLOP/s/GPU |", "|---|---|---|---|---|---|---|---|"]
    for fig in ("fig7", "fig8"):
        for r in by(rows, fig):
            L.append(f"| {fig[3:]} | {r['model_b']:g}B | {r['gpus']} | {r['zero_config']} | "
                     f"{r['samples_per_s'] * r['step_s'] / (r['gpus'] // r['mp']):.0f} | {r['memory_gib']:.1f} | "
                     f"{'yes' if r['fits'] else '**no**'} | {r['tflops_per_gpu']:.1f} |")
    path.write_text("\n".join(L) + "\n")


def cfg_name(r):
    text = (ROOT / "configs/paper" / r["config"]).read_text()
    m = re.search(r"^zero-config = (\S+)", text, re.M)
    return m.group(1) if m else "stage 0"


def charts(out, res):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["rows"]
    # Figure 2
    z = sorted(by(rows, "fig2", "zero"), key=lambda r: r["model_b"])
    b = sorted(by(rows, "fig2", "baseline"), key=lambda r: r["model_b"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([r["model_b"] for r in z], [r["tflops_per_gpu"] for r in z], "o-", label="ZeRO-100B (planned)")
    ax.plot([r["model_b"] for r in b], [r["tflops_per_gpu"] for r in b], "s-", label="Megatron baseline (planned, all NICs)")
    ax.plot([r["model_b"] for r in b], [r["tflops_one_nic"] for r in b], "s--", label="Megatron baseline (planned, one NIC)")
    ax.plot([100], [PAPER["zero_100b_tflops"]], "k^", ms=10, label="paper: ZeRO 100B (over 38)")
    ax.plot([40], [PAPER["baseline_40b_tflops"]], "kv", ms=10, label="paper: Megatron 40B, 2 nodes (about 5)")
    ax.set_xscale("log")
    ax.set_xlabel("model size (billion parameters)")
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("Figure 2: ZeRO vs Megatron baseline, DGX-2 profile")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig2.png", dpi=110)
    # Figure 3
    r3 = sorted(by(rows, "fig3"), key=lambda r: r["gpus"])
    fig, ax = plt.subplots(figsize=(6, 4))
    g = [r["gpus"] for r in r3]
    ax.plot(g, [r["tflops_per_gpu"] * r["gpus"] / 1000 for r in r3], "o-", label="planned aggregate PFLOP/s")
    ax.plot(g, [r3[0]["tflops_per_gpu"] * x / 1000 for x in g], "k--", label="linear from 64 GPUs")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("PFLOP/s")
    ax.set_title("Figure 3: 60B model, superlinear scaling")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig3.png", dpi=110)
    # Figure 4
    r4 = sorted(by(rows, "fig4"), key=lambda r: r["model_b"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for sysname, mark in (("zero", "o-"), ("baseline", "s")):
        rr = [r for r in r4 if r["system"] == sysname]
        ax.plot([r["model_b"] for r in rr], [r["tflops_per_gpu"] for r in rr], mark,
                label="ZeRO (planned)" if sysname == "zero" else "plain DP (planned)")
    f4 = res["fig4_largest"]
    ax.axvline(f4["zero"]["params_b"], color="C0", ls=":", label=f"ZeRO largest {f4['zero']['params_b']:.1f}B (paper 13B)")
    ax.axvline(f4["baseline"]["params_b"], color="C1", ls=":", label=f"plain DP largest {f4['baseline']['params_b']:.1f}B (paper 1.4B)")
    ax.set_xlabel("model size (billion parameters)")
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("Figure 4: data parallelism only, 128 GPUs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig4.png", dpi=110)
    # Figure 6
    f6 = res["fig6_largest"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(f6))
    ax.bar([x - 0.2 for x in xs], [PAPER["fig6_largest_b"][c] for c in f6], 0.4, label="paper")
    ax.bar([x + 0.2 for x in xs], [v["params_b"] for v in f6.values()], 0.4, label="planned")
    ax.set_xticks(list(xs), list(f6))
    ax.set_ylabel("largest model (B parameters)")
    ax.set_title("Figure 6: largest model per configuration, 400 GPUs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig6.png", dpi=110)
    # Figure 8
    r8 = by(rows, "fig8")
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['model_b']:g}B {r['zero_config']}" for r in r8]
    ax.bar(range(len(r8)), [r["tflops_per_gpu"] for r in r8],
           color=["C0" if r["fits"] else "C3" for r in r8])
    ax.set_xticks(range(len(r8)), labels, rotation=30)
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("Figure 8: throughput per configuration (red: does not fit 32 GiB)")
    fig.tight_layout()
    fig.savefig(out / "fig8.png", dpi=110)


if __name__ == "__main__":
    main()
