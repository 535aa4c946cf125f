// --gemm-epilogues (kernels/linear_epilogues.h, megazero/cuda/lt_matmul.h).
//
// Everywhere: each entry point against a naive fp64 loop of its definition
// (fp64 and fp32 tight, bf16/fp16 within their roundings), argument errors
// naming the operand, and on a meta device standing in for CUDA the fused
// path's memory (cuBLASLt's workspace and the bias gradient it writes) and its
// one GEMM for the time model.
//
// In a CUDA build, without a GPU: each cuBLASLt problem our describe_*
// functions make from row-major tensors (with padded row strides) is run by an
// interpreter of cuBLASLt's documented column-major semantics (op(A), op(B),
// leading dimensions, BIAS / GELU_AUX_BIAS / DGELU_BGRAD / BGRADB) and must
// equal the definitions — an operand swapped, a transpose or leading
// dimension wrong, a bias on the wrong side fails it; cuBLASLt itself creates
// and sets every descriptor of every problem (bf16/fp16/fp32).
//
// With a GPU (tools/gpu_session.sh cudnn): the entry points on the GPU against
// the fp64 definitions in bf16/fp16/fp32, and cuBLASLt must have taken every
// problem (else the test prints what it refused).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "megazero/core/device.h"
#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/linear_epilogues.h"

#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/gemm_cuda.h"
#include "megazero/cuda/lt_matmul.h"
#endif

using namespace megazero;
using i64 = std::int64_t;

