// Fused causal attention (fused_attention.h): validation, device dispatch and
// the CPU implementation.
//
// CPU algorithm, per block of kBlockRows query rows [i0, i1) of all BH
// matrices at once (keys [0, i1): the causal mask never needs later keys):
//   forward   scores = q_blk k^T          (GEMM, compute dtype)
//             row softmax as causal_softmax_forward computes it, the row's
//             log-sum-exp saved, dropout applied, rounded once -> probs
//             out_blk = probs v            (GEMM)
//   backward  P recomputed from lse; dv += P_dropped^T dout_blk;
//             dP = dout_blk v^T; dS = P (dropout'(dP) - rowsum(dout . out));
//             dq_blk = scale dS k; dk += scale dS^T q_blk
// The working set is [BH, rows, keys] per block instead of [BH, S, S].
// dk/dv accumulate over blocks: in fp32 workspaces for 16-bit storage (then
// rounded once), in place for fp32/fp64.
#include "megazero/kernels/fused_attention.h"

#include <cmath>
#include <limits>

#include "megazero/kernels/gemm.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/flash_attention.h"
#endif

namespace megazero::kernels {
namespace {

using namespace detail;  // kernel_support.h

// Query rows per block: large enough that the GEMMs run near the library's
// speed, small enough that the working set stays a fraction of [S, S].
constexpr i64 kBlockRows = 128;

struct Dims {
  i64 bh, s, d;
  i64 kv_group;  // query heads per k/v head
};

// The first key of row i of matrix bh: 0, or its document's start (clamped
// to [0, i] as the unfused softmax's, softmax.cpp).
struct KeyStarts {
  const std::int64_t* starts = nullptr;  // [samples * s]
  i64 heads = 1;                         // matrices of a sample
  i64 first(i64 bh, i64 i, i64 s) const {
    if (!starts) return 0;
    const std::int64_t st = starts[bh / heads * s + i];
    return st < 0 ? 0 : st > i ? i : st;
  }
};

KeyStarts check_key_starts(const char* op, const Tensor& q, const Tensor& key_starts, const Dims& dm) {
  const i64 samples = key_start_samples(op, q, key_starts, dm.s, dm.bh);
  if (samples == 0) return {};
  return {ptr<const std::int64_t>(key_starts), dm.bh / samples};
}

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float(op, "q", q);
  MZ_CHECK(q.dim() == 3, op, ": q must be [batch*heads, seq, head_dim], got ", q.to_string());
  check_operands(op, q, q.dtype(), {{"q", &q}, {"k", &k}, {"v", &v}});
  MZ_CHECK(
      k.dim() == 3 && k.size(0) > 0 && q.size(0) % k.size(0) == 0 && k.size(1) == q.size(1) && k.size(2) == q.size(2),
      op, ": k must be [batch*heads / group, seq, head_dim] for q ", q.to_string(), ", got ", k.to_string());
  check_shapes(op, k.shape(), {{"v", &v}});
  return {q.size(0), q.size(1), q.size(2), q.size(0) / k.size(0)};
}

// The CPU kernels take one k/v head per query head: a grouped k or v
// ([BH / group, S, D]) repeated into workspace (head h reads head h / group).
Tensor per_query_head(const Tensor& kv, const Dims& dm) {
  if (dm.kv_group == 1) return kv;
  Tensor out = Tensor::empty(kv.device_ptr(), {dm.bh, dm.s, dm.d}, kv.dtype(), MemoryCategory::Workspace, "attn-kv");
  const Tensor src = kv.view({dm.bh / dm.kv_group, 1, dm.s, dm.d});
  const Tensor dst = out.view({dm.bh / dm.kv_group, dm.kv_group, dm.s, dm.d});
  for (i64 j = 0; j < dm.kv_group; ++j) dst.narrow(1, j, 1).copy_from(src);
  return out;
}

void check_attention_dropout(const char* op, double p, const DropoutLayout& l, const Dims& d) {
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  MZ_CHECK(l.samples * l.groups == d.bh && l.matrix_rows == d.s && l.matrix_cols == d.s, op, ": dropout layout [",
           l.samples, ", ", l.groups, ", ", l.matrix_rows, ", ", l.matrix_cols,
           "] must be [samples, local heads, seq, seq] for ", d.bh, " matrices of ", d.s, " x ", d.s);
  check_layout(op, l, d.bh * d.s * d.s);
}

// What forward and backward share: q, k, v, lse, the dropout arguments, and a kernel for them.
Dims check_arguments(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, double p,
                     const DropoutLayout& layout) {
  const Dims dm = check_qkv(op, q, k, v);
  check_stat(op, "lse", lse, q, q.dtype());
  check_shape(op, "lse", lse, {dm.bh, dm.s});
  check_attention_dropout(op, p, layout, dm);
  const std::string why = fused_attention_unsupported(q.device().kind(), q.dtype(), dm.d);
  MZ_CHECK(why.empty(), op, ": ", why);
  return dm;
}

// A [BH, rows, keys] view at the start of a workspace buffer.
Tensor block_view(const Tensor& workspace, i64 bh, i64 rows, i64 keys) {
  return Tensor::view_of(workspace.buffer(), {bh, rows, keys}, workspace.dtype());
}

template <typename S>
void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Dims& dm, double scale, double p,
                 const RngKey& key, const DropoutLayout& layout, Tensor& out, Tensor& lse, KeyStarts ks) {
  using C = compute_t<S>;
  const bool host = on_host("fused_attention_forward", q);
  const i64 br = std::min(kBlockRows, dm.s);
  const DType cdt = row_stat_dtype(q.dtype());
  Tensor scores_ws = Tensor::empty(q.device_ptr(), {dm.bh * br * dm.s}, cdt, MemoryCategory::Workspace, "attn-scores");
  Tensor probs_ws =
      Tensor::empty(q.device_ptr(), {dm.bh * br * dm.s}, q.dtype(), MemoryCategory::Workspace, "attn-probs");
  const double keep_scale = p > 0 ? 1.0 / (1.0 - p) : 1.0;
  for (i64 i0 = 0; i0 < dm.s; i0 += br) {
    const i64 rows = std::min(br, dm.s - i0), keys = i0 + rows;
    Tensor scores = block_view(scores_ws, dm.bh, rows, keys);
    Tensor probs = block_view(probs_ws, dm.bh, rows, keys);
    gemm(q.narrow(1, i0, rows), false, k.narrow(1, 0, keys), true, scores);
    if (host) {
      C* sc = ptr<C>(scores);
      S* pr = ptr<S>(probs);
      C* ls = ptr<C>(lse);
      const C csc = static_cast<C>(scale);
#pragma omp parallel for num_threads(threads()) schedule(static) if (dm.bh * rows * keys > kParallelMin)
      for (i64 row = 0; row < dm.bh * rows; ++row) {
        const i64 bh = row / rows, i = i0 + row % rows, lo = ks.first(bh, i, dm.s);
        C* e = sc + row * keys;
        S* pd = pr + row * keys;
        // causal_softmax_forward's arithmetic, so the probabilities round alike.
        const C mx = scaled_max(e + lo, csc, i + 1 - lo);
        const double sum = exp_scaled_shifted(e + lo, csc, mx, e + lo, i + 1 - lo);
        ls[bh * dm.s + i] = static_cast<C>(static_cast<double>(mx) + std::log(sum));
        const double inv = 1.0 / sum;
        for (i64 j = 0; j < lo; ++j) pd[j] = zero<S>();
        if (p > 0) {
          const UniformStream uniform(key);
          const std::uint64_t base = dropout_row_base(layout, bh) + static_cast<std::uint64_t>(i * dm.s);
          alignas(64) float u[UniformStream::kFillMax];
          for (i64 j0 = lo; j0 <= i; j0 += UniformStream::kFillMax) {
            const i64 j1 = std::min(i + 1, j0 + UniformStream::kFillMax);
            uniform.fill(base + static_cast<std::uint64_t>(j0), j1 - j0, u);
            for (i64 j = j0; j < j1; ++j) pd[j] = u[j - j0] >= p ? st<S>(e[j] * inv * keep_scale) : zero<S>();
          }
        } else {
          for (i64 j = lo; j <= i; ++j) pd[j] = st<S>(e[j] * inv);
        }
        for (i64 j = i + 1; j < keys; ++j) pd[j] = zero<S>();
      }
    }
    Tensor out_blk = out.narrow(1, i0, rows);
    gemm(probs, false, v.narrow(1, 0, keys), false, out_blk);
  }
}

