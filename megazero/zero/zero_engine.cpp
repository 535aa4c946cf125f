#include "megazero/zero/zero_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "megazero/core/error.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/optimizer_kernels.h"

namespace megazero::zero {

using layers::Parameter;

void ZeroConfig::validate() const {
  MZ_REQUIRE(stage >= 0 && stage <= 3, "--zero-stage must be 0, 1, 2 or 3, got ", stage);
  MZ_REQUIRE(reduce_bucket_size > 0, "--reduce-bucket-size must be positive, got ", reduce_bucket_size);
  MZ_REQUIRE(is_floating(param_dtype), "parameters must be a floating dtype, got ", dtype_name(param_dtype));
  MZ_REQUIRE(!overlap_optimizer || stage == 0, "--overlap-optimizer is for --zero-stage 0; stage ", stage,
             stage == 3 ? " updates only this rank's partition, which the next forward gathers group by group"
                        : " all-gathers the updated parameters right after the update (--overlap-param-gather "
                          "overlaps that with the next forward)",
             ": drop the flag");
  MZ_REQUIRE(!offload_params || stage == 3,
             "--param-cpu-offload keeps each rank's parameter partition in host memory, which only --zero-stage 3 "
             "partitions (stage ",
             stage, " holds every parameter on every rank): use --zero-stage 3, or drop the flag");
  MZ_REQUIRE(!offload_params || offload_optimizer,
             "--param-cpu-offload needs --optimizer-cpu-offload: the host's AdamW writes the offloaded parameters in "
             "place (add it, or drop --param-cpu-offload)");
  MZ_REQUIRE(!(offload_optimizer && overlap_optimizer),
             "--optimizer-cpu-offload runs AdamW on the host, which --overlap-optimizer would queue on the device "
             "beside the next forward: drop one of the two");
}

namespace {

FlatLayout make_layout(const std::vector<Parameter*>& ps, int dp) {
  std::vector<std::int64_t> numels;
  std::vector<int> groups;
  for (auto* p : ps) {
    numels.push_back(p->local_numel());
    groups.push_back(p->group);
  }
  return FlatLayout(numels, groups, dp);
}

// The part of a flat buffer (that starts at flat offset `base`) covering r. An
// empty r may lie outside the buffer: it gives an empty view.
Tensor flat_slice(const Tensor& flat, Range r, std::int64_t base = 0) {
  if (r.empty()) return flat.narrow(0, 0, 0);
  return flat.narrow(0, r.begin - base, r.size());
}

// Where publish_params puts the master's values: the whole flat buffer (stage
// 0), this rank's partition of it (stages 1-2, then all-gathered in place), or
// the partition buffer (stage 3). As many elements as the master.
Tensor publish_target(int stage, const Tensor& params_full, Range part, const Tensor& params_part) {
  if (stage == 0) return params_full;
  if (stage <= 2) return flat_slice(params_full, part);
  return params_part;
}

}  // namespace

ZeroEngine::ZeroEngine(layers::ParameterSet& params, Communicator& dp, Communicator& tp, std::shared_ptr<Device> device,
                       const ZeroConfig& cfg, std::shared_ptr<Device> host)
    : params_(params.all()),
      dp_(dp),
      tp_(tp),
      device_(std::move(device)),
      cfg_(cfg),
      layout_(make_layout(params_, dp.size())) {
  cfg_.validate();
  part_ = layout_.partition(dp.rank());
  owned_ = cfg_.stage == 0 ? Range{0, layout_.numel()} : part_;
  // Weight decay per owned element; norm counting per partition element (a
  // TP-replicated parameter is counted on TP rank 0 only).
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Range r = layout_.param(i);
    const Range o = r.intersect(owned_);
    if (!o.empty()) owned_segments_.push_back({o.begin - owned_.begin, o.end - owned_.begin, params_[i]->weight_decay});
    const Range n = r.intersect(part_);
    if (!n.empty() && (!params_[i]->tp_replicated() || tp.rank() == 0))
      norm_ranges_.emplace_back(n.begin - part_.begin, n.end - part_.begin);
  }
  const auto P = layout_.partition_size(), N = layout_.numel();
  if (cfg_.offload_optimizer || cfg_.offload_params) host_ = host ? std::move(host) : device_->host_device();
  if (cfg_.offload_optimizer) {
    // Chunks of a bucket, at least four where the partition is large, so the
    // copies of one chunk overlap the host's update of another.
    const std::int64_t chunk =
        std::min(cfg_.reduce_bucket_size, std::max<std::int64_t>((owned_.size() + 3) / 4, std::int64_t{1} << 16));
    // With offload_params the update writes the parameters in host memory
    // itself: nothing to upload.
    offload_ = std::make_unique<OptimizerOffload>(device_, host_, owned_.size(), cfg_.param_dtype, owned_segments_,
                                                  chunk, /*publish_on_host=*/cfg_.offload_params);
    master_ = offload_->master();
    exp_avg_ = offload_->exp_avg();
    exp_avg_sq_ = offload_->exp_avg_sq();
  } else {
    master_ = Tensor::zeros(device_, {owned_.size()}, DType::F32, MemoryCategory::OptimizerStates, "fp32-master");
    exp_avg_ = Tensor::zeros(device_, {owned_.size()}, DType::F32, MemoryCategory::OptimizerStates, "adam-m");
    exp_avg_sq_ = Tensor::zeros(device_, {owned_.size()}, DType::F32, MemoryCategory::OptimizerStates, "adam-v");
  }
  if (cfg_.stage <= 2) {
    params_full_ = Tensor::zeros(device_, {N}, cfg_.param_dtype, MemoryCategory::Parameters, "params");
    bind_full(&Parameter::value, params_full_, {0, N});
  } else {
    // offload_params (ZeRO-Infinity's CPU offload): the partition in host
    // memory; each gather uploads this rank's piece first.
    params_part_ =
        Tensor::zeros(cfg_.offload_params ? host_ : device_, {P}, cfg_.param_dtype, MemoryCategory::Parameters,
                      cfg_.offload_params ? "params-partition (host)" : "params-partition");
  }
  if (cfg_.stage <= 1) {
    grads_full_ = Tensor::zeros(device_, {N}, cfg_.param_dtype, MemoryCategory::Gradients, "grads");
    bind_full(&Parameter::grad, grads_full_, {0, N});
  } else {
    grads_part_ = Tensor::zeros(device_, {P}, cfg_.param_dtype, MemoryCategory::Gradients, "grads-partition");
    if (cfg_.contiguous_gradients) {  // MD: reserve the group-gradient buffers once
      std::int64_t largest_other = 0;
      for (int g = 1; g < layout_.num_groups(); ++g) largest_other = std::max(largest_other, layout_.group(g).size());
      grad_arena_[0] = Tensor::empty(device_, {layout_.group(0).size()}, cfg_.param_dtype, MemoryCategory::Gradients,
                                     "group-grad-arena");
      grad_arena_[1] =
          Tensor::empty(device_, {largest_other}, cfg_.param_dtype, MemoryCategory::Gradients, "group-grad-arena");
    }
    // Two constant-size staging buffers (the paper's CB): one filling while
    // the other's reduce-scatter is in flight.
    const std::int64_t slot = std::min(cfg_.reduce_bucket_size, N);
    for (int i = 0; i < 2; ++i) {
      slots_.push_back(Tensor::empty(device_, {slot}, cfg_.param_dtype, MemoryCategory::CommBuffers, "grad-bucket"));
      slot_busy_.push_back(false);
    }
  }
  buckets_ = layout_.buckets(cfg_.reduce_bucket_size);
  slot_of_bucket_.assign(buckets_.size(), -1);
  if (cfg_.stage == 1 || cfg_.stage == 2 || (cfg_.stage == 0 && cfg_.overlap_optimizer)) {
    // Runs of whole groups of about a bucket each (a larger group is a run of
    // its own), so the first layer's forward waits for its own run only; one
    // run of everything for a gather without the overlap, waited for at once.
    const bool split = cfg_.stage == 0 || cfg_.overlap_param_gather;
    const int groups = layout_.num_groups();
    for (int g = 0; g < groups; ++g) {
      const Range r = layout_.group(g);
      GroupRun* last = group_runs_.empty() ? nullptr : &group_runs_.back();
      if (last && (!split || last->range.size() + r.size() <= cfg_.reduce_bucket_size)) {
        last->last_group = g;
        last->range.end = r.end;
      } else {
        group_runs_.push_back({g, g, {last ? last->range.end : 0, r.end}});
      }
    }
    if (group_runs_.empty()) group_runs_.push_back({0, groups - 1, {0, 0}});
    group_runs_.back().range.end = layout_.numel();  // the padding: constant, but the all-gather has always moved it
  }
}

