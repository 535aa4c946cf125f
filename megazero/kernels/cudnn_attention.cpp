#include "megazero/kernels/cudnn_attention.h"

#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/kernel_support.h"

#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cudnn_sdpa.h"
#endif

namespace megazero::kernels {
namespace {

using namespace detail;  // kernel_support.h

struct Dims4 {
  std::int64_t b, h, s, d;
  std::int64_t hk;  // k/v heads (h, or a divisor of h)
};

// A [b, heads, s, d] view of `dtype` with unit stride in d, on ref's device.
void check_view(const char* op, const char* name, const Tensor& t, const Tensor& ref, const Dims4& dm,
                std::int64_t heads) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  MZ_CHECK(t.dtype() == ref.dtype(), op, ": ", name, " must be ", dtype_name(ref.dtype()), ", got ", t.to_string());
  MZ_CHECK(t.dim() == 4 && t.size(0) == dm.b && t.size(1) == heads && t.size(2) == dm.s && t.size(3) == dm.d, op, ": ",
           name, " has shape ", shape_str(t.shape()), ", expected (", dm.b, ", ", heads, ", ", dm.s, ", ", dm.d, ")");
  MZ_CHECK(t.strides()[3] == 1, op, ": ", name, " needs unit stride in the head dimension, got strides ",
           shape_str(t.strides()));
  MZ_CHECK(t.device().kind() == ref.device().kind() && t.device().index() == ref.device().index(), op, ": ", name,
           " is on ", t.device().name(), " but q is on ", ref.device().name());
}

// CUDA, or the meta device standing in for it; everything else runs the
// host reference below.
bool runs_on_gpu(const Tensor& t) {
  const DeviceKind kind =
      t.device().kind() == DeviceKind::Meta ? static_cast<MetaDevice&>(t.device()).kernels() : t.device().kind();
  return kind == DeviceKind::CUDA;
}

// The host reference: the same contract through fused_attention_* on
// contiguous copies (Philox masks). Users never reach it (the arguments refuse
// --attention-backend cudnn off CUDA); it lets CPU CI prove the layer's
// strided plumbing (TP equivalence, finite differences, activation bytes).
Tensor contiguous_heads(const Tensor& view) {
  Tensor t = Tensor::empty(view.device_ptr(), {view.size(0) * view.size(1), view.size(2), view.size(3)}, view.dtype(),
                           MemoryCategory::Workspace, "cudnn reference operand");
  t.view(view.shape()).copy_from(view);
  return t;
}

// Per-query-head [b*h, s, d] gradients summed over each group of h / hk
// consecutive heads into the [b, hk, s, d] view `out` (in head order).
void sum_groups_into(const Tensor& per_head, const Dims4& dm, Tensor& out) {
  const std::int64_t P = dm.h / dm.hk;
  const Tensor five = per_head.view({dm.b, dm.hk, P, dm.s, dm.d});
  Tensor acc = Tensor::empty(per_head.device_ptr(), {dm.b, dm.hk, dm.s, dm.d}, per_head.dtype(),
                             MemoryCategory::Workspace, "cudnn reference group sum");
  acc.copy_from(five.select(2, 0));
  if (P > 1) {
    Tensor term = Tensor::empty(per_head.device_ptr(), acc.shape(), acc.dtype(), MemoryCategory::Workspace,
                                "cudnn reference group term");
    for (std::int64_t j = 1; j < P; ++j) {
      term.copy_from(five.select(2, j));
      add(acc, term, acc);
    }
  }
  out.copy_from(acc);
}

// q and the per-query-head operands have q's heads; `kv_views` (k, v, dk, dv)
// have k's, which must divide them.
Dims4 check_arguments(const char* op, const Tensor& q, const Tensor& k, const Tensor& lse, double p,
                      std::initializer_list<Named> views, std::initializer_list<Named> kv_views) {
  MZ_CHECK(q.defined() && q.dim() == 4, op, ": q must be [samples, heads, S, D], got ",
           q.defined() ? q.to_string() : "undefined");
  MZ_CHECK(k.defined() && k.dim() == 4, op, ": k must be [samples, k/v heads, S, D]");
  const Dims4 dm{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)};
  MZ_CHECK(dm.hk > 0 && dm.h % dm.hk == 0, op, ": ", dm.hk, " k/v heads do not divide ", dm.h, " query heads");
  check_view(op, "q", q, q, dm, dm.h);
  for (const auto& [name, t] : views) check_view(op, name, *t, q, dm, dm.h);
  for (const auto& [name, t] : kv_views) check_view(op, name, *t, q, dm, dm.hk);
  check_stat(op, "lse", lse, q, q.dtype());
  check_shape(op, "lse", lse, {dm.b * dm.h, dm.s});
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability must be in [0, 1), got ", p);
  if (runs_on_gpu(q)) {
    const std::string why = cudnn_attention_unsupported(DeviceKind::CUDA, q.dtype(), dm.d);
    MZ_REQUIRE(why.empty(), why);
  }
  return dm;
}

