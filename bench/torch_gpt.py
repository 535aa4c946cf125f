#!/usr/bin/env python3
"""The PyTorch peer of our end-to-end GPT step (pretrain_gpt --device cuda, ZeRO 0, one rank,
mock data): the same GPT-2, the same FLOP count, timed per training iteration.

Model (as layers/gpt_model.cpp builds it): learned word and position embeddings, embedding
dropout, pre-LN blocks (LayerNorm eps 1e-5; fused QKV linear; causal attention through
F.scaled_dot_product_attention(is_causal=True) with attention dropout; output projection;
residual dropout; MLP h -> 4h -> h with GeLU's tanh approximation; residual dropout), final
LayerNorm, logits through the tied word embedding. The vocabulary is padded to a multiple of
--make-vocab-size-divisible-by (padding rows zero) and the cross-entropy runs over the real
vocabulary only. Init: normal(0, --init-method-std) for weights, the attention output and fc2
weights scaled by 1/sqrt(2 layers), biases 0, LayerNorm 1/0.

Training step: forward, backward, grad clipping by global norm (--clip-grad), AdamW (fused where
the device has it; betas/eps/weight decay as ours, no decay on biases and LayerNorm), constant
learning rate (ours runs a cosine schedule: a scalar per step, nothing to time).

Precision: ours keeps bf16 parameters and gradients with fp32 master weights and Adam states.
The usual PyTorch practice for that is what this runs: fp32 parameters, gradients and Adam states
with torch.autocast(bf16) around forward (fp16: autocast fp16 plus a GradScaler; fp32: no
autocast). Memory is therefore not byte-for-byte ours: 16 bytes/parameter of states either way,
plus autocast's 16-bit weight copies and an fp32 residual stream here.

Timing: each iteration (fresh random tokens, forward, backward, clip, step, zero_grad) between
two device synchronisations, wall clock; the median over --steps after --warmup iterations
(compilation happens in the warm-up). FLOPs: Narayanan et al. (2021) eq. 3 as our
GPTModel::flops_per_token counts it (logits included, real vocabulary), MFU against
--peak-tflops (989 = H100 SXM dense bf16). Peak memory: torch.cuda.max_memory_allocated over
the timed steps. Prints a summary line and one JSON line (bench "gpt").

  python3 bench/torch_gpt.py                      # GPT-2 medium 355M, bf16, B 8, seq 1024, eager
  python3 bench/torch_gpt.py --compile            # the same model under torch.compile
  python3 bench/torch_gpt.py --device cpu --num-layers 2 --hidden-size 64 --num-attention-heads 4 \\
      --seq-length 32 --micro-batch-size 2 --vocab-size 1000 --steps 2 --warmup 1   # smoke test
"""
import argparse
import contextlib
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


def flops_per_token(layers, hidden, seq, vocab, ffn=None):
    """GPTModel::flops_per_token(false) for GPT-2 (multi-head attention, GeLU MLP): a layer's
    forward is 2 x its GEMM weights per token plus 4 s h (scores and context), x3 for forward and
    backward; the logits add 6 h V (V the real vocabulary)."""
    h, s, v = float(hidden), float(seq), float(vocab)
    f = float(ffn if ffn else 4 * hidden)
    weights = h * (h + 2.0 * h) + h * h + 2.0 * h * f
    return 3.0 * layers * (2.0 * weights + 4.0 * s * h) + 6.0 * h * v


def padded_vocab(vocab, multiple):
    return (vocab + multiple - 1) // multiple * multiple


class Block(torch.nn.Module):
    def __init__(self, h, heads, attn_dropout, hidden_dropout):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(h, eps=1e-5)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.dense = torch.nn.Linear(h, h)
        self.ln2 = torch.nn.LayerNorm(h, eps=1e-5)
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)
        self.heads, self.d = heads, h // heads
        self.attn_p, self.hidden_p = attn_dropout, hidden_dropout

    def forward(self, x):  # x: [B, S, h]
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads, 3, self.d)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        p = self.attn_p if self.training else 0.0
        ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        ctx = ctx.transpose(1, 2).reshape(b, s, h)
        x = x + F.dropout(self.dense(ctx), self.hidden_p, self.training)
        y = self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x + F.dropout(y, self.hidden_p, self.training)


