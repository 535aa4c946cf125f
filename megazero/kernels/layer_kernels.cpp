// Shape checking, device dispatch and the CPU implementations of the layer
// kernels (layer_kernels.h). Each public function validates its arguments (also
// on the meta device, where nothing is computed), then runs a template over the
// storage type S (float, double, BFloat16 or Half) on raw pointers. Elements
// are read with ld() into the compute type C = compute_t<S> (float for 16-bit
// storage, S otherwise) and written with st<S>(), which rounds once to nearest
// even; for float and double both are the identity/the plain cast, so the
// fp32/fp64 code is what it was before 16-bit storage existed. Loops over rows
// are OpenMP-parallel; sums across rows (parameter gradients) are taken column
// block by column block in a fixed row order, so results are bitwise identical
// for any thread count.
#include "megazero/kernels/layer_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/layer_kernels_cuda.h"
#endif

namespace megazero::kernels {

DType row_stat_dtype(DType storage) { return storage == DType::BF16 || storage == DType::F16 ? DType::F32 : storage; }

bool is_grad_accumulator_dtype(DType storage, DType acc) {
  return acc == storage || (acc == DType::F32 && (storage == DType::BF16 || storage == DType::F16));
}

namespace {

using namespace detail;  // kernel_support.h

// dst[c] += sum_r term(r, c) for c < cols. Each column's sum is taken in double
// and in row order by one thread, so the result does not depend on the number
// of threads (per-thread partial sums would); it is rounded once into G.
template <typename G, typename Term>
void accumulate_columns(G* dst, i64 rows, i64 cols, Term term) {
  constexpr i64 kBlock = 64;
  const i64 blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * cols > kParallelMin)
  for (i64 blk = 0; blk < blocks; ++blk) {
    const i64 c0 = blk * kBlock, n = std::min(kBlock, cols - c0);
    double acc[kBlock] = {};
    for (i64 r = 0; r < rows; ++r)
      for (i64 k = 0; k < n; ++k) acc[k] += term(r, c0 + k);
    for (i64 k = 0; k < n; ++k) dst[c0 + k] = st<G>(ld(dst[c0 + k]) + acc[k]);
  }
}

// ---- LayerNorm ----

// Two-pass mean and variance in double: no cancellation for rows with a large
// mean, and fp32 statistics are rounded once. Reads x[c] before writing y[c].
template <typename S, typename C = compute_t<S>>
void layernorm_forward_cpu(const S* x, const S* gamma, const S* beta, double eps, S* y, C* mean, C* rstd, Rows s) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* xr = x + r * s.cols;
    S* yr = y + r * s.cols;
    double sum = 0;
    for (i64 c = 0; c < s.cols; ++c) sum += ld(xr[c]);
    const double m = sum / static_cast<double>(s.cols);
    double sq = 0;
    for (i64 c = 0; c < s.cols; ++c) sq += (ld(xr[c]) - m) * (ld(xr[c]) - m);
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(s.cols) + eps);
    for (i64 c = 0; c < s.cols; ++c) yr[c] = st<S>((ld(xr[c]) - m) * rs * ld(gamma[c]) + ld(beta[c]));
    mean[r] = static_cast<C>(m);
    rstd[r] = static_cast<C>(rs);
  }
}

// dgamma += sum_r dy * xhat, dbeta += sum_r dy, each into its own accumulator type.
template <typename S, typename C = compute_t<S>>
void layernorm_param_grads_cpu(const S* dy, const S* x, const C* mean, const C* rstd, const Tensor& dgamma,
                               const Tensor& dbeta, Rows s) {
  with_accumulator_type<S>(dgamma, [&](auto tag) {
    using G = decltype(tag);
    accumulate_columns(ptr<G>(dgamma), s.rows, s.cols, [&](i64 r, i64 c) {
      return static_cast<double>(ld(dy[r * s.cols + c])) *
             ((ld(x[r * s.cols + c]) - static_cast<double>(mean[r])) * rstd[r]);
    });
  });
  with_accumulator_type<S>(dbeta, [&](auto tag) {
    using G = decltype(tag);
    accumulate_columns(ptr<G>(dbeta), s.rows, s.cols,
                       [&](i64 r, i64 c) { return static_cast<double>(ld(dy[r * s.cols + c])); });
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
// Reads dy[c] before writing dx[c], so dx may alias dy.
template <typename S, typename C = compute_t<S>>
void layernorm_backward_dx_cpu(const S* dy, const S* x, const S* gamma, const C* mean, const C* rstd, S* dx,
                               const S* add, Rows s) {
  const double inv_cols = 1.0 / static_cast<double>(s.cols);
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* dyr = dy + r * s.cols;
    const S* xr = x + r * s.cols;
    S* dxr = dx + r * s.cols;
    const double m = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
      sum_g += g;
      sum_gx += g * (ld(xr[c]) - m) * rs;
    }
    const double mean_g = sum_g * inv_cols, mean_gx = sum_gx * inv_cols;
    const S* addr = add ? add + r * s.cols : nullptr;
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
      const double v = rs * (g - mean_g - (ld(xr[c]) - m) * rs * mean_gx);
      dxr[c] = st<S>(addr ? v + static_cast<double>(ld(addr[c])) : v);
    }
  }
}

// ---- GeLU (tanh form), in the compute type ----

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

// gelu(x) = 0.5 x (1 + tanh(u)), u = c (x + a x^3), in three pieces so that the
// fp32 paths can take every tanh from one vector_math call (gelu_chunks).
template <typename T>
T gelu_arg(T x) {
  return static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
}
template <typename T>
T gelu_of(T x, T t) {  // t = tanh(gelu_arg(x))
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + t);
}
// d/dx of gelu: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(u).
template <typename T>
T gelu_grad_of(T x, T t) {
  const T du = static_cast<T>(kGeluC) * (static_cast<T>(1) + static_cast<T>(3 * kGeluA) * x * x);
  return static_cast<T>(0.5) * (static_cast<T>(1) + t) + static_cast<T>(0.5) * x * (static_cast<T>(1) - t * t) * du;
}

