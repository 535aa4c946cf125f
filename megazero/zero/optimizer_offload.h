// ZeRO-Offload's optimizer half (Ren et al., ATC 2021; DeepSpeed's
// zero_optimization.offload_optimizer, Megatron-Core's --optimizer-cpu-offload):
// the fp32 master weights and Adam's moments of the partition a rank owns live
// in host memory (page-locked on a GPU) and AdamW runs on the host's cores.
// Device memory keeps the working-precision parameters and gradients only, so
// the paper's K = 12 bytes a parameter leave the device at every stage.
//
// Each step moves the owned gradients down and the updated parameters up in
// chunks, pipelined: every chunk's download is queued at once (after the
// backward and the reductions that produced them), the host updates chunk i as
// soon as its download has landed while later downloads run, and queues chunk
// i's upload at once, so the copies overlap the host's arithmetic. The device's
// later work (the stage 1-2 all-gather, the next forward) is ordered after the
// uploads without the host waiting for them.
//
// The update is kernels::adamw, one fp32 formula on every device: an
// offloaded run keeps every bit of the same run on the device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megazero/core/tensor.h"
#include "megazero/optim/adamw.h"
#include "megazero/zero/flat_layout.h"

namespace megazero::zero {

class OptimizerOffload {
 public:
  // `owned` elements of optimizer state with their weight-decay segments
  // (relative to the owned range), gradients and parameters in `param_dtype`
  // on `device`, the state on `host` (the device's host_device(); a meta
  // device when planning). Chunks of about `chunk` elements.
  // publish_on_host: step's `published` lies in host memory (the stage-3
  // parameter offload): the update writes it directly, nothing is uploaded.
  OptimizerOffload(std::shared_ptr<Device> device, std::shared_ptr<Device> host, std::int64_t owned, DType param_dtype,
                   const std::vector<optim::DecaySegment>& segments, std::int64_t chunk, bool publish_on_host = false);
  ~OptimizerOffload();

  // The state, in host memory: fp32, `owned` elements each.
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }

  // One AdamW step: `grads` (device, param dtype, owned elements) scaled by
  // `grad_scale`, the new weights written into `published` (param dtype,
  // owned elements; on the device, or on the host with publish_on_host) as
  // kernels::adamw writes its params operand. Returns with the uploads queued:
  // device work issued afterwards runs after them.
  void step(const Tensor& grads, const Tensor& published, const optim::AdamConfig& adam, double lr,
            std::int64_t step_number, double grad_scale);
  // Waits (on the host) for the last step's uploads: before `published` or the
  // host staging is read or written by anyone but the device's ordered work.
  void finish();

  std::size_t chunks() const { return chunks_.size(); }
  // Bytes copied between the device and the host since construction (both ways).
  std::int64_t copied_bytes() const { return copied_bytes_; }
  // "ZeRO-Offload: ... in host memory" for the start-up log.
  std::string describe() const;

 private:
  struct Chunk {
    Range range;                                // owned-relative
    std::vector<optim::DecaySegment> segments;  // chunk-relative
  };
  std::shared_ptr<Device> device_, host_;
  Tensor master_, exp_avg_, exp_avg_sq_;  // fp32, host
  Tensor grads_, params_;                 // param dtype, host: the chunks' staging
  std::vector<Chunk> chunks_;
  std::vector<std::shared_ptr<Device::Transfer>> uploads_;  // the last step's, until finish()
  std::int64_t copied_bytes_ = 0;
  bool publish_on_host_ = false;
};

}  // namespace megazero::zero
