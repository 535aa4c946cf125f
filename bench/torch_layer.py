#!/usr/bin/env python3
"""The PyTorch baseline for bench_layer: the same pre-LayerNorm GPT layer, as
one TP rank holds it (heads / TP, ffn / TP; no collectives), same shapes,
dtype, dropout and FLOP count, timed the same way (forward + backward, median
over steps after warm-up, synchronised). Two attention variants:
  sdpa    - torch.nn.functional.scaled_dot_product_attention (flash/cuDNN kernels)
  unfused - matmul + masked softmax + dropout + matmul (megazero's --attention-backend unfused)
--compile runs each variant under torch.compile (impl "torch-sdpa-compile" etc.; compilation
happens in the warm-up steps).
Prints a line per variant and a JSON line each, like bench_layer.

  python3 bench/torch_layer.py --hidden-size 8192 --num-attention-heads 64 \
      --tensor-model-parallel-size 16 --seq-length 1024 --micro-batch-size 32 --dtype bf16
  python3 bench/torch_layer.py --attention sdpa --compile
"""
import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F


class Layer(torch.nn.Module):
    def __init__(self, h, heads_local, head_dim, ffn_local, dropout, attention):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(h, eps=1e-5)
        self.qkv = torch.nn.Linear(h, 3 * heads_local * head_dim)
        self.dense = torch.nn.Linear(heads_local * head_dim, h)
        self.ln2 = torch.nn.LayerNorm(h, eps=1e-5)
        self.fc1 = torch.nn.Linear(h, ffn_local)
        self.fc2 = torch.nn.Linear(ffn_local, h)
        self.heads, self.d, self.p, self.attention = heads_local, head_dim, dropout, attention

    def attend(self, q, k, v):
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.d))
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return torch.matmul(F.dropout(probs, self.p), v)

    def forward(self, x):  # x: [B, S, h]
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads, 3, self.d)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        ctx = self.attend(q, k, v).transpose(1, 2).reshape(b, s, self.heads * self.d)
        x1 = x + F.dropout(self.dense(ctx), self.p)
        return x1 + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x1)), approximate="tanh")), self.p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden-size", type=int, default=8192)
    ap.add_argument("--num-attention-heads", type=int, default=64)
    ap.add_argument("--tensor-model-parallel-size", type=int, default=16)
    ap.add_argument("--seq-length", type=int, default=1024)
    ap.add_argument("--micro-batch-size", type=int, default=32)
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--attention", default="sdpa,unfused")
    ap.add_argument("--compile", action="store_true", help="torch.compile the layer")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    a = ap.parse_args()
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    h, tp, S, B = a.hidden_size, a.tensor_model_parallel_size, a.seq_length, a.micro_batch_size
    heads_local, d, ffn_local = a.num_attention_heads // tp, h // a.num_attention_heads, 4 * h // tp
    fwd = 24.0 * B * S * h * h + 4.0 * B * S * S * h
    flops = 3.0 * fwd / tp
    torch.manual_seed(0)
    for attention in a.attention.split(","):
        layer = Layer(h, heads_local, d, ffn_local, a.dropout, attention).cuda().to(dt)
        step, variant = layer, attention
        if a.compile:
            step = torch.compile(layer, mode=None if a.compile_mode == "default" else a.compile_mode)
            variant += "-compile" if a.compile_mode == "default" else f"-compile-{a.compile_mode}"
        x = torch.randn(B, S, h, device="cuda", dtype=dt, requires_grad=True)
        dy = torch.randn(B, S, h, device="cuda", dtype=dt) * 1e-3
        times = []
        for i in range(a.warmup + a.steps):
            if i == a.warmup:  # the timed steps' peak, not compilation's or autotuning's
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            step(x).backward(dy)
            end.record()
            torch.cuda.synchronize()
            if i >= a.warmup:
                times.append(start.elapsed_time(end))
            layer.zero_grad(set_to_none=True)
            x.grad = None
        med = statistics.median(times)
        tflops = flops / (med * 1e-3) / 1e12
        peak_mib = torch.cuda.max_memory_allocated() / 2**20
        print(f"torch {torch.__version__} {variant}: median {med:.3f} ms (min {min(times):.3f}, max {max(times):.3f}), "
              f"{tflops:.1f} TFLOP/s, MFU {100 * tflops / a.peak_tflops:.1f}% of {a.peak_tflops:.0f}, "
              f"peak memory {peak_mib:.0f} MiB")
        print("steps in order (ms): " + " ".join(f"{t:.3f}" for t in times))
        print(json.dumps({"bench": "layer", "impl": f"torch-{variant}", "dtype": a.dtype, "ms": round(med, 4),
                          "tflops": round(tflops, 2), "mfu": round(tflops / a.peak_tflops, 4),
                          "peak_mib": round(peak_mib, 1)}))
        del layer, step, x, dy
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
