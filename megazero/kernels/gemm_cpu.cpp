// CPU GEMM through oneDNN's matmul primitive (fp32/bf16/fp16) and OpenBLAS
// (fp64). oneDNN keeps its own primitive cache, so re-creating the descriptor per
// call costs microseconds; its scratchpad is allocated through the device so
// the memory counters see it (category Workspace).
#include <cblas.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"

namespace megazero {
namespace {

dnnl::memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::F32: return dnnl::memory::data_type::f32;
    case DType::BF16: return dnnl::memory::data_type::bf16;
    case DType::F16: return dnnl::memory::data_type::f16;
    default: break;
  }
  throw InternalError(detail::concat("gemm: oneDNN path does not take ", dtype_name(t)));
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// op(X) as a 3-D (batch, rows, cols) oneDNN descriptor over X's own strides; a
// 2-D operand gets batch 1 (broadcast) with a zero batch stride.
dnnl::memory::desc logical_desc(const Tensor& x, bool trans, std::int64_t batch) {
  Tensor v = trans ? x.transpose(-1, -2) : x;
  const bool has_batch = v.dim() == 3;
  dnnl::memory::dims dims{has_batch ? batch : 1, v.size(-2), v.size(-1)};
  dnnl::memory::dims strides{has_batch ? v.strides()[0] : v.size(-2) * v.size(-1), v.strides()[v.dim() - 2],
                             v.strides()[v.dim() - 1]};
  return dnnl::memory::desc(dims, to_dnnl(x.dtype()), strides);
}

struct PathKey {
  DType in, out;
  bool operator<(const PathKey& o) const { return std::tie(in, out) < std::tie(o.in, o.out); }
};
std::mutex g_path_mu;
std::map<PathKey, bool> g_native_ok;  // does oneDNN implement this dtype pair on this CPU?

bool try_native(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) {
  const std::int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  auto a_md = logical_desc(a, ta, batch);
  auto b_md = logical_desc(b, tb, batch);
  dnnl::memory::desc c_md({batch, c.size(-2), c.size(-1)}, to_dnnl(c.dtype()),
                          {c.dim() == 3 ? c.strides()[0] : c.size(-2) * c.size(-1), c.strides()[c.dim() - 2], 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return false;
    throw;
  }
  dnnl::matmul prim(pd);
  auto& eng = cpu_engine();
  dnnl::stream stream(eng);
  const auto scratch_bytes = pd.scratchpad_desc().get_size();
  auto scratch = a.device().allocate(scratch_bytes, MemoryCategory::Workspace, "onednn-scratchpad");
  dnnl::memory a_mem(a_md, eng, a.data()), b_mem(b_md, eng, b.data()), c_mem(c_md, eng, c.data());
  dnnl::memory s_mem(pd.scratchpad_desc(), eng, scratch->data());
  prim.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem},
                        {DNNL_ARG_SCRATCHPAD, s_mem}});
  stream.wait();
  return true;
}

void gemm_f64(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, double alpha, double beta) {
  const std::int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  for (std::int64_t i = 0; i < batch; ++i) {
    Tensor ai = a.dim() == 3 ? a.select(0, i) : a;
    Tensor bi = b.dim() == 3 ? b.select(0, i) : b;
    Tensor ci = c.dim() == 3 ? c.select(0, i) : c;
    // A row-major matrix with a unit column stride is used as is; one with a
    // unit row stride is the transpose of a row-major matrix.
    auto as_blas = [](const Tensor& x, bool t, CBLAS_TRANSPOSE& op, blasint& ld) {
      if (x.strides()[1] == 1 || x.size(1) == 1) {
        op = t ? CblasTrans : CblasNoTrans;
        ld = static_cast<blasint>(std::max<std::int64_t>(x.strides()[0], x.size(1)));
      } else {
        MZ_CHECK(x.strides()[0] == 1 || x.size(0) == 1, "gemm fp64: operand needs a unit stride");
        op = t ? CblasNoTrans : CblasTrans;
        ld = static_cast<blasint>(std::max<std::int64_t>(x.strides()[1], x.size(0)));
      }
    };
    CBLAS_TRANSPOSE opa, opb;
    blasint lda, ldb;
    as_blas(ai, ta, opa, lda);
    as_blas(bi, tb, opb, ldb);
    const auto m = static_cast<blasint>(ci.size(0)), n = static_cast<blasint>(ci.size(1));
    const auto k = static_cast<blasint>(ta ? ai.size(0) : ai.size(1));
    const auto ldc = static_cast<blasint>(std::max<std::int64_t>(ci.strides()[0], ci.size(1)));
    cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, ai.data_as<double>(), lda, bi.data_as<double>(), ldb,
                beta, ci.data_as<double>(), ldc);
  }
}

}  // namespace

std::string cpu_gemm_path(DType in, DType out) {
  std::lock_guard<std::mutex> lock(g_path_mu);
  auto it = g_native_ok.find({in, out});
  if (in == DType::F64) return "openblas";
  if (it == g_native_ok.end()) return "onednn (not yet used)";
  return it->second ? "onednn" : "onednn-f32-widened";
}

namespace cpu {

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) {
  if (a.dtype() == DType::F64) {
    MZ_CHECK(c.dtype() == DType::F64, "gemm: fp64 inputs need an fp64 C");
    gemm_f64(a, ta, b, tb, c, alpha, beta);
    return;
  }
  if (c.numel() == 0) return;
  const PathKey key{a.dtype(), c.dtype()};
  bool known_native = true;
  {
    std::lock_guard<std::mutex> lock(g_path_mu);
    auto it = g_native_ok.find(key);
    if (it != g_native_ok.end()) known_native = it->second;
  }
  if (known_native) {
    const bool ok = try_native(a, ta, b, tb, c, alpha, beta);
    std::lock_guard<std::mutex> lock(g_path_mu);
    g_native_ok[key] = ok;
    if (ok) return;
  }
  // Widen 16-bit inputs to fp32 (exact); compute; round the result once.
  MZ_CHECK(a.dtype() != DType::F32, "oneDNN has no fp32 matmul on this CPU");
  Tensor a32 = a.to(DType::F32, MemoryCategory::Workspace);
  Tensor b32 = b.to(DType::F32, MemoryCategory::Workspace);
  if (c.dtype() == DType::F32) {
    try_native(a32, ta, b32, tb, c, alpha, beta);
  } else {
    Tensor c32 = c.to(DType::F32, MemoryCategory::Workspace);
    try_native(a32, ta, b32, tb, c32, alpha, beta);
    c.copy_from(c32);
  }
}

}  // namespace cpu
}  // namespace megazero