// The GeLU map over `rows` runs of `cols` elements (the last run may stop at
// `n`), 256 at a time: arg(r, c) gives the GeLU input in the compute type,
// then all the chunk's tanh come from one vector_math::tanh_f32 call, then
// out(r, c, x, t) stores the result. tanh_f32 computes every element with the
// same vector routine wherever it sits, so the fused and unfused GeLU paths
// (different runs over the same values) agree bit for bit. fp32 compute only
// (fp32 and 16-bit storage); fp64 keeps the scalar std::tanh.
template <typename Arg, typename Out>
void gelu_chunks(i64 rows, i64 cols, i64 n, Arg arg, Out out) {
  constexpr i64 kChunk = 256;
#pragma omp parallel for num_threads(threads()) schedule(static) if (n > kParallelMin)
  for (i64 r = 0; r < rows; ++r) {
    float x[kChunk], u[kChunk], t[kChunk];
    const i64 len = std::min(cols, n - r * cols);
    for (i64 c0 = 0; c0 < len; c0 += kChunk) {
      const i64 m = std::min(kChunk, len - c0);
      for (i64 k = 0; k < m; ++k) {
        x[k] = arg(r, c0 + k);
        u[k] = gelu_arg(x[k]);
      }
      tanh_f32(u, t, m);
      for (i64 k = 0; k < m; ++k) out(r, c0 + k, x[k], t[k]);
    }
  }
}

// A flat run of n elements as gelu_chunks' rows (no division per element).
constexpr i64 kGeluFlatRow = 4096;
inline i64 flat_rows(i64 n) { return (n + kGeluFlatRow - 1) / kGeluFlatRow; }

// Applies out[i] = f(i) over n elements; f reads only index i, so outputs may
// alias inputs.
template <typename T, typename F>
void elementwise(T* out, i64 n, F f) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (n > kParallelMin)
  for (i64 i = 0; i < n; ++i) out[i] = f(i);
}

// Applies out[r * cols + c] = f(r, c) row by row (a bias indexed by c without
// a division per element); f reads only that element, so outputs may alias inputs.
template <typename T, typename F>
void rowwise(T* out, i64 rows, i64 cols, F f) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * cols > kParallelMin)
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) out[r * cols + c] = f(r, c);
}

// A per-thread compute-type row of at least n elements, for the 16-bit rows
// the softmaxes widen before their vector exponentials (a few hundred KB at
// most, outside the memory tracker, as a library's thread buffer would be).
template <typename C>
C* row_scratch(i64 n) {
  thread_local std::vector<C> scratch;
  if (static_cast<i64>(scratch.size()) < n) scratch.resize(static_cast<std::size_t>(n));
  return scratch.data();
}

// ---- causal softmax ----// ---- causal softmax ----

// Row i of each [n, n] matrix is softmax over j <= i of scale * s; the max is
// subtracted before exp and the sum is taken in double. The unnormalised
// exponentials live in probs itself for fp32/fp64 and in a per-thread fp32 row
// for 16-bit storage (so that probabilities are rounded to 16 bits once).
template <typename S>
void causal_softmax_forward_cpu(const S* scores, double scale, S* probs, i64 mats, i64 n) {
  using C = compute_t<S>;
  const C sc = static_cast<C>(scale);
#pragma omp parallel for num_threads(threads()) schedule(static) if (mats * n * n > kParallelMin)
  for (i64 row = 0; row < mats * n; ++row) {
    const i64 i = row % n;
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
      for (i64 j = 0; j <= i; ++j) e[j] = ld(s[j]);
    }
    const C mx = scaled_max(x, sc, i + 1);
    const double sum = exp_scaled_shifted(x, sc, mx, e, i + 1);
    const double inv = 1.0 / sum;
    for (i64 j = 0; j <= i; ++j) p[j] = st<S>(e[j] * inv);
    for (i64 j = i + 1; j < n; ++j) p[j] = zero<S>();
  }
}

// Masked columns get an exact 0 whatever dprobs holds there (even NaN).
template <typename S>
void causal_softmax_backward_cpu(const S* dprobs, const S* probs, double scale, S* dscores, i64 mats, i64 n) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (mats * n * n > kParallelMin)
  for (i64 row = 0; row < mats * n; ++row) {
    const i64 i = row % n;
    const S* dp = dprobs + row * n;
    const S* p = probs + row * n;
    S* ds = dscores + row * n;
    double dot = 0;
    for (i64 j = 0; j <= i; ++j) dot += static_cast<double>(ld(dp[j])) * ld(p[j]);
    for (i64 j = 0; j <= i; ++j) ds[j] = st<S>(scale * ld(p[j]) * (ld(dp[j]) - dot));
    for (i64 j = i + 1; j < n; ++j) ds[j] = zero<S>();
  }
}

// ---- dropout ----

// out = in * keep / (1 - p), keep = uniform_at(key, global index) >= p (the
// keep decision never looks at the data or its dtype). Work is split into
// chunks of a [C, D] block so that every thread has some even when A * B is
// small (hidden states have B = 1).
template <typename S>
void dropout_cpu(const S* in, double p, const RngKey& key, const DropoutLayout& l, S* out) {
  using C = compute_t<S>;
  constexpr i64 kChunk = 4096;
  const i64 inner = l.C * l.D;
  const i64 chunks = (inner + kChunk - 1) / kChunk;
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
#pragma omp parallel for num_threads(threads()) schedule(static) if (l.A * l.B * inner > kParallelMin / 8)
  for (i64 item = 0; item < l.A * l.B * chunks; ++item) {
    const i64 row = item / chunks, k0 = (item % chunks) * kChunk, k1 = std::min(inner, k0 + kChunk);
    const std::uint64_t base = dropout_row_base(l, row);
    UniformStream uniform(key);
    for (i64 k = k0; k < k1; ++k) {
      const i64 idx = row * inner + k;
      const bool keep = uniform.at(base + static_cast<std::uint64_t>(k)) >= p;
      out[idx] = keep ? st<S>(ld(in[idx]) * keep_scale) : zero<S>();
    }
  }
}