// key_starts: int64 [b * s] on q's device, or undefined; the samples of a bias (0: none).
std::int64_t check_key_starts(const char* op, const Tensor& q, const Tensor& key_starts, const Dims4& dm) {
  const std::int64_t samples = key_start_samples(op, q, key_starts, dm.s, dm.b);
  MZ_CHECK(samples == 0 || samples == dm.b, op, ": key_starts must be [", dm.b * dm.s, "] (samples x S), got ",
           key_starts.to_string());
  return samples;
}

#ifdef MEGAZERO_WITH_CUDA
cuda::sdpa::Strides4 strides_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2], t.strides()[3]};
}

// The forward's problem; its backward fields repeat O's, so the forward plan's
// key does not depend on what the backward will pass.
cuda::sdpa::Problem forward_problem(const Dims4& dm, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, double scale, double p, bool bias) {
  cuda::sdpa::Problem pr;
  pr.bias = bias;
  pr.b = dm.b;
  pr.h = dm.h;
  pr.s = dm.s;
  pr.d = dm.d;
  pr.hk = dm.hk;
  pr.io = q.dtype() == DType::BF16 ? cuda::sdpa::ElementType::bf16 : cuda::sdpa::ElementType::f16;
  pr.scale = scale;
  pr.dropout = p;
  pr.q = strides_of(q), pr.k = strides_of(k), pr.v = strides_of(v), pr.o = strides_of(out);
  pr.d_o = pr.dq = pr.dk = pr.dv = pr.o;
  return pr;
}

cuda::sdpa::Problem backward_problem(cuda::sdpa::Problem pr, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv, bool deterministic) {
  pr.d_o = strides_of(dout), pr.dq = strides_of(dq), pr.dk = strides_of(dk), pr.dv = strides_of(dv);
  pr.deterministic = deterministic;
  return pr;
}
#endif

// The planner's dry run: the causal halves of the products (forward QK^T and
// PV; backward S again, dP, dV, dK, dQ).
void log_work(const Tensor& q, const Dims4& dm, int products) {
  auto& meta = static_cast<MetaDevice&>(q.device());
  for (int i = 0; i < products; ++i) meta.compute_log().add_gemm({dm.s, (dm.s + 1) / 2, dm.d, dm.b * dm.h, q.dtype()});
}

}  // namespace

std::string cudnn_attention_unsupported(DeviceKind device, DType dtype, std::int64_t head_dim) {
  if (device != DeviceKind::CUDA)
    return "--attention-backend cudnn runs on --device cuda only; on this device use --attention-backend fused "
           "(the same fused math) or unfused";
#ifndef MEGAZERO_WITH_CUDA
  return "--attention-backend cudnn needs a build with the CUDA backend (tools/build.sh with CUDA and cuDNN "
         "installed)";
#endif
  if (dtype != DType::BF16 && dtype != DType::F16)
    return "--attention-backend cudnn takes bf16 or fp16 activations (--bf16 or --fp16)";
  if (head_dim > 128 || head_dim % 8 != 0)
    return ::megazero::detail::concat(
        "--attention-backend cudnn takes head sizes that are multiples of 8 up to 128, "
        "not ",
        head_dim, "; use --attention-backend unfused");
  return {};
}

void cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double p,
                             const RngKey& key, const DropoutLayout& layout, Tensor& out, Tensor& lse,
                             const Tensor& key_starts) {
  const char* op = "cudnn_attention_forward";
  const Dims4 dm = check_arguments(op, q, k, lse, p, {{"out", &out}}, {{"k", &k}, {"v", &v}});
  const std::int64_t bias_samples = check_key_starts(op, q, key_starts, dm);
  const Tensor ws = allocate_gpu_scratch(
      q, gpu_scratch::cudnn_sdpa_scratch(false, false, dm.b * dm.h, dm.s, dm.d, bias_samples).total(),
      "cuDNN attention");
#ifdef MEGAZERO_WITH_CUDA
  if (q.device().kind() == DeviceKind::CUDA) {
    cuda::cudnn_sdpa_forward(forward_problem(dm, q, k, v, out, scale, p, bias_samples > 0), q.data(), k.data(),
                             v.data(), out.data(), ptr<float>(lse), cuda::cudnn_dropout_seed(key, layout),
                             scratch_of(ws), stream_of(q),
                             bias_samples > 0 ? ptr<const std::int64_t>(key_starts) : nullptr);
    return;
  }
#endif
  if (runs_on_gpu(q)) {
    log_work(q, dm, 2);  // the meta device standing in for CUDA
    return;
  }
  Tensor o = Tensor::empty(out.device_ptr(), {dm.b * dm.h, dm.s, dm.d}, out.dtype(), MemoryCategory::Workspace,
                           "cudnn reference output");
  fused_attention_forward(contiguous_heads(q), contiguous_heads(k), contiguous_heads(v), scale, p, key, layout, o, lse,
                          key_starts);
  out.copy_from(o.view(out.shape()));
}

