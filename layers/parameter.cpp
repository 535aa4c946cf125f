#include "layers/parameter.h"

#include <algorithm>
#include <cmath>

#include "megazero/kernels/optimizer_kernels.h"

#include "megazero/core/error.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/rng.h"

namespace megazero::layers {

std::uint32_t Parameter::id() const {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  return h;
}

std::int64_t Parameter::global_index(std::int64_t local_flat) const {
  std::int64_t global = 0, rem = local_flat;
  Shape local_strides = contiguous_strides(local_shape);
  Shape global_strides = contiguous_strides(global_shape);
  for (std::size_t d = 0; d < local_shape.size(); ++d) {
    std::int64_t coord = rem / local_strides[d];
    rem %= local_strides[d];
    if (static_cast<int>(d) == split_dim) coord += shard_start;
    global += coord * global_strides[d];
  }
  return global;
}

double Parameter::init_value(std::uint64_t seed, std::int64_t local_flat) const {
  double v = 0;
  init_values(seed, local_flat, local_flat + 1, &v);
  return v;
}

void Parameter::init_values(std::uint64_t seed, std::int64_t begin, std::int64_t end, double* out) const {
  MZ_CHECK(0 <= begin && begin <= end && end <= local_numel(), "init_values: [", begin, ", ", end, ") of ",
           local_numel(), " elements of '", name, "'");
  if (init == Init::Ones || init == Init::Zeros) {
    std::fill(out, out + (end - begin), init == Init::Ones ? 1.0 : 0.0);
    return;
  }
  const Shape local_strides = contiguous_strides(local_shape), global_strides = contiguous_strides(global_shape);
  const std::int64_t row = global_shape.size() > 1 ? shape_numel(global_shape) / global_shape[0] : 1;
  const RngKey key{seed, 0, id(), kRngInit};
  const double bound = init == Init::XavierUniform ? xavier_bound() : 0.0;
  parallel_ranges(end - begin, [&](std::int64_t b, std::int64_t e) {
    NormalStream normals(key);
    UniformStream uniforms(key);
    for (std::int64_t i = begin + b; i < begin + e; ++i) {
      std::int64_t g = 0, rem = i;  // global_index without its allocations
      for (std::size_t d = 0; d < local_shape.size(); ++d) {
        std::int64_t coord = rem / local_strides[d];
        rem %= local_strides[d];
        if (static_cast<int>(d) == split_dim) coord += shard_start;
        g += coord * global_strides[d];
      }
      double& v = out[i - begin];
      if (padding_from_row >= 0 && g / row >= padding_from_row)
        v = 0.0;  // padding stays 0
      else if (init == Init::XavierUniform)
        v = bound * (2.0 * static_cast<double>(uniforms.at(static_cast<std::uint64_t>(g))) - 1.0);
      else
        v = init_std * normals.at(static_cast<std::uint64_t>(g));
    }
  });
}

double Parameter::xavier_bound() const {
  const std::int64_t fan_in = global_shape.back();
  std::int64_t numel = shape_numel(global_shape);
  if (padding_from_row >= 0) numel = numel / global_shape[0] * padding_from_row;  // the vocabulary's rows only
  const std::int64_t fan_out = global_shape.size() > 1 ? numel / fan_in : 1;
  return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
}

Parameter& ParameterSet::add(std::string name, Shape global_shape, int split_dim, int part, int parts, Init init,
                             double init_std, bool weight_decay) {
  MZ_CHECK(!by_name_.count(name), "parameter '", name, "' declared twice");
  Parameter p;
  p.name = std::move(name);
  p.global_shape = global_shape;
  p.local_shape = global_shape;
  p.split_dim = split_dim;
  if (split_dim >= 0) {
    const auto d = static_cast<std::size_t>(split_dim);
    MZ_CHECK(d < global_shape.size() && parts > 0 && global_shape[d] % parts == 0, "parameter '", p.name, "': dim ",
             split_dim, " of ", shape_str(global_shape), " does not split into ", parts, " parts");
    p.local_shape[d] = global_shape[d] / parts;
    p.shard_start = p.local_shape[d] * part;
  }
  if (group_names_.empty()) group_names_.push_back("default");
  p.group = num_groups() - 1;
  p.init = xavier_uniform_ && init == Init::Normal ? Init::XavierUniform : init;
  p.init_std = init_std;
  p.weight_decay = weight_decay;
  params_.push_back(std::move(p));
  by_name_[params_.back().name] = &params_.back();
  return params_.back();
}

int ParameterSet::begin_group(std::string name) {
  group_names_.push_back(std::move(name));
  return num_groups() - 1;
}

std::vector<Parameter*> ParameterSet::all() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(&p);
  return out;
}
std::vector<const Parameter*> ParameterSet::all() const {
  std::vector<const Parameter*> out;
  for (const auto& p : params_) out.push_back(&p);
  return out;
}