void dropout(const char* op, const Tensor& in, double p, const RngKey& key, const DropoutLayout& layout, Tensor& out) {
  check_float(op, "input", in);
  check_operands(op, in, in.dtype(), {{"input", &in}, {"output", &out}});
  check_shape(op, "output", out, in.shape());
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, in.numel());
  MZ_ON_CUDA(in, cuda::dropout(in.dtype(), in.data(), p, key, layout, out.data(), stream_of(in)));
  if (!on_host(op, in)) return;
  with_storage_type(in.dtype(), [&](auto tag) {
    using S = decltype(tag);
    if (p == 0.0) {  // no RNG at all: an identity, also in cost
      if (ptr<S>(out) != ptr<S>(in)) std::copy_n(ptr<S>(in), in.numel(), ptr<S>(out));
      return;
    }
    dropout_cpu(ptr<const S>(in), p, key, layout, ptr<S>(out));
  });
}

// ---- cross-entropy pieces ----

struct VocabSlice {
  i64 rows, cols, valid;
};

VocabSlice check_logits(const char* op, const Tensor& logits, i64 valid) {
  check_float(op, "logits", logits);
  check_operand(op, "logits", logits, logits, logits.dtype());
  MZ_CHECK(logits.dim() == 2, op, ": logits must be [N, V_local], got ", logits.to_string());
  MZ_CHECK(valid >= 0 && valid <= logits.size(1), op, ": valid columns ", valid, " must be in [0, ", logits.size(1),
           "]");
  return {logits.size(0), logits.size(1), valid};
}

// Local column of a global target, or -1 when another rank holds it.
inline i64 local_column(std::int64_t target, i64 vocab_start, i64 valid) {
  const i64 c = target - vocab_start;
  return c >= 0 && c < valid ? c : -1;
}

// One row at a time, so the second sweep over it reads cache, not memory.
// The exponentials are vector_math's (libmvec) for fp32 and 16-bit rows.
template <typename S, typename C = compute_t<S>>
void cross_entropy_forward_cpu(S* logits, const std::int64_t* targets, i64 vocab_start, VocabSlice s, C* row_max,
                               C* sum_exp, C* target_logit) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.valid > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    S* lr = logits + r * s.cols;
    const i64 t = local_column(targets[r], vocab_start, s.valid);
    target_logit[r] = t >= 0 ? ld(lr[t]) : C{0};  // 0: the all-reduce sums over ranks
    // The row in the compute type: itself, or a per-thread copy of a 16-bit row.
    C* x;
    if constexpr (std::is_same_v<S, C>) {
      x = lr;
    } else {
      x = row_scratch<C>(s.valid);
      for (i64 c = 0; c < s.valid; ++c) x[c] = ld(lr[c]);
    }
    const C mx = scaled_max(x, C{1}, s.valid);  // -inf: a slice of only padding contributes nothing
    const double sum = exp_scaled_shifted(x, C{1}, mx, x, s.valid);
    if constexpr (!std::is_same_v<S, C>)
      for (i64 c = 0; c < s.valid; ++c) lr[c] = st<S>(x[c]);
    for (i64 c = s.valid; c < s.cols; ++c) lr[c] = zero<S>();
    row_max[r] = mx;
    sum_exp[r] = static_cast<C>(sum);
  }
}

// exp(row_max - global_max) / sum_exp: what turns a row's exponentials into
// probabilities. 0 for a slice of only padding (row_max = -inf).
template <typename C>
double softmax_factor(C row_max, C global_max, C sum_exp) {
  return std::exp(static_cast<double>(row_max) - static_cast<double>(global_max)) / static_cast<double>(sum_exp);
}

// Cloned per ISA (picked at load time): the 16-bit rows' store, a double
// product rounded to odd in fp32 and then to 16 bits, vectorises 8 doubles
// wide with AVX-512 (bf16 [1024, 25216]: 69 -> 38 ms on one thread).
template <typename S, typename C = compute_t<S>>
__attribute__((target_clones("avx512f", "avx2", "default"))) void cross_entropy_backward_cpu(
    const S* exp_logits, const C* row_max, const C* global_max, const C* sum_exp, const std::int64_t* targets,
    i64 vocab_start, VocabSlice s, double scale, S* dlogits) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* er = exp_logits + r * s.cols;
    S* dr = dlogits + r * s.cols;
    const double f = scale * softmax_factor(row_max[r], global_max[r], sum_exp[r]);
    const i64 t = local_column(targets[r], vocab_start, s.valid);
    // Taken before the loop (dlogits may alias exp_logits) and in double, so
    // the one-hot subtraction is not rounded twice.
    const double target_grad = t >= 0 ? static_cast<double>(ld(er[t])) * f - scale : 0.0;
#pragma omp simd
    for (i64 c = 0; c < s.valid; ++c) dr[c] = st<S>(static_cast<double>(ld(er[c])) * f);
    if (t >= 0) dr[t] = st<S>(target_grad);
    for (i64 c = s.valid; c < s.cols; ++c) dr[c] = zero<S>();
  }
}

}  // namespace