ZeroEngine::~ZeroEngine() {
  try {
    flush();
    finish_step();
    for (auto& [g, entry] : gathered_) entry.work.wait();
  } catch (...) {  // a failed collective is reported by whoever waited first
  }
  for (auto* p : params_) p->value = p->grad = Tensor();
}

void ZeroEngine::bind_full(Tensor Parameter::*member, const Tensor& flat, Range within) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Range r = layout_.param(i);
    if (r.intersect(within).size() != r.size()) continue;
    params_[i]->*member = flat_slice(flat, r, within.begin).view(params_[i]->local_shape);
  }
}

void ZeroEngine::timed_wait(Work& w) {
  auto before = device_->mark();
  w.wait();
  comm_waits_.emplace_back(std::move(before), device_->mark());
}

double ZeroEngine::exposed_comm_seconds() {
  double s = 0;
  for (const auto& [before, after] : comm_waits_) s += device_->seconds_between(*before, *after);
  return s;
}

// ---------------------------------------------------------------- init / publish
// In chunks of the owned range (a 355M-parameter partition would otherwise
// hold 2.8 GB of doubles on the host), each parameter's part on the math
// threads; the gaps between parameters stay 0.
void ZeroEngine::initialize(std::uint64_t seed) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 22;
  std::vector<double> v;
  const std::int64_t last = master_.device().has_storage() ? owned_.end : owned_.begin;  // meta: no values
  for (std::int64_t c0 = owned_.begin; c0 < last; c0 += kChunk) {
    const Range chunk{c0, std::min(owned_.end, c0 + kChunk)};
    v.assign(static_cast<std::size_t>(chunk.size()), 0.0);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Range p = layout_.param(i), o = p.intersect(chunk);
      if (!o.empty()) params_[i]->init_values(seed, o.begin - p.begin, o.end - p.begin, v.data() + (o.begin - c0));
    }
    master_.narrow(0, c0 - owned_.begin, chunk.size()).copy_from_doubles(v);
  }
  publish_params();
}

