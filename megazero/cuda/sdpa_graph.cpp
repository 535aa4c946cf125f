#include "megazero/cuda/sdpa_graph.h"

#include <limits>

#include "megazero/core/error.h"

namespace megazero::cuda::sdpa {

const char* to_string(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return "fp32";
    case ElementType::bf16:
      return "bf16";
    case ElementType::f16:
      return "fp16";
    case ElementType::i32:
      return "int32";
    case ElementType::int64:
      return "int64";
    case ElementType::boolean:
      return "bool";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::matmul:
      return "matmul";
    case OpKind::pointwise:
      return "pointwise";
    case OpKind::reduction:
      return "reduction";
    case OpKind::rng:
      return "rng";
    case OpKind::reshape:
      return "reshape";
  }
  return "?";
}

const char* to_string(Pointwise m) {
  switch (m) {
    case Pointwise::mul:
      return "mul";
    case Pointwise::add:
      return "add";
    case Pointwise::sub:
      return "sub";
    case Pointwise::div:
      return "div";
    case Pointwise::exp:
      return "exp";
    case Pointwise::log:
      return "log";
    case Pointwise::gen_index:
      return "gen_index";
    case Pointwise::cmp_ge:
      return "cmp_ge";
    case Pointwise::binary_select:
      return "binary_select";
    case Pointwise::identity:
      return "identity";
  }
  return "?";
}

Strides4 bhsd_strides(i64 b, i64 h, i64 s, i64 d) {
  (void)b;
  return {h * s * d, s * d, d, 1};
}

Strides4 interleaved_strides(i64 s, i64 heads, i64 parts, i64 d) {
  return {s * heads * parts * d, parts * d, heads * parts * d, 1};
}

const GraphTensor& Graph::tensor(i64 uid) const {
  for (const GraphTensor& t : tensors)
    if (t.uid == uid) return t;
  MZ_CHECK(false, "SDPA graph has no tensor with uid ", uid);
  return tensors.front();  // unreachable
}

std::vector<i64> Graph::io_uids() const {
  std::vector<i64> out;
  for (const GraphTensor& t : tensors)
    if (!t.is_virtual && !t.by_value) out.push_back(t.uid);
  return out;
}

i64 kv_heads(const Problem& p) { return p.hk > 0 ? p.hk : p.h; }

void validate(const Problem& p) {
  MZ_REQUIRE(p.b > 0 && p.h > 0 && p.s > 0 && p.d > 0, "cuDNN attention: empty problem b=", p.b, " h=", p.h, " s=", p.s,
             " d=", p.d);
  MZ_REQUIRE(p.d % 8 == 0 && p.d <= 128,
             "cuDNN attention needs a head size that is a multiple of 8 and at most 128 "
             "(got ",
             p.d, "); use --attention-backend unfused");
  MZ_REQUIRE(p.io == ElementType::bf16 || p.io == ElementType::f16, "cuDNN attention runs on bf16/fp16 tensors (got ",
             to_string(p.io),
             "); use --bf16 or --fp16, or "
             "--attention-backend unfused");
  MZ_REQUIRE(p.dropout >= 0.0 && p.dropout < 1.0, "attention dropout must be in [0, 1), got ", p.dropout);
  MZ_REQUIRE(p.hk >= 0 && p.h % kv_heads(p) == 0, "cuDNN attention: ", kv_heads(p), " key/value heads do not divide ",
             p.h, " query heads");
  for (const Strides4* st : {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv})
    MZ_CHECK((*st)[3] == 1, "cuDNN attention tensors need unit stride in the head dimension");
}

namespace {

// Builds one graph: tensors get uids in creation order after kFirstInternal.
class Builder {
 public:
  explicit Builder(const Problem& p) : p_(p) {}