// ======================= public entry points =======================

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  constexpr const char* op = "layernorm_forward";
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  MZ_CHECK(s.cols > 0, op, ": x has no columns: ", x.to_string());
  MZ_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  check_operands(op, x, dt, {{"x", &x}, {"gamma", &gamma}, {"beta", &beta}, {"y", &y}});
  check_stat(op, "mean", mean, x, dt);
  check_stat(op, "rstd", rstd, x, dt);
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"beta", &beta}});
  check_shape(op, "y", y, x.shape());
  check_rows(op, "mean", mean, s.rows);
  check_rows(op, "rstd", rstd, s.rows);
  MZ_ON_CUDA(x, cuda::layernorm_forward(dt, x.data(), gamma.data(), beta.data(), eps, y.data(), mean.data(),
                                        rstd.data(), s.rows, s.cols, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(dt, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    layernorm_forward_cpu<S>(ptr<const S>(x), ptr<const S>(gamma), ptr<const S>(beta), eps, ptr<S>(y), ptr<C>(mean),
                             ptr<C>(rstd), s);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx) {
  constexpr const char* op = "layernorm_backward";
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  check_operands(op, x, dt, {{"dy", &dy}, {"x", &x}, {"gamma", &gamma}, {"dx", &dx}});
  check_stat(op, "mean", mean, x, dt);
  check_stat(op, "rstd", rstd, x, dt);
  check_accumulator(op, "dgamma", dgamma, x, dt);
  check_accumulator(op, "dbeta", dbeta, x, dt);
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  if (add_to_dx) {
    check_operand(op, "add_to_dx", *add_to_dx, x, dt);
    check_shape(op, "add_to_dx", *add_to_dx, x.shape());
  }
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"dgamma", &dgamma}, {"dbeta", &dbeta}});
  check_rows(op, "mean", mean, s.rows);
  check_rows(op, "rstd", rstd, s.rows);
  const Tensor ws =
      allocate_gpu_scratch(x, gpu_scratch::column_sums_bytes(dt, s.rows, s.cols, 2), "layernorm_backward scratch");
  MZ_ON_CUDA(x, cuda::layernorm_backward(dt, dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                                         dgamma.data(), dgamma.dtype(), dbeta.data(), dbeta.dtype(),
                                         add_to_dx ? add_to_dx->data() : nullptr, s.rows, s.cols, scratch_of(ws),
                                         stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(dt, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    // Parameter gradients first: dx may overwrite dy.
    layernorm_param_grads_cpu<S>(ptr<const S>(dy), ptr<const S>(x), ptr<const C>(mean), ptr<const C>(rstd), dgamma,
                                 dbeta, s);
    layernorm_backward_dx_cpu<S>(ptr<const S>(dy), ptr<const S>(x), ptr<const S>(gamma), ptr<const C>(mean),
                                 ptr<const C>(rstd), ptr<S>(dx), add_to_dx ? ptr<const S>(*add_to_dx) : nullptr, s);
  });
}

void gelu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "gelu_forward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  MZ_ON_CUDA(x, cuda::gelu_forward(x.dtype(), x.data(), y.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* xp = ptr<const S>(x);
    S* yp = ptr<S>(y);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      elementwise(yp, x.numel(), [=](i64 i) { return st<S>(gelu_of(ld(xp[i]), std::tanh(gelu_arg(ld(xp[i]))))); });
    } else {
      const i64 n = x.numel();
      gelu_chunks(
          flat_rows(n), kGeluFlatRow, n, [=](i64 r, i64 c) { return ld(xp[r * kGeluFlatRow + c]); },
          [=](i64 r, i64 c, float v, float t) { yp[r * kGeluFlatRow + c] = st<S>(gelu_of(v, t)); });
    }
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  constexpr const char* op = "gelu_backward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  MZ_ON_CUDA(x, cuda::gelu_backward(x.dtype(), dy.data(), x.data(), dx.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* xp = ptr<const S>(x);
    const S* dyp = ptr<const S>(dy);
    S* dxp = ptr<S>(dx);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      elementwise(dxp, x.numel(), [=](i64 i) {
        const double v = ld(xp[i]);
        return st<S>(ld(dyp[i]) * gelu_grad_of(v, std::tanh(gelu_arg(v))));
      });
    } else {
      const i64 n = x.numel();
      gelu_chunks(
          flat_rows(n), kGeluFlatRow, n, [=](i64 r, i64 c) { return ld(xp[r * kGeluFlatRow + c]); },
          [=](i64 r, i64 c, float v, float t) {
            const i64 i = r * kGeluFlatRow + c;
            dxp[i] = st<S>(ld(dyp[i]) * gelu_grad_of(v, t));
          });
    }
  });
}

void bias_gelu_forward(const Tensor& y, const Tensor& bias, Tensor& out) {
  constexpr const char* op = "bias_gelu_forward";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}, {"out", &out}});
  check_shape(op, "bias", bias, {s.cols});
  check_shape(op, "out", out, y.shape());
  MZ_ON_CUDA(y, cuda::bias_gelu_forward(y.dtype(), y.data(), bias.data(), out.data(), s.rows, s.cols, stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* yp = ptr<const S>(y);
    const S* bp = ptr<const S>(bias);
    S* op_ = ptr<S>(out);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      rowwise(op_, s.rows, s.cols, [=](i64 r, i64 c) {
        const double v = ld(yp[r * s.cols + c]) + ld(bp[c]);
        return st<S>(gelu_of(v, std::tanh(gelu_arg(v))));
      });
    } else {
      gelu_chunks(
          s.rows, s.cols, s.rows * s.cols, [=](i64 r, i64 c) { return ld(yp[r * s.cols + c]) + ld(bp[c]); },
          [=](i64 r, i64 c, float v, float t) { op_[r * s.cols + c] = st<S>(gelu_of(v, t)); });
    }
  });
}

void bias_gelu_backward(const Tensor& dy, const Tensor& y, const Tensor& bias, Tensor& dx, Tensor& dbias) {
  constexpr const char* op = "bias_gelu_backward";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"dy", &dy}, {"y", &y}, {"bias", &bias}, {"dx", &dx}});
  check_shapes(op, y.shape(), {{"dy", &dy}, {"dx", &dx}});
  check_shape(op, "bias", bias, {s.cols});
  check_accumulator(op, "dbias", dbias, y, y.dtype());
  check_shape(op, "dbias", dbias, {s.cols});
  const Tensor ws = allocate_gpu_scratch(y, gpu_scratch::column_sums_bytes(y.dtype(), s.rows, s.cols, 1),
                                         "bias_gelu_backward scratch");
  MZ_ON_CUDA(y, cuda::bias_gelu_backward(y.dtype(), dy.data(), y.data(), bias.data(), dx.data(), dbias.data(),
                                         dbias.dtype(), s.rows, s.cols, scratch_of(ws), stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* yp = ptr<const S>(y);
    const S* bp = ptr<const S>(bias);
    const S* dyp = ptr<const S>(dy);
    S* dxp = ptr<S>(dx);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      rowwise(dxp, s.rows, s.cols, [=](i64 r, i64 c) {
        const i64 i = r * s.cols + c;
        const double v = ld(yp[i]) + ld(bp[c]);
        return st<S>(ld(dyp[i]) * gelu_grad_of(v, std::tanh(gelu_arg(v))));
      });
    } else {
      gelu_chunks(
          s.rows, s.cols, s.rows * s.cols, [=](i64 r, i64 c) { return ld(yp[r * s.cols + c]) + ld(bp[c]); },
          [=](i64 r, i64 c, float v, float t) {
            const i64 i = r * s.cols + c;
            dxp[i] = st<S>(ld(dyp[i]) * gelu_grad_of(v, t));
          });
    }
  });
  bias_grad(dx, dbias);  // the CPU gains nothing from fusing this pass
}