namespace {

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double dgelu(double x) {
  const double c = std::sqrt(2.0 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// Row-major matrices as doubles.
struct M {
  i64 rows = 0, cols = 0;
  std::vector<double> v;
  double& at(i64 r, i64 c) { return v[static_cast<std::size_t>(r * cols + c)]; }
  double at(i64 r, i64 c) const { return v[static_cast<std::size_t>(r * cols + c)]; }
};
M random_m(i64 rows, i64 cols, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0.0, scale);
  M m{rows, cols, std::vector<double>(static_cast<std::size_t>(rows * cols))};
  for (double& x : m.v) x = n(g);
  return m;
}

// The definitions, naive: op(a) op(b) (x w^T, dy w, dy^T x); column sums.
M matmul(const M& a, bool trans_a, const M& b, bool trans_b) {
  const i64 rows = trans_a ? a.cols : a.rows, inner = trans_a ? a.rows : a.cols, cols = trans_b ? b.rows : b.cols;
  const auto at = [](const M& m, bool t, i64 r, i64 c) { return t ? m.at(c, r) : m.at(r, c); };
  M y{rows, cols, std::vector<double>(static_cast<std::size_t>(rows * cols))};
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) {
      double s = 0;
      for (i64 l = 0; l < inner; ++l) s += at(a, trans_a, r, l) * at(b, trans_b, l, c);
      y.at(r, c) = s;
    }
  return y;
}
std::vector<double> column_sums(const M& m) {
  std::vector<double> s(static_cast<std::size_t>(m.cols), 0.0);
  for (i64 r = 0; r < m.rows; ++r)
    for (i64 c = 0; c < m.cols; ++c) s[static_cast<std::size_t>(c)] += m.at(r, c);
  return s;
}

// The four operations' expected outputs.
struct Expected {
  M y, pre, out, dpre, dw;
  std::vector<double> dbias_gelu, dbias_w;
};
struct Inputs {
  // x [N, in], w and w2 [out, in], bias [out], dy_fwd and dy_bwd [N, out], dw0 [out, in]: dy_fwd feeds the
  // weight gradient, dy_bwd the GeLU backward (through w2, into [N, in], with x as the GeLU's input).
  M x, w, bias, dy_fwd, dy_bwd, w2, dw0;
  std::vector<double> dbias0_in, dbias0_out;
};
Inputs make_inputs(i64 rows, i64 in, i64 out) {
  Inputs a;
  a.x = random_m(rows, in, 1);
  a.w = random_m(out, in, 2, 0.3);
  a.bias = random_m(1, out, 3);
  a.dy_fwd = random_m(rows, out, 4);
  a.w2 = random_m(out, in, 5, 0.3);
  a.dy_bwd = random_m(rows, out, 6);
  a.dw0 = random_m(out, in, 7, 0.1);
  a.dbias0_in = random_m(1, in, 8, 0.1).v;
  a.dbias0_out = random_m(1, out, 9, 0.1).v;
  return a;
}
Expected expected(const Inputs& a) {
  Expected e;
  e.y = matmul(a.x, false, a.w, true);
  for (i64 r = 0; r < e.y.rows; ++r)
    for (i64 c = 0; c < e.y.cols; ++c) e.y.at(r, c) += a.bias.v[static_cast<std::size_t>(c)];
  e.pre = e.y;
  e.out = e.y;
  for (double& v : e.out.v) v = gelu(v);
  // The GeLU backward: dy_bwd w2 is [N, in]; x stands for the GeLU's input there.
  e.dpre = matmul(a.dy_bwd, false, a.w2, false);
  for (i64 r = 0; r < e.dpre.rows; ++r)
    for (i64 c = 0; c < e.dpre.cols; ++c) e.dpre.at(r, c) *= dgelu(a.x.at(r, c));
  e.dbias_gelu = column_sums(e.dpre);
  for (std::size_t i = 0; i < e.dbias_gelu.size(); ++i) e.dbias_gelu[i] += a.dbias0_in[i];
  e.dw = matmul(a.dy_fwd, true, a.x, false);
  for (std::size_t i = 0; i < e.dw.v.size(); ++i) e.dw.v[i] += a.dw0.v[i];
  e.dbias_w = column_sums(a.dy_fwd);
  for (std::size_t i = 0; i < e.dbias_w.size(); ++i) e.dbias_w[i] += a.dbias0_out[i];
  return e;
}

double max_rel(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / std::max(den, 1e-30);
}

// Runs the four entry points on `dev` in `dtype` (operands rounded to it
// first, and the expectations computed from the rounded values) and checks
// every output against the definitions within `tol` (relative to each
// output's largest magnitude); what passes through the GeLU (its value, its
// derivative) within `gelu_tol`: cuBLASLt's GeLU epilogues may use the GPU's
// approximate tanh (~2^-11 relative), which no fp32 tolerance of a GEMM covers.
// Each output's error is printed when `print` (the GPU half: one run says
// what the hardware gives).
void check_entry_points(const std::shared_ptr<Device>& dev, DType dtype, double tol, double gelu_tol, i64 rows, i64 in,
                        i64 out, bool print = false) {
  SCOPED_TRACE(testing::Message() << dev->name() << " " << dtype_name(dtype) << " rows " << rows << " in " << in
                                  << " out " << out);
  auto cpu = make_device(DeviceKind::CPU);
  Inputs a = make_inputs(rows, in, out);
  // Round every input to dtype (through a CPU tensor), so the definitions see
  // exactly the values the kernels do.
  const auto on_dev = [&](const M& m, const Shape& shape, M* rounded) {
    Tensor host = Tensor::empty(cpu, shape, dtype, MemoryCategory::Activations);
    host.copy_from_doubles(m.v);
    if (rounded) rounded->v = host.to_double_vector();
    Tensor t = Tensor::empty(dev, shape, dtype, MemoryCategory::Activations);
    t.copy_from(host);
    return t;
  };
  const auto vec_on_dev = [&](std::vector<double>& v) {
    M m{1, static_cast<i64>(v.size()), v};
    Tensor t = on_dev(m, {m.cols}, &m);
    v = m.v;
    return t;
  };
  Tensor x = on_dev(a.x, {rows, in}, &a.x), w = on_dev(a.w, {out, in}, &a.w);
  Tensor bias = on_dev(a.bias, {out}, &a.bias), dy_fwd = on_dev(a.dy_fwd, {rows, out}, &a.dy_fwd);
  Tensor w2 = on_dev(a.w2, {out, in}, &a.w2), dy_bwd = on_dev(a.dy_bwd, {rows, out}, &a.dy_bwd);
  Tensor dw = on_dev(a.dw0, {out, in}, &a.dw0);
  Tensor dbias_in = vec_on_dev(a.dbias0_in), dbias_out = vec_on_dev(a.dbias0_out);
  const Expected e = expected(a);
  const auto check = [&](const Tensor& got, const std::vector<double>& want, double limit, const char* what) {
    const double err = max_rel(got.to_double_vector(), want);
    if (print)
      std::printf("[lt] %s %s: max relative error %.3g (limit %.3g)\n", std::string(dtype_name(dtype)).c_str(), what,
                  err, limit);
    EXPECT_LE(err, limit) << what;
  };

  Tensor y = Tensor::empty(dev, {rows, out}, dtype, MemoryCategory::Activations);
  kernels::linear_bias_forward(x, w, bias, y);
  check(y, e.y.v, tol, "linear_bias_forward");

  Tensor pre = Tensor::empty(dev, {rows, out}, dtype, MemoryCategory::Activations);
  Tensor act = Tensor::empty(dev, {rows, out}, dtype, MemoryCategory::Activations);
  kernels::linear_bias_gelu_forward(x, w, bias, pre, act);
  check(pre, e.pre.v, tol, "linear_bias_gelu_forward: pre (with its bias)");
  check(act, e.out.v, gelu_tol, "linear_bias_gelu_forward: gelu(pre)");

  Tensor dpre = Tensor::empty(dev, {rows, in}, dtype, MemoryCategory::Activations);
  kernels::linear_dgelu_bias_grad(dy_bwd, w2, x, dpre, dbias_in);  // x stands for the GeLU's input [N, in]
  check(dpre, e.dpre.v, gelu_tol, "linear_dgelu_bias_grad: dpre");
  check(dbias_in, e.dbias_gelu, gelu_tol, "linear_dgelu_bias_grad: dbias (+=)");

  kernels::linear_weight_bias_grad(dy_fwd, x, dw, dbias_out);
  check(dw, e.dw.v, tol, "linear_weight_bias_grad: dw (+=)");
  check(dbias_out, e.dbias_w, tol, "linear_weight_bias_grad: dbias (+=)");
}

TEST(LinearEpilogues, HostDevicesComputeTheDefinitions) {
  auto cpu = make_device(DeviceKind::CPU);
  check_entry_points(cpu, DType::F64, 1e-12, 1e-12, 13, 24, 16);
  check_entry_points(cpu, DType::F32, 1e-5, 1e-5, 13, 24, 16);
  check_entry_points(cpu, DType::BF16, 3e-2, 3e-2, 64, 40, 24);  // rows of GEMM output rounded, then bias, then GeLU
  check_entry_points(cpu, DType::F16, 4e-3, 4e-3, 64, 40, 24);
}

TEST(LinearEpilogues, BadOperandsAreRefusedNamingThem) {
  auto cpu = make_device(DeviceKind::CPU);
  const auto t = [&](const Shape& s, DType d = DType::F32) { return Tensor::zeros(cpu, s, d, MemoryCategory::Other); };
  Tensor x = t({4, 6}), w = t({5, 6}), bias = t({5}), y = t({4, 5}), wrong_bias = t({6});
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { kernels::linear_bias_forward(x, w, wrong_bias, y); }).find("linear_bias_forward: bias"),
            std::string::npos);
  Tensor y_bad = t({4, 6});
  EXPECT_NE(message([&] { kernels::linear_bias_forward(x, w, bias, y_bad); }).find("y has shape"), std::string::npos);
  Tensor half_w = t({5, 6}, DType::BF16);
  EXPECT_NE(message([&] { kernels::linear_bias_forward(x, half_w, bias, y); }).find("w must be fp32"),
            std::string::npos);
  EXPECT_NE(message([&] { kernels::linear_bias_gelu_forward(x, w, bias, y, y); }).find("must not alias"),
            std::string::npos);
  Tensor dbias_bad = t({4});
  Tensor dw = t({5, 6}), dy = t({4, 5});
  EXPECT_NE(message([&] { kernels::linear_weight_bias_grad(dy, x, dw, dbias_bad); }).find("dbias has shape"),
            std::string::npos);
}

