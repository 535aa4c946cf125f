// GEMM against a naive double-precision reference over the same (rounded)
// inputs, for odd shapes, every transpose, batched and broadcast operands,
// strided views, alpha/beta, and every dtype. The tolerance is the standard
// bound for fp32 accumulation (K * 2^-23 * sum |a||b|, doubled for safety)
// plus half an ulp of the output dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/openblas_core.h"

using namespace megazero;
using MC = MemoryCategory;

namespace {

struct Case {
  std::int64_t batch, m, n, k;  // batch 0 = plain 2-D
  bool ta, tb, b_shared;
};

Tensor random_tensor(const std::shared_ptr<Device>& dev, const Shape& shape, DType t, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  Tensor out = Tensor::empty(dev, shape, t, MC::Other);
  out.copy_from_doubles(v);  // rounds to t: the reference uses the rounded values
  return out;
}

double ulp_half_of(DType t, double x) {
  const int bits = t == DType::F32 ? 24 : t == DType::BF16 ? 8 : t == DType::F16 ? 11 : 53;
  if (x == 0) return 0;
  int e;
  std::frexp(x, &e);
  double u = std::ldexp(1.0, e - bits);
  if (t == DType::F16) u = std::max(u, std::ldexp(1.0, -25));
  return u;
}

void check_case(const Case& cs, DType in, DType out, float alpha, float beta, bool strided) {
  SCOPED_TRACE(testing::Message() << "batch " << cs.batch << " m " << cs.m << " n " << cs.n << " k " << cs.k << " ta "
                                  << cs.ta << " tb " << cs.tb << " in " << dtype_name(in) << " out " << dtype_name(out)
                                  << " alpha " << alpha << " beta " << beta << " strided " << strided);
  auto dev = make_device(DeviceKind::CPU);
  std::mt19937 rng(static_cast<unsigned>(cs.m * 131 + cs.n * 17 + cs.k));
  auto with_batch = [&](Shape s, bool batched) {
    if (batched) s.insert(s.begin(), cs.batch);
    return s;
  };
  const bool batched = cs.batch > 0;
  Shape a_shape = with_batch(cs.ta ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k}, batched);
  Shape b_shape = with_batch(cs.tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n}, batched && !cs.b_shared);
  Tensor a = random_tensor(dev, a_shape, in, rng);
  Tensor b = random_tensor(dev, b_shape, in, rng);
  if (strided) {  // operands as narrow views of wider tensors: leading strides > row length
    Shape wide = a_shape;
    wide.back() += 3;
    Tensor aw = random_tensor(dev, wide, in, rng);
    a = aw.narrow(-1, 2, a_shape.back());
    a.copy_from(random_tensor(dev, a_shape, in, rng));
  }
  Tensor c = random_tensor(dev, with_batch({cs.m, cs.n}, batched), out, rng);
  const auto av = a.to_double_vector(), bv = b.to_double_vector(), c0 = c.to_double_vector();
  gemm(a, cs.ta, b, cs.tb, c, alpha, beta);
  const auto cv = c.to_double_vector();
  const std::int64_t nb = batched ? cs.batch : 1;
  for (std::int64_t p = 0; p < nb; ++p)
    for (std::int64_t i = 0; i < cs.m; ++i)
      for (std::int64_t j = 0; j < cs.n; ++j) {
        double ref = 0, mag = 0;
        for (std::int64_t l = 0; l < cs.k; ++l) {
          const std::int64_t ai = p * cs.m * cs.k + (cs.ta ? l * cs.m + i : i * cs.k + l);
          const std::int64_t bp = (batched && !cs.b_shared) ? p * cs.k * cs.n : 0;
          const std::int64_t bi = bp + (cs.tb ? j * cs.k + l : l * cs.n + j);
          const double prod = av[static_cast<std::size_t>(ai)] * bv[static_cast<std::size_t>(bi)];
          ref += prod;
          mag += std::fabs(prod);
        }
        const auto ci = static_cast<std::size_t>(p * cs.m * cs.n + i * cs.n + j);
        const double expect = alpha * ref + beta * c0[ci];
        const double tol = 2.0 * static_cast<double>(cs.k + 2) * std::ldexp(1.0, -23) *
                               (std::fabs(alpha) * mag + std::fabs(beta * c0[ci])) +
                           ulp_half_of(out, expect) + 1e-30;
        ASSERT_NEAR(cv[ci], expect, tol) << "at " << p << "," << i << "," << j;
      }
}

const Case kCases[] = {
    {0, 1, 1, 1, false, false, false},    {0, 7, 13, 5, false, false, false},   {0, 7, 13, 5, true, false, false},
    {0, 7, 13, 5, false, true, false},    {0, 7, 13, 5, true, true, false},     {0, 33, 65, 17, false, true, false},
    {0, 127, 3, 255, true, false, false}, {0, 64, 64, 64, false, false, false}, {3, 5, 9, 11, false, false, false},
    {3, 5, 9, 11, true, true, false},     {4, 17, 8, 33, false, true, true},    {2, 31, 7, 16, true, false, true},
};

}  // namespace

class GemmDtypes : public testing::TestWithParam<std::pair<DType, DType>> {};

TEST_P(GemmDtypes, MatchesReferenceOnOddShapesAndTransposes) {
  const auto [in, out] = GetParam();
  for (const auto& cs : kCases) check_case(cs, in, out, 1.0f, 0.0f, false);
}

