// A hardware profile: what the time model (time_model.h) needs to know about
// a machine — compute peaks, memory and link bandwidths, latencies — as data.
// Profiles are JSON files (configs/hardware/*.json); the ones shipped there
// are built in by name (dgx2-v100, h100-node, h200-node, this-machine), any other file
// is read from its path (--hardware).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "megazero/core/device.h"
#include "megazero/core/dtype.h"

namespace megazero::plan {

struct LinkProfile {
  double bus_bandwidth_gbps = 0;  // NCCL-style bus bandwidth per device, GB/s (1e9 bytes)
  double latency_us = 0;          // per ring step
};

struct HardwareProfile {
  std::string name, description, source;
  DeviceKind kernels = DeviceKind::CUDA;  // "kernels": "cuda" (default) or "cpu"
  int devices_per_node = 1;
  double memory_gib = 0;                      // device memory per device
  std::map<std::string, double> peak_tflops;  // by dtype name ("fp16", "bf16", "fp32")
  double gemm_efficiency = 1;                 // fraction of the peak that large GEMMs reach
  double kernel_overhead_us = 0;              // fixed cost per GEMM call (launch, tail effects)
  double memory_bandwidth_gbps = 0;           // device memory, for memory-bound kernels
  // Bytes moved by elementwise kernels per byte of activations written (an
  // unfused kernel reads its inputs and writes its output).
  double elementwise_traffic_factor = 3;
  LinkProfile intra_node;      // within a node, per device
  double inter_node_gbps = 0;  // per node, all NICs together
  double inter_node_latency_us = 0;
  // The most one collective's rings get across nodes, whatever the node has
  // (the NICs they can use); default: the node's bandwidth.
  double inter_node_group_gbps = 0;
  double host_link_gbps = 0;  // device <-> host memory, per device (Pa+cpu, ZeRO-Offload's copies)
  // The host's memory bandwidth per device (the node's, shared by its
  // devices' ranks): ZeRO-Offload's AdamW streams the state through it.
  // Optional ("host_memory_gbps"); a CPU profile's device memory is the host's.
  double host_memory_gbps = 0;

  // Peak FLOP/s for GEMMs in `dtype`; ConfigError naming the profile when the
  // device has no such arithmetic.
  double peak_flops(DType dtype) const;
};

// A built-in name or a path to a JSON file; ConfigError naming --hardware and
// the problem (unknown name, unreadable file, missing or invalid field).
HardwareProfile load_hardware_profile(const std::string& name_or_path);
std::vector<std::string> builtin_hardware_profiles();

}  // namespace megazero::plan