  i64 io(i64 uid, const char* name, const Strides4& st, std::vector<i64> dims, ElementType t) {
    GraphTensor g;
    g.uid = uid;
    g.name = name;
    g.dims = std::move(dims);
    g.strides.assign(st.begin(), st.end());
    g.type = t;
    g.is_virtual = false;
    graph_.tensors.push_back(g);
    return uid;
  }
  // A non-virtual tensor described with its last two dims swapped (K^T, V^T):
  // the same memory and uid as far as the variant pack is concerned, so it is
  // added under the caller's uid and must not be added twice.
  i64 transposed_io(i64 uid, const char* name, const Strides4& st) {
    return io(uid, name, {st[0], st[1], st[3], st[2]}, {p_.b, kv_heads(p_), p_.d, p_.s}, p_.io);
  }
  i64 stats_like(i64 uid, const char* name) {
    return io(uid, name, {p_.h * p_.s, p_.s, 1, 1}, {p_.b, p_.h, p_.s, 1}, ElementType::f32);
  }
  i64 scalar(const char* name, double value, ElementType t = ElementType::f32) {
    GraphTensor g;
    g.uid = next_++;
    g.name = name;
    g.dims = {1, 1, 1, 1};
    g.strides = {1, 1, 1, 1};
    g.type = t;
    g.is_virtual = false;
    g.by_value = true;
    g.value = value;
    graph_.tensors.push_back(g);
    return g.uid;
  }
  // The dropout seed and offset: int64 [1, 1, 1, 1] in device memory (as
  // cuDNN's flash-attention samples bind them), written per call.
  i64 rng_state(i64 uid, const char* name) {
    GraphTensor g;
    g.uid = uid;
    g.name = name;
    g.dims = {1, 1, 1, 1};
    g.strides = {1, 1, 1, 1};
    g.type = ElementType::int64;
    g.is_virtual = false;
    graph_.tensors.push_back(g);
    return uid;
  }
  i64 virt(const char* name, std::vector<i64> dims, ElementType t = ElementType::f32) {
    GraphTensor g;
    g.uid = next_++;
    g.name = name;
    g.strides.assign(dims.size(), 1);
    for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) g.strides[i] = g.strides[i + 1] * dims[i + 1];
    g.dims = std::move(dims);
    g.type = t;
    graph_.tensors.push_back(g);
    return g.uid;
  }
  i64 scores(const char* name, ElementType t = ElementType::f32) { return virt(name, {p_.b, p_.h, p_.s, p_.s}, t); }
  // A [b, h, s, s] virtual tensor's transpose: dims as [b, h, keys, queries]
  // over the same row-major storage.
  i64 transposed_scores(const char* name, ElementType t) {
    return virt_strided(name, {p_.b, p_.h, p_.s, p_.s}, {p_.h * p_.s * p_.s, p_.s * p_.s, 1, p_.s}, t);
  }
  i64 virt_strided(const char* name, std::vector<i64> dims, std::vector<i64> strides, ElementType t) {
    const i64 uid = virt(name, std::move(dims), t);
    graph_.tensors.back().strides = std::move(strides);
    return uid;
  }
  i64 rows(const char* name) { return virt(name, {p_.b, p_.h, p_.s, 1}); }

  void matmul(const char* name, i64 a, i64 b, i64 out) { op(OpKind::matmul, name, {a, b}, out); }
  // A product per query head into `out` (dK or dV): with fewer K/V heads,
  // through a per-query-head tensor (I/O type) summed over each group.
  void grouped_matmul(const char* name, i64 a, i64 b, i64 out, const char* full_name, const char* reduce_name) {
    if (kv_heads(p_) == p_.h) return matmul(name, a, b, out);
    const i64 full = virt(full_name, {p_.b, p_.h, p_.s, p_.d}, p_.io);
    matmul(name, a, b, full);
    reduce(reduce_name, Reduction::add, full, out);
  }
  void pw(const char* name, Pointwise m, std::vector<i64> in, i64 out, i64 axis = 0) {
    GraphOp& o = op(OpKind::pointwise, name, std::move(in), out);
    o.pointwise = m;
    o.axis = axis;
    if (m == Pointwise::cmp_ge) o.compute = ElementType::boolean;
  }
  // The softmax scale, one by-value tensor for the scores and (backward) dS,
  // as the frontend's SDPA pattern has it.
  i64 attn_scale() {
    if (attn_scale_ == 0) attn_scale_ = scalar("attn_scale", p_.scale);
    return attn_scale_;
  }
  void reduce(const char* name, Reduction r, i64 x, i64 out) { op(OpKind::reduction, name, {x}, out).reduction = r; }
  void reshape(const char* name, i64 x, i64 out) { op(OpKind::reshape, name, {x}, out); }
  // Bernoulli(keep) mask [b, h, s, s] from the run's seed and offset.
  i64 dropout_mask() {
    const i64 seed = rng_state(kSeed, "seed"), offset = rng_state(kOffset, "offset");
    const i64 mask = scores("dropout_mask");
    op(OpKind::rng, "rng", {seed, offset}, mask).keep_probability = 1.0 - p_.dropout;
    return mask;
  }
  // causal(scale * Q K^T [+ Bias]): the scores with entries above the diagonal at -inf.
  i64 masked_scores() {
    const i64 s = scores("q_kt");
    matmul("matmul_q_kt", kQ, kK, s);
    i64 scaled = scores("scaled_scores");
    pw("mul_scale", Pointwise::mul, {s, attn_scale()}, scaled);
    if (p_.bias) {  // the frontend's bias: after the scale, before the masks
      io(kBias, "Bias", {p_.s * p_.s, p_.s * p_.s, p_.s, 1}, {p_.b, 1, p_.s, p_.s}, p_.io);
      const i64 biased = scores("biased_scores");
      pw("add_bias", Pointwise::add, {scaled, kBias}, biased);
      scaled = biased;
    }
    const i64 row = scores("row_index", ElementType::i32), col = scores("col_index", ElementType::i32);
    pw("gen_row_index", Pointwise::gen_index, {scaled}, row, 2);
    pw("gen_col_index", Pointwise::gen_index, {scaled}, col, 3);
    const i64 keep = scores("causal_keep", ElementType::boolean);
    pw("row_ge_col", Pointwise::cmp_ge, {row, col}, keep);
    const i64 masked = scores("causal_scores");
    pw("causal_select", Pointwise::binary_select,
       {scaled, scalar("negative_inf", -std::numeric_limits<double>::infinity()), keep}, masked);
    return masked;
  }

