// The causal softmax (softmax.h): shape checks, device dispatch and the CPU
// kernels. Each public function validates its arguments (also on the meta
// device, where nothing is computed), then runs a template over the storage
// type S (float, double, BFloat16 or Half) on raw pointers: elements are read
// with ld() into the compute type C = compute_t<S> and written with st<S>(),
// which rounds once to nearest even (kernel_support.h). The exponentials are
// vector_math's (libmvec) for fp32 compute; rows are OpenMP-parallel, each
// computed by one thread, so results are bitwise identical for any thread
// count.
#include "megazero/kernels/softmax.h"

#include <type_traits>

#include "megazero/core/error.h"
#include "megazero/kernels/cpu_loops.h"
#include "megazero/kernels/kernel_support.h"
#include "megazero/kernels/vector_math.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/softmax.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h, cpu_loops.h

// ---- causal softmax ----

// Row r of each [sq, sk] matrix is the query at key position i = r + sk - sq:
// softmax over j <= i of scale * s; the max is subtracted before exp and the
// sum is taken in double. The unnormalised exponentials live in probs itself
// for fp32/fp64 and in a per-thread fp32 row for 16-bit storage (so that
// probabilities are rounded to 16 bits once).
// The first key row `row` (of mats x sq) keeps: 0, or its document's start.
struct KeyStarts {
  const std::int64_t* starts = nullptr;  // [samples * sq]
  i64 rows_per_sample = 1;               // matrices of a sample x sq
  i64 first(i64 row, i64 i, i64 sq) const {
    if (!starts) return 0;
    const std::int64_t st = starts[row / rows_per_sample * sq + row % sq];
    return st < 0 ? 0 : st > i ? i : st;
  }
};

template <typename S>
void causal_softmax_forward_cpu(const S* scores, double scale, S* probs, i64 mats, i64 sq, i64 n, KeyStarts ks) {
  using C = compute_t<S>;
  const C sc = static_cast<C>(scale);
#pragma omp parallel for num_threads(threads()) schedule(static) if (mats * sq * n > kParallelMin)
  for (i64 row = 0; row < mats * sq; ++row) {
    const i64 i = row % sq + (n - sq);
    const i64 lo = ks.first(row, i, sq);
    const S* s = scores + row * n;
    S* p = probs + row * n;
    C* e;
    if constexpr (std::is_same_v<S, C>) {
      e = p;
    } else {
      e = row_scratch<C>(n);
    }
    const C* x = e;  // the scores in the compute type
    if constexpr (std::is_same_v<S, C>) {
      x = s;  // e[j] overwrites s[j] after reading it when probs aliases scores
    } else {
      for (i64 j = lo; j <= i; ++j) e[j] = ld(s[j]);
    }
    const C mx = scaled_max(x + lo, sc, i + 1 - lo);
    const double sum = exp_scaled_shifted(x + lo, sc, mx, e + lo, i + 1 - lo);
    const double inv = 1.0 / sum;
    for (i64 j = 0; j < lo; ++j) p[j] = zero<S>();
    for (i64 j = lo; j <= i; ++j) p[j] = st<S>(e[j] * inv);
    for (i64 j = i + 1; j < n; ++j) p[j] = zero<S>();
  }
}

// Masked columns get an exact 0 whatever dprobs holds there (even NaN).
template <typename S>
void causal_softmax_backward_cpu(const S* dprobs, const S* probs, double scale, S* dscores, i64 mats, i64 n,
                                 KeyStarts ks) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (mats * n * n > kParallelMin)
  for (i64 row = 0; row < mats * n; ++row) {
    const i64 i = row % n;
    const i64 lo = ks.first(row, i, n);
    const S* dp = dprobs + row * n;
    const S* p = probs + row * n;
    S* ds = dscores + row * n;
    double dot = 0;
    for (i64 j = lo; j <= i; ++j) dot += static_cast<double>(ld(dp[j])) * ld(p[j]);
    for (i64 j = 0; j < lo; ++j) ds[j] = zero<S>();
    for (i64 j = lo; j <= i; ++j) ds[j] = st<S>(scale * ld(p[j]) * (ld(dp[j]) - dot));
    for (i64 j = i + 1; j < n; ++j) ds[j] = zero<S>();
  }
}