// A dry run for a CUDA run allocates what the fused path does (the planner's
// numbers) and logs one GEMM per call for the time model.
TEST(LinearEpilogues, MetaDeviceForCudaPlansTheFusedPath) {
  auto meta = make_meta_device(DeviceKind::CUDA);
  auto& log = static_cast<MetaDevice&>(*meta).compute_log();
  const auto t = [&](const Shape& s) { return Tensor::empty(meta, s, DType::BF16, MemoryCategory::Activations); };
  Tensor x = t({32, 64}), w = t({48, 64}), bias = t({48}), pre = t({32, 48}), out = t({32, 48});
  Tensor dy = t({32, 48}), dw = t({48, 64}), dbias = t({48});
  const auto workspace_peak = [&] {
    return meta->memory().snapshot().by_category[static_cast<std::size_t>(MemoryCategory::Workspace)].peak_bytes;
  };
  kernels::linear_bias_gelu_forward(x, w, bias, pre, out);
  kernels::linear_weight_bias_grad(dy, x, dw, dbias);
  ASSERT_EQ(log.gemms().size(), 2u) << "one GEMM per call, no element-wise pass";
  EXPECT_EQ(log.gemms().begin()->first.m + std::next(log.gemms().begin())->first.m, 32 + 48);
  EXPECT_GE(workspace_peak(), kernels::gpu_scratch::kCublasWorkspaceBytes + 48 * 2)
      << "cuBLASLt's workspace and the bias gradient it writes";
  EXPECT_EQ(meta->memory().snapshot().total_live_bytes,
            static_cast<std::size_t>((32 * 64 + 48 * 64 + 48 + 3 * 32 * 48 + 48 * 64 + 48) * 2))
      << "the scratch is released after each call";
}