void add_bias(Tensor& y, const Tensor& bias) {
  constexpr const char* op = "add_bias";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}});
  check_shape(op, "bias", bias, {s.cols});
  MZ_ON_CUDA(y, cuda::add_bias(y.dtype(), y.data(), bias.data(), s.rows, s.cols, stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    S* yp = ptr<S>(y);
    const S* bp = ptr<const S>(bias);
    rowwise(yp, s.rows, s.cols, [=](i64 r, i64 c) { return st<S>(ld(yp[r * s.cols + c]) + ld(bp[c])); });
  });
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  constexpr const char* op = "bias_grad";
  check_float(op, "dy", dy);
  const Rows s = rows_of(op, "dy", dy);
  check_operand(op, "dy", dy, dy, dy.dtype());
  check_accumulator(op, "dbias", dbias, dy, dy.dtype());
  check_shape(op, "dbias", dbias, {s.cols});
  const Tensor ws =
      allocate_gpu_scratch(dy, gpu_scratch::column_sums_bytes(dy.dtype(), s.rows, s.cols, 1), "bias_grad scratch");
  MZ_ON_CUDA(dy, cuda::bias_grad(dy.dtype(), dy.data(), dbias.data(), dbias.dtype(), s.rows, s.cols, scratch_of(ws),
                                 stream_of(dy)));
  if (!on_host(op, dy)) return;
  with_storage_type(dy.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* g = ptr<const S>(dy);
    with_accumulator_type<S>(dbias, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      accumulate_columns(ptr<G>(dbias), s.rows, s.cols,
                         [=](i64 r, i64 c) { return static_cast<double>(ld(g[r * s.cols + c])); });
    });
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* op = "add";
  check_float(op, "a", a);
  check_operands(op, a, a.dtype(), {{"a", &a}, {"b", &b}, {"out", &out}});
  check_shapes(op, a.shape(), {{"b", &b}, {"out", &out}});
  MZ_ON_CUDA(a, cuda::add(a.dtype(), a.data(), b.data(), out.data(), a.numel(), stream_of(a)));
  if (!on_host(op, a)) return;
  with_storage_type(a.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* ap = ptr<const S>(a);
    const S* bp = ptr<const S>(b);
    elementwise(ptr<S>(out), a.numel(), [=](i64 i) { return st<S>(ld(ap[i]) + ld(bp[i])); });
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  constexpr const char* op = "axpy";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  MZ_ON_CUDA(x, cuda::axpy(x.dtype(), alpha, x.data(), y.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const S* xp = ptr<const S>(x);
    S* yp = ptr<S>(y);
    const C a = static_cast<C>(alpha);
    elementwise(yp, x.numel(), [=](i64 i) { return st<S>(ld(yp[i]) + a * ld(xp[i])); });
  });
}

void scale(Tensor& x, double alpha) {
  constexpr const char* op = "scale";
  check_float(op, "x", x);
  check_operand(op, "x", x, x, x.dtype());
  MZ_ON_CUDA(x, cuda::scale_elements(x.dtype(), x.data(), x.numel(), alpha, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    S* xp = ptr<S>(x);
    const C a = static_cast<C>(alpha);
    elementwise(xp, x.numel(), [=](i64 i) { return st<S>(ld(xp[i]) * a); });
  });
}

namespace {
// Attention scores are [..., n, n]; returns the number of n x n matrices.
i64 check_square(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.dim() >= 2 && t.size(-1) == t.size(-2), op, ": ", name, " must be [batch, sq, sk] with sq == sk, got ",
           t.to_string());
  return t.size(-1) == 0 ? 0 : t.numel() / (t.size(-1) * t.size(-1));
}
}  // namespace

void causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs) {
  constexpr const char* op = "causal_softmax_forward";
  check_float(op, "scores", scores);
  const i64 mats = check_square(op, "scores", scores);
  check_operands(op, scores, scores.dtype(), {{"scores", &scores}, {"probs", &probs}});
  check_shape(op, "probs", probs, scores.shape());
  MZ_ON_CUDA(scores, cuda::causal_softmax_forward(scores.dtype(), scores.data(), scale, probs.data(), mats,
                                                  scores.size(-1), stream_of(scores)));
  if (!on_host(op, scores)) return;
  with_storage_type(scores.dtype(), [&](auto tag) {
    using S = decltype(tag);
    causal_softmax_forward_cpu(ptr<const S>(scores), scale, ptr<S>(probs), mats, scores.size(-1));
  });
}

void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale, Tensor& dscores) {
  constexpr const char* op = "causal_softmax_backward";
  check_float(op, "probs", probs);
  const i64 mats = check_square(op, "probs", probs);
  check_operands(op, probs, probs.dtype(), {{"dprobs", &dprobs}, {"probs", &probs}, {"dscores", &dscores}});
  check_shapes(op, probs.shape(), {{"dprobs", &dprobs}, {"dscores", &dscores}});
  MZ_ON_CUDA(probs, cuda::causal_softmax_backward(probs.dtype(), dprobs.data(), probs.data(), scale, dscores.data(),
                                                  mats, probs.size(-1), stream_of(probs)));
  if (!on_host(op, probs)) return;
  with_storage_type(probs.dtype(), [&](auto tag) {
    using S = decltype(tag);
    causal_softmax_backward_cpu(ptr<const S>(dprobs), ptr<const S>(probs), scale, ptr<S>(dscores), mats,
                                probs.size(-1));
  });
}