void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, double scale, double p, const RngKey& key, const DropoutLayout& layout,
                              bool deterministic, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& key_starts) {
  const char* op = "cudnn_attention_backward";
  const Dims4 dm = check_arguments(op, q, k, lse, p, {{"out", &out}, {"dout", &dout}, {"dq", &dq}},
                                   {{"k", &k}, {"v", &v}, {"dk", &dk}, {"dv", &dv}});
  const std::int64_t bias_samples = check_key_starts(op, q, key_starts, dm);
  const Tensor ws = allocate_gpu_scratch(
      q, gpu_scratch::cudnn_sdpa_scratch(true, deterministic, dm.b * dm.h, dm.s, dm.d, bias_samples).total(),
      "cuDNN attention");
#ifdef MEGAZERO_WITH_CUDA
  if (q.device().kind() == DeviceKind::CUDA) {
    const auto pr = backward_problem(forward_problem(dm, q, k, v, out, scale, p, bias_samples > 0), dout, dq, dk, dv,
                                     deterministic);
    cuda::cudnn_sdpa_backward(pr, q.data(), k.data(), v.data(), out.data(), dout.data(), ptr<float>(lse), dq.data(),
                              dk.data(), dv.data(), cuda::cudnn_dropout_seed(key, layout), scratch_of(ws), stream_of(q),
                              bias_samples > 0 ? ptr<const std::int64_t>(key_starts) : nullptr);
    return;
  }
#endif
  if (runs_on_gpu(q)) {
    log_work(q, dm, 5);
    return;
  }
  const Shape heads{dm.b * dm.h, dm.s, dm.d};
  Tensor gq = Tensor::empty(q.device_ptr(), heads, q.dtype(), MemoryCategory::Workspace, "cudnn reference dq");
  Tensor gk = Tensor::empty(q.device_ptr(), heads, q.dtype(), MemoryCategory::Workspace, "cudnn reference dk");
  Tensor gv = Tensor::empty(q.device_ptr(), heads, q.dtype(), MemoryCategory::Workspace, "cudnn reference dv");
  fused_attention_backward(contiguous_heads(q), contiguous_heads(k), contiguous_heads(v), contiguous_heads(out),
                           contiguous_heads(dout), lse, scale, p, key, layout, gq, gk, gv, key_starts);
  dq.copy_from(gq.view(dq.shape()));
  sum_groups_into(gk, dm, dk);  // fused_attention_backward gives dk, dv per query head
  sum_groups_into(gv, dm, dv);
}

std::string cudnn_attention_prepare(Device& gpu, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                    double scale, double p, bool deterministic, bool documents) {
  if (gpu.kind() != DeviceKind::CUDA) return {};
#ifdef MEGAZERO_WITH_CUDA
  const Dims4 dm{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)};
  const std::string why = cudnn_attention_unsupported(DeviceKind::CUDA, q.dtype(), dm.d);
  MZ_REQUIRE(why.empty(), why);
  const cuda::sdpa::Problem pr = forward_problem(dm, q, k, v, out, scale, p, documents);
  const cudaStream_t stream = as_cuda_device(gpu).stream();
  const std::string fwd = cuda::cudnn_sdpa_prepare(pr, false, stream);
  const std::string bwd = cuda::cudnn_sdpa_prepare(backward_problem(pr, dout, dq, dk, dv, deterministic), true, stream);
  return ::megazero::detail::concat("cuDNN attention ", dm.b, "x", dm.h, "x", dm.s, "x", dm.d, " ",
                                    dtype_name(q.dtype()), ", dropout ", p, documents ? ", document masks" : "",
                                    ": forward ", fwd, "; backward", deterministic ? " (deterministic) " : " ", bwd,
                                    " (", cuda::cudnn_versions(), ")");
#else
  (void)q, (void)k, (void)v, (void)out, (void)dout, (void)dq, (void)dk, (void)dv, (void)scale, (void)p;
  (void)deterministic, (void)documents;
  return {};
#endif
}

}  // namespace megazero::kernels