template <typename S>
void backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                  const Tensor& lse, const Dims& dm, double scale, double p, const RngKey& key,
                  const DropoutLayout& layout, Tensor& dq, Tensor& dk, Tensor& dv, KeyStarts ks) {
  using C = compute_t<S>;
  const bool host = on_host("fused_attention_backward", q);
  const auto& dev = q.device_ptr();
  const i64 br = std::min(kBlockRows, dm.s);
  const DType cdt = row_stat_dtype(q.dtype());
  const double keep_scale = p > 0 ? 1.0 / (1.0 - p) : 1.0;

  // rowsum(dout . out) = sum_j P_ij dropout'(dP)_ij: the softmax backward's
  // per-row dot product, without the probabilities.
  Tensor dot = Tensor::empty(dev, {dm.bh * dm.s}, cdt, MemoryCategory::Workspace, "attn-dout-dot-out");
  if (host) {
    const S* o = ptr<const S>(out);
    const S* g = ptr<const S>(dout);
    C* dd = ptr<C>(dot);
#pragma omp parallel for num_threads(threads()) schedule(static) if (dm.bh * dm.s * dm.d > kParallelMin)
    for (i64 row = 0; row < dm.bh * dm.s; ++row) {
      double acc = 0;
      for (i64 c = 0; c < dm.d; ++c) acc += static_cast<double>(ld(o[row * dm.d + c])) * ld(g[row * dm.d + c]);
      dd[row] = static_cast<C>(acc);
    }
  }
  constexpr bool kWide = is_16bit_v<S>;  // accumulate dk/dv in fp32, round once at the end
  Tensor dk_acc = kWide ? Tensor::zeros(dev, dk.shape(), DType::F32, MemoryCategory::Workspace, "attn-dk") : dk;
  Tensor dv_acc = kWide ? Tensor::zeros(dev, dv.shape(), DType::F32, MemoryCategory::Workspace, "attn-dv") : dv;
  if (!kWide) {
    dk.zero_();
    dv.zero_();
  }
  Tensor probs_ws = Tensor::empty(dev, {dm.bh * br * dm.s}, cdt, MemoryCategory::Workspace, "attn-probs");
  Tensor dprobs_ws = Tensor::empty(dev, {dm.bh * br * dm.s}, cdt, MemoryCategory::Workspace, "attn-dprobs");
  Tensor operand_ws = Tensor::empty(dev, {dm.bh * br * dm.s}, q.dtype(), MemoryCategory::Workspace, "attn-operand");
  for (i64 i0 = 0; i0 < dm.s; i0 += br) {
    const i64 rows = std::min(br, dm.s - i0), keys = i0 + rows;
    const Tensor q_blk = q.narrow(1, i0, rows), dout_blk = dout.narrow(1, i0, rows);
    const Tensor k_keys = k.narrow(1, 0, keys), v_keys = v.narrow(1, 0, keys);
    Tensor probs = block_view(probs_ws, dm.bh, rows, keys);
    Tensor dprobs = block_view(dprobs_ws, dm.bh, rows, keys);
    Tensor operand = block_view(operand_ws, dm.bh, rows, keys);  // dropped P, then dS (storage dtype)
    gemm(q_blk, false, k_keys, true, probs);
    if (host) {  // P from the saved log-sum-exp; operand = dropout(P)
      C* pr = ptr<C>(probs);
      S* od = ptr<S>(operand);
      const C* ls = ptr<const C>(lse);
#pragma omp parallel for num_threads(threads()) schedule(static) if (dm.bh * rows * keys > kParallelMin)
      for (i64 row = 0; row < dm.bh * rows; ++row) {
        const i64 bh = row / rows, i = i0 + row % rows, lo = ks.first(bh, i, dm.s);
        C* pp = pr + row * keys;
        S* o = od + row * keys;
        const double l = ls[bh * dm.s + i];
        const UniformStream uniform(key);
        const std::uint64_t base = dropout_row_base(layout, bh) + static_cast<std::uint64_t>(i * dm.s);
        alignas(64) float u[UniformStream::kFillMax];
        for (i64 j0 = 0; j0 < keys; j0 += UniformStream::kFillMax) {
          const i64 j1 = std::min(keys, j0 + UniformStream::kFillMax);
          if (p != 0) uniform.fill(base + static_cast<std::uint64_t>(j0), j1 - j0, u);
          for (i64 j = j0; j < j1; ++j) {
            const double pij = j >= lo && j <= i ? std::exp(scale * static_cast<double>(pp[j]) - l) : 0.0;
            pp[j] = static_cast<C>(pij);
            const bool keep = p == 0 || u[j - j0] >= p;
            o[j] = keep ? st<S>(pij * keep_scale) : zero<S>();
          }
        }
      }
    }
    Tensor dv_keys = dv_acc.narrow(1, 0, keys);
    gemm(operand, true, dout_blk, false, dv_keys, 1.0f, 1.0f);
    gemm(dout_blk, false, v_keys, true, dprobs);
    if (host) {  // operand = dS = P (dropout'(dP) - dot), rounded once
      const C* pr = ptr<const C>(probs);
      const C* dp = ptr<const C>(dprobs);
      S* od = ptr<S>(operand);
      const C* dd = ptr<const C>(dot);
#pragma omp parallel for num_threads(threads()) schedule(static) if (dm.bh * rows * keys > kParallelMin)
      for (i64 row = 0; row < dm.bh * rows; ++row) {
        const i64 bh = row / rows, i = i0 + row % rows, lo = ks.first(bh, i, dm.s);
        const double d = dd[bh * dm.s + i];
        const UniformStream uniform(key);
        const std::uint64_t base = dropout_row_base(layout, bh) + static_cast<std::uint64_t>(i * dm.s);
        alignas(64) float u[UniformStream::kFillMax];
        for (i64 j0 = 0; j0 < keys; j0 += UniformStream::kFillMax) {
          const i64 j1 = std::min(keys, j0 + UniformStream::kFillMax);
          if (p != 0) uniform.fill(base + static_cast<std::uint64_t>(j0), j1 - j0, u);
          for (i64 j = j0; j < j1; ++j) {
            const i64 e = row * keys + j;
            if (j > i || j < lo) {
              od[e] = zero<S>();
              continue;
            }
            const bool keep = p == 0 || u[j - j0] >= p;
            const double g = keep ? static_cast<double>(dp[e]) * keep_scale : 0.0;
            od[e] = st<S>(scale * static_cast<double>(pr[e]) * (g - d));
          }
        }
      }
    }
    Tensor dq_blk = dq.narrow(1, i0, rows);
    gemm(operand, false, k_keys, false, dq_blk);
    Tensor dk_keys = dk_acc.narrow(1, 0, keys);
    gemm(operand, true, q_blk, false, dk_keys, 1.0f, 1.0f);
  }
  if (kWide) {
    dk.copy_from(dk_acc);
    dv.copy_from(dv_acc);
  }
}

