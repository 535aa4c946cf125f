#include "megazero/train/deepspeed_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megazero/core/error.h"
#include "megazero/train/arguments.h"

namespace megazero::train {
namespace {

using json = nlohmann::json;

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
template <typename T>
std::string text_of_value(const T& x) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, bool>)
    os << (x ? "true" : "false");
  else
    os << x;
  return os.str();
}

class Translator {
 public:
  Translator(TrainArgs& a, const std::string& path, const std::vector<std::string>& given)
      : a_(a), path_(path), given_(given) {}

  std::string where(const std::string& key) const { return "--deepspeed-config " + path_ + ": " + key; }
  bool given(const char* flag) const { return std::find(given_.begin(), given_.end(), flag) != given_.end(); }
  void note(const std::string& text) { a_.notes.push_back("--deepspeed-config: " + text); }
  void refuse(const std::string& key, const std::string& why) { refused_.push_back(key + ": " + why); }
  void unknown(const std::string& key) { unknown_.push_back(key); }
  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  // The value of `key` for `flag`'s field: "auto" keeps the command line's,
  // a value contradicting an explicit flag is refused.
  template <typename T>
  void set(const json& v, const std::string& key, const char* flag, T& field) {
    if (is_auto(v)) {
      note(key + " is auto: --" + flag + " " + text_of_value(field) + " (this command line's)");
      return;
    }
    const T x = as<T>(v, key);
    MZ_REQUIRE(!given(flag) || x == field, where(key), " is ", text_of(v), " but --", flag, " ", text_of_value(field),
               " was given; drop one of them");
    field = x;
  }

  template <typename T>
  T as(const json& v, const std::string& key) const {
    if constexpr (std::is_same_v<T, bool>) {
      MZ_REQUIRE(v.is_boolean(), where(key), " must be true or false, got ", v.dump());
      return v.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      MZ_REQUIRE(v.is_string(), where(key), " must be a string, got ", v.dump());
      return v.get<std::string>();
    } else if constexpr (std::is_integral_v<T>) {
      // 5e8 is a JSON float: a whole number either way.
      MZ_REQUIRE(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
                     std::abs(v.get<double>()) < 9e18,
                 where(key), " must be a whole number, got ", v.dump());
      return static_cast<T>(v.get<double>());
    } else {
      MZ_REQUIRE(v.is_number() && std::isfinite(v.get<double>()), where(key), " must be a number, got ", v.dump());
      return v.get<double>();
    }
  }

  void finish() const {
    std::string msg;
    if (!unknown_.empty()) {
      msg += where("") + "unknown key" + (unknown_.size() > 1 ? "s " : " ");
      for (std::size_t i = 0; i < unknown_.size(); ++i) msg += (i ? ", " : "") + unknown_[i];
      msg += " (not DeepSpeed configuration keys megazero knows; remove them)";
    }
    for (const auto& r : refused_) msg += (msg.empty() ? "" : "; ") + where(r);
    if (!msg.empty()) throw ConfigError(msg);
  }

  TrainArgs& a_;

 private:
  std::string path_;
  const std::vector<std::string>& given_;
  std::vector<std::string> unknown_, refused_;
};

bool flag_true(const json& v) { return v.is_boolean() && v.get<bool>(); }

