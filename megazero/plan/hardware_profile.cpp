#include "megazero/plan/hardware_profile.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "megazero/core/error.h"

namespace megazero::plan {
namespace {

// configs/hardware/*.json, embedded at build time (CMake writes this file).
#include "hardware_profiles_builtin.inc"

using json = nlohmann::json;

double positive(const json& j, const char* key, const std::string& where, bool allow_zero = false) {
  MZ_REQUIRE(j.contains(key) && j.at(key).is_number(), "--hardware ", where, ": the number '", key,
             "' is missing; see configs/hardware/dgx2-v100.json for every field");
  const double v = j.at(key).get<double>();
  MZ_REQUIRE(allow_zero ? v >= 0 : v > 0, "--hardware ", where, ": '", key, "' is ", v, ", it must be ",
             allow_zero ? "at least 0" : "positive");
  return v;
}

HardwareProfile parse(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(detail::concat("--hardware ", where, ": not valid JSON: ", e.what()));
  }
  MZ_REQUIRE(j.is_object(), "--hardware ", where, ": expected a JSON object");
  HardwareProfile h;
  h.name = j.value("name", where);
  h.description = j.value("description", "");
  h.source = j.value("source", "");
  const std::string kernels = j.value("kernels", "cuda");
  MZ_REQUIRE(kernels == "cuda" || kernels == "cpu", "--hardware ", where, ": 'kernels' is '", kernels,
             "'; it must be \"cuda\" or \"cpu\" (whose GEMMs the plan's workspace follows)");
  h.kernels = kernels == "cpu" ? DeviceKind::CPU : DeviceKind::CUDA;
  h.devices_per_node = static_cast<int>(positive(j, "devices_per_node", where));
  h.memory_gib = positive(j, "memory_gib", where);
  MZ_REQUIRE(j.contains("peak_tflops") && j["peak_tflops"].is_object() && !j["peak_tflops"].empty(), "--hardware ",
             where, ": 'peak_tflops' must map dtype names (fp16, bf16, fp32) to TFLOP/s");
  for (const auto& [k, v] : j["peak_tflops"].items()) {
    MZ_REQUIRE(v.is_number() && v.get<double>() > 0, "--hardware ", where, ": peak_tflops.", k, " must be positive");
    h.peak_tflops[k] = v.get<double>();
  }
  h.gemm_efficiency = positive(j, "gemm_efficiency", where);
  MZ_REQUIRE(h.gemm_efficiency <= 1, "--hardware ", where, ": gemm_efficiency is a fraction of the peak (at most 1)");
  h.kernel_overhead_us = positive(j, "kernel_overhead_us", where, true);
  h.memory_bandwidth_gbps = positive(j, "memory_bandwidth_gbps", where);
  h.elementwise_traffic_factor = positive(j, "elementwise_traffic_factor", where, true);
  MZ_REQUIRE(j.contains("intra_node") && j.contains("inter_node"), "--hardware ", where,
             ": 'intra_node' and 'inter_node' objects are required");
  h.intra_node.bus_bandwidth_gbps = positive(j["intra_node"], "bus_bandwidth_gbps", where + " intra_node");
  h.intra_node.latency_us = positive(j["intra_node"], "latency_us", where + " intra_node", true);
  h.inter_node_gbps = positive(j["inter_node"], "node_bandwidth_gbps", where + " inter_node");
  h.inter_node_latency_us = positive(j["inter_node"], "latency_us", where + " inter_node", true);
  h.inter_node_group_gbps = j["inter_node"].contains("group_bandwidth_gbps")
                                ? positive(j["inter_node"], "group_bandwidth_gbps", where + " inter_node")
                                : h.inter_node_gbps;
  h.host_link_gbps = positive(j, "host_link_gbps", where);
  h.host_memory_gbps = j.contains("host_memory_gbps") ? positive(j, "host_memory_gbps", where)
                       : h.kernels == DeviceKind::CPU ? h.memory_bandwidth_gbps
                                                      : 0;
  return h;
}

}  // namespace

double HardwareProfile::peak_flops(DType dtype) const {
  const std::string d(dtype_name(dtype));
  const auto it = peak_tflops.find(d);
  MZ_REQUIRE(
      it != peak_tflops.end(), "--hardware ", name, " has no ", d, " peak (peak_tflops lists ",
      [&] {
        std::string s;
        for (const auto& [k, v] : peak_tflops) s += (s.empty() ? "" : ", ") + k;
        return s;
      }(),
      "): plan with a precision it has, or add peak_tflops.", d, " to the profile");
  return it->second * 1e12;
}

std::vector<std::string> builtin_hardware_profiles() {
  std::vector<std::string> names;
  for (const auto& b : kBuiltinProfiles) names.emplace_back(b.name);
  return names;
}

HardwareProfile load_hardware_profile(const std::string& spec) {
  for (const auto& b : kBuiltinProfiles)
    if (spec == b.name) return parse(b.json, spec);
  if (std::filesystem::is_regular_file(spec)) {
    std::ifstream in(spec);
    std::stringstream ss;
    ss << in.rdbuf();
    MZ_REQUIRE(in.good() || in.eof(), "--hardware ", spec, ": cannot read the file");
    return parse(ss.str(), spec);
  }
  std::string names;
  for (const auto& n : builtin_hardware_profiles()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(detail::concat("--hardware ", spec, ": neither a built-in profile (", names,
                                   ") nor a readable JSON file; copy configs/hardware/dgx2-v100.json and edit it"));
}

}  // namespace megazero::plan
