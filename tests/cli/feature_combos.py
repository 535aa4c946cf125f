#!/usr/bin/env python3
"""feature_combos.py --exe PRETRAIN_GPT [--combos N] [--seed S] [--jobs J]

Features meet in combinations no hand-written test lists. Each combination
draws a model (positions, norms, the MLP, grouped queries, biases, tied output,
dropout, precision, packed documents, the loss mask, clipping) and a layout to
train it on (2 or 4 ranks, TP, sequence parallelism, a ZeRO stage, ZeRO-R,
offload, the overlaps, bucket sizes, the attention backend, the device and the
transport, and switches that change no result), trains it there for a few iterations, and trains the same model on
one rank (TP 1, stage 0, nothing else) with the same global batch. What must
hold, for every draw:

- each run ends with exit 0, or refuses with exit 2 and a message that names a
  flag (`--...`): no crash, no hang, no other exit;
- a refusal comes from the layout, never from the model (the one-rank run
  trains the model, so the model's flags are accepted);
- both runs log a loss for every iteration and a validation loss, all finite,
  and the layout's equal the one rank's to rounding: 2e-5 relative in fp32,
  2e-3 in bf16/fp16 (a layout sums in another order; the dropout masks and
  data are the same by construction). With --eod-mask-loss alone the loss is
  the mean of each micro-batch's mean (Megatron's), so the layout keeps the
  one rank's micro-batches then;
- in 40% of the draws the layout saves halfway and a second layout, drawn
  the same way, loads that checkpoint and trains on: its losses are the one
  rank's to the same rounding (checkpoints load on any layout, with or
  without offload, on either device); with --convert that checkpoint is
  also exported to Hugging Face's format and imported back, and must give
  the same logits (or the export refuses naming a flag).

The draws come from --seed, so a failure prints the command lines that
reproduce it. --device puts every run on one device (the one-rank run too):
tools/gpu_session.sh's combos phase runs the same draws on cuda, where the
fused draws take cuDNN's attention half the time. CI runs a few combinations (tests/CMakeLists.txt); a session
runs hundreds with another seed.
"""
import argparse
import concurrent.futures
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile

ITERS = 6
GLOBAL_BATCH = 16
RUN_TIMEOUT = 240
BASE = ["--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "64", "--mock-data", "--vocab-size", "256", "--global-batch-size",
        str(GLOBAL_BATCH), "--train-iters", str(ITERS), "--log-interval", "1", "--eval-interval", str(ITERS),
        "--eval-iters", "1", "--lr", "3e-3", "--lr-warmup-iters", "2", "--seed", "1234"]
EOD = "7"  # frequent enough in 256-token mock data to end documents inside samples


def draw_model(r):
    """The model's flags: both runs get them."""
    f = []
    layers = r.choice([2, 2, 3])
    f += ["--num-layers", str(layers)]
    # A quarter of the models are GPT-2s and a quarter Llamas (what Hugging
    # Face's formats hold: --convert exports them), the rest anything.
    family = r.choice(["gpt2", "llama", "any", "any"])
    gpt2, llama = family == "gpt2", family == "llama"
    rope = r.random() < 0.5
    if (rope or llama) and not gpt2:
        f += ["--position-embedding-type", "rope"]
        if r.random() < 0.25:
            f += ["--rotary-seq-len-interpolation-factor", "2"]
        if r.random() < 0.25:
            f += ["--rotary-interleaved"]
        if r.random() < 0.2:  # Llama 3's frequencies; a base whose frequencies reach all three bands
            f += ["--use-rope-scaling", "--rope-scaling-factor", "8", "--rotary-base", "500000"]
    if (r.random() < 0.4 or llama) and not gpt2:
        f += ["--normalization", "RMSNorm"]
    if r.random() < 0.2 and family == "any":
        f += ["--apply-layernorm-1p"]
    mlp = r.random()
    if (mlp < 0.35 or llama) and not gpt2:
        f += ["--swiglu"]
    elif mlp < 0.5 and family == "any":
        f += ["--squared-relu"]
    if r.random() < 0.15:
        f += ["--init-method-xavier-uniform"]
    if r.random() < 0.25 and family == "any":
        f += ["--qk-layernorm"]
    if r.random() < 0.12 and family == "any":
        f += ["--apply-residual-connection-post-layernorm"]
    if r.random() < 0.35 and not gpt2:
        f += ["--group-query-attention", "--num-query-groups", r.choice(["1", "2"])]
    if r.random() < 0.3 and not gpt2:
        f += ["--disable-bias-linear"]
        if r.random() < 0.4:  # the QKV projection keeps its bias (Qwen2)
            f += ["--add-qkv-bias"]
    if r.random() < 0.3 and not gpt2:
        f += ["--untie-embeddings-and-output-weights"]
    if r.random() < 0.15:
        f += ["--no-bias-gelu-fusion"]
    if r.random() < 0.5:
        f += ["--hidden-dropout", "0.1"]
    else:
        f += ["--hidden-dropout", "0"]
    if r.random() < 0.5:
        f += ["--attention-dropout", "0.1"]
    else:
        f += ["--attention-dropout", "0"]
    precision = r.choice(["fp32", "fp32", "bf16", "fp16"])
    if precision == "bf16":
        f += ["--bf16"]
    elif precision == "fp16":
        f += ["--fp16", "--initial-loss-scale", "1024"]
    eod = False
    if r.random() < 0.25:
        f += ["--eod-mask-loss"]
        eod = True
        if r.random() < 0.5:
            f += ["--calculate-per-token-loss"]
    if r.random() < 0.25:
        f += ["--reset-position-ids"]
        eod = True
    if r.random() < 0.25:
        f += ["--reset-attention-mask"]
        eod = True
    if eod:
        f += ["--eod-token-id", EOD]
    f += ["--clip-grad", r.choice(["0", "1.0", "1.0"])]
    return f, precision, layers