void precision(Translator& t, const json& section, const std::string& name) {
  TrainArgs& a = t.a_;
  const bool fp16 = name == "fp16";
  for (const auto& [key, v] : section.items()) {
    const std::string k = name + "." + key;
    if (key == "enabled") {
      if (Translator::is_auto(v))
        t.note(k + " is auto: this command line's precision");
      else
        t.set(v, k, fp16 ? "fp16" : "bf16", fp16 ? a.fp16 : a.bf16);
    } else if (!fp16 && key == "immediate_grad_update") {
      t.note(k + ": gradients are reduced into their fp32 optimizer partitions as the step needs them");
    } else if (fp16 && key == "loss_scale") {
      // 0: dynamic scaling; a number: Megatron's constant --loss-scale.
      if (!Translator::is_auto(v) && t.as<double>(v, k) != 0) t.set(v, k, "loss-scale", a.loss_scale.constant_scale);
    } else if (fp16 && key == "initial_scale_power") {
      if (Translator::is_auto(v)) continue;
      const double scale = std::ldexp(1.0, t.as<int>(v, k));
      t.set(json(scale), k, "initial-loss-scale", a.loss_scale.initial_scale);
    } else if (fp16 && key == "loss_scale_window") {
      t.set(v, k, "loss-scale-window", a.loss_scale.window);
    } else if (fp16 && key == "hysteresis") {
      t.set(v, k, "hysteresis", a.loss_scale.hysteresis);
    } else if (fp16 && key == "min_loss_scale") {
      t.set(v, k, "min-loss-scale", a.loss_scale.min_scale);
    } else if (fp16 && key == "consecutive_hysteresis") {
      if (flag_true(v))
        t.refuse(k, "consecutive hysteresis is not implemented (Megatron's hysteresis counts overflows)");
    } else if (fp16 && key == "auto_cast") {
      if (flag_true(v)) t.refuse(k, "autocasting inputs is not implemented: the model runs in --fp16 throughout");
    } else {
      t.unknown(k);
    }
  }
}

// ZeRO-Offload's {"device": "cpu"}: offload_optimizer is --optimizer-cpu-offload,
// offload_param --param-cpu-offload (stage 3).
void offload_target(Translator& t, const std::string& k, const json& v, const char* flag, bool& field) {
  if (!v.is_object()) {
    t.refuse(k, "must be an object such as {\"device\": \"cpu\"}");
    return;
  }
  const std::string device = v.value("device", std::string("none"));
  if (device == "nvme") {
    t.refuse(k + ".device", "offloading to NVMe (ZeRO-Infinity) is not implemented: use \"cpu\" (host memory)");
    return;
  }
  if (device != "cpu" && device != "none") {
    t.refuse(k + ".device", "must be \"cpu\" or \"none\", got \"" + device + "\"");
    return;
  }
  t.set(json(device == "cpu"), k + ".device", flag, field);
  for (const auto& [key, x] : v.items()) {
    const std::string kk = k + "." + key;
    if (key == "device") continue;
    if (key == "pin_memory") {
      if (x.is_boolean() && !x.get<bool>())
        t.note(kk +
               " false has no effect here: on a GPU the offloaded state is always page-locked (the copies are "
               "DMA transfers that overlap the host's update)");
    } else if (key == "ratio") {
      if (!x.is_number() || x.get<double>() != 1.0)
        t.refuse(kk,
                 "a partial offload is not implemented: the whole of the partition's state moves to host "
                 "memory (use 1.0 or leave it out)");
    } else if (key == "max_in_cpu" || key == "buffer_size") {
      t.note(kk + " has no effect here: the whole partition lives in host memory");
    } else if (key == "buffer_count" || key == "fast_init" || key == "nvme_path" || key == "pipeline_read" ||
               key == "pipeline_write" || key == "pipeline") {
      t.note(kk +
             " has no effect here: the host's update is pipelined with the copies, chunk by chunk, "
             "in --reduce-bucket-size chunks");
    } else {
      t.unknown(kk);
    }
  }
}