void bias_dropout_add(const Tensor& y, const Tensor& bias, const Tensor& residual, double p, const RngKey& key,
                      const DropoutLayout& layout, Tensor& out) {
  constexpr const char* op = "bias_dropout_add";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}, {"residual", &residual}, {"out", &out}});
  check_shape(op, "bias", bias, {s.cols});
  check_shapes(op, y.shape(), {{"residual", &residual}, {"out", &out}});
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, y.numel());
  MZ_ON_CUDA(y, cuda::bias_dropout_add(y.dtype(), y.data(), bias.data(), residual.data(), p, key, layout, out.data(),
                                       s.cols, stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const S* yp = ptr<const S>(y);
    const S* bp = ptr<const S>(bias);
    const S* rp = ptr<const S>(residual);
    S* op_ = ptr<S>(out);
    const C keep_scale = static_cast<C>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
    const i64 inner = layout.C * layout.D, cols = s.cols;
#pragma omp parallel for num_threads(threads()) schedule(static) if (y.numel() > kParallelMin)
    for (i64 row = 0; row < layout.A * layout.B; ++row) {
      const std::uint64_t base = dropout_row_base(layout, row);
      UniformStream uniform(key);
      for (i64 k = 0; k < inner; ++k) {
        const i64 idx = row * inner + k;
        const bool keep = p == 0.0 || uniform.at(base + static_cast<std::uint64_t>(k)) >= p;
        const C v = keep ? (ld(yp[idx]) + ld(bp[idx % cols])) * keep_scale : C(0);
        op_[idx] = st<S>(ld(rp[idx]) + v);
      }
    }
  });
}

void dropout_forward(const Tensor& x, double p, const RngKey& key, const DropoutLayout& layout, Tensor& y) {
  dropout("dropout_forward", x, p, key, layout, y);
}

// The mask is a pure function of (key, global index): regenerating it costs
// compute but no memory, and matches the forward bit for bit.
void dropout_backward(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx) {
  dropout("dropout_backward", dy, p, key, layout, dx);
}

void dropout_backward_bias_grad(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx,
                                Tensor& dbias) {
  constexpr const char* op = "dropout_backward_bias_grad";
  check_float(op, "dy", dy);
  const Rows s = rows_of(op, "dy", dy);
  check_operands(op, dy, dy.dtype(), {{"dy", &dy}, {"dx", &dx}});
  check_shape(op, "dx", dx, dy.shape());
  check_accumulator(op, "dbias", dbias, dy, dy.dtype());
  check_shape(op, "dbias", dbias, {s.cols});
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, dy.numel());
  const Tensor ws = allocate_gpu_scratch(dy, gpu_scratch::dropout_bias_grad_bytes(s.rows, s.cols),
                                         "dropout_backward_bias_grad scratch");
  MZ_ON_CUDA(dy, cuda::dropout_backward_bias_grad(dy.dtype(), dy.data(), p, key, layout, dx.data(), dbias.data(),
                                                  dbias.dtype(), s.rows, s.cols, scratch_of(ws), stream_of(dy)));
  if (!on_host(op, dy)) return;
  dropout(op, dy, p, key, layout, dx);
  bias_grad(dx, dbias);
}

void embedding_forward(const Tensor& ids, const Tensor& table, std::int64_t vocab_start, Tensor& out) {
  constexpr const char* op = "embedding_forward";
  check_float(op, "table", table);
  MZ_CHECK(table.dim() == 2, op, ": table must be [V_local, H], got ", table.to_string());
  const i64 v = table.size(0), h = table.size(1);
  check_operand(op, "table", table, table, table.dtype());
  check_operand(op, "ids", ids, table, DType::I64);
  MZ_CHECK(ids.dim() == 1, op, ": ids must be [N], got ", ids.to_string());
  const i64 n = ids.size(0);
  check_operand(op, "out", out, table, table.dtype());
  check_shape(op, "out", out, {n, h});
  MZ_ON_CUDA(table, cuda::embedding_forward(table.dtype(), ptr<const std::int64_t>(ids), table.data(), vocab_start, v,
                                            h, out.data(), n, stream_of(table)));
  if (!on_host(op, table)) return;
  with_storage_type(table.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const std::int64_t* id = ptr<const std::int64_t>(ids);
    const S* tab = ptr<const S>(table);
    S* o = ptr<S>(out);
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0)
        std::copy_n(tab + row * h, h, o + i * h);
      else
        std::fill_n(o + i * h, h, zero<S>());  // another rank's row; the all-reduce fills it
    }
  });
}