// The planner's dry run standing in for the CUDA kernel: what its GEMM-like
// work is, for the time model (the causal half of each S x S product; forward
// QK^T and PV, backward seven: S and dP twice, dV, dK, dQ).
void log_fused_work(const Tensor& q, const Dims& dm, int products) {
  auto& meta = static_cast<MetaDevice&>(q.device());
  for (int i = 0; i < products; ++i) meta.compute_log().add_gemm({dm.s, (dm.s + 1) / 2, dm.d, dm.bh, q.dtype()});
}

}  // namespace

std::string fused_attention_unsupported(DeviceKind device, DType dtype, std::int64_t head_dim) {
  if (device != DeviceKind::CUDA) return {};
  if (dtype != DType::BF16 && dtype != DType::F16)
    return "the CUDA fused attention kernel takes bf16 or fp16 activations (--bf16 or --fp16)";
  if (head_dim > 128 || head_dim % 8 != 0)
    return ::megazero::detail::concat(
        "the CUDA fused attention kernel takes head sizes that are multiples of 8 up to 128, not ", head_dim);
  return {};
}

void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double p,
                             const RngKey& key, const DropoutLayout& layout, Tensor& out, Tensor& lse,
                             const Tensor& key_starts) {
  const char* op = "fused_attention_forward";
  const Dims dm = check_arguments(op, q, k, v, lse, p, layout);
  check_operand(op, "out", out, q, q.dtype());
  check_shape(op, "out", out, q.shape());
  const KeyStarts ks = check_key_starts(op, q, key_starts, dm);
#ifdef MEGAZERO_WITH_CUDA
  MZ_ON_CUDA(
      q, cuda::flash_attention_forward(q.dtype(), q.data(), k.data(), v.data(), dm.bh, dm.s, dm.d, dm.kv_group, scale,
                                       p, key, layout, out.data(), ptr<float>(lse), stream_of(q), ks.starts, ks.heads));
#endif
  if (q.device().kind() == DeviceKind::Meta && static_cast<MetaDevice&>(q.device()).kernels() != DeviceKind::CPU) {
    log_fused_work(q, dm, 2);
    return;
  }
  const Tensor kh = per_query_head(k, dm), vh = per_query_head(v, dm);
  with_storage_type(q.dtype(),
                    [&](auto tag) { forward_cpu<decltype(tag)>(q, kh, vh, dm, scale, p, key, layout, out, lse, ks); });
}