def draw_layout(r, precision, layers, model, device=None):
    """Where the model trains: only the second run gets these."""
    n = r.choice([2, 4, 4])
    tps = [t for t in (1, 2, 4) if t <= n]
    if "--num-query-groups" in model and r.random() < 0.8:  # mostly a TP size the groups allow
        groups = int(model[model.index("--num-query-groups") + 1])
        tps = [t for t in tps if groups % t == 0]
    tp = r.choice(tps)
    dp = n // tp
    stage = r.randint(0, 3)
    f = ["--tensor-model-parallel-size", str(tp), "--zero-stage", str(stage)]
    if tp > 1 and r.random() < 0.5:
        f += ["--sequence-parallel"]
    micro = r.choice([m for m in (1, 2, 4, 8) if GLOBAL_BATCH % (m * dp) == 0])
    if "--eod-mask-loss" in model and "--calculate-per-token-loss" not in model:
        micro = 4  # the loss is then the mean of each micro-batch's mean: the one rank's micro-batches

    f += ["--micro-batch-size", str(micro)]
    recompute = r.choice(["none", "none", "full", "selective", "block", "uniform"])
    if recompute == "full":
        f += ["--recompute-activations"]
    elif recompute == "selective":
        f += ["--recompute-granularity", "selective"]
    elif recompute == "block":
        f += ["--recompute-activations", "--recompute-method", "block", "--recompute-num-layers",
              str(r.randint(1, layers))]
    elif recompute == "uniform":
        f += ["--recompute-activations", "--recompute-method", "uniform", "--recompute-num-layers",
              str(r.randint(1, layers))]
    if recompute in ("full", "block", "uniform"):
        if r.random() < 0.5:
            f += ["--partition-activations"]
            if r.random() < 0.5:
                f += ["--cpu-checkpointing"]
        if r.random() < 0.4:
            f += ["--contiguous-memory-optimization"]
    if precision != "fp32" and r.random() < 0.3:
        f += ["--optimizer-cpu-offload"]
        if stage == 3 and r.random() < 0.5:
            f += ["--param-cpu-offload"]
    if stage == 0 and "--optimizer-cpu-offload" not in f and r.random() < 0.3:
        f += ["--overlap-optimizer", "true"]
    if stage in (1, 2) and r.random() < 0.3:
        f += ["--overlap-param-gather=false"]
    if stage == 3 and r.random() < 0.3:
        f += ["--stage3-prefetch", "false"]
    if r.random() < 0.3:
        f += ["--reduce-bucket-size", str(r.choice([2000, 5000, 20000]))]
    if r.random() < 0.4:
        # cuDNN's attention where the device has it (one number drawn either
        # way, so a seed draws the same combinations on every device)
        cudnn = r.random() < 0.5
        f += ["--attention-backend", "cudnn" if device == "cuda" and cudnn else "fused"]
    # Switches that change no result: the CPU's unfused epilogue passes, the
    # planned arena, no overlap of the gradient buckets, the logged norms
    # and zero counts, the collectives' cross-check, deterministic kernels.
    epilogues = r.choice(["forward", "all"])
    if r.random() < 0.2 and "--disable-bias-linear" not in model:  # (no biases: refused, nothing to fuse)
        f += ["--gemm-epilogues=" + epilogues]
    if r.random() < 0.2:
        f += ["--device-arena"]
    if r.random() < 0.15:
        f += ["--overlap-comm", "false"]
    if r.random() < 0.2:
        f += ["--log-params-norm", "--log-num-zeros-in-grad"]
    if r.random() < 0.1:
        f += ["--check-collectives"]
    if r.random() < 0.1:
        f += ["--deterministic-mode"]
    drawn = r.choice(["cpu", "cpu-isolated"])
    f += ["--device", device or drawn]
    if r.random() < 0.3:
        f += ["--distributed-backend", "shm"]
    return n, f


