#include "megazero/train/train_step.h"

#include <chrono>
#include <memory>
#include <vector>

#include "megazero/comm/activity.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gelu_bias.h"

namespace megazero::train {

StepResult train_step(layers::GPTModel& model, zero::ZeroEngine& engine, Communicator& dp,
                      const std::vector<MicroBatch>& micro_batches, const OptimizerSettings& opt,
                      optim::LossScaler& scaler, std::int64_t iteration,
                      const std::function<void()>& while_optimizer_runs) {
  MZ_CHECK(!micro_batches.empty(), "train_step without micro-batches");
  model.set_param_hooks(&engine);
  engine.zero_grad();
  StepResult r;
  r.loss_scale = scaler.scale();
  const double per_micro = r.loss_scale / (static_cast<double>(micro_batches.size()) * dp.size());
  // The losses are summed on the device and read once, at the end: no
  // micro-batch waits for the device to report its loss. The phases are timed
  // with device marks (Device::mark) read after that read-back, so on a GPU
  // they are the device's time for each phase, not the host's time to launch
  // it, and reading them waits for nothing.
  Tensor loss_sum;
  std::int64_t tokens = 0;
  Device& dev = engine.device();
  const std::int64_t waits_before = dev.host_waits();
  const auto issue_begin = std::chrono::steady_clock::now();
  using Marks = std::vector<std::shared_ptr<Device::Mark>>;
  Marks fwd_begin, fwd_end, bwd_end;
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    const auto& mb = micro_batches[i];
    fwd_begin.push_back(dev.mark());
    set_activity("forward");
    layers::StepInfo step = mb.step;
    step.backward_scale = per_micro;  // the backward's, below
    const Tensor losses = model.forward_losses(mb.ids, mb.targets, step, mb.loss_weights);
    if (!loss_sum.defined())
      loss_sum = Tensor::zeros(losses.device_ptr(), {1}, losses.dtype(), MemoryCategory::Workspace);
    kernels::column_sums(losses.view({losses.numel(), 1}), loss_sum);  // one column: loss_sum += the sum of the losses
    tokens += losses.numel();
    fwd_end.push_back(dev.mark());
    set_activity("backward");
    engine.begin_backward(i + 1 == micro_batches.size());
    model.backward(per_micro);
    bwd_end.push_back(dev.mark());
  }
  r.host_issue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - issue_begin).count();
  // The logged loss: the mean over every token of every micro-batch of every
  // DP rank (all micro-batches hold the same number of tokens). Its sum over
  // the DP group is issued here, ahead of the step's collectives: at stages
  // 1-2 the step leaves the parameter all-gathers in flight for the next
  // forward, and waiting for the loss must not wait for them.
  Tensor loss_total = Tensor::empty(loss_sum.device_ptr(), {1}, DType::F64, MemoryCategory::Workspace, "loss sum");
  loss_total.copy_from(loss_sum);
  Work loss_reduced = dp.all_reduce(loss_total, ReduceOp::Sum);
  r.lr = opt.lr_at ? opt.lr_at(iteration) : opt.lr.at(iteration);
  const auto opt_begin = dev.mark();
  set_activity("optimizer step");
  optim::AdamConfig adam = opt.adam;
  if (opt.weight_decay_at) adam.weight_decay = opt.weight_decay_at(iteration);
  r.weight_decay = adam.weight_decay;
  r.stats = engine.step(r.lr, adam, opt.clip_grad, r.loss_scale, iteration + 1 - opt.optimizer_start_iteration);
  const auto opt_end = dev.mark();
  scaler.update(r.stats.skipped);
  if (while_optimizer_runs) while_optimizer_runs();
  loss_reduced.wait();
  if (loss_total.device().has_storage())
    r.loss = loss_total.to_double_vector()[0] / (static_cast<double>(tokens) * dp.size());
  r.host_waits = dev.host_waits() - waits_before;
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    r.forward_s += dev.seconds_between(*fwd_begin[i], *fwd_end[i]);
    r.backward_s += dev.seconds_between(*fwd_end[i], *bwd_end[i]);
  }
  r.optimizer_s = dev.seconds_between(*opt_begin, *opt_end);
  r.exposed_comm_s = engine.exposed_comm_seconds();
  return r;
}

}  // namespace megazero::train
