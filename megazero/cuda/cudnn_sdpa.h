// cuDNN's fused attention behind kernels::fused_attention_* for
// --attention-backend cudnn: the operation graphs of megazero/cuda/sdpa_graph.h
// lowered to cuDNN backend descriptors (cudnn_graph.h), an execution plan per
// problem (shape, strides, dtype, dropout, direction, GPU) chosen by cuDNN's
// heuristics and cached, run on the device's compute stream.
//
// Lowering is split so a machine without a GPU checks what it can: every
// tensor and operation descriptor is created and finalized by cuDNN itself
// (finalize_operations; no handle needed), and only the operation graph, the
// heuristics and the plans need a GPU.
//
// Dropout: cuDNN draws its own Bernoulli mask from (seed, offset) and its own
// element order, so it does not reproduce the Philox masks of our kernels
// (kernels/dropout.h). cudnn_dropout_seed() derives the seed from everything
// that keys our masks (run seed, iteration, layer, site, the micro-batch's
// first global sample, the rank's first head), with offset 0: masks are
// independent across layers, iterations, micro-batches and TP ranks, and
// repeat bit for bit on a rerun of the same layout — but a TP-4 run and a TP-1
// run drop different elements. With dropout 0 the backends agree to rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "megazero/cuda/sdpa_graph.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda {

struct CudnnDropoutKey {
  std::int64_t seed = 0, offset = 0;
};
CudnnDropoutKey cudnn_dropout_seed(const RngKey& key, const kernels::DropoutLayout& layout);

// Creates and finalizes every tensor and operation descriptor of `graph`
// (cuDNN validates dims, strides, types and each operation's operands);
// returns how many operations were finalized. Needs libcudnn, not a GPU.
// Throws InternalError naming the descriptor, the attribute and cuDNN's
// message on the first failure.
int finalize_operations(const sdpa::Graph& graph);

// Both run on `stream` (nothing blocks the host). `ws` is the scratch
// gpu_scratch::cudnn_sdpa_scratch lays out; the plan is chosen among the engine
// configurations whose workspace fits it (InternalError listing the sizes if
// none does).
// key_starts (p.bias): int64 [p.b * p.s] on the device, each row's document
// start; the bias is made from them in the scratch (cuda::document_mask_bias)
// before the graph runs.
void cudnn_sdpa_forward(const sdpa::Problem& p, const void* q, const void* k, const void* v, void* o, float* stats,
                        CudnnDropoutKey dropout, kernels::GpuScratch ws, cudaStream_t stream,
                        const std::int64_t* key_starts = nullptr);
void cudnn_sdpa_backward(const sdpa::Problem& p, const void* q, const void* k, const void* v, const void* o,
                         const void* d_o, const float* stats, void* dq, void* dk, void* dv, CudnnDropoutKey dropout,
                         kernels::GpuScratch ws, cudaStream_t stream, const std::int64_t* key_starts = nullptr);

// Builds (and caches) the plan of `p` in one direction on the current GPU
// without running it: what the first call would do, done at start-up so a
// graph cuDNN cannot run is refused before training and the first step is not
// slowed by planning. Returns "engine configuration #i of n, workspace W B".
std::string cudnn_sdpa_prepare(const sdpa::Problem& p, bool backward, cudaStream_t stream);

// "cuDNN <run-time version> at run time, built against <header version>".
std::string cudnn_versions();

// Plans built so far in this process (for tests and the benchmark's report).
std::size_t cudnn_sdpa_cached_plans();

}  // namespace megazero::cuda