class GPT(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        h = a.hidden_size
        self.vocab = a.vocab_size
        self.wte = torch.nn.Embedding(padded_vocab(a.vocab_size, a.make_vocab_size_divisible_by), h)
        self.wpe = torch.nn.Embedding(a.max_position_embeddings or a.seq_length, h)
        self.hidden_p = a.hidden_dropout
        self.blocks = torch.nn.ModuleList(
            Block(h, a.num_attention_heads, a.attention_dropout, a.hidden_dropout) for _ in range(a.num_layers))
        self.ln_f = torch.nn.LayerNorm(h, eps=1e-5)
        std, out_std = a.init_method_std, a.init_method_std / math.sqrt(2.0 * a.num_layers)
        with torch.no_grad():
            for m in self.modules():  # LayerNorms keep their 1 / 0
                if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                    m.weight.normal_(0.0, std)
                if isinstance(m, torch.nn.Linear):
                    m.bias.zero_()
            for blk in self.blocks:  # the layers' output projections
                blk.dense.weight.normal_(0.0, out_std)
                blk.fc2.weight.normal_(0.0, out_std)
            self.wte.weight[a.vocab_size:].zero_()  # padding rows, as ours

    def forward(self, ids, targets):  # [B, S] int64 each; returns the mean loss
        s = ids.shape[1]
        x = F.dropout(self.wte(ids) + self.wpe.weight[:s], self.hidden_p, self.training)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied; [B, S, padded V]
        v = self.vocab
        return F.cross_entropy(logits[..., :v].reshape(-1, v), targets.reshape(-1))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-layers", type=int, default=24)
    ap.add_argument("--hidden-size", type=int, default=1024)
    ap.add_argument("--num-attention-heads", type=int, default=16)
    ap.add_argument("--seq-length", type=int, default=1024)
    ap.add_argument("--max-position-embeddings", type=int, default=0, help="0: --seq-length")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--dropout", type=float, default=None, help="sets both dropouts")
    ap.add_argument("--hidden-dropout", type=float, default=0.1)
    ap.add_argument("--attention-dropout", type=float, default=0.1)
    ap.add_argument("--init-method-std", type=float, default=0.02)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--adam-beta1", type=float, default=0.9)
    ap.add_argument("--adam-beta2", type=float, default=0.999)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--clip-grad", type=float, default=1.0, help="0: no clipping")
    ap.add_argument("--steps", type=int, default=20, help="timed iterations")
    ap.add_argument("--warmup", type=int, default=10, help="untimed iterations first (compilation)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (forward and loss)")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense peak for MFU (H100 SXM bf16)")
    a = ap.parse_args(argv)
    if a.dropout is not None:
        a.hidden_dropout = a.attention_dropout = a.dropout
    if a.hidden_size % a.num_attention_heads:
        ap.error("--hidden-size must be divisible by --num-attention-heads")
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be positive and --warmup non-negative")
    return a


def impl_name(a):
    if not a.compile:
        return "torch-eager"
    return "torch-compile" if a.compile_mode == "default" else f"torch-compile-{a.compile_mode}"


def main(argv=None):
    a = parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(a.seed)
    model = GPT(a).to(dev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt_kw = dict(lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps)
    try:
        opt = torch.optim.AdamW(groups, fused=cuda, **opt_kw)
        fused = cuda
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(groups, **opt_kw)
        fused = False
    step_model = model
    if a.compile:
        step_model = torch.compile(model, mode=None if a.compile_mode == "default" else a.compile_mode)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.dtype)
    scaler = torch.amp.GradScaler(dev.type, enabled=a.dtype == "fp16")

    def autocast():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=dev.type, dtype=amp_dtype)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    B, S, V = a.micro_batch_size, a.seq_length, a.vocab_size
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        if i == a.warmup and cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        sync()
        t0 = time.perf_counter()
        ids = torch.randint(0, V, (B, S + 1), device=dev)  # mock data: a random batch per iteration
        inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        with autocast():
            loss = step_model(inputs, targets)
        scaler.scale(loss).backward()
        if a.clip_grad > 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(dt * 1e3)

    med = statistics.median(times)
    mean = statistics.fmean(times)  # tokens/s over the timed steps: the statistic ours reports
    tokens = B * S
    flops = flops_per_token(a.num_layers, a.hidden_size, S, V) * tokens
    tflops = flops / (med * 1e-3) / 1e12
    peak_mib = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None
    name = impl_name(a)
    print(f"GPT l={a.num_layers} h={a.hidden_size} heads={a.num_attention_heads} s={S} B={B} V={V} "
          f"(padded {padded_vocab(V, a.make_vocab_size_divisible_by)}) {a.dtype} on {dev}, "
          f"{n_params / 1e6:.2f}M parameters, dropout {a.hidden_dropout}/{a.attention_dropout}, "
          f"AdamW{' fused' if fused else ''}, torch {torch.__version__} {name}")
    print(f"{name}: median {med:.2f} ms/iter (min {min(times):.2f}, max {max(times):.2f} over {a.steps} steps "
          f"after {a.warmup}), {tokens / (med * 1e-3):.0f} tokens/s, {tflops:.1f} TFLOP/s, "
          f"MFU {100 * tflops / a.peak_tflops:.1f}% of {a.peak_tflops:.0f}, "
          f"peak memory {'n/a' if peak_mib is None else f'{peak_mib:.0f} MiB'}, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print("steps in order (ms): " + " ".join(f"{t:.2f}" for t in times))
    print(json.dumps({"bench": "gpt", "impl": name, "dtype": a.dtype, "layers": a.num_layers,
                      "hidden": a.hidden_size, "heads": a.num_attention_heads, "seq": S, "micro_batch": B,
                      "vocab": V, "ms": round(med, 4), "tokens_per_s": round(tokens / (med * 1e-3), 1),
                      "tflops": round(tflops, 2), "mfu": round(tflops / a.peak_tflops, 4),
                      "mean_ms": round(mean, 4), "mean_tokens_per_s": round(tokens / (mean * 1e-3), 1),
                      "mean_mfu": round(flops / (mean * 1e-3) / 1e12 / a.peak_tflops, 4),
                      "peak_mib": None if peak_mib is None else round(peak_mib, 1),
                      "loss": round(losses[-1], 4), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