TEST_P(GemmDtypes, AlphaBetaAndStridedOperands) {
  const auto [in, out] = GetParam();
  for (const auto& cs : kCases) {
    check_case(cs, in, out, 0.5f, 1.0f, true);
    check_case(cs, in, out, -2.0f, 0.25f, false);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, GemmDtypes,
                         testing::Values(std::make_pair(DType::F32, DType::F32),
                                         std::make_pair(DType::BF16, DType::F32),
                                         std::make_pair(DType::BF16, DType::BF16),
                                         std::make_pair(DType::F16, DType::F32), std::make_pair(DType::F16, DType::F16),
                                         std::make_pair(DType::F64, DType::F64)),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param.first)) + "_to_" +
                                  std::string(dtype_name(param_info.param.second));
                         });

TEST(Gemm, ReportsWhichCpuPathRan) {
  auto dev = make_device(DeviceKind::CPU);
  Tensor a = Tensor::zeros(dev, {8, 8}, DType::BF16, MC::Other);
  Tensor c = Tensor::empty(dev, {8, 8}, DType::F32, MC::Other);
  gemm(a, false, a, false, c);
  const auto path = cpu_gemm_path(DType::BF16, DType::F32);
  EXPECT_TRUE(path == "onednn" || path == "fp32-widened-openblas") << path;
  EXPECT_EQ(cpu_gemm_path(DType::F32, DType::F32), "openblas");
  RecordProperty("bf16_path", path);
}

// On the CPU's math threads (CTest runs with one; pretrain_gpt gives each
// rank its share of the cores): 16-bit GEMMs with a transposed B at M = 16,
// N = 49..63, against an fp64 reference. oneDNN computed these wrongly on two
// threads (errors as large as the results; TP 2's logits GEMM of a small model
// hit it), so gemm_cpu takes its native path on one thread only.
TEST(Gemm, SixteenBitTransposedBOnThreadsMatchesTheReference) {
  auto cpu = make_device(DeviceKind::CPU);
  const int threads_before = cpu_math_threads();
  std::mt19937 rng(1);
  std::normal_distribution<double> nd(0, 1);
  for (DType t : {DType::BF16, DType::F16})
    for (int threads : {1, 2, 4})
      for (bool ta : {false, true})
        for (std::int64_t n : {48, 49, 50, 56, 63, 64, 100}) {
          SCOPED_TRACE(testing::Message()
                       << dtype_name(t) << ", " << threads << " threads, n " << n << (ta ? ", A transposed" : ""));
          const std::int64_t m = 16, k = 32;
          std::vector<double> av(static_cast<std::size_t>(m * k)), bv(static_cast<std::size_t>(k * n));
          for (auto& x : av) x = nd(rng);
          for (auto& x : bv) x = nd(rng);
          Tensor a = Tensor::empty(cpu, ta ? Shape{k, m} : Shape{m, k}, t, MC::Other);
          Tensor b = Tensor::empty(cpu, {n, k}, t, MC::Other);
          a.copy_from_doubles(av);
          b.copy_from_doubles(bv);
          set_cpu_math_threads(threads);
          Tensor c = Tensor::zeros(cpu, {m, n}, DType::F32, MC::Other);
          gemm(a, ta, b, true, c);
          const auto ad = a.to_double_vector(), bd = b.to_double_vector(), got = c.to_double_vector();
          double worst = 0;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              double want = 0;
              for (std::int64_t q = 0; q < k; ++q)
                want += (ta ? ad[static_cast<std::size_t>(q * m + i)] : ad[static_cast<std::size_t>(i * k + q)]) *
                        bd[static_cast<std::size_t>(j * k + q)];
              worst = std::max(worst, std::fabs(got[static_cast<std::size_t>(i * n + j)] - want));
            }
          EXPECT_LE(worst, 1e-3) << "fp32 accumulation of exact 16-bit products";
        }
  set_cpu_math_threads(threads_before);
}

// OpenBLAS runs kernels made for this CPU, not the SSE3 ones Debian's
// OpenBLAS 0.3.21 falls back to on Intel models it does not know (an Emerald
// Rapids Xeon ran fp32 GEMMs 7x slower): on any CPU with AVX2 and FMA the
// kernels in use are not Prescott's, unless OPENBLAS_CORETYPE asks for them.
// The GEMMs of every other test here run on the kernels chosen.
TEST(Gemm, OpenBlasRunsKernelsForThisCpu) {
  EXPECT_EQ(openblas_core_for(true, true), "SkylakeX");
  EXPECT_EQ(openblas_core_for(false, true), "Haswell");
  EXPECT_EQ(openblas_core_for(false, false), "");
  const OpenBlasCore& core = openblas_core();
  EXPECT_FALSE(core.used.empty());
  EXPECT_EQ(&openblas_core(), &core) << "chosen once";
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"))
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << forced << " chooses the kernels";
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) GTEST_SKIP() << "an SSE-class CPU";
  EXPECT_NE(core.used, "Prescott") << "OpenBLAS chose " << core.loaded << " at load; " << core.note;
  if (core.loaded == "Prescott") {
    EXPECT_NE(core.note.find("kernels run instead"), std::string::npos) << core.note;
  }
}

TEST(Gemm, RejectsMismatchedShapes) {
  auto dev = make_device(DeviceKind::CPU);
  Tensor a = Tensor::zeros(dev, {4, 5}, DType::F32, MC::Other);
  Tensor c = Tensor::empty(dev, {4, 4}, DType::F32, MC::Other);
  EXPECT_THROW(gemm(a, false, a, false, c), InternalError);
  Tensor h = Tensor::zeros(dev, {5, 4}, DType::F16, MC::Other);
  EXPECT_THROW(gemm(a, false, h, false, c), InternalError);
}
