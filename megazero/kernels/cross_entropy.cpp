// The vocabulary-parallel cross-entropy's pieces (cross_entropy.h): shape
// checks, device dispatch and the CPU kernels. Each public function validates
// its arguments (also on the meta device, where nothing is computed), then
// runs a template over the storage type S (float, double, BFloat16 or Half)
// on raw pointers: elements are read with ld() into the compute type
// C = compute_t<S> and written with st<S>(), which rounds once to nearest even
// (kernel_support.h). Rows are OpenMP-parallel, each computed by one thread,
// so results are bitwise identical for any thread count.
#include "megazero/kernels/cross_entropy.h"

#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "megazero/core/error.h"
#include "megazero/kernels/cpu_loops.h"
#include "megazero/kernels/kernel_support.h"
#include "megazero/kernels/vector_math.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cross_entropy.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h, cpu_loops.h

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

// The row in the compute type: the logits themselves (fp32, fp64), or the
// 16-bit row widened into `scratch`.
template <typename S, typename C>
const C* widened_row(const S* row, i64 n, C* scratch) {
  if constexpr (std::is_same_v<S, C>) {
    return row;
  } else {
    for (i64 c = 0; c < n; ++c) scratch[c] = ld(row[c]);
    return scratch;
  }
}

// The row's exponentials go to a per-thread scratch row (the logits stay as
// they are); a 16-bit row is widened into it first and exponentiated in
// place. The exponentials are vector_math's (libmvec) for fp32 and 16-bit rows.
template <typename S, typename C = compute_t<S>>
void cross_entropy_forward_cpu(const S* logits, const std::int64_t* targets, i64 vocab_start, VocabSlice s, C* row_max,
                               C* sum_exp, C* target_logit) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.valid > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* lr = logits + r * s.cols;
    const i64 t = local_column(targets[r], vocab_start, s.valid);
    target_logit[r] = t >= 0 ? ld(lr[t]) : C{0};  // 0: the all-reduce sums over ranks
    C* e = row_scratch<C>(s.valid);
    const C* x = widened_row(lr, s.valid, e);
    const C mx = scaled_max(x, C{1}, s.valid);  // -inf: a slice of only padding contributes nothing
    row_max[r] = mx;
    sum_exp[r] = static_cast<C>(exp_scaled_shifted(x, C{1}, mx, e, s.valid));
  }
}

// Cloned per ISA (picked at load time): the 16-bit rows' store, a double
// product rounded to odd in fp32 and then to 16 bits, vectorises 8 doubles
// wide with AVX-512 (bf16 [1024, 25216]: 69 -> 38 ms on one thread).
template <typename S, typename C = compute_t<S>>
__attribute__((target_clones("avx512f", "avx2", "default"))) void scale_row_into(const C* e, double f, i64 n, S* d) {
#pragma omp simd
  for (i64 c = 0; c < n; ++c) d[c] = st<S>(static_cast<double>(e[c]) * f);
}

template <typename S, typename C = compute_t<S>>
void cross_entropy_backward_cpu(const S* logits, const C* global_max, const C* sum_exp, const std::int64_t* targets,
                                i64 vocab_start, VocabSlice s, double scale, const C* weight, S* dlogits) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* lr = logits + r * s.cols;
    S* dr = dlogits + r * s.cols;
    // The softmax's exponentials, computed as the forward's are (into the
    // scratch row, so dlogits may alias the logits), then scaled in double.
    C* e = row_scratch<C>(s.valid);
    exp_scaled_shifted(widened_row(lr, s.valid, e), C{1}, global_max[r], e, s.valid);
    const double row_scale = weight ? scale * static_cast<double>(weight[r]) : scale;
    const double f = row_scale / static_cast<double>(sum_exp[r]);
    const i64 t = local_column(targets[r], vocab_start, s.valid);
    scale_row_into<S>(e, f, s.valid, dr);
    // In double, so the one-hot subtraction is not rounded twice.
    if (t >= 0) dr[t] = st<S>(static_cast<double>(e[t]) * f - row_scale);
    for (i64 c = s.valid; c < s.cols; ++c) dr[c] = zero<S>();
  }
}

// The forward's operands: logits, targets and the three row statistics.
VocabSlice check_forward(const char* op, const Tensor& logits, const Tensor& targets, i64 valid, const Tensor& row_max,
                         const Tensor& sum_exp, const Tensor& target_logit) {
  const VocabSlice s = check_logits(op, logits, valid);
  check_operand(op, "targets", targets, logits, DType::I64);
  check_rows(op, "targets", targets, s.rows);
  for (const auto& [name, t] : {Named{"row_max", &row_max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}}) {
    check_stat(op, name, *t, logits, logits.dtype());
    check_rows(op, name, *t, s.rows);
  }
  return s;
}

