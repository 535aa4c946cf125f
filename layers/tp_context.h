// What every tensor-parallel layer needs: its TP communicator, where to
// allocate activations, and the working dtype. Layers know nothing of ZeRO.
#pragma once

#include <memory>

#include "layers/gpt_config.h"
#include "megazero/comm/communicator.h"

namespace megazero::layers {

struct TpContext {
  Communicator* tp = nullptr;
  std::shared_ptr<Device> device;
  DType dtype = DType::F32;  // parameters and activations (fp32, or fp64 for reference runs)
  // Sequence parallelism (--sequence-parallel; GPTModel sets it for TP > 1):
  // outside the TP-split GEMMs (norms, dropout, the residual stream) each rank
  // holds only its share of the token rows (layers/mappings.h).
  bool sequence_parallel = false;
  // A replicated layer (a norm) that sees only this rank's share of the rows
  // its parameters serve: under sequence parallelism, or --qk-layernorm's
  // per-head norms (each rank normalises its own heads). Its parameter
  // gradients are then partial sums over the TP group (NormGradients).
  bool partial_rows() const { return sequence_parallel || heads_split; }
  bool heads_split = false;  // set for --qk-layernorm's norms (layers/attention.cpp)
  // --gemm-epilogues (GPTConfig::gemm_epilogues): which of the linear layers'
  // bias, GeLU and bias-gradient passes go through kernels/linear_epilogues.h.
  GemmEpilogues gemm_epilogues = GemmEpilogues::None;

  int rank() const { return tp->rank(); }
  int size() const { return tp->size(); }
  // Rows of a [rows, H] tensor of the residual stream on this rank, and the
  // global token row of its first: all of them, or this rank's 1/TP under
  // sequence parallelism.
  std::int64_t local_rows(std::int64_t rows) const { return sequence_parallel ? rows / size() : rows; }
  std::int64_t first_row(std::int64_t rows) const { return sequence_parallel ? rank() * (rows / size()) : 0; }
  Tensor activation(const Shape& shape) const {
    return Tensor::empty(device, shape, dtype, MemoryCategory::Activations);
  }
  // Per-row statistics (LayerNorm mean/rstd, softmax max and sums): fp32 when
  // the activations are 16-bit, as the kernels require.
  Tensor row_stats(const Shape& shape) const {
    const DType t = (dtype == DType::BF16 || dtype == DType::F16) ? DType::F32 : dtype;
    return Tensor::empty(device, shape, t, MemoryCategory::Activations);
  }
};

}  // namespace megazero::layers