// After initialize and checkpoint loads; step() has AdamW write the target
// itself and does only the all-gather.
void ZeroEngine::publish_params() {
  finish_step();  // a gather or an update still in flight would land over what is written here
  Tensor mine = publish_target(cfg_.stage, params_full_, part_, params_part_);
  mine.copy_from(master_);
  if (cfg_.stage == 1 || cfg_.stage == 2) {
    issue_param_gathers();
    finish_step();
  }
}

// Stages 1-2: every rank's updated partition to every rank, in place (each
// partition already lies at its place in params_full_), one all-gather per run
// of groups, in forward order.
void ZeroEngine::issue_param_gathers() {
  for (const GroupRun& run : group_runs_) {
    const Range r = run.range;
    // This rank's part of the run: where its chunk of the output starts even
    // when it contributes nothing (before the run: at its start; after: at its end).
    const Range mine = r.intersect(part_);
    const std::int64_t at = mine.empty() ? std::clamp(part_.begin, r.begin, r.end) : mine.begin;
    Tensor output = flat_slice(params_full_, r);
    pending_.push_back({run.first_group,
                        dp_.all_gather(params_full_.narrow(0, at, mine.size()), output, layout_.split_counts(r)),
                        nullptr});
  }
  if (!cfg_.overlap_param_gather) finish_step();
}

