// Parameters and the metadata that travels with them. ZeRO (partitioning),
// gradient clipping (count TP-replicated parameters once) and checkpoints
// (reshard on load from global shapes) all read this metadata; layers only
// declare parameters and use their `value` / `grad` views.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "megazero/core/tensor.h"

namespace megazero::layers {

// Normal: N(0, init_std). XavierUniform (--init-method-xavier-uniform, in
// place of every Normal): U(-a, a), a = sqrt(6 / (fan_in + fan_out)) of the
// matrix the weight stands for at TP 1 — fan_in its last dimension, fan_out
// the rest, a padded vocabulary's rows not counted — so every layout draws
// the same values (Megatron draws on each rank's shard unless
// --use-cpu-initialization).
enum class Init { Normal, Zeros, Ones, XavierUniform };

struct Parameter {
  std::string name;              // e.g. "layers.3.attention.qkv.weight"
  Shape global_shape;            // the full tensor, as at TP = 1
  int split_dim = -1;            // dimension split across TP ranks; -1 = replicated
  std::int64_t shard_start = 0;  // this rank's first index along split_dim (global)
  Shape local_shape;             // what this rank holds
  bool weight_decay = true;      // false for biases and LayerNorm
  Init init = Init::Normal;
  double init_std = 0.0;        // for Init::Normal
  double xavier_bound() const;  // a, for Init::XavierUniform
  // Rows of dim 0 at or beyond this index are padding (vocab padding) and stay
  // zero at init; -1 = none.
  std::int64_t padding_from_row = -1;

  int group = 0;  // parameter group (see param_hooks.h), in forward order

  Tensor value;  // views into storage bound by the owner (ParameterSet::allocate or ZeRO)
  Tensor grad;

  // Gradients a GEMM writes first (PyTorch's zero_grad(set_to_none=True)
  // gain: no memset of them before a backward, no read of those zeros in the
  // weight-gradient GEMM). A layer sets grad_overwritable on a parameter whose
  // every gradient write is a GEMM taking its beta from take_grad_beta (the
  // linear layers' weights). clear_grads leaves such a gradient as it was and
  // sets grad_unset: the next write overwrites (beta 0), later ones add.
  // settle_grad zeroes one still unset before anything else reads it.
  bool grad_overwritable = false;
  bool grad_unset = false;

  bool tp_replicated() const { return split_dim < 0; }
  std::int64_t local_numel() const { return shape_numel(local_shape); }
  // Stable id from the name: the RNG stream of this parameter's init, the
  // same in every layout.
  std::uint32_t id() const;
  // Global flat index (row-major over global_shape) of local flat index i.
  std::int64_t global_index(std::int64_t local_flat) const;
  // Initial value of local element i: a function of (seed, name, global index)
  // only, so every layout (TP shard, ZeRO partition) computes the same value.
  double init_value(std::uint64_t seed, std::int64_t local_flat) const;
  // init_value of local elements [begin, end) into out[0, end - begin), on
  // the math threads (the same values for any thread count): what
  // initialisation calls, the per-parameter work done once.
  void init_values(std::uint64_t seed, std::int64_t begin, std::int64_t end, double* out) const;
};

// The beta of the next GEMM that writes p.grad: 0 while the gradient is unset
// (the GEMM overwrites it, and it is set from then on), else 1 (it adds).
float take_grad_beta(Parameter& p);
// Zeroes p.grad if it is still unset (a parameter no GEMM wrote this
// backward), so it reads as zero; a no-op otherwise.
void settle_grad(Parameter& p);

// A parameter whose gradient lies at `offset` elements into a flat buffer.
struct GradAt {
  Parameter* param;
  std::int64_t offset;
};
// Prepares `flat` (a gradient buffer) for a backward, zero_grad's job: every
// element is zeroed (one kernels::zero_ranges call) except the gradients of
// the overwritable parameters in `at`, which are flagged unset instead; the
// others in `at` are flagged set.
void clear_grads(const Tensor& flat, const std::vector<GradAt>& at);

// All parameters of a model on this rank, in registration (= forward) order.
class ParameterSet {
 public:
  ParameterSet() = default;
  // by_name_ points into params_: a copy would point into the original.
  ParameterSet(const ParameterSet&) = delete;
  ParameterSet& operator=(const ParameterSet&) = delete;
  ParameterSet(ParameterSet&&) = default;
  ParameterSet& operator=(ParameterSet&&) = default;
  // Declares a parameter split along `split_dim` into `parts` equal contiguous
  // shards, of which this rank holds shard `part`. split_dim -1: replicated.
  Parameter& add(std::string name, Shape global_shape, int split_dim, int part, int parts, Init init,
                 double init_std = 0.0, bool weight_decay = true);

  // Parameters declared after this call belong to a new group named `name`.
  // Groups must be declared in forward order and their parameters contiguously.
  int begin_group(std::string name);
  // Megatron's --init-method-xavier-uniform: parameters added from here with
  // Init::Normal (every weight matrix and embedding) take Init::XavierUniform.
  void set_xavier_uniform(bool on) { xavier_uniform_ = on; }
  int num_groups() const { return static_cast<int>(group_names_.size()); }
  const std::string& group_name(int g) const { return group_names_[static_cast<std::size_t>(g)]; }

  std::vector<Parameter*> all();
  std::vector<const Parameter*> all() const;
  Parameter& get(const std::string& name);
  std::int64_t local_numel() const;  // elements this rank holds

  // Default storage: one flat value buffer and one flat gradient buffer on
  // `device`, parameters packed in registration order. (ZeRO binds its own.)
  void allocate(const std::shared_ptr<Device>& device, DType dtype);
  // Fills values from the seed: a function of (seed, parameter name, global
  // element index) only, so every TP layout holds bit-identical shards.
  void initialize(std::uint64_t seed);
  void zero_grad();

  const Tensor& flat_values() const { return flat_values_; }
  const Tensor& flat_grads() const { return flat_grads_; }

 private:
  bool xavier_uniform_ = false;
  std::deque<Parameter> params_;                         // stable addresses
  std::unordered_map<std::string, Parameter*> by_name_;  // declaration and lookup in O(1), not O(parameters)
  std::vector<std::string> group_names_;
  Tensor flat_values_, flat_grads_;
};

}  // namespace megazero::layers
