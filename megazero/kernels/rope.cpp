// Rotary position embedding (rope.h): argument checks, the CUDA dispatch
// (cuda/rope.cu) and the CPU kernels. Positions are split over threads; each
// thread takes the cos/sin of its position's D/2 angles once (in double,
// rounded to the compute type) and rotates that position's row in all N
// blocks. Element-wise, so nothing depends on the thread count.
#include "megazero/kernels/rope.h"

#include <cmath>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/kernels/kernel_support.h"
#include "megazero/kernels/rope_frequencies.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/rope_cuda.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h

struct RopeShape {
  i64 n, seq, d;
  i64 first = 0;                      // the position of row 0
  const std::int64_t* pos = nullptr;  // per token [samples * seq], or nullptr: first + s
  i64 samples = 1;                    // n = samples x heads
  double scale = 1.0;                 // positions x scale (--rotary-seq-len-interpolation-factor)
  bool interleaved = false;           // pairs (2i, 2i + 1), not (i, i + D/2)
  double llama3 = 0;                  // Llama 3's rope scaling factor (rope_frequencies.h), 0: off
};

// A per-thread row of at least n compute-type values (the cos and sin of one
// position: D values), outside the memory tracker like a library's thread buffer.
template <typename C>
C* trig_scratch(i64 n) {
  thread_local std::vector<C> scratch;
  if (static_cast<i64>(scratch.size()) < n) scratch.resize(static_cast<std::size_t>(n));
  return scratch.data();
}

// out = rotation of in by theta (BACKWARD: by -theta), pairs (i, i + D/2) or,
// interleaved, (2i, 2i + 1).
// Each pair is read before either half is written, so out may alias in.
template <typename S, bool BACKWARD>
void rope_cpu(const S* in, double base, S* out, RopeShape s) {
  using C = compute_t<S>;
  const i64 half = s.d / 2;
  const i64 heads = s.n / s.samples;
  const i64 first_of = s.interleaved ? 2 : 1, partner = s.interleaved ? 1 : half;  // pair i: (first_of i, + partner)
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.n * s.seq * s.d > kParallelMin)
  for (i64 sp = 0; sp < s.samples * s.seq; ++sp) {  // (sample, row)
    const i64 sample = sp / s.seq, pos = sp % s.seq;
    const i64 p = s.pos ? s.pos[sp] : s.first + pos;
    C* cs = trig_scratch<C>(2 * half);
    C* sn = cs + half;
    for (i64 i = 0; i < half; ++i) {
      const double theta = static_cast<double>(p) * s.scale * rope_inv_freq(base, i, s.d, s.llama3);
      cs[i] = static_cast<C>(std::cos(theta));
      sn[i] = static_cast<C>(std::sin(theta));
    }
    for (i64 b = sample * heads; b < (sample + 1) * heads; ++b) {
      const S* xr = in + (b * s.seq + pos) * s.d;
      S* yr = out + (b * s.seq + pos) * s.d;
      for (i64 i = 0; i < half; ++i) {
        const i64 j0 = i * first_of, j1 = j0 + partner;
        const C x0 = ld(xr[j0]), x1 = ld(xr[j1]);
        if constexpr (BACKWARD) {
          yr[j0] = st<S>(x0 * cs[i] + x1 * sn[i]);
          yr[j1] = st<S>(x1 * cs[i] - x0 * sn[i]);
        } else {
          yr[j0] = st<S>(x0 * cs[i] - x1 * sn[i]);
          yr[j1] = st<S>(x1 * cs[i] + x0 * sn[i]);
        }
      }
    }
  }
}

void rope(const char* op, const char* in_name, const Tensor& in, double base, const char* out_name, Tensor& out,
          bool backward, i64 first, const Tensor& positions, double position_scale, bool interleaved,
          double llama3_factor) {
  check_float(op, in_name, in);
  check_operands(op, in, in.dtype(), {{in_name, &in}, {out_name, &out}});
  MZ_CHECK(in.dim() == 3, op, ": ", in_name,
           " must be [N, S, D] (N = batch x heads, S = sequence, D = head size), got ", in.to_string());
  MZ_CHECK(first >= 0, op, ": the first position must not be negative, got ", first);
  RopeShape s{in.size(0), in.size(1), in.size(2), first};
  if (positions.defined()) {
    check_operand(op, "positions", positions, in, DType::I64);
    MZ_CHECK(first == 0, op, ": positions and a first position ", first, " both given");
    MZ_CHECK(positions.is_contiguous() && s.seq > 0 && positions.numel() % s.seq == 0 &&
                 positions.numel() / s.seq > 0 && s.n % (positions.numel() / s.seq) == 0,
             op, ": positions must be [B*S] with S = ", s.seq, " and B dividing N = ", s.n, ", got ",
             positions.to_string());
    s.samples = positions.numel() / s.seq;
    s.pos = ptr<const std::int64_t>(positions);
  }
  MZ_CHECK(s.d > 0 && s.d % 2 == 0, op, ": the head size D = ", s.d,
           " must be even and positive (dimension i pairs with i + D/2), got ", in.to_string());
  MZ_CHECK(std::isfinite(base) && base > 0, op, ": base must be finite and positive, got ", base);
  MZ_CHECK(std::isfinite(position_scale) && position_scale > 0, op,
           ": the position scale must be finite and positive, got ", position_scale);
  MZ_CHECK(llama3_factor == 0 || (std::isfinite(llama3_factor) && llama3_factor >= 1), op,
           ": the Llama 3 rope scaling factor must be 0 (off) or at least 1, got ", llama3_factor);
  s.scale = position_scale;
  s.interleaved = interleaved;
  s.llama3 = llama3_factor;
  check_shape(op, out_name, out, in.shape());
  MZ_ON_CUDA(in, cuda::rope(in.dtype(), in.data(), base, out.data(), s.n, s.seq, s.d, backward, stream_of(in), s.first,
                            s.pos, s.samples, s.scale, s.interleaved, s.llama3));
  if (!on_host(op, in)) return;
  with_storage_type(in.dtype(), [&](auto tag) {
    using S = decltype(tag);
    if (backward)
      rope_cpu<S, true>(ptr<const S>(in), base, ptr<S>(out), s);
    else
      rope_cpu<S, false>(ptr<const S>(in), base, ptr<S>(out), s);
  });
}

}  // namespace

void rope_forward(const Tensor& x, double base, Tensor& y, std::int64_t first_position, const Tensor& positions,
                  double position_scale, bool interleaved, double llama3_factor) {
  rope("rope_forward", "x", x, base, "y", y, false, first_position, positions, position_scale, interleaved,
       llama3_factor);
}

void rope_backward(const Tensor& dy, double base, Tensor& dx, std::int64_t first_position, const Tensor& positions,
                   double position_scale, bool interleaved, double llama3_factor) {
  rope("rope_backward", "dy", dy, base, "dx", dx, true, first_position, positions, position_scale, interleaved,
       llama3_factor);
}

}  // namespace megazero::kernels