void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, double scale, double p, const RngKey& key, const DropoutLayout& layout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& key_starts) {
  const char* op = "fused_attention_backward";
  const Dims dm = check_arguments(op, q, k, v, lse, p, layout);
  check_operands(op, q, q.dtype(), {{"out", &out}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  check_shapes(op, q.shape(),
               {{"out", &out}, {"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});  // dk, dv per query head
  const KeyStarts ks = check_key_starts(op, q, key_starts, dm);
  const Tensor ws = allocate_gpu_scratch(q, gpu_scratch::flash_backward_bytes(dm.bh, dm.s), "flash backward row dots");
#ifdef MEGAZERO_WITH_CUDA
  MZ_ON_CUDA(q, cuda::flash_attention_backward(q.dtype(), q.data(), k.data(), v.data(), out.data(), dout.data(),
                                               ptr<float>(lse), dm.bh, dm.s, dm.d, dm.kv_group, scale, p, key, layout,
                                               dq.data(), dk.data(), dv.data(), scratch_of(ws), stream_of(q), ks.starts,
                                               ks.heads));
#endif
  if (q.device().kind() == DeviceKind::Meta && static_cast<MetaDevice&>(q.device()).kernels() != DeviceKind::CPU) {
    log_fused_work(q, dm, 7);
    return;
  }
  const Tensor kh = per_query_head(k, dm), vh = per_query_head(v, dm);
  with_storage_type(q.dtype(), [&](auto tag) {
    backward_cpu<decltype(tag)>(q, kh, vh, out, dout, lse, dm, scale, p, key, layout, dq, dk, dv, ks);
  });
}

}  // namespace megazero::kernels
