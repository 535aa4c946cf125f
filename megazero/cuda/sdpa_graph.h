// Causal scaled-dot-product attention as cuDNN operation graphs, held as plain
// data (tensors with dims, strides, types and unique ids; operations naming
// them) before anything touches cuDNN. megazero/cuda/cudnn_sdpa.cpp lowers a
// graph to backend descriptors one for one; tests/test_sdpa_graph.cpp runs the
// same graph through an interpreter of the operations' documented semantics
// and compares it with kernels::fused_attention_* on the CPU, so the math of
// what we hand cuDNN is proven on a machine without a GPU.
//
// The graphs follow the pattern cuDNN's fused flash-attention engines match
// (the shape the cuDNN frontend's composite SDPA node expands to, for
// cuDNN 9.x): forward  O = dropout(softmax(causal(scale * Q K^T))) V  with the
// row statistics Stats = max + log(sum exp) saved for backward; backward
// recomputes P = exp(causal(scale * Q K^T) - Stats) and produces dQ, dK, dV
// (with Problem::bias, scale * Q K^T + Bias in both)
// through a row-sum workspace (SoftmaxSum = rowsum(dO * O) * (1 - p)).
//
// Q, K, V, O, dO, dQ, dK, dV are 4-D [b, h, s, d] (K, V, dK, dV with hk heads)
// with any strides whose last is 1, so the caller may point them into the fused QKV projection's output
// and the output projection's input without head copies. K^T and V^T are the
// same tensors described with their last two dims (and strides) swapped.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace megazero::cuda::sdpa {

using i64 = std::int64_t;
using Strides4 = std::array<i64, 4>;

enum class ElementType { f32, bf16, f16, i32, int64, boolean };
const char* to_string(ElementType t);

// The caller's tensors, by unique id (the variant pack names them so).
enum Uid : i64 {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,   // fp32 [b, h, s, 1]: max + log(sum exp) per row (natural log)
  kSeed = 6,    // int64 [1, 1, 1, 1] in device memory (dropout only)
  kOffset = 7,  // int64 [1, 1, 1, 1] in device memory (dropout only)
  kDO = 8,
  kDQ = 9,
  kDK = 10,
  kDV = 11,
  kSoftmaxSum = 12,  // fp32 [b, h, s, 1] backward workspace
  kDQAccum = 13,     // fp32 [b, h, s, d] backward workspace (not deterministic)
  kBias = 14,        // io-type [b, 1, s, s] contiguous (Problem::bias only)
  kFirstInternal = 100,
};

struct Problem {
  i64 b = 0, h = 0, s = 0, d = 0;
  // Heads of K and V (and dK, dV): h (0 means h), or a divisor of h for
  // grouped-query attention — query head i reads K/V head i / (h / hk), and
  // dK/dV come out summed over each group (the backward's extra reductions).
  i64 hk = 0;
  ElementType io = ElementType::bf16;  // Q, K, V, O, dO, dQ, dK, dV
  double scale = 1.0;                  // applied to Q K^T
  double dropout = 0.0;                // probability of dropping; 0: no RNG in the graph
  // Per-document masks (--reset-attention-mask): an additive bias [b, 1, s, s]
  // (0 where a key is visible, a large finite negative where it is not;
  // cuda::document_mask_bias) added to the scaled scores before the causal
  // mask, in forward and in backward's recomputed scores, as the cuDNN
  // frontend places its bias. No bias gradient.
  bool bias = false;
  // Backward: false (cuDNN's default) accumulates dQ in an fp32 tensor we
  // own (kDQAccum, then cast into dQ), which the engines fill with atomics:
  // the last bits may differ from run to run. true writes dQ directly, the
  // variant cuDNN runs deterministically (on Hopper) at the cost of a
  // [b, h, s, s] 16-bit dP workspace.
  bool deterministic = false;
  // [b, h, s, d] strides of each tensor (elements); the last must be 1.
  Strides4 q{}, k{}, v{}, o{}, d_o{}, dq{}, dk{}, dv{};
};

// Strides of a contiguous [b, h, s, d] tensor.
Strides4 bhsd_strides(i64 b, i64 h, i64 s, i64 d);
// Strides of head `which` of a [b, s, heads, parts, d] row-major buffer viewed
// as [b, heads, s, d] (the QKV projection's rows: part 0 = q, 1 = k, 2 = v).
Strides4 interleaved_strides(i64 s, i64 heads, i64 parts, i64 d);

enum class OpKind { matmul, pointwise, reduction, rng, reshape };
enum class Pointwise { mul, add, sub, div, exp, log, gen_index, cmp_ge, binary_select, identity };
enum class Reduction { max, add };
const char* to_string(OpKind k);
const char* to_string(Pointwise m);

struct GraphTensor {
  i64 uid = 0;
  std::string name;
  std::vector<i64> dims, strides;
  ElementType type = ElementType::f32;
  bool is_virtual = true;
  bool by_value = false;  // a scalar passed in host memory through the variant pack
  double value = 0.0;     // by-value constants (scale, -inf, dropout scales)
};

struct GraphOp {
  OpKind kind = OpKind::pointwise;
  std::string name;
  Pointwise pointwise = Pointwise::mul;
  Reduction reduction = Reduction::add;
  i64 axis = 0;  // gen_index: the dimension whose index is produced
  // pointwise: the precision it computes in (fp32, but a comparison is
  // boolean, as the cuDNN frontend describes its causal mask).
  ElementType compute = ElementType::f32;
  double keep_probability = 1;  // rng: Bernoulli(keep) in {0, 1}
  // matmul: {A, B} -> out (A [.., m, k] x B [.., k, n]); pointwise: {x}, {x, b}
  // or binary_select {x, b, t} (y = t ? x : b); reduction: {x} -> out with 1 in
  // the reduced dims; rng: {seed, offset} -> out; reshape: {x} -> out, the
  // same elements described with other dims/strides.
  std::vector<i64> inputs;
  i64 output = 0;
};

struct Graph {
  std::vector<GraphTensor> tensors;
  std::vector<GraphOp> ops;
  const GraphTensor& tensor(i64 uid) const;
  // The caller's device tensors (non-virtual, not by value; the seed and
  // offset included when there is dropout), in tensor order.
  std::vector<i64> io_uids() const;
};

// ConfigError naming what cuDNN cannot run (dims, head size, dtype, dropout);
// InternalError for a stride layout the caller should never produce.
i64 kv_heads(const Problem& p);  // hk, or h when hk is 0
void validate(const Problem& p);
Graph forward_graph(const Problem& p);
Graph backward_graph(const Problem& p);

}  // namespace megazero::cuda::sdpa