  Graph take() { return std::move(graph_); }
  const Problem& p() const { return p_; }

 private:
  GraphOp& op(OpKind k, const char* name, std::vector<i64> in, i64 out) {
    GraphOp o;
    o.kind = k;
    o.name = name;
    o.inputs = std::move(in);
    o.output = out;
    graph_.ops.push_back(o);
    return graph_.ops.back();
  }

  const Problem& p_;
  Graph graph_;
  i64 next_ = kFirstInternal;
  i64 attn_scale_ = 0;  // uid once made
};

}  // namespace

Graph forward_graph(const Problem& p) {
  validate(p);
  Builder g(p);
  g.io(kQ, "Q", p.q, {p.b, p.h, p.s, p.d}, p.io);
  g.transposed_io(kK, "K^T", p.k);
  g.io(kV, "V", p.v, {p.b, kv_heads(p), p.s, p.d}, p.io);
  g.io(kO, "O", p.o, {p.b, p.h, p.s, p.d}, p.io);
  g.stats_like(kStats, "Stats");

  const i64 masked = g.masked_scores();
  // Softmax with its statistics: max, exp(x - max), sum, Stats = max + log(sum).
  const i64 max = g.rows("row_max");
  g.reduce("reduce_max", Reduction::max, masked, max);
  const i64 shifted = g.scores("shifted");
  g.pw("sub_max", Pointwise::sub, {masked, max}, shifted);
  const i64 e = g.scores("exp");
  g.pw("exp", Pointwise::exp, {shifted}, e);
  const i64 sum = g.rows("row_sum");
  g.reduce("reduce_sum", Reduction::add, e, sum);
  const i64 log_sum = g.rows("log_sum");
  g.pw("log", Pointwise::log, {sum}, log_sum);
  g.pw("stats", Pointwise::add, {max, log_sum}, kStats);
  // bmm2's A operand carries the I/O type (as the fused engines expect).
  i64 probs = g.scores("probs", p.dropout > 0 ? ElementType::f32 : p.io);
  g.pw("div_sum", Pointwise::div, {e, sum}, probs);
  if (p.dropout > 0) {
    const i64 mask = g.dropout_mask();
    const i64 kept = g.scores("probs_kept");
    g.pw("mul_dropout_mask", Pointwise::mul, {probs, mask}, kept);
    probs = g.scores("probs_dropped", p.io);
    g.pw("mul_dropout_scale", Pointwise::mul, {kept, g.scalar("dropout_scale", 1.0 / (1.0 - p.dropout))}, probs);
  }
  g.matmul("matmul_p_v", probs, kV, kO);
  return g.take();
}