namespace {
// dtable[row] += dout[i] for the tokens i whose id is in the slice. Repeated ids
// add into one row in token order, so the result is fixed whatever the threads.
template <typename S, typename G>
void embedding_backward_cpu(const std::int64_t* id, const S* g, i64 vocab_start, i64 n, i64 v, i64 h, G* dt) {
  constexpr i64 kBlock = 64;
  if constexpr (!is_16bit_v<G>) {
    // An fp32/fp64 accumulator sums in place. Threads split the columns, never
    // the tokens, so there are no races.
    const i64 blocks = (h + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 blk = 0; blk < blocks; ++blk) {
      const i64 c0 = blk * kBlock, c1 = std::min(h, c0 + kBlock);
      for (i64 i = 0; i < n; ++i) {
        const i64 row = local_column(id[i], vocab_start, v);
        if (row < 0) continue;
        for (i64 c = c0; c < c1; ++c) dt[row * h + c] += ld(g[i * h + c]);
      }
    }
  } else {
    // A 16-bit accumulator is rounded once per call: the tokens of each row are
    // listed (a counting sort, stable in token order) and summed in fp32 from
    // the row's old value; threads split the rows.
    std::vector<i64> first(static_cast<std::size_t>(v) + 1, 0);
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0) ++first[static_cast<std::size_t>(row) + 1];
    }
    for (std::size_t r = 0; r < static_cast<std::size_t>(v); ++r) first[r + 1] += first[r];
    std::vector<i64> tokens(static_cast<std::size_t>(first.back())), next(first.begin(), first.end() - 1);
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0) tokens[static_cast<std::size_t>(next[static_cast<std::size_t>(row)]++)] = i;
    }
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 row = 0; row < v; ++row) {
      const i64 t0 = first[static_cast<std::size_t>(row)], t1 = first[static_cast<std::size_t>(row) + 1];
      if (t0 == t1) continue;
      for (i64 c0 = 0; c0 < h; c0 += kBlock) {
        const i64 len = std::min(kBlock, h - c0);
        G* dr = dt + row * h + c0;
        float acc[kBlock];
        for (i64 k = 0; k < len; ++k) acc[k] = ld(dr[k]);
        for (i64 t = t0; t < t1; ++t) {
          const S* gr = g + tokens[static_cast<std::size_t>(t)] * h + c0;
          for (i64 k = 0; k < len; ++k) acc[k] += ld(gr[k]);
        }
        for (i64 k = 0; k < len; ++k) dr[k] = st<G>(acc[k]);
      }
    }
  }
}
}  // namespace

void embedding_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start, Tensor& dtable) {
  constexpr const char* op = "embedding_backward";
  check_float(op, "dout", dout);
  check_accumulator(op, "dtable", dtable, dout, dout.dtype());
  MZ_CHECK(dtable.dim() == 2, op, ": dtable must be [V_local, H], got ", dtable.to_string());
  const i64 v = dtable.size(0), h = dtable.size(1);
  check_operand(op, "ids", ids, dtable, DType::I64);
  MZ_CHECK(ids.dim() == 1, op, ": ids must be [N], got ", ids.to_string());
  const i64 n = ids.size(0);
  check_operand(op, "dout", dout, dtable, dout.dtype());
  check_shape(op, "dout", dout, {n, h});
  const Tensor ws = allocate_gpu_scratch(dtable, n > 0 && h > 0 ? gpu_scratch::embedding_sort_bytes(n) : 0,
                                         "embedding_backward sort");
  MZ_ON_CUDA(dtable, cuda::embedding_backward(dout.dtype(), ptr<const std::int64_t>(ids), dout.data(), vocab_start, n,
                                              v, h, dtable.data(), dtable.dtype(), scratch_of(ws), stream_of(dtable)));
  if (!on_host(op, dtable)) return;
  with_storage_type(dout.dtype(), [&](auto tag) {
    using S = decltype(tag);
    with_accumulator_type<S>(dtable, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      embedding_backward_cpu(ptr<const std::int64_t>(ids), ptr<const S>(dout), vocab_start, n, v, h, ptr<G>(dtable));
    });
  });
}

namespace {
// out/dout is [B * seq, H]; pos_table/dpos holds at least `seq` positions of H.
// The position table has the activations' dtype; a gradient `accumulator` may
// also be fp32 for 16-bit activations.
Rows check_positions(const char* op, const Tensor& act, const Tensor& pos, std::int64_t seq, bool accumulator) {
  check_float(op, "activations", act);
  check_operand(op, "activations", act, act, act.dtype());
  if (accumulator)
    check_accumulator(op, "position gradient", pos, act, act.dtype());
  else
    check_operand(op, "position table", pos, act, act.dtype());
  MZ_CHECK(act.dim() == 2, op, ": activations must be [B*S, H], got ", act.to_string());
  MZ_CHECK(pos.dim() == 2 && pos.size(1) == act.size(1), op, ": position table must be [P, ", act.size(1), "], got ",
           pos.to_string());
  MZ_CHECK(seq > 0 && act.size(0) % seq == 0, op, ": ", act.size(0), " rows are not a whole number of sequences of ",
           seq);
  MZ_CHECK(pos.size(0) >= seq, op, ": sequence length ", seq, " exceeds the ", pos.size(0), " positions of the table");
  return {act.size(0) / seq, act.size(1)};  // {batch, hidden}
}
}  // namespace

void add_position_embedding(Tensor& out, const Tensor& pos_table, std::int64_t seq) {
  constexpr const char* op = "add_position_embedding";
  const Rows s = check_positions(op, out, pos_table, seq, false);
  MZ_ON_CUDA(out, cuda::add_position_embedding(out.dtype(), out.data(), pos_table.data(), out.numel(), seq * s.cols,
                                               stream_of(out)));
  if (!on_host(op, out)) return;
  with_storage_type(out.dtype(), [&](auto tag) {
    using S = decltype(tag);
    S* o = ptr<S>(out);
    const S* pos = ptr<const S>(pos_table);
    const i64 per_sample = seq * s.cols;  // out[b*S + s, :] is element b * per_sample + (s * H + h)
    elementwise(o, out.numel(), [=](i64 i) { return st<S>(ld(o[i]) + ld(pos[i % per_sample])); });
  });
}

void position_embedding_backward(const Tensor& dout, std::int64_t seq, Tensor& dpos) {
  constexpr const char* op = "position_embedding_backward";
  const Rows s = check_positions(op, dout, dpos, seq, true);
  const Tensor ws = allocate_gpu_scratch(dout, gpu_scratch::column_sums_bytes(dout.dtype(), s.rows, seq * s.cols, 1),
                                         "position_embedding_backward scratch");
  MZ_ON_CUDA(dout, cuda::position_embedding_backward(dout.dtype(), dout.data(), s.rows, seq * s.cols, dpos.data(),
                                                     dpos.dtype(), scratch_of(ws), stream_of(dout)));
  if (!on_host(op, dout)) return;
  with_storage_type(dout.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* g = ptr<const S>(dout);
    const i64 per_sample = seq * s.cols;
    // The first seq rows of dpos, flattened, are a sum over samples b of dout's
    // b-th [seq * H] block.
    with_accumulator_type<S>(dpos, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      accumulate_columns(ptr<G>(dpos), s.rows, per_sample,
                         [=](i64 b, i64 j) { return static_cast<double>(ld(g[b * per_sample + j])); });
    });
  });
}