void zero_optimization(Translator& t, const json& section) {
  TrainArgs& a = t.a_;
  for (const auto& [key, v] : section.items()) {
    const std::string k = "zero_optimization." + key;
    if (key == "stage") {
      t.set(v, k, "zero-stage", a.zero.stage);
    } else if (key == "reduce_bucket_size") {
      t.set(v, k, "reduce-bucket-size", a.zero.reduce_bucket_size);
    } else if (key == "overlap_comm") {
      t.set(v, k, "overlap-comm", a.zero.overlap_comm);
    } else if (key == "offload_optimizer") {
      offload_target(t, k, v, "optimizer-cpu-offload", a.zero.offload_optimizer);
    } else if (key == "cpu_offload") {  // DeepSpeed's older spelling of offload_optimizer {"device": "cpu"}
      t.set(json(flag_true(v)), k, "optimizer-cpu-offload", a.zero.offload_optimizer);
    } else if (key == "offload_param") {
      offload_target(t, k, v, "param-cpu-offload", a.zero.offload_params);
    } else if (key == "cpu_offload_params") {  // the older spelling of offload_param {"device": "cpu"}
      t.set(json(flag_true(v)), k, "param-cpu-offload", a.zero.offload_params);
    } else if (key == "reduce_scatter" || key == "allgather_partitions") {
      if (v.is_boolean() && !v.get<bool>())
        t.refuse(k, "stages 1-3 always reduce-scatter gradients and all-gather the partitions");
    } else if (key == "contiguous_gradients") {
      t.note(k + ": gradients always live in flat contiguous buffers (the paper's CB)");
    } else if (key == "allgather_bucket_size" || key == "stage3_prefetch_bucket_size" ||
               key == "stage3_param_persistence_threshold" || key == "stage3_max_live_parameters" ||
               key == "stage3_max_reuse_distance" || key == "sub_group_size" || key == "round_robin_gradients" ||
               key == "elastic_checkpoint" || key == "ignore_unused_parameters" || key == "load_from_fp32_weights" ||
               key == "memory_efficient_linear" || key == "stage3_gather_16bit_weights_on_model_save" ||
               key == "stage3_gather_fp16_weights_on_model_save" || key == "use_multi_rank_bucket_allreduce") {
      t.note(k +
             " has no effect here: megazero's engine gathers whole parameter groups, one ahead "
             "(--stage3-prefetch), reduces in --reduce-bucket-size buckets, saves fp32 partitions "
             "(tools/convert_checkpoint exports the weights)");
    } else {
      t.unknown(k);
    }
  }
}

void activation_checkpointing(Translator& t, const json& section) {
  TrainArgs& a = t.a_;
  for (const auto& [key, v] : section.items()) {
    const std::string k = "activation_checkpointing." + key;
    if (key == "partition_activations") {
      t.set(v, k, "partition-activations", a.zero_r.partition_activations);
    } else if (key == "cpu_checkpointing") {
      t.set(v, k, "cpu-checkpointing", a.zero_r.cpu_checkpointing);
    } else if (key == "contiguous_memory_optimization") {
      t.set(v, k, "contiguous-memory-optimization", a.zero_r.contiguous_memory);
    } else if (key == "number_checkpoints" || key == "synchronize_checkpoint_boundary" || key == "profile") {
      t.note(k +
             " has no effect here: one checkpoint per recomputed layer (--recompute-method), the timers are "
             "always printed");
    } else {
      t.unknown(k);
    }
  }
}