LOSS = re.compile(r"\| lm loss ([0-9.eE+-]+|nan|inf|-inf)")
VALID = re.compile(r"validation loss at iteration \d+: ([0-9.eE+-]+|nan|inf)")


def run(exe, ranks, flags, workdir):
    return run_cmd([os.environ.get("MZ_MPIEXEC", "mpiexec"), "-n", str(ranks), exe] + BASE + flags, workdir)


def run_cmd(cmd, workdir):
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGAZERO_NUM_THREADS="1")
    # A session of its own, so a run past its time is ended with every rank
    # (mpiexec alone would leave them).
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir,
                         start_new_session=True)
    RUNNING.add(p)
    try:
        out, _ = p.communicate(timeout=RUN_TIMEOUT)
        return cmd, p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return cmd, f"timeout after {RUN_TIMEOUT} s (a hang)", out
    finally:
        RUNNING.discard(p)


RUNNING = set()  # the runs in flight, ended with this script (CTest's timeout, ^C)


def end_runs(signum, _frame):
    for p in list(RUNNING):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sys.exit(128 + signum)


def losses(out):
    return [float(x) for x in LOSS.findall(out)] + [float(x) for x in VALID.findall(out)]


def refusal_named(out):
    return re.search(r"--[a-z]", out) is not None


def read_logits(path):
    with open(path) as f:
        words = f.read().split()
    return [float(w) for w in words[2:]]  # after "rows cols"


def hf_round_trip(convert, work, device):
    """The checkpoint exported to Hugging Face's format and imported back: the
    same logits (fp32 export), or the export refused naming a flag.
    Returns (problem or None, verdict words)."""
    dev = ["--device", device] if device else []
    cmd, rc, out = run_cmd([convert, "export", "--load", "ckpt", "--output", "hf", "--dtype", "fp32"], work)
    if rc == 2 and refusal_named(out):
        return None, "no Hugging Face form (refused by name)"
    if rc != 0:
        return f"export ended with {rc}: {' '.join(cmd)}\n" + "\n".join(out.strip().splitlines()[-8:]), ""
    steps = [[convert, "import", "--input", "hf", "--save", "imported"] + dev]
    for load, name in (("ckpt", "a.txt"), ("imported", "b.txt")):
        steps.append([convert, "logits", "--load", load, "--tokens", "1,2,3,5,8,13,21,34", "--output", name] + dev)
    for step in steps:
        cmd, rc, out = run_cmd(step, work)
        if rc != 0:
            return f"{step[1]} ended with {rc}: {' '.join(cmd)}\n" + "\n".join(out.strip().splitlines()[-8:]), ""
    a, b = read_logits(os.path.join(work, "a.txt")), read_logits(os.path.join(work, "b.txt"))
    largest = max(abs(x) for x in a) if a else 0.0
    worst = max((abs(x - y) for x, y in zip(a, b)), default=math.inf) if len(a) == len(b) else math.inf
    if not worst <= 1e-4 * largest + 1e-6:
        return f"the Hugging Face export, imported back, computes other logits: {worst:.3g} off (largest {largest:.3g})", ""
    return None, f"exported and imported back ({worst / max(largest, 1e-30):.2g})"