// Stage 0: AdamW run by run of groups, each queued beside the compute. Every
// element's update depends on its own state only, so the runs give the bits
// of one call over everything.
void ZeroEngine::queue_updates(const optim::AdamConfig& adam, double lr, std::int64_t step_number, double grad_scale) {
  for (const GroupRun& run : group_runs_) {
    const Range r = run.range;  // owned_ is everything at stage 0
    std::vector<optim::DecaySegment> segments;
    for (const auto& seg : owned_segments_) {
      const Range in = Range{seg.begin, seg.end}.intersect(r);
      if (!in.empty()) segments.push_back({in.begin - r.begin, in.end - r.begin, seg.decay});
    }
    const Tensor w = flat_slice(master_, r), m = flat_slice(exp_avg_, r), v = flat_slice(exp_avg_sq_, r);
    const Tensor g = flat_slice(grads_full_, r), p = flat_slice(params_full_, r);
    pending_.push_back({run.first_group, Work(), device_->run_queued([=] {
                          optim::adamw_step(w, m, v, g, segments, adam, lr, step_number, grad_scale, p);
                        })});
  }
}

void ZeroEngine::wait_pending(int up_to_group) {
  // The runs were issued in group order (and a communicator completes its
  // operations in issue order): the oldest first. A gather's wait is DP
  // communication the compute did not hide; an update's orders the device's
  // later work after it, as a GPU's stream wait does, and the host goes on.
  while (!pending_.empty() && pending_.front().first_group <= up_to_group) {
    Pending& p = pending_.front();
    if (p.update)
      device_->queue_after(*p.update);
    else
      timed_wait(p.gather);
    pending_.pop_front();
  }
}

// ---------------------------------------------------------------- gradients
// The parameters whose gradients lie wholly in `within` of the flat layout,
// with their offsets from its start (what layers::clear_grads takes).
std::vector<layers::GradAt> ZeroEngine::grads_in(Range within) const {
  std::vector<layers::GradAt> at;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Range r = layout_.param(i);
    if (r.intersect(within).size() == r.size() && !r.empty()) at.push_back({params_[i], r.begin - within.begin});
  }
  return at;
}

// The full gradients: zeroed but for the ones a GEMM overwrites first
// (layers/parameter.h); the partition's accumulator: zeroed.
void ZeroEngine::zero_grad() {
  flush();
  comm_waits_.clear();
  // An update still beside the next forward reads these gradients: they are
  // cleared when the backward begins, once the forward waited for every run.
  if (grads_full_.defined()) {
    if (pending_.empty())
      clear_full_grads();
    else
      clear_grads_at_backward_ = true;
  }
  if (grads_part_.defined()) grads_part_.zero_();
}

void ZeroEngine::clear_full_grads() {
  clear_grads_at_backward_ = false;
  layers::clear_grads(grads_full_, grads_in({0, layout_.numel()}));
}

// The clear zero_grad left while an update read the gradients: after every run of it.
void ZeroEngine::clear_deferred_grads() {
  if (!clear_grads_at_backward_) return;
  finish_step();
  clear_full_grads();
}

void ZeroEngine::set_evaluating(bool on) {
  evaluating_ = on;
  if (on) return;
  seq_pos_ = 0;
  while (!gathered_.empty()) release(gathered_.begin()->first);  // none without a prefetch; kept for certainty
}

