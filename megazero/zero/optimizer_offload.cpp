#include "megazero/zero/optimizer_offload.h"

#include <algorithm>
#include <cstdio>

#include "megazero/core/error.h"

namespace megazero::zero {

namespace {

Tensor chunk_of(const Tensor& flat, Range r) { return flat.narrow(0, r.begin, r.size()); }

std::string mib(std::int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return s;
}

}  // namespace

OptimizerOffload::OptimizerOffload(std::shared_ptr<Device> device, std::shared_ptr<Device> host, std::int64_t owned,
                                   DType param_dtype, const std::vector<optim::DecaySegment>& segments,
                                   std::int64_t chunk, bool publish_on_host)
    : device_(std::move(device)), host_(std::move(host)), publish_on_host_(publish_on_host) {
  MZ_CHECK(host_ && host_->kind() != DeviceKind::CUDA, "ZeRO-Offload needs a host device for the optimizer state");
  MZ_CHECK(chunk > 0, "ZeRO-Offload: chunks of ", chunk, " elements");
  // The state is what checkpoints read and write; the staging is what moves.
  master_ = Tensor::zeros(host_, {owned}, DType::F32, MemoryCategory::OptimizerStates, "fp32-master (host)");
  exp_avg_ = Tensor::zeros(host_, {owned}, DType::F32, MemoryCategory::OptimizerStates, "adam-m (host)");
  exp_avg_sq_ = Tensor::zeros(host_, {owned}, DType::F32, MemoryCategory::OptimizerStates, "adam-v (host)");
  grads_ = Tensor::zeros(host_, {owned}, param_dtype, MemoryCategory::Gradients, "offloaded grads (host)");
  if (!publish_on_host_)
    params_ = Tensor::zeros(host_, {owned}, param_dtype, MemoryCategory::Parameters, "offloaded params (host)");
  for (std::int64_t b = 0; b < owned; b += chunk) {
    Chunk c{{b, std::min(owned, b + chunk)}, {}};
    for (const auto& seg : segments) {
      const Range in = Range{seg.begin, seg.end}.intersect(c.range);
      if (!in.empty()) c.segments.push_back({in.begin - b, in.end - b, seg.decay});
    }
    chunks_.push_back(std::move(c));
  }
}

OptimizerOffload::~OptimizerOffload() {
  try {
    finish();
  } catch (...) {  // a failed copy is reported by whoever waited first
  }
}

void OptimizerOffload::finish() {
  for (const auto& t : uploads_) device_->wait(*t);
  uploads_.clear();
}

void OptimizerOffload::step(const Tensor& grads, const Tensor& published, const optim::AdamConfig& adam, double lr,
                            std::int64_t step_number, double grad_scale) {
  MZ_CHECK(grads.numel() == master_.numel() && published.numel() == master_.numel() && grads.is_contiguous() &&
               published.is_contiguous() && grads.dtype() == grads_.dtype() && published.dtype() == grads_.dtype() &&
               (&published.device() == host_.get()) == publish_on_host_,
           "ZeRO-Offload step: gradients ", grads.to_string(), " and parameters ", published.to_string(), " for ",
           master_.numel(), " offloaded elements of ", dtype_name(grads_.dtype()));
  // The staging's last uploads have long ended by now (the forward and
  // backward ran after them); waiting makes reusing it safe by construction.
  finish();
  const bool copies = device_->has_storage();
  const std::size_t esize = dtype_size(grads_.dtype());
  std::vector<std::shared_ptr<Device::Transfer>> downloads;
  for (const Chunk& c : chunks_) {
    const auto bytes = static_cast<std::size_t>(c.range.size()) * esize;
    if (copies)
      downloads.push_back(
          device_->copy_to_host_queued(chunk_of(grads_, c.range).data(), chunk_of(grads, c.range).data(), bytes));
    copied_bytes_ += static_cast<std::int64_t>(bytes);
  }
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    if (copies) device_->wait(*downloads[i]);
    const Tensor up = chunk_of(publish_on_host_ ? published : params_, c.range);
    optim::adamw_step(chunk_of(master_, c.range), chunk_of(exp_avg_, c.range), chunk_of(exp_avg_sq_, c.range),
                      chunk_of(grads_, c.range), c.segments, adam, lr, step_number, grad_scale, up);
    if (publish_on_host_) continue;
    const auto bytes = static_cast<std::size_t>(c.range.size()) * esize;
    if (copies)
      uploads_.push_back(device_->copy_from_host_queued(chunk_of(published, c.range).data(), up.data(), bytes));
    copied_bytes_ += static_cast<std::int64_t>(bytes);
  }
  // The device's later work (gathers, the next forward) reads the parameters:
  // it waits for the uploads on the device, the host goes on.
  for (const auto& t : uploads_) device_->queue_after(*t);
}

std::string OptimizerOffload::describe() const {
  const auto state = static_cast<std::int64_t>(master_.nbytes() * 3);
  const auto staging = static_cast<std::int64_t>(grads_.nbytes() + (params_.defined() ? params_.nbytes() : 0));
  return "ZeRO-Offload: fp32 master weights and Adam moments of " + std::to_string(master_.numel()) + " parameters (" +
         mib(state) + ") in host memory on " + host_->name() + ", AdamW on the host's cores; " + mib(staging) +
         " of host staging; gradients copied down in " + std::to_string(chunks_.size()) + " chunk" +
         (chunks_.size() == 1 ? "" : "s") + " a step, " +
         (publish_on_host_ ? "the 16-bit parameter partition updated in place in host memory (--param-cpu-offload: "
                             "each rank's piece uploaded before each gather)"
                           : "parameters up likewise");
}

}  // namespace megazero::zero