def check(exe, index, seed, device=None, convert=None):
    r = random.Random(seed * 100003 + index)
    model, precision, layers = draw_model(r)
    ranks, layout = draw_layout(r, precision, layers, model, device)
    resume = r.random() < 0.4
    if resume:  # the layout saves halfway; another layout loads it and trains on
        ranks2, layout2 = draw_layout(r, precision, layers, model, device)
        layout += ["--save", "ckpt", "--save-interval", str(ITERS // 2)]
        layout2 += ["--load", "ckpt", "--ckpt-step", str(ITERS // 2)]
    with tempfile.TemporaryDirectory() as work:
        ref_cmd, ref_rc, ref_out = run(exe, 1, model + ["--micro-batch-size", "4"] + (["--device", device] if device else []), work)
        cmd, rc, out = run(exe, ranks, model + layout, work)
        runs = [("one rank", ref_cmd, ref_rc, ref_out), ("layout", cmd, rc, out)]
        if resume and rc == 0:
            cmd2, rc2, out2 = run(exe, ranks2, model + layout2, work)
            runs.append(("resumed on another layout", cmd2, rc2, out2))
            if convert:
                hf_problem, hf_verdict = hf_round_trip(convert, work, device)
    show = lambda c: " ".join(c)
    problems = []
    if resume and rc == 0 and convert:
        if hf_problem:
            problems.append(hf_problem)
    for name, c, code, text in runs:
        if code == 0:
            continue
        if code == 2 and refusal_named(text):
            if name == "one rank":
                problems.append("the one-rank run refused the model's flags")
            continue
        tail = "\n".join(text.strip().splitlines()[-15:])
        problems.append(f"{name} ended with {code}:\n{tail}")
    verdict = "ok"
    if not problems and rc == 2:
        verdict = "refused: " + next((l for l in out.splitlines() if "--" in l), "").strip()[:200]
    if not problems and rc == 0 and ref_rc == 0:
        a, b = losses(ref_out), losses(out)
        if len(a) != ITERS + 1 or len(b) != ITERS + 1:
            problems.append(f"expected {ITERS} losses and a validation loss, got {len(a)} and {len(b)}")
        else:
            tol = 2e-5 if precision == "fp32" else 2e-3
            worst = max(abs(x - y) / max(abs(x), 1e-12) if math.isfinite(x) and math.isfinite(y) else math.inf
                        for x, y in zip(a, b))
            if not worst <= tol:
                problems.append(f"losses differ by {worst:.3g} relative (tolerance {tol}):\n  one rank {a}\n"
                                f"  layout   {b}")
            verdict = f"ok (largest relative difference {worst:.2g})"
            if len(runs) == 3 and runs[2][2] == 0:
                c = losses(runs[2][3])
                half = ITERS // 2
                if len(c) != ITERS - half + 1:
                    problems.append(f"the resumed run logged {len(c)} losses, not {ITERS - half + 1}")
                else:
                    worst2 = max(abs(x - y) / max(abs(x), 1e-12) if math.isfinite(y) else math.inf
                                 for x, y in zip(a[half:], c))
                    if not worst2 <= tol:
                        problems.append(f"the resumed run's losses differ by {worst2:.3g} relative:\n"
                                        f"  one rank {a[half:]}\n  resumed  {c}")
                    verdict += f", resumed on another layout ({worst2:.2g})"
            elif len(runs) == 3:
                verdict += ", the other layout refused the checkpoint's model with a named flag"
            if resume and convert and hf_verdict:
                verdict += ", " + hf_verdict
    report = f"combo {index}: {'FAIL' if problems else verdict}\n  one rank: {show(ref_cmd)}\n  layout:   {show(cmd)}"
    if len(runs) == 3:
        report += f"\n  resumed:  {show(runs[2][1])}"
    if problems:
        report += "\n  " + "\n  ".join(problems)
    return not problems, rc == 2, report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", required=True)
    ap.add_argument("--combos", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first", type=int, default=0, help="the first combination's index (to rerun one)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--device", help="every run on this device (the one-rank run too), e.g. cuda on a GPU lease")
    ap.add_argument("--convert", help="convert_checkpoint: the saved checkpoints also exported to Hugging Face's "
                    "format and imported back, with the same logits (or the export refused naming a flag)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, end_runs)
    signal.signal(signal.SIGINT, end_runs)
    exe = os.path.abspath(a.exe)
    failed = refused = 0
    idx = range(a.first, a.first + a.combos)
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for ok, was_refused, report in pool.map(lambda i: check(exe, i, a.seed, a.device, a.convert and os.path.abspath(a.convert)), idx):
            failed += not ok
            refused += was_refused
            if not ok or a.verbose:
                print(report, flush=True)
            else:
                print(report.splitlines()[0], flush=True)
    print(f"feature_combos: {a.combos} combinations (seed {a.seed}): {a.combos - failed} passed "
          f"({refused} of them refused by the layout with a named flag), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