void ZeroEngine::begin_backward(bool last_micro_batch) {
  clear_deferred_grads();
  reduce_now_ = cfg_.stage >= 2 || last_micro_batch;
  next_bucket_ = static_cast<std::int64_t>(buckets_.size()) - 1;
}

void ZeroEngine::pre_backward(int group) {
  if (cfg_.stage == 3) gather(group);
  wait_pending(group);  // its forward has (a backward alone would not have)
  if (cfg_.stage >= 2) {
    const Range r = layout_.group(group);
    Tensor g;
    if (cfg_.contiguous_gradients) {
      Tensor& arena = grad_arena_[group == 0 ? 0 : 1];
      MZ_CHECK(arena.numel() >= r.size(), "gradient arena too small for group ", group);
      for (const auto& [other, t] : group_grads_)
        MZ_CHECK(group == 0 || other == 0, "groups ", other, " and ", group, " would share the gradient arena");
      g = arena.narrow(0, 0, r.size());
      ++arena_fills_;
    } else {
      g = Tensor::empty(device_, {r.size()}, cfg_.param_dtype, MemoryCategory::Gradients, "group-grads");
    }
    layers::clear_grads(g, grads_in(r));  // each micro-batch's group gradients start afresh
    bind_full(&Parameter::grad, g, r);
    group_grads_[group] = g;
  }
}

void ZeroEngine::post_backward(int group) {
  for (auto* p : params_)  // one no GEMM wrote (none in a GPT) reads as zero before it is reduced
    if (p->group == group) layers::settle_grad(*p);
  if (cfg_.stage >= 2) stage_group_grads(group);
  if (reduce_now_) launch_ready_buckets(layout_.group(group).begin);
  if (cfg_.stage == 3) release(group);
}

// Copies a finished group's gradients into the staging slots of the buckets it
// overlaps (highest first), launching each bucket as soon as it is complete.
void ZeroEngine::stage_group_grads(int group) {
  const Range r = layout_.group(group);
  const Tensor& g = group_grads_.at(group);
  for (std::size_t b = buckets_.size(); b-- > 0;) {
    const Range part = buckets_[b].intersect(r);
    if (part.empty()) continue;
    if (slot_of_bucket_[b] < 0) {
      slot_of_bucket_[b] = acquire_slot();
      slots_[static_cast<std::size_t>(slot_of_bucket_[b])].zero_();  // padding and not-yet-staged parts
    }
    Tensor slot = slots_[static_cast<std::size_t>(slot_of_bucket_[b])];
    flat_slice(slot, part, buckets_[b].begin).copy_from(flat_slice(g, part, r.begin));
    launch_ready_buckets(std::max(part.begin, r.begin));
  }
  for (auto* p : params_)
    if (p->group == group) p->grad = Tensor();
  group_grads_.erase(group);
}

int ZeroEngine::acquire_slot() {
  for (;;) {
    for (std::size_t i = 0; i < slot_busy_.size(); ++i)
      if (!slot_busy_[i]) {
        slot_busy_[i] = true;
        return static_cast<int>(i);
      }
    MZ_CHECK(!in_flight_.empty(), "no gradient bucket slot free and none in flight");
    complete_oldest();
  }
}

// Launches, highest first, every bucket whose range lies entirely at or above
// `final_from` (backward finishes groups from the last to the first).
void ZeroEngine::launch_ready_buckets(std::int64_t final_from) {
  while (next_bucket_ >= 0 && buckets_[static_cast<std::size_t>(next_bucket_)].begin >= final_from) {
    const auto b = static_cast<std::size_t>(next_bucket_--);
    if (cfg_.stage >= 2 && slot_of_bucket_[b] < 0) {  // nothing staged: only padding
      slot_of_bucket_[b] = acquire_slot();
      slots_[static_cast<std::size_t>(slot_of_bucket_[b])].zero_();
    }
    launch(b);
  }
}

