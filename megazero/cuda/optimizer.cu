// The optimizer's kernels on the GPU: the launchers of megazero/cuda/optimizer.h
// (contracts: megazero/kernels/optimizer_kernels.h; kernels and segment tables:
// optimizer_kernels.cuh): AdamW, element by element in fp32 as the CPU computes
// it (and, when asked, the working-precision parameters in the same pass), and the gradient
// norm's sum of squares, a fixed-order two-pass reduction (no atomics) kept on
// the device. Each takes all its segments in one launch, so a step costs a few
// launches, not a few per parameter.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/optimizer.h"
#include "megazero/cuda/optimizer_kernels.cuh"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda {
using namespace detail_k;

namespace {
constexpr unsigned kNormBlocks = static_cast<unsigned>(kernels::gpu_scratch::kNormBlocks);
}  // namespace

void adamw(float* w, float* m, float* v, const void* g, DType grad_type, void* p, DType param_type,
           const std::vector<kernels::AdamSegment>& segments, const kernels::AdamStep& a, cudaStream_t s) {
  const std::vector<SegmentTable> tables = segment_tables(segments);
  const kernels::AdamCoefficients c = kernels::adam_coefficients(a);
  with_storage(grad_type, [&](auto g_tag) {
    using G = decltype(g_tag);
    const auto launch = [&](auto* out) {
      using P = std::remove_pointer_t<decltype(out)>;
      for (const SegmentTable& t : tables) {
        const auto kernel = adamw_segments_kernel<G, P>;
        const unsigned grid =
            resident_grid(kernel, (t.end[t.count - 1] + kAdamPerThread - 1) / kAdamPerThread, kThreads, "adamw");
        kernel<<<grid, kThreads, 0, s>>>(w, m, v, static_cast<const G*>(g), out, t, c);
      }
    };
    if (p == nullptr)
      launch(static_cast<NoParams*>(nullptr));
    else
      with_storage(param_type, [&](auto p_tag) { launch(static_cast<decltype(p_tag)*>(p)); });
  });
  check_launch("adamw");
}

namespace {
template <RangeSum kSum>
void sum_over_ranges(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                     double* out, cudaStream_t s, const char* what) {
  const std::vector<SegmentTable> tables = range_tables(ranges);
  double* p = scratch_as<double>(ws, kernels::gpu_scratch::sum_of_squares_bytes(static_cast<i64>(ranges.size())), what);
  with_storage(t, [&](auto tag) {
    using G = decltype(tag);
    for (std::size_t c = 0; c < tables.size(); ++c)
      sum_sq_segments_kernel<G, kSum>
          <<<kNormBlocks, kThreads, 0, s>>>(static_cast<const G*>(g), tables[c], p + static_cast<i64>(c) * kNormBlocks);
  });
  check_launch(what);
  sum_partials_kernel<double><<<1, 1024, 0, s>>>(p, static_cast<i64>(tables.size()) * kNormBlocks, out);
  check_launch(what);
}
}  // namespace

void sum_of_squares(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                    double* out, cudaStream_t s) {
  sum_over_ranges<RangeSum::Squares>(g, t, ranges, ws, out, s, "grad norm");
}

void count_zeros(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                 double* out, cudaStream_t s) {
  sum_over_ranges<RangeSum::Zeros>(g, t, ranges, ws, out, s, "zeros in grad");
}

void zero_ranges(void* x, DType t, const std::vector<std::pair<i64, i64>>& ranges, cudaStream_t s) {
  const std::vector<SegmentTable> tables = range_tables(ranges);
  const auto launch = [&](auto* words) {
    using W = std::remove_pointer_t<decltype(words)>;
    for (const SegmentTable& table : tables) {
      const auto kernel = zero_segments_kernel<W>;
      const unsigned grid = resident_grid(kernel, table.end[table.count - 1], kThreads, "zero_ranges");
      kernel<<<grid, kThreads, 0, s>>>(words, table);
    }
  };
  switch (dtype_size(t)) {
    case 2:
      launch(static_cast<std::uint16_t*>(x));
      break;
    case 4:
      launch(static_cast<std::uint32_t*>(x));
      break;
    case 8:
      launch(static_cast<std::uint64_t*>(x));
      break;
    default:
      throw InternalError(::megazero::detail::concat("zero_ranges: unsupported dtype ", dtype_name(t)));
  }
  check_launch("zero_ranges");
}

}  // namespace megazero::cuda