void optimizer(Translator& t, const json& section) {
  TrainArgs& a = t.a_;
  for (const auto& [key, v] : section.items()) {
    if (key == "type") {
      std::string type = t.as<std::string>(v, "optimizer.type");
      std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
      if (type != "adam" && type != "adamw" && type != "fusedadam")
        t.refuse("optimizer.type",
                 detail::concat("'", text_of(v), "': megazero's optimizer is AdamW (decoupled weight decay)"));
    } else if (key == "params") {
      MZ_REQUIRE(v.is_object(), t.where("optimizer.params"), " must be an object");
      for (const auto& [p, x] : v.items()) {
        const std::string k = "optimizer.params." + p;
        if (p == "lr") {
          t.set(x, k, "lr", a.lr.max_lr);
        } else if (p == "betas") {
          if (Translator::is_auto(x)) {
            t.note(k + " is auto: this command line's --adam-beta1 and --adam-beta2");
            continue;
          }
          MZ_REQUIRE(x.is_array() && x.size() == 2, t.where(k), " must be [beta1, beta2], got ", x.dump());
          t.set(x[0], k + "[0]", "adam-beta1", a.adam.beta1);
          t.set(x[1], k + "[1]", "adam-beta2", a.adam.beta2);
        } else if (p == "eps") {
          t.set(x, k, "adam-eps", a.adam.eps);
        } else if (p == "weight_decay") {
          t.set(x, k, "weight-decay", a.adam.weight_decay);
        } else if (p == "adam_w_mode") {
          if (x.is_boolean() && !x.get<bool>())
            t.refuse(k, "Adam with L2 regularisation is not implemented: the weight decay is decoupled (AdamW)");
        } else if (p == "torch_adam" || p == "bias_correction" || p == "amsgrad") {
          if (p == "amsgrad" && flag_true(x)) t.refuse(k, "AMSGrad is not implemented");
          if (p == "bias_correction" && x.is_boolean() && !x.get<bool>())
            t.refuse(k, "Adam without bias correction is not implemented");
        } else {
          t.unknown(k);
        }
      }
    } else {
      t.unknown("optimizer." + key);
    }
  }
}

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR with a linear warmup.
void scheduler(Translator& t, const json& section) {
  TrainArgs& a = t.a_;
  const std::string type = section.contains("type") ? t.as<std::string>(section["type"], "scheduler.type") : "";
  const bool decay = type == "WarmupDecayLR", cosine = type == "WarmupCosineLR";
  if (type != "WarmupLR" && !decay && !cosine) {
    t.refuse("scheduler.type", "'" + type +
                                   "' is not implemented: WarmupLR, WarmupDecayLR and WarmupCosineLR are (or "
                                   "Megatron's --lr-decay-style flags)");
    return;
  }
  const json params = section.value("params", json::object());
  for (const auto& [key, v] : section.items())
    if (key != "type" && key != "params") t.unknown("scheduler." + key);
  // DeepSpeed's default warmup is logarithmic.
  const std::string warmup = params.contains("warmup_type") ? text_of(params["warmup_type"]) : "log";
  if (warmup != "linear" && warmup != "log") {
    t.refuse("scheduler.params.warmup_type", "'" + warmup + "' is not one of log, linear");
    return;
  }
  t.set(json(warmup), "scheduler.params.warmup_type", "lr-warmup-style", a.lr.warmup_style);
  std::string style = decay ? "linear" : cosine ? "cosine" : "constant";
  t.set(json(style), "scheduler.type " + type, "lr-decay-style", a.lr.style);
  for (const auto& [key, v] : params.items()) {
    const std::string k = "scheduler.params." + key;
    if (key == "warmup_type" || key == "last_batch_iteration") {
      if (key == "last_batch_iteration" && !Translator::is_auto(v) && t.as<std::int64_t>(v, k) != -1)
        t.refuse(k, "resuming a schedule from a given step is --load's (the checkpoint's iteration)");
    } else if (key == "warmup_num_steps") {
      t.set(v, k, "lr-warmup-iters", a.lr.warmup_iters);
    } else if (key == "total_num_steps" && (decay || cosine)) {
      t.set(v, k, "lr-decay-iters", a.lr.decay_iters);
    } else if (key == "warmup_max_lr" && !cosine) {
      t.set(v, k, "lr", a.lr.max_lr);
    } else if (key == "warmup_min_lr" && !cosine) {
      t.set(v, k, "lr-warmup-init", a.lr.init_lr);
    } else if (cosine && (key == "warmup_min_ratio" || key == "cos_min_ratio")) {
      if (Translator::is_auto(v)) continue;
      const double ratio = t.as<double>(v, k);
      if (key == "warmup_min_ratio")
        t.set(json(ratio * a.lr.max_lr), k, "lr-warmup-init", a.lr.init_lr);
      else
        t.set(json(ratio * a.lr.max_lr), k, "min-lr", a.lr.min_lr);
    } else {
      t.unknown(k);
    }
  }
  if (decay && !t.given("min-lr")) a.lr.min_lr = 0;  // WarmupDecayLR decays to zero
}

}  // namespace