void ZeroEngine::launch(std::size_t b) {
  const Range bucket = buckets_[b];
  const Range mine = bucket.intersect(part_);
  const auto counts = layout_.split_counts(bucket);
  Work w;
  int slot = -1;
  if (cfg_.stage == 0) {
    w = dp_.all_reduce(flat_slice(grads_full_, bucket), ReduceOp::Sum);
  } else if (cfg_.stage == 1) {
    w = dp_.reduce_scatter(flat_slice(grads_full_, bucket), flat_slice(grads_full_, mine), ReduceOp::Sum, counts);
  } else {
    // The slot now belongs to this reduce-scatter until it completes; the
    // next micro-batch stages the same bucket into a fresh slot.
    slot = slot_of_bucket_[b];
    slot_of_bucket_[b] = -1;
    const Tensor s = slots_[static_cast<std::size_t>(slot)].narrow(0, 0, bucket.size());
    w = dp_.reduce_scatter(s, flat_slice(s, mine, bucket.begin), ReduceOp::Sum, counts);
  }
  in_flight_.push_back({b, slot, w});
  if (!cfg_.overlap_comm) complete_oldest();
}

void ZeroEngine::complete_oldest() {
  InFlight f = in_flight_.front();
  in_flight_.pop_front();
  timed_wait(f.work);
  if (f.slot >= 0) {
    const Range bucket = buckets_[f.bucket];
    const Range mine = bucket.intersect(part_);
    if (!mine.empty()) {
      const Tensor s = slots_[static_cast<std::size_t>(f.slot)];
      Tensor dst = flat_slice(grads_part_, mine, part_.begin);
      kernels::axpy(1.0, flat_slice(s, mine, bucket.begin), dst);
    }
    slot_busy_[static_cast<std::size_t>(f.slot)] = false;
  }
}

void ZeroEngine::flush() {
  while (!in_flight_.empty()) complete_oldest();
}

// ---------------------------------------------------------------- stage 3
void ZeroEngine::pre_forward(int group) {
  if (cfg_.stage == 3) gather(group);
  wait_pending(group);  // the last step's gather (stages 1-2) or update (stage 0) of this group's run
}

void ZeroEngine::post_forward(int group) {
  if (cfg_.stage == 3) release(group);
}

void ZeroEngine::issue_gather(int group) {
  const Range r = layout_.group(group);
  Gathered& e = gathered_[group];
  e.buffer = Tensor::empty(device_, {r.size()}, cfg_.param_dtype, MemoryCategory::Parameters, "gathered-params");
  gathered_bytes_ += static_cast<std::int64_t>(e.buffer.nbytes());
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
  const Range mine = r.intersect(part_);
  if (!cfg_.offload_params) {
    e.work = dp_.all_gather(flat_slice(params_part_, mine, part_.begin), e.buffer, layout_.split_counts(r));
    return;
  }
  // This rank's piece up from host memory into its place in the gathered
  // buffer (where its chunk of the output starts even when it has none), then
  // the all-gather in place; the device's later work, the gather included,
  // waits for the upload on the device.
  const std::int64_t at = (mine.empty() ? std::clamp(part_.begin, r.begin, r.end) : mine.begin) - r.begin;
  const Tensor input = e.buffer.narrow(0, at, mine.size());
  if (!mine.empty() && device_->has_storage()) {
    device_->queue_after(*device_->copy_from_host_queued(
        input.data(), flat_slice(params_part_, mine, part_.begin).data(), input.nbytes()));
  }
  param_upload_bytes_ += static_cast<std::int64_t>(input.nbytes());
  e.work = dp_.all_gather(input, e.buffer, layout_.split_counts(r));
}