Graph backward_graph(const Problem& p) {
  validate(p);
  Builder g(p);
  g.io(kQ, "Q", p.q, {p.b, p.h, p.s, p.d}, p.io);
  g.transposed_io(kK, "K^T", p.k);
  g.transposed_io(kV, "V^T", p.v);
  g.io(kO, "O", p.o, {p.b, p.h, p.s, p.d}, p.io);
  g.io(kDO, "dO", p.d_o, {p.b, p.h, p.s, p.d}, p.io);
  g.stats_like(kStats, "Stats");
  g.io(kDQ, "dQ", p.dq, {p.b, p.h, p.s, p.d}, p.io);
  const i64 hk = kv_heads(p);
  g.io(kDK, "dK", p.dk, {p.b, hk, p.s, p.d}, p.io);
  g.io(kDV, "dV", p.dv, {p.b, hk, p.s, p.d}, p.io);
  g.stats_like(kSoftmaxSum, "SoftmaxSum");

  // SoftmaxSum = rowsum(dO * O) * (1 - p): the softmax backward's row term,
  // in the units of the dropped dP (see the derivation in docs/ARCHITECTURE.md).
  const i64 do_o = g.virt("dO_times_O", {p.b, p.h, p.s, p.d});
  g.pw("mul_dO_O", Pointwise::mul, {kDO, kO}, do_o);
  const i64 row_dot = g.rows("rowsum_dO_O");
  g.reduce("reduce_dO_O", Reduction::add, do_o, row_dot);
  g.pw("mul_keep", Pointwise::mul, {row_dot, g.scalar("keep_probability", 1.0 - p.dropout)}, kSoftmaxSum);

  // P recomputed from Stats (undropped), then dropped for dV.
  const i64 masked = g.masked_scores();
  const i64 shifted = g.scores("shifted");
  g.pw("sub_stats", Pointwise::sub, {masked, kStats}, shifted);
  const i64 probs = g.scores("probs");
  g.pw("exp", Pointwise::exp, {shifted}, probs);
  i64 mask = 0, dropped = probs;
  const i64 dropout_scale = p.dropout > 0 ? g.scalar("dropout_scale", 1.0 / (1.0 - p.dropout)) : 0;
  if (p.dropout > 0) {
    mask = g.dropout_mask();
    const i64 kept = g.scores("probs_kept");
    g.pw("mul_dropout_mask", Pointwise::mul, {probs, mask}, kept);
    dropped = g.scores("probs_dropped");
    g.pw("mul_dropout_scale", Pointwise::mul, {kept, dropout_scale}, dropped);
  }
  const i64 probs_t = g.transposed_scores("probs_t", p.io);  // P^T: the same elements, rows and columns swapped
  g.reshape("reshape_probs_t", dropped, probs_t);
  g.grouped_matmul("matmul_pt_dO", probs_t, kDO, kDV, "dV_per_query_head", "reduce_dV_groups");

  // dS = scale * P * (dP * mask / (1 - p) - rowsum(dO * O)), with dP = dO V^T.
  const i64 dp = g.scores("dP");
  g.matmul("matmul_dO_vt", kDO, kV, dp);
  i64 dp_kept = dp;
  if (p.dropout > 0) {
    dp_kept = g.scores("dP_kept");
    g.pw("mul_dP_mask", Pointwise::mul, {dp, mask}, dp_kept);
  }
  const i64 centred = g.scores("dP_minus_rowsum");
  g.pw("sub_softmax_sum", Pointwise::sub, {dp_kept, kSoftmaxSum}, centred);
  i64 ds = g.scores("dS_unscaled");
  g.pw("mul_probs", Pointwise::mul, {centred, probs}, ds);
  if (p.dropout > 0) {
    const i64 next = g.scores("dS_dropout_scaled");
    g.pw("mul_dS_dropout_scale", Pointwise::mul, {ds, dropout_scale}, next);
    ds = next;
  }
  const i64 ds_scaled = g.scores("dS");
  g.pw("mul_dS_scale", Pointwise::mul, {ds, g.attn_scale()}, ds_scaled);

  const i64 ds_t = g.transposed_scores("dS_t", p.io);
  g.reshape("reshape_dS_t", ds_scaled, ds_t);
  g.grouped_matmul("matmul_dSt_q", ds_t, kQ, kDK, "dK_per_query_head", "reduce_dK_groups");
  const i64 k_plain = g.virt_strided("K", {p.b, hk, p.s, p.d}, {p.k[0], p.k[1], p.k[2], p.k[3]}, p.io);
  g.reshape("reshape_k", kK, k_plain);
  if (p.deterministic) {
    g.matmul("matmul_dS_k", ds_scaled, k_plain, kDQ);
  } else {  // through the fp32 accumulator, as cuDNN's default backward
    g.io(kDQAccum, "dQ_accum", bhsd_strides(p.b, p.h, p.s, p.d), {p.b, p.h, p.s, p.d}, ElementType::f32);
    g.matmul("matmul_dS_k", ds_scaled, k_plain, kDQAccum);
    g.pw("cast_dQ", Pointwise::identity, {kDQAccum}, kDQ);
  }
  return g.take();
}

}  // namespace megazero::cuda::sdpa