void apply_deepspeed_config(TrainArgs& a, const std::string& json_text, const std::string& path,
                            const std::vector<std::string>& given) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw ConfigError("--deepspeed-config " + path + " is not valid JSON: " + e.what());
  }
  MZ_REQUIRE(j.is_object(), "--deepspeed-config ", path, " must hold a JSON object (DeepSpeed's configuration)");
  Translator t(a, path, given);
  auto section = [&](const std::string& key, const json& v) -> const json& {
    MZ_REQUIRE(v.is_object(), t.where(key), " must be an object, got ", v.dump());
    return v;
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "train_batch_size") {
      t.set(v, key, "global-batch-size", a.global_batch_size);
    } else if (key == "train_micro_batch_size_per_gpu") {
      t.set(v, key, "micro-batch-size", a.micro_batch_size);
    } else if (key == "gradient_accumulation_steps") {
      if (!Translator::is_auto(v)) a.gradient_accumulation_steps = t.as<std::int64_t>(v, key);
    } else if (key == "gradient_clipping") {
      t.set(v, key, "clip-grad", a.clip_grad);
    } else if (key == "steps_per_print") {
      t.set(v, key, "log-interval", a.log_interval);
    } else if (key == "fp16" || key == "bf16") {
      precision(t, section(key, v), key);
    } else if (key == "zero_optimization") {
      zero_optimization(t, section(key, v));
    } else if (key == "activation_checkpointing") {
      activation_checkpointing(t, section(key, v));
    } else if (key == "optimizer") {
      optimizer(t, section(key, v));
    } else if (key == "scheduler") {
      scheduler(t, section(key, v));
    } else if (key == "tensorboard") {
      const json& tb = section(key, v);
      if (tb.value("enabled", false)) {
        std::string dir = tb.value("output_path", std::string("."));
        if (tb.contains("job_name"))
          dir = detail::concat(dir, "/", t.as<std::string>(tb["job_name"], "tensorboard.job_name"));
        t.set(json(dir), key + ".output_path", "tensorboard-dir", a.tensorboard_dir);
      }
    } else if (key == "wall_clock_breakdown" || key == "zero_allow_untested_optimizer" ||
               key == "zero_force_ds_cpu_optimizer" || key == "memory_breakdown" || key == "dump_state") {
      t.note(key + " has no effect here: the step's timers and memory are always logged");
    } else if (key == "prescale_gradients" || key == "gradient_predivide_factor") {
      const bool plain = key == "prescale_gradients" ? !flag_true(v) : (v.is_number() && v.get<double>() == 1.0);
      if (!plain) t.refuse(key, "gradients are averaged once, in fp32 partitions; pre-division is not implemented");
    } else if (key == "flops_profiler" || key == "comms_logger" || key == "wandb" || key == "csv_monitor") {
      if (v.is_object() && v.value("enabled", false))
        t.refuse(key,
                 "not built in: the iteration line prints TFLOP/s and MFU, --tensorboard-dir and "
                 "--metrics-file take the scalars, --profile the GPU's kernels");
    } else if (key == "communication_data_type" || key == "data_types" || key == "amp" || key == "sparse_attention" ||
               key == "curriculum_learning" || key == "data_efficiency" || key == "compression_training" ||
               key == "pipeline" || key == "elasticity" || key == "autotuning" || key == "aio" || key == "checkpoint" ||
               key == "seq_parallel_communication_data_type") {
      t.refuse(key,
               "not implemented in megazero (its equivalent, where one exists, is a pretrain_gpt flag: "
               "--help lists them)");
    } else {
      t.unknown(key);
    }
  }
  t.finish();
}

}  // namespace megazero::train