#ifdef MEGAZERO_WITH_CUDA

// cuBLASLt's documented semantics (column-major) on fp64 host buffers.
void interpret(const cuda::LtMatmul& p) {
  const auto* A = static_cast<const double*>(p.a);
  const auto* B = static_cast<const double*>(p.b);
  auto* D = static_cast<double*>(p.d);
  auto* bias = static_cast<double*>(p.bias);
  auto* aux = static_cast<double*>(p.aux);
  const auto op_a = [&](i64 i, i64 l) { return p.trans_a ? A[l + i * p.lda] : A[i + l * p.lda]; };
  const auto op_b = [&](i64 l, i64 j) { return p.trans_b ? B[j + l * p.ldb] : B[l + j * p.ldb]; };
  std::vector<double> acc(static_cast<std::size_t>(p.m * p.n));
  for (i64 j = 0; j < p.n; ++j)
    for (i64 i = 0; i < p.m; ++i) {
      double s = 0;
      for (i64 l = 0; l < p.k; ++l) s += op_a(i, l) * op_b(l, j);
      acc[static_cast<std::size_t>(i + j * p.m)] = p.alpha * s + (p.beta != 0 ? p.beta * D[i + j * p.ldd] : 0.0);
    }
  for (i64 j = 0; j < p.n; ++j)
    for (i64 i = 0; i < p.m; ++i) {
      const double a = acc[static_cast<std::size_t>(i + j * p.m)];
      double& d = D[i + j * p.ldd];
      switch (p.epilogue) {
        case cuda::LtEpilogue::None:
          d = a;
          break;
        case cuda::LtEpilogue::Bias:
          d = a + bias[i];
          break;
        case cuda::LtEpilogue::GeluAuxBias:
          aux[i + j * p.aux_ld] = a + bias[i];
          d = gelu(a + bias[i]);
          break;
        case cuda::LtEpilogue::DGeluBGrad:
          d = a * dgelu(aux[i + j * p.aux_ld]);
          break;
        case cuda::LtEpilogue::BGradB:
          d = a;
          break;
      }
    }
  if (p.epilogue == cuda::LtEpilogue::DGeluBGrad)
    for (i64 i = 0; i < p.m; ++i) {
      double s = 0;
      for (i64 j = 0; j < p.n; ++j) s += D[i + j * p.ldd];
      bias[i] = s;
    }
  if (p.epilogue == cuda::LtEpilogue::BGradB)
    for (i64 j = 0; j < p.n; ++j) {
      double s = 0;
      for (i64 l = 0; l < p.k; ++l) s += op_b(l, j);
      bias[j] = s;
    }
}