// The forward's scores are [..., sq, sk] with sq <= sk; returns the number of matrices.
i64 check_queries_over_keys(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.dim() >= 2 && t.size(-2) <= t.size(-1), op, ": ", name,
           " must be [batch, sq, sk] with sq <= sk (the queries the last sq of the sk positions), got ", t.to_string());
  return t.size(-1) == 0 || t.size(-2) == 0 ? 0 : t.numel() / (t.size(-1) * t.size(-2));
}

// Attention scores are [..., n, n]; returns the number of n x n matrices.
i64 check_square(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.dim() >= 2 && t.size(-1) == t.size(-2), op, ": ", name, " must be [batch, sq, sk] with sq == sk, got ",
           t.to_string());
  return t.size(-1) == 0 ? 0 : t.numel() / (t.size(-1) * t.size(-1));
}

// key_starts of `mats` matrices of [sq, sk] scores (softmax.h), checked.
KeyStarts check_key_starts(const char* op, const Tensor& scores, const Tensor& key_starts, i64 mats) {
  if (!key_starts.defined() || mats == 0) return {};
  const i64 sq = scores.size(-2);
  MZ_CHECK(sq == scores.size(-1), op, ": key_starts (per-document masks) need square scores [batch, S, S], got ",
           scores.to_string());
  const i64 samples = key_start_samples(op, scores, key_starts, sq, mats);
  if (samples == 0) return {};
  return {ptr<const std::int64_t>(key_starts), mats / samples * sq};
}

}  // namespace

void causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs, const Tensor& key_starts) {
  constexpr const char* op = "causal_softmax_forward";
  check_float(op, "scores", scores);
  const i64 mats = check_queries_over_keys(op, "scores", scores);
  check_operands(op, scores, scores.dtype(), {{"scores", &scores}, {"probs", &probs}});
  check_shape(op, "probs", probs, scores.shape());
  const KeyStarts ks = check_key_starts(op, scores, key_starts, mats);
  MZ_ON_CUDA(scores,
             cuda::causal_softmax_forward(scores.dtype(), scores.data(), scale, probs.data(), mats, scores.size(-2),
                                          scores.size(-1), stream_of(scores), ks.starts, ks.rows_per_sample));
  if (!on_host(op, scores)) return;
  with_storage_type(scores.dtype(), [&](auto tag) {
    using S = decltype(tag);
    causal_softmax_forward_cpu(ptr<const S>(scores), scale, ptr<S>(probs), mats, scores.size(-2), scores.size(-1), ks);
  });
}

void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale, Tensor& dscores,
                             const Tensor& key_starts) {
  constexpr const char* op = "causal_softmax_backward";
  check_float(op, "probs", probs);
  const i64 mats = check_square(op, "probs", probs);
  check_operands(op, probs, probs.dtype(), {{"dprobs", &dprobs}, {"probs", &probs}, {"dscores", &dscores}});
  check_shapes(op, probs.shape(), {{"dprobs", &dprobs}, {"dscores", &dscores}});
  const KeyStarts ks = check_key_starts(op, probs, key_starts, mats);
  MZ_ON_CUDA(probs,
             cuda::causal_softmax_backward(probs.dtype(), dprobs.data(), probs.data(), scale, dscores.data(), mats,
                                           probs.size(-1), stream_of(probs), ks.starts, ks.rows_per_sample));
  if (!on_host(op, probs)) return;
  with_storage_type(probs.dtype(), [&](auto tag) {
    using S = decltype(tag);
    causal_softmax_backward_cpu(ptr<const S>(dprobs), ptr<const S>(probs), scale, ptr<S>(dscores), mats, probs.size(-1),
                                ks);
  });
}

}  // namespace megazero::kernels