Parameter& ParameterSet::get(const std::string& name) {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) throw InternalError("no parameter named '" + name + "'");
  return *it->second;
}

std::int64_t ParameterSet::local_numel() const {
  std::int64_t n = 0;
  for (const auto& p : params_) n += p.local_numel();
  return n;
}

void ParameterSet::allocate(const std::shared_ptr<Device>& device, DType dtype) {
  const std::int64_t total = local_numel();
  flat_values_ = Tensor::empty(device, {total}, dtype, MemoryCategory::Parameters, "parameters");
  flat_grads_ = Tensor::zeros(device, {total}, dtype, MemoryCategory::Gradients, "gradients");
  std::int64_t offset = 0;
  for (auto& p : params_) {
    p.value = flat_values_.narrow(0, offset, p.local_numel()).view(p.local_shape);
    p.grad = flat_grads_.narrow(0, offset, p.local_numel()).view(p.local_shape);
    offset += p.local_numel();
  }
}

void ParameterSet::initialize(std::uint64_t seed) {
  for (auto& p : params_) {
    MZ_CHECK(p.value.defined(), "parameter '", p.name, "' has no storage; allocate() first");
    if (!p.value.device().has_storage()) continue;
    std::vector<double> v(static_cast<std::size_t>(p.local_numel()));
    p.init_values(seed, 0, p.local_numel(), v.data());
    p.value.copy_from_doubles(v);
  }
}

void ParameterSet::zero_grad() {
  if (flat_grads_.defined()) {
    std::vector<GradAt> at;
    std::int64_t offset = 0;
    for (auto& p : params_) {
      at.push_back({&p, offset});
      offset += p.local_numel();
    }
    clear_grads(flat_grads_, at);
    return;
  }
  for (auto& p : params_)
    if (p.grad.defined()) {
      p.grad.zero_();
      p.grad_unset = false;
    }
}

float take_grad_beta(Parameter& p) {
  if (!p.grad_unset) return 1.0f;
  p.grad_unset = false;
  return 0.0f;
}

void settle_grad(Parameter& p) {
  if (!p.grad_unset) return;
  if (p.grad.defined()) p.grad.zero_();
  p.grad_unset = false;
}

void clear_grads(const Tensor& flat, const std::vector<GradAt>& at) {
  std::vector<std::pair<std::int64_t, std::int64_t>> kept;  // the overwritable gradients, left as they are
  for (const GradAt& g : at) {
    g.param->grad_unset = g.param->grad_overwritable;
    if (g.param->grad_overwritable) kept.emplace_back(g.offset, g.offset + g.param->local_numel());
  }
  std::sort(kept.begin(), kept.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> cleared;  // everything else, gaps included
  std::int64_t from = 0;
  for (const auto& [b, e] : kept) {
    if (b > from) cleared.emplace_back(from, b);
    from = std::max(from, e);
  }
  if (from < flat.numel()) cleared.emplace_back(from, flat.numel());
  kernels::zero_ranges(flat, cleared);
}

}  // namespace megazero::layers