// A row-major matrix stored with `pad` extra elements per row (a view's row
// stride), filled from m; the padding holds NaN, so reading it shows.
struct Padded {
  i64 rows, cols, stride;
  std::vector<double> buf;
  Padded(const M& m, i64 pad) : rows(m.rows), cols(m.cols), stride(m.cols + pad) {
    buf.assign(static_cast<std::size_t>(rows * stride), NAN);
    for (i64 r = 0; r < rows; ++r)
      for (i64 c = 0; c < cols; ++c) buf[static_cast<std::size_t>(r * stride + c)] = m.at(r, c);
  }
  cuda::RowMajor rm() const { return {buf.data(), stride}; }
  std::vector<double> values() const {
    std::vector<double> v;
    for (i64 r = 0; r < rows; ++r)
      for (i64 c = 0; c < cols; ++c) v.push_back(buf[static_cast<std::size_t>(r * stride + c)]);
    return v;
  }
};

TEST(LtProblems, DescribedProblemsComputeTheDefinitionsByCublasLtSemantics) {
  const i64 rows = 11, in = 16, out = 8;
  const Inputs a = make_inputs(rows, in, out);
  const Expected e = expected(a);
  for (i64 pad : {0, 3}) {
    SCOPED_TRACE(testing::Message() << "row padding " << pad);
    {  // bias
      Padded x(a.x, pad), w(a.w, pad + 1), y(M{rows, out, std::vector<double>(rows * out, 0.0)}, pad);
      std::vector<double> bias = a.bias.v;
      cuda::LtMatmul p = cuda::describe_linear_forward(cuda::LtEpilogue::Bias, rows, in, out, x.rm(), w.rm(),
                                                       bias.data(), y.rm(), y.rm(), DType::F64, DType::F64);
      interpret(p);
      EXPECT_LE(max_rel(y.values(), e.y.v), 1e-13) << "Bias";
    }
    {  // bias + GeLU, aux = pre
      Padded x(a.x, pad), w(a.w, pad), pre(M{rows, out, std::vector<double>(rows * out, 0.0)}, pad + 2),
          act(M{rows, out, std::vector<double>(rows * out, 0.0)}, pad);
      std::vector<double> bias = a.bias.v;
      cuda::LtMatmul p = cuda::describe_linear_forward(cuda::LtEpilogue::GeluAuxBias, rows, in, out, x.rm(), w.rm(),
                                                       bias.data(), act.rm(), pre.rm(), DType::F64, DType::F64);
      interpret(p);
      EXPECT_LE(max_rel(pre.values(), e.pre.v), 1e-13) << "GeluAuxBias: aux";
      EXPECT_LE(max_rel(act.values(), e.out.v), 1e-13) << "GeluAuxBias: D";
    }
    {  // GeLU backward + bias gradient (written: the entry point adds it)
      Padded dy(a.dy_bwd, pad), w2(a.w2, pad), pre(a.x, pad + 1),
          dpre(M{rows, in, std::vector<double>(rows * in, 0.0)}, pad);
      std::vector<double> grad(static_cast<std::size_t>(in), NAN);
      cuda::LtMatmul p =
          cuda::describe_linear_dgelu(rows, in, out, dy.rm(), w2.rm(), pre.rm(), dpre.rm(), grad.data(), DType::F64);
      interpret(p);
      EXPECT_LE(max_rel(dpre.values(), e.dpre.v), 1e-13) << "DGeluBGrad: D";
      std::vector<double> want = e.dbias_gelu;
      for (std::size_t i = 0; i < want.size(); ++i) want[i] -= a.dbias0_in[i];
      EXPECT_LE(max_rel(grad, want), 1e-13) << "DGeluBGrad: bias gradient";
    }
    {  // weight gradient (accumulated, beta 1) + bias gradient
      Padded dy(a.dy_fwd, pad), x(a.x, pad + 1), dw(a.dw0, pad);
      std::vector<double> grad(static_cast<std::size_t>(out), NAN);
      cuda::LtMatmul p = cuda::describe_linear_wgrad(rows, in, out, dy.rm(), x.rm(), dw.rm(), grad.data(), DType::F64);
      interpret(p);
      EXPECT_LE(max_rel(dw.values(), e.dw.v), 1e-13) << "BGradB: dW += dy^T x";
      std::vector<double> want = e.dbias_w;
      for (std::size_t i = 0; i < want.size(); ++i) want[i] -= a.dbias0_out[i];
      EXPECT_LE(max_rel(grad, want), 1e-13) << "BGradB: bias gradient";
    }
  }
}