void ZeroEngine::gather(int group) {
  if (recording_ && !evaluating_) sequence_.push_back(group);
  if (!evaluating_) ++seq_pos_;
  if (!gathered_.count(group)) issue_gather(group);
  Gathered& e = gathered_[group];
  timed_wait(e.work);
  if (!e.bound) {
    bind_full(&Parameter::value, e.buffer, layout_.group(group));
    e.bound = true;
  }
  // Prefetch the group that came next on the recorded first step.
  if (cfg_.prefetch && !recording_ && !evaluating_ && seq_pos_ < sequence_.size()) {
    const int next = sequence_[seq_pos_];
    if (!gathered_.count(next)) {
      issue_gather(next);
      ++prefetched_gathers_;
    }
  }
}

void ZeroEngine::release(int group) {
  auto it = gathered_.find(group);
  if (it == gathered_.end()) return;
  it->second.work.wait();
  for (auto* p : params_)
    if (p->group == group) p->value = Tensor();
  gathered_bytes_ -= static_cast<std::int64_t>(it->second.buffer.nbytes());
  gathered_.erase(it);
}

std::string ZeroEngine::constant_buffers() const {
  std::int64_t bytes = 0;
  for (const auto& t : slots_) bytes += static_cast<std::int64_t>(t.nbytes());
  const std::string bucket = "--reduce-bucket-size " + std::to_string(cfg_.reduce_bucket_size) + " elements";
  if (slots_.empty())
    return "gradients reduced in place in buckets of " + bucket + " (no staging buffers at stage " +
           std::to_string(cfg_.stage) + ")";
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.2f", static_cast<double>(bytes) / 1048576.0);
  return std::to_string(slots_.size()) + " gradient staging buffers of " + std::to_string(slots_.front().numel()) +
         " elements (" + mib + " MiB in all; " + bucket + ", capped at the model)";
}

// ---------------------------------------------------------------- step
// Reads the partition in place: a host copy of it (Psi/Nd doubles) every step
// would cost more memory traffic than the sum itself. The sum stays on the
// device for the all-reduces; the step reads it once, after them. All ranges
// in one kernel call (on a GPU a launch per 240 merged ranges and a finish,
// not one per parameter).
void ZeroEngine::sum_of_squares(const Tensor& grads, Tensor& out) const {
  kernels::sum_of_squares(grads, norm_ranges_, out);
}

double ZeroEngine::params_norm() {
  finish_step();
  // The master covers owned_: this rank's partition, or at stage 0 the whole
  // buffer, of which the partition is the part norm_ranges_ counts.
  const Tensor mine = flat_slice(master_, part_, owned_.begin);
  // The sum on the master's device (the host's with offload), all-reduced on
  // the communicators' (the model's).
  Tensor sumsq = Tensor::empty(device_, {1}, DType::F64, MemoryCategory::Workspace, "params norm sum");
  if (&master_.device() == device_.get()) {
    kernels::sum_of_squares(mine, norm_ranges_, sumsq);
  } else {
    Tensor local = Tensor::empty(master_.device_ptr(), {1}, DType::F64, MemoryCategory::Workspace, "params norm sum");
    kernels::sum_of_squares(mine, norm_ranges_, local);
    sumsq.copy_from(local);
  }
  tp_.all_reduce(sumsq, ReduceOp::Sum).wait();
  dp_.all_reduce(sumsq, ReduceOp::Sum).wait();
  return sumsq.device().has_storage() ? std::sqrt(sumsq.to_double_vector()[0]) : 0.0;
}

std::int64_t ZeroEngine::grad_zeros() {
  const Tensor part_grads = partition_grads();
  Tensor count = Tensor::empty(part_grads.device_ptr(), {1}, DType::F64, MemoryCategory::Workspace, "zeros in grad");
  kernels::count_zeros(part_grads, norm_ranges_, count);
  tp_.all_reduce(count, ReduceOp::Sum).wait();
  dp_.all_reduce(count, ReduceOp::Sum).wait();
  return count.device().has_storage() ? std::llround(count.to_double_vector()[0]) : 0;
}

