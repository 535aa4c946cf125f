#include "megazero/optim/adamw.h"

#include <cmath>

#include "megazero/core/device.h"
#include "megazero/core/error.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/layer_kernels_cuda.h"
#endif

namespace megazero::optim {
namespace {

// Split over the math threads and vectorised (fp32, fp64 and bf16 gradients;
// fp16's conversion keeps its branches): no element depends on another, so the
// result is the same bits for any thread count or vector width (the operations
// are the scalar ones, each correctly rounded, none fused: -ffp-contract=off;
// nothing is summed). The bare loop through a load-function pointer ran at ~14
// ns per parameter.
template <typename G>
void update(float* w, float* m, float* v, const G* g, std::int64_t b, std::int64_t e, bool decay,
            const AdamConfig& c, double lr, double bc1, double bc2, double scale) {
  const double b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = decay ? c.weight_decay : 0.0;
#pragma omp parallel for simd num_threads(cpu_math_threads()) schedule(static) if (parallel : e - b > (std::int64_t{1} << 16))
  for (std::int64_t i = b; i < e; ++i) {
    const double grad = static_cast<double>(widen(g[i])) * scale;
    const double mi = b1 * m[i] + (1 - b1) * grad;
    const double vi = b2 * v[i] + (1 - b2) * grad * grad;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double update = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    w[i] = static_cast<float>(w[i] - lr * (update + wd * w[i]));  // decoupled decay
  }
}

}  // namespace

void adamw_step(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grads,
                const std::vector<DecaySegment>& segments, const AdamConfig& cfg, double lr, std::int64_t step,
                double grad_scale) {
  const std::int64_t n = master.numel();
  MZ_CHECK(master.dtype() == DType::F32 && exp_avg.dtype() == DType::F32 && exp_avg_sq.dtype() == DType::F32,
           "adamw: master weights and moments must be fp32");
  MZ_CHECK(exp_avg.numel() == n && exp_avg_sq.numel() == n && grads.numel() == n, "adamw: sizes differ");
  MZ_CHECK(step >= 1, "adamw: step counts from 1");
  if (!master.device().has_storage()) return;
  const double bc1 = 1 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(cfg.beta2, static_cast<double>(step));
#ifdef MEGAZERO_WITH_CUDA
  if (master.device().kind() == DeviceKind::CUDA) {
    const cuda::AdamArgs a{cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, lr, bc1, bc2, grad_scale};
    const cudaStream_t s = as_cuda_device(master.device()).stream();
    for (const auto& seg : segments) {
      MZ_CHECK(seg.begin >= 0 && seg.end <= n && seg.begin <= seg.end, "adamw: segment out of range");
      cuda::adamw(master.data_as<float>(), exp_avg.data_as<float>(), exp_avg_sq.data_as<float>(), grads.data(),
                  grads.dtype(), seg.begin, seg.end, seg.decay, a, s);
    }
    return;
  }
#endif
  MZ_CHECK(master.device().kind() == DeviceKind::CPU, "adamw: tensors on ", master.device().name());
  auto* w = master.data_as<float>();
  auto* m = exp_avg.data_as<float>();
  auto* v = exp_avg_sq.data_as<float>();
  for (const auto& s : segments) {
    MZ_CHECK(s.begin >= 0 && s.end <= n && s.begin <= s.end, "adamw: segment out of range");
    const bool floating = with_float_dtype(grads.dtype(), [&](auto tag) {
      using G = decltype(tag);
      update(w, m, v, grads.data_as<G>(), s.begin, s.end, s.decay, cfg, lr, bc1, bc2, grad_scale);
    });
    MZ_CHECK(floating, "adamw: gradients of dtype ", dtype_name(grads.dtype()));
  }
}

}  // namespace megazero::optim