// The optional row weights: [rows] of the statistics' dtype, on their device.
void check_weight(const char* op, const Tensor* weight, const Tensor& like_stat, i64 rows) {
  if (!weight) return;
  MZ_CHECK(weight->defined(), op, ": the row weights are undefined (pass nullptr for none)");
  check_operand(op, "weight", *weight, like_stat, like_stat.dtype());
  check_rows(op, "weight", *weight, rows);
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                           Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  constexpr const char* op = "cross_entropy_forward";
  const VocabSlice s = check_forward(op, logits, targets, valid, row_max, sum_exp, target_logit);
  MZ_ON_CUDA(logits, cuda::cross_entropy_forward(logits.dtype(), logits.data(), ptr<const std::int64_t>(targets),
                                                 vocab_start, s.rows, s.cols, s.valid, row_max.data(), sum_exp.data(),
                                                 target_logit.data(), stream_of(logits)));
  if (!on_host(op, logits)) return;
  with_storage_type(logits.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    cross_entropy_forward_cpu<S>(ptr<const S>(logits), ptr<const std::int64_t>(targets), vocab_start, s,
                                 ptr<C>(row_max), ptr<C>(sum_exp), ptr<C>(target_logit));
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

void cross_entropy_loss(const Tensor& global_max, const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss,
                        const Tensor* weight) {
  constexpr const char* op = "cross_entropy_loss";
  const i64 rows = check_stat_vectors(
      op, loss, {{"global_max", &global_max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}, {"loss", &loss}});
  check_weight(op, weight, loss, rows);
  MZ_ON_CUDA(loss, cuda::cross_entropy_loss(loss.dtype(), global_max.data(), sum_exp.data(), target_logit.data(),
                                            weight ? weight->data() : nullptr, rows, loss.data(), stream_of(loss)));
  if (!on_host(op, loss)) return;
  with_stat_type(loss.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const C* m = ptr<const C>(global_max);
    const C* se = ptr<const C>(sum_exp);
    const C* tl = ptr<const C>(target_logit);
    const C* w = weight ? ptr<const C>(*weight) : nullptr;
    elementwise(ptr<C>(loss), rows, [=](i64 r) {
      const double l = std::log(static_cast<double>(se[r])) + static_cast<double>(m[r]) - static_cast<double>(tl[r]);
      return static_cast<C>(w ? l * static_cast<double>(w[r]) : l);
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& global_max, const Tensor& sum_exp,
                            const Tensor& targets, std::int64_t vocab_start, std::int64_t valid, double scale,
                            Tensor& dlogits, const Tensor* weight) {
  constexpr const char* op = "cross_entropy_backward";
  const VocabSlice s = check_logits(op, logits, valid);
  for (const auto& [name, t] : {Named{"global_max", &global_max}, {"sum_exp", &sum_exp}}) {
    check_stat(op, name, *t, logits, logits.dtype());
    check_rows(op, name, *t, s.rows);
  }
  check_operand(op, "targets", targets, logits, DType::I64);
  check_rows(op, "targets", targets, s.rows);
  check_operand(op, "dlogits", dlogits, logits, logits.dtype());
  check_shape(op, "dlogits", dlogits, logits.shape());
  check_weight(op, weight, sum_exp, s.rows);
  MZ_ON_CUDA(logits,
             cuda::cross_entropy_backward(logits.dtype(), logits.data(), global_max.data(), sum_exp.data(),
                                          ptr<const std::int64_t>(targets), vocab_start, s.rows, s.cols, s.valid, scale,
                                          weight ? weight->data() : nullptr, dlogits.data(), stream_of(logits)));
  if (!on_host(op, logits)) return;
  with_storage_type(logits.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    cross_entropy_backward_cpu<S>(ptr<const S>(logits), ptr<const C>(global_max), ptr<const C>(sum_exp),
                                  ptr<const std::int64_t>(targets), vocab_start, s, scale,
                                  weight ? ptr<const C>(*weight) : nullptr, ptr<S>(dlogits));
  });
}

bool cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets, std::int64_t valid, double scale,
                                    Tensor& row_max, Tensor& sum_exp, Tensor& target_logit, Tensor& dlogits,
                                    const Tensor* weight) {
  constexpr const char* op = "cross_entropy_forward_backward";
  const VocabSlice s = check_forward(op, logits, targets, valid, row_max, sum_exp, target_logit);
  check_operand(op, "dlogits", dlogits, logits, logits.dtype());
  check_shape(op, "dlogits", dlogits, logits.shape());
  check_weight(op, weight, sum_exp, s.rows);
#ifdef MEGAZERO_WITH_CUDA
  if (logits.device().kind() == DeviceKind::CUDA)
    return cuda::cross_entropy_forward_backward(logits.dtype(), logits.data(), ptr<const std::int64_t>(targets), 0,
                                                s.rows, s.cols, s.valid, scale, weight ? weight->data() : nullptr,
                                                row_max.data(), sum_exp.data(), target_logit.data(), dlogits.data(),
                                                stream_of(logits));
#endif
  if (!on_host(op, logits)) return false;
  cross_entropy_forward(logits, targets, 0, valid, row_max, sum_exp, target_logit);
  cross_entropy_backward(logits, row_max, sum_exp, targets, 0, valid, scale, dlogits, weight);
  return false;
}

}  // namespace megazero::kernels