// megazero::gemm's plain problem as cuBLASLt sees it (--gemm-autotune's
// path): every transpose, operands that are narrowed views (row strides above
// their widths) or transposed views (a unit stride in the other dimension),
// alpha and an accumulating beta, interpreted by cuBLASLt's semantics against
// the CPU's gemm over the same fp64 tensors.
TEST(LtProblems, DescribedGemmComputesWhatGemmComputes) {
  auto cpu = make_device(DeviceKind::CPU);
  std::mt19937_64 g(7);
  std::normal_distribution<double> n;
  const auto filled = [&](const Shape& s) {
    std::vector<double> v(static_cast<std::size_t>(shape_numel(s)));
    for (double& x : v) x = n(g);
    Tensor t = Tensor::empty(cpu, s, DType::F64, MemoryCategory::Other);
    t.copy_from_doubles(v);
    return t;
  };
  const i64 m = 13, k = 9, nn = 11;
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int view = 0; view < 3; ++view) {  // 0 contiguous, 1 narrowed, 2 transposed views
        SCOPED_TRACE(testing::Message() << "trans_a " << ta << " trans_b " << tb << " view " << view);
        const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{nn, k} : Shape{k, nn};
        const auto operand = [&](const Shape& s) {
          if (view == 1) return filled({s[0], s[1] + 5}).narrow(1, 2, s[1]);
          if (view == 2) return filled({s[1], s[0]}).transpose(0, 1);
          return filled(s);
        };
        const Tensor a = operand(sa), b = operand(sb);
        Tensor c_wide = filled({m, nn + 3});
        Tensor c = view == 1 ? c_wide.narrow(1, 1, nn) : filled({m, nn});
        Tensor want = Tensor::empty(cpu, {m, nn}, DType::F64, MemoryCategory::Other);
        want.copy_from(c);
        gemm(a, ta, b, tb, want, 0.75f, 0.5f);
        const cuda::LtMatmul p = cuda::describe_gemm(a, ta, b, tb, c, 0.75f, 0.5f);
        EXPECT_EQ(p.epilogue, cuda::LtEpilogue::None);
        cuda::LtMatmul p16 = p;  // fp64 is cuBLAS's; the same problem in bf16 is cuBLASLt's to take
        p16.in = p16.out = DType::BF16;
        EXPECT_TRUE(cuda::lt_eligible(p16));
        interpret(p);
        EXPECT_LE(max_rel(c.to_double_vector(), want.to_double_vector()), 1e-13);
        ++cases;
      }
  EXPECT_EQ(cases, 12);
}

TEST(LtProblems, AutotuneKeepsTheFastestCandidateThatRan) {
  EXPECT_EQ(cuda::fastest_candidate({}), 0) << "nothing timed: the heuristics' first";
  EXPECT_EQ(cuda::fastest_candidate({-1, -1}), 0) << "none ran: the heuristics' first";
  EXPECT_EQ(cuda::fastest_candidate({0.5, 0.4, 0.45}), 1);
  EXPECT_EQ(cuda::fastest_candidate({0.5, -1, 0.3, 0.3}), 2) << "a failed one skipped; the earlier of equals";
  EXPECT_EQ(cuda::fastest_candidate({-1, 0.9}), 1);
}