Tensor ZeroEngine::partition_grads() {
  flush();
  clear_deferred_grads();  // no backward since zero_grad: cleared now, as they would have been
  return cfg_.stage <= 1 ? flat_slice(grads_full_, part_) : grads_part_;
}

StepStats ZeroEngine::step(double lr, const optim::AdamConfig& adam, double clip_grad, double loss_scale,
                           std::int64_t step_number) {
  flush();
  finish_step();       // (the forward waited for them all) AdamW writes this rank's part of the gathers' output
  recording_ = false;  // the first step recorded the group order
  seq_pos_ = 0;
  const Tensor part_grads = partition_grads();
  // The step on a GPU: the sum of squares (one launch per 240 merged ranges,
  // one for GPT-2 355M, and a finish), its two all-reduces, one read-back,
  // AdamW (one launch per 240 merged owned segments, likewise one; the
  // loss-scale unscale and the clip coefficient are its grad_scale, the
  // overflow check is the sum's finiteness; it writes the published
  // parameters too), then the all-gather at stages 1-2 (in flight when the
  // step returns, with overlap_param_gather). Nothing loops over parameters.
  // The sum lives on the gradients' device (planned like any other
  // allocation; NCCL reduces it in place) and is read by the host once: the
  // step's one wait (NCCL's Work::wait only orders the compute stream).
  Tensor sumsq = Tensor::empty(part_grads.device_ptr(), {1}, DType::F64, MemoryCategory::Workspace, "grad norm sum");
  sum_of_squares(part_grads, sumsq);
  tp_.all_reduce(sumsq, ReduceOp::Sum).wait();
  dp_.all_reduce(sumsq, ReduceOp::Sum).wait();
  const double total = sumsq.device().has_storage() ? sumsq.to_double_vector()[0] : 0.0;
  StepStats st;
  st.grad_norm = std::sqrt(total) / loss_scale;
  if (!std::isfinite(total)) {  // the same verdict on every rank: the sum was all-reduced
    st.skipped = true;
    return st;
  }
  st.clip_coef = clip_grad > 0 ? std::min(1.0, clip_grad / (st.grad_norm + 1e-6)) : 1.0;
  const Tensor owned_grads = cfg_.stage == 0 ? grads_full_ : part_grads;
  // AdamW publishes: it writes each updated weight into the working-precision
  // parameters (publish_params' target) as it stores the master, converted as
  // copy_from converts it, so the step does not read the fp32 master a second
  // time for a cast pass. It writes only the owned segments' elements; the rest
  // of the target is the layout's padding ([unpadded, padded): parameters lie
  // without gaps from 0, and owned_segments_ is every parameter's range cut to
  // owned_). No step changes the padding's master (0 from initialize; loads
  // write parameter ranges only), and only publish_params and the all-gathers
  // of the ranks' equally constant padding write it in the parameters (no
  // Parameter view covers it), so it still holds the cast of its master.
  Tensor published = publish_target(cfg_.stage, params_full_, part_, params_part_);
  MZ_CHECK(published.numel() == master_.numel(), "ZeRO step: ", published.numel(), " parameters to publish, ",
           master_.numel(), " master weights");
  if (cfg_.stage == 0 && cfg_.overlap_optimizer) {
    queue_updates(adam, lr, step_number, st.clip_coef / loss_scale);
    return st;
  }
  if (offload_)  // down, AdamW on the host, up: the same formula, the same bits
    offload_->step(owned_grads, published, adam, lr, step_number, st.clip_coef / loss_scale);
  else
    optim::adamw_step(master_, exp_avg_, exp_avg_sq_, owned_grads, owned_segments_, adam, lr, step_number,
                      st.clip_coef / loss_scale, published);
  // Stages 1-2: the all-gather, as publish_params gathers; with the overlap
  // the next forward waits for each run of groups as it reaches it.
  if (cfg_.stage == 1 || cfg_.stage == 2) issue_param_gathers();
  return st;
}

}  // namespace megazero::zero