void cross_entropy_forward(Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                           Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  constexpr const char* op = "cross_entropy_forward";
  const VocabSlice s = check_logits(op, logits, valid);
  check_operand(op, "targets", targets, logits, DType::I64);
  check_rows(op, "targets", targets, s.rows);
  for (const auto& [name, t] : {Named{"row_max", &row_max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}}) {
    check_stat(op, name, *t, logits, logits.dtype());
    check_rows(op, name, *t, s.rows);
  }
  MZ_ON_CUDA(logits, cuda::cross_entropy_forward(logits.dtype(), logits.data(), ptr<const std::int64_t>(targets),
                                                 vocab_start, s.rows, s.cols, s.valid, row_max.data(), sum_exp.data(),
                                                 target_logit.data(), stream_of(logits)));
  if (!on_host(op, logits)) return;
  with_storage_type(logits.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    cross_entropy_forward_cpu<S>(ptr<S>(logits), ptr<const std::int64_t>(targets), vocab_start, s, ptr<C>(row_max),
                                 ptr<C>(sum_exp), ptr<C>(target_logit));
  });
}

namespace {
// Per-row statistics all of one float dtype, one element per row.
i64 check_stat_vectors(const char* op, const Tensor& first, std::initializer_list<Named> all) {
  MZ_CHECK(first.defined(), op, ": statistics are undefined");
  MZ_CHECK(first.dtype() == DType::F32 || first.dtype() == DType::F64, op,
           ": statistics must be fp32 or fp64 (row_stat_dtype), got ", first.to_string());
  const i64 rows = first.numel();
  for (const auto& [name, t] : all) {
    check_operand(op, name, *t, first, first.dtype());
    check_rows(op, name, *t, rows);
  }
  return rows;
}

// Calls fn(C{}) with the host type of a statistics dtype (fp32 or fp64).
template <typename Fn>
void with_stat_type(DType t, Fn&& fn) {
  if (t == DType::F64)
    fn(double{});
  else
    fn(float{});
}
}  // namespace

void rescale_sum_exp(const Tensor& row_max, const Tensor& global_max, Tensor& sum_exp) {
  constexpr const char* op = "rescale_sum_exp";
  const i64 rows =
      check_stat_vectors(op, sum_exp, {{"row_max", &row_max}, {"global_max", &global_max}, {"sum_exp", &sum_exp}});
  MZ_ON_CUDA(sum_exp, cuda::rescale_sum_exp(sum_exp.dtype(), row_max.data(), global_max.data(), rows, sum_exp.data(),
                                            stream_of(sum_exp)));
  if (!on_host(op, sum_exp)) return;
  with_stat_type(sum_exp.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const C* m = ptr<const C>(row_max);
    const C* g = ptr<const C>(global_max);
    C* se = ptr<C>(sum_exp);
    // A slice of only padding (sum 0, max -inf) stays 0.
    elementwise(se, rows, [=](i64 r) {
      return se[r] == C{0} ? C{0}
                           : static_cast<C>(static_cast<double>(se[r]) *
                                            std::exp(static_cast<double>(m[r]) - static_cast<double>(g[r])));
    });
  });
}

void cross_entropy_loss(const Tensor& global_max, const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss) {
  constexpr const char* op = "cross_entropy_loss";
  const i64 rows = check_stat_vectors(
      op, loss, {{"global_max", &global_max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}, {"loss", &loss}});
  MZ_ON_CUDA(loss, cuda::cross_entropy_loss(loss.dtype(), global_max.data(), sum_exp.data(), target_logit.data(), rows,
                                            loss.data(), stream_of(loss)));
  if (!on_host(op, loss)) return;
  with_stat_type(loss.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const C* m = ptr<const C>(global_max);
    const C* se = ptr<const C>(sum_exp);
    const C* tl = ptr<const C>(target_logit);
    elementwise(ptr<C>(loss), rows, [=](i64 r) {
      return static_cast<C>(std::log(static_cast<double>(se[r])) + static_cast<double>(m[r]) -
                            static_cast<double>(tl[r]));
    });
  });
}

void cross_entropy_backward(const Tensor& exp_logits, const Tensor& row_max, const Tensor& global_max,
                            const Tensor& sum_exp, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                            double scale, Tensor& dlogits) {
  constexpr const char* op = "cross_entropy_backward";
  const VocabSlice s = check_logits(op, exp_logits, valid);
  for (const auto& [name, t] : {Named{"row_max", &row_max}, {"global_max", &global_max}, {"sum_exp", &sum_exp}}) {
    check_stat(op, name, *t, exp_logits, exp_logits.dtype());
    check_rows(op, name, *t, s.rows);
  }
  check_operand(op, "targets", targets, exp_logits, DType::I64);
  check_rows(op, "targets", targets, s.rows);
  check_operand(op, "dlogits", dlogits, exp_logits, exp_logits.dtype());
  check_shape(op, "dlogits", dlogits, exp_logits.shape());
  MZ_ON_CUDA(exp_logits,
             cuda::cross_entropy_backward(exp_logits.dtype(), exp_logits.data(), row_max.data(), global_max.data(),
                                          sum_exp.data(), ptr<const std::int64_t>(targets), vocab_start, s.rows, s.cols,
                                          s.valid, scale, dlogits.data(), stream_of(exp_logits)));
  if (!on_host(op, exp_logits)) return;
  with_storage_type(exp_logits.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    cross_entropy_backward_cpu<S>(ptr<const S>(exp_logits), ptr<const C>(row_max), ptr<const C>(global_max),
                                  ptr<const C>(sum_exp), ptr<const std::int64_t>(targets), vocab_start, s, scale,
                                  ptr<S>(dlogits));
  });
}

}  // namespace megazero::kernels