// Problems as the entry points make them, in each dtype cuBLASLt takes.
std::vector<cuda::LtMatmul> sample_problems(DType t) {
  static double dummy[64];  // alignment only: nothing is read
  const cuda::RowMajor x{dummy, 1024}, w{dummy, 1024}, y{dummy, 4096}, dy{dummy, 1024};
  return {cuda::describe_linear_forward(cuda::LtEpilogue::Bias, 8192, 1024, 3072, x, w, dummy, {dummy, 3072},
                                        {dummy, 3072}, t, t),
          cuda::describe_linear_forward(cuda::LtEpilogue::GeluAuxBias, 8192, 1024, 4096, x, w, dummy, y, y, t, t),
          cuda::describe_linear_dgelu(8192, 4096, 1024, dy, {dummy, 4096}, y, y, dummy, t),
          cuda::describe_linear_wgrad(8192, 1024, 3072, {dummy, 3072}, x, w, dummy, t),
          [&] {  // a plain GEMM (--gemm-autotune's): no bias pointer, no aux
            cuda::LtMatmul p = cuda::describe_linear_wgrad(8192, 1024, 3072, {dummy, 3072}, x, w, nullptr, t);
            p.epilogue = cuda::LtEpilogue::None;
            return p;
          }()};
}

TEST(LtProblems, CublasLtCreatesEveryDescriptor) {
  for (DType t : {DType::BF16, DType::F16, DType::F32})
    for (const cuda::LtMatmul& p : sample_problems(t)) {
      SCOPED_TRACE(testing::Message() << cuda::lt_epilogue_name(p.epilogue) << " " << dtype_name(t));
      EXPECT_TRUE(cuda::lt_eligible(p));
      EXPECT_EQ(cuda::lt_descriptors_error(p, kernels::gpu_scratch::kCublasWorkspaceBytes), "");
    }
}

TEST(LtProblems, WhatCublasLtCannotTakeIsNotAsked) {
  cuda::LtMatmul p = sample_problems(DType::BF16)[1];
  EXPECT_TRUE(cuda::lt_eligible(p));
  p.aux_ld = 4100;  // not a multiple of 8: cuBLASLt's rule for the GeLU input
  EXPECT_FALSE(cuda::lt_eligible(p));
  p = sample_problems(DType::BF16)[0];
  p.in = p.out = DType::F64;
  EXPECT_FALSE(cuda::lt_eligible(p));
  p = sample_problems(DType::BF16)[0];
  p.ldd = p.m - 1;  // a leading dimension below the rows
  EXPECT_FALSE(cuda::lt_eligible(p));
}

// ---- on a GPU ----

TEST(LinearEpiloguesOnGpu, CublasLtComputesTheDefinitions) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  auto gpu = make_device(DeviceKind::CUDA, 0);
  // 16-bit first: the layers' real use, where every problem must be fused.
  check_entry_points(gpu, DType::BF16, 3e-2, 3e-2, 256, 128, 96, true);
  check_entry_points(gpu, DType::F16, 4e-3, 1e-2, 256, 128, 96, true);
  check_entry_points(gpu, DType::BF16, 3e-2, 3e-2, 512, 256, 1024, true);  // a wide MLP-like shape
  const cuda::LtReport r16 = cuda::lt_report();
  EXPECT_GT(r16.fused_problems, 0u);
  EXPECT_EQ(r16.refused, "") << "cuBLASLt refused these 16-bit problems (computed unfused instead)";
  // fp32 (no TF32): the definitions either way; a refusal is reported, not failed.
  check_entry_points(gpu, DType::F32, 1e-5, 3e-3, 96, 64, 48, true);
  std::printf("[lt] %s\n", kernels::linear_epilogues_report(*gpu).c_str());
}

#endif  // MEGAZERO_WITH_CUDA

}  // namespace
