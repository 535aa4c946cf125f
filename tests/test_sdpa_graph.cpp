// The math of the cuDNN attention graphs (megazero/cuda/sdpa_graph.h), proven
// without a GPU: a small interpreter runs a Graph on the CPU in double
// following the documented semantics of each cuDNN operation (matmul,
// pointwise, reduction, rng, reshape over strided tensors), and its outputs are
// compared with kernels::fused_attention_* in fp64:
//  - forward O and Stats, backward dQ, dK, dV and the SoftmaxSum workspace,
//    with Q/K/V contiguous or interleaved in one QKV-projection buffer;
//  - with dropout, the rng op fed the keep mask our Philox dropout draws for
//    the same key and layout, so the graphs must place and scale it as we do;
//  - a corrupted graph is caught (the comparison is not vacuous), bad problems
//    are rejected, and every graph is well formed (uids, order, caller tensors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/cuda/sdpa_graph.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/fused_attention.h"

using namespace megazero;
namespace sd = megazero::cuda::sdpa;
using Vec = std::vector<double>;
using Index = std::vector<std::int64_t>;
using i64 = std::int64_t;

namespace {

// Calls fn(c) for every coordinate c of dims, the last dimension fastest.
template <typename Fn>
void for_each_index(const Index& dims, Fn&& fn) {
  for (i64 n : dims)
    if (n == 0) return;
  Index c(dims.size(), 0);
  for (;;) {
    fn(c);
    int i = static_cast<int>(dims.size()) - 1;
    for (; i >= 0; --i) {
      if (++c[i] < dims[i]) break;
      c[i] = 0;
    }
    if (i < 0) return;
  }
}

// Runs a Graph's ops in the listed order. Every tensor is a strided array over
// some storage: caller tensors over the buffers bound to their uids, virtual
// tensors over a buffer of their own laid out by their own strides, and a
// reshape's output over its input's storage (the same memory, another view).
class Interpreter {
 public:
  // The rng op's Bernoulli draw at an output coordinate (the test's mask).
  using Mask = std::function<double(const Index&)>;

  Interpreter(const sd::Graph& graph, Mask mask) : graph_(graph), mask_(std::move(mask)) {
    for (const sd::GraphTensor& t : graph_.tensors) tensors_[t.uid] = &t;
  }
  void bind(i64 uid, std::shared_ptr<Vec> data, i64 offset) { storage_[uid] = {std::move(data), offset}; }
  void run() {
    for (const sd::GraphOp& op : graph_.ops) execute(op);
  }

 private:
  struct Storage {
    std::shared_ptr<Vec> data;
    i64 offset = 0;
  };

  const sd::GraphTensor& t(i64 uid) const {
    const auto it = tensors_.find(uid);
    if (it == tensors_.end()) throw std::logic_error("no tensor with uid " + std::to_string(uid));
    return *it->second;
  }
  // The element of `uid` at coordinate c, broadcasting its size-1 dims.
  double& cell(i64 uid, const Index& c) {
    const sd::GraphTensor& x = t(uid);
    const auto it = storage_.find(uid);
    if (it == storage_.end()) throw std::logic_error(x.name + " read before it was written or bound");
    if (c.size() != x.dims.size()) throw std::logic_error(x.name + ": rank mismatch");
    i64 at = it->second.offset;
    for (std::size_t i = 0; i < c.size(); ++i) at += (x.dims[i] == 1 ? 0 : c[i]) * x.strides[i];
    return it->second.data->at(static_cast<std::size_t>(at));
  }
  double read(i64 uid, const Index& c) {
    const sd::GraphTensor& x = t(uid);
    if (!x.by_value) return cell(uid, c);
    if (uid == sd::kSeed || uid == sd::kOffset) throw std::logic_error("seed/offset read outside the rng op");
    return x.value;
  }
  // Each of x's dims (but the last `skip`) must be 1, y's, or a divisor of
  // y's: grouped broadcast, coordinate i of y reads i / (y's / x's) of x
  // (grouped-query attention's K/V heads).
  void check_broadcast(i64 x_uid, const sd::GraphTensor& y, std::size_t skip = 0) const {
    const sd::GraphTensor& x = t(x_uid);
    if (x.dims.size() != y.dims.size()) throw std::logic_error(x.name + " vs " + y.name + ": rank mismatch");
    for (std::size_t i = 0; i + skip < y.dims.size(); ++i)
      if (y.dims[i] % x.dims[i] != 0) throw std::logic_error(x.name + " does not broadcast to " + y.name);
  }
  // y's coordinate c as x's coordinate (dims but the last `skip`).
  static Index fit(const sd::GraphTensor& x, Index c, const std::vector<i64>& y_dims, std::size_t skip) {
    for (std::size_t i = 0; i + skip < c.size(); ++i) c[i] /= y_dims[i] / x.dims[i];
    return c;
  }
  // The op's output, written by this op only: caller tensors must be bound,
  // virtual ones get storage of their own (sized by their strides).
  const sd::GraphTensor& output(const sd::GraphOp& op) {
    const sd::GraphTensor& y = t(op.output);
    if (y.by_value || !written_.insert(y.uid).second) throw std::logic_error(y.name + " written twice or by value");
    if (!y.is_virtual && !storage_.count(y.uid)) throw std::logic_error(y.name + " is not bound");
    if (y.is_virtual && op.kind != sd::OpKind::reshape) {
      i64 size = 1;
      for (std::size_t i = 0; i < y.dims.size(); ++i) size += (y.dims[i] - 1) * y.strides[i];
      storage_[y.uid] = {std::make_shared<Vec>(static_cast<std::size_t>(size), 0.0), 0};
    }
    return y;
  }

  void execute(const sd::GraphOp& op) {
    const sd::GraphTensor& y = output(op);
    const std::vector<i64>& in = op.inputs;
    switch (op.kind) {
      case sd::OpKind::matmul: {  // [.., m, k] x [.., k, n] -> [.., m, n], batch dims broadcast
        const std::size_t r = y.dims.size();
        const i64 k = t(in[0]).dims[r - 1];
        check_broadcast(in[0], y, 2);
        check_broadcast(in[1], y, 2);
        if (t(in[0]).dims[r - 2] != y.dims[r - 2] || t(in[1]).dims[r - 2] != k || t(in[1]).dims[r - 1] != y.dims[r - 1])
          throw std::logic_error(op.name + ": matmul shapes do not agree");
        for_each_index(y.dims, [&](const Index& c) {
          Index ca = fit(t(in[0]), c, y.dims, 2), cb = fit(t(in[1]), c, y.dims, 2);
          double acc = 0;
          for (i64 kk = 0; kk < k; ++kk) {
            ca[r - 1] = cb[r - 2] = kk;
            acc += read(in[0], ca) * read(in[1], cb);
          }
          cell(y.uid, c) = acc;
        });
        break;
      }
      case sd::OpKind::pointwise:
        for (i64 x : in) check_broadcast(x, y);
        for_each_index(y.dims, [&](const Index& c) { cell(y.uid, c) = pointwise(op, c); });
        break;
      case sd::OpKind::reduction: {  // over the dims where y has 1 (or a divisor: groups of x's) and x does not
        const bool is_max = op.reduction == sd::Reduction::max;
        check_broadcast(op.output, t(in[0]));
        for_each_index(y.dims, [&](const Index& c) { cell(y.uid, c) = is_max ? -INFINITY : 0.0; });
        for_each_index(t(in[0]).dims, [&](const Index& c) {
          const Index cy = fit(y, c, t(in[0]).dims, 0);
          double& acc = cell(y.uid, cy);
          acc = is_max ? std::max(acc, read(in[0], c)) : acc + read(in[0], c);
        });
        break;
      }
      case sd::OpKind::rng:
        if (in != std::vector<i64>{sd::kSeed, sd::kOffset}) throw std::logic_error("rng takes {seed, offset}");
        for_each_index(y.dims, [&](const Index& c) { cell(y.uid, c) = mask_(c); });
        break;
      case sd::OpKind::reshape: {  // the same memory seen through y's dims and strides
        const sd::GraphTensor& x = t(in[0]);
        i64 nx = 1, ny = 1;
        for (i64 n : x.dims) nx *= n;
        for (i64 n : y.dims) ny *= n;
        if (nx != ny || !storage_.count(x.uid)) throw std::logic_error(op.name + ": bad reshape");
        storage_[y.uid] = storage_[x.uid];
        break;
      }
    }
  }

  double pointwise(const sd::GraphOp& op, const Index& c) {
    const auto arg = [&](std::size_t i) { return read(op.inputs.at(i), c); };
    switch (op.pointwise) {
      case sd::Pointwise::mul:
        return arg(0) * arg(1);
      case sd::Pointwise::add:
        return arg(0) + arg(1);
      case sd::Pointwise::sub:
        return arg(0) - arg(1);
      case sd::Pointwise::div:
        return arg(0) / arg(1);
      case sd::Pointwise::exp:
        return std::exp(arg(0));
      case sd::Pointwise::log:
        return std::log(arg(0));
      case sd::Pointwise::gen_index:
        return static_cast<double>(c.at(static_cast<std::size_t>(op.axis)));
      case sd::Pointwise::cmp_ge:
        return arg(0) >= arg(1) ? 1.0 : 0.0;
      case sd::Pointwise::binary_select:
        return arg(2) != 0 ? arg(0) : arg(1);
      case sd::Pointwise::identity:
        return arg(0);
    }
    throw std::logic_error("unknown pointwise mode");
  }

  const sd::Graph& graph_;
  Mask mask_;
  std::map<i64, const sd::GraphTensor*> tensors_;
  std::map<i64, Storage> storage_;
  std::set<i64> written_;
};

struct Case {
  i64 b, h, s, d;
  // Q/K/V (and dQ/dK/dV) in one QKV-projection buffer, O and dO as [b, s, h, d]
  // rows. With groups that buffer is Megatron's [b, s, hk, h/hk + 2, d] and Q
  // (dQ) is a contiguous copy, as the layer makes it.
  bool interleaved;
  i64 hk = 0;  // K/V heads: 0 = h; fewer = grouped-query attention
  i64 kv() const { return hk > 0 ? hk : h; }
};
const Case kCases[] = {{2, 3, 5, 8, false},    {2, 3, 5, 8, true},    {1, 2, 17, 16, false},  {1, 2, 17, 16, true},
                       {2, 4, 5, 8, false, 2}, {2, 4, 5, 8, true, 2}, {1, 3, 17, 16, true, 1}};
constexpr double kScale = 0.35;
const RngKey kKey{7, 3, 1, kRngAttentionDropout};

// The caller's buffers for one case, each caller tensor a strided view of one.
struct Io {
  struct View {
    std::shared_ptr<Vec> data;
    i64 offset;  // of element 0
    sd::Strides4 strides;
  };
  sd::Problem problem;
  std::map<i64, View> views;  // by uid

  Io(const Case& c, double p) {
    // bf16 is what validate() asks for; the interpreter computes in double anyway.
    problem = {
        .b = c.b, .h = c.h, .s = c.s, .d = c.d, .hk = c.hk, .io = sd::ElementType::bf16, .scale = kScale, .dropout = p};
    const i64 n = c.b * c.h * c.s * c.d, g = c.kv(), per = c.h / g, nkv = c.b * g * c.s * c.d;
    const auto buffer = [](i64 size) { return std::make_shared<Vec>(static_cast<std::size_t>(size), 0.0); };
    const sd::Strides4 bhsd = sd::bhsd_strides(c.b, c.h, c.s, c.d), kv_bhsd = sd::bhsd_strides(c.b, g, c.s, c.d);
    // Part j of group k in [b, s, g, per + 2, d] rows (MHA: per = 1, the [b, s, h, 3, d] rows).
    const sd::Strides4 parts = sd::interleaved_strides(c.s, g, per + 2, c.d),
                       rows = sd::interleaved_strides(c.s, c.h, 1, c.d);
    const auto qkv = buffer(c.b * c.s * g * (per + 2) * c.d), dqkv = buffer(c.b * c.s * g * (per + 2) * c.d);
    for (i64 part = 1; part < 3; ++part) {  // K, V and dK, dV
      views[sd::kQ + part] = c.interleaved ? View{qkv, (per - 1 + part) * c.d, parts} : View{buffer(nkv), 0, kv_bhsd};
      views[sd::kDQ + part] = c.interleaved ? View{dqkv, (per - 1 + part) * c.d, parts} : View{buffer(nkv), 0, kv_bhsd};
    }
    const bool q_in_rows = c.interleaved && per == 1;
    views[sd::kQ] = q_in_rows ? View{qkv, 0, parts} : View{buffer(n), 0, bhsd};
    views[sd::kDQ] = q_in_rows ? View{dqkv, 0, parts} : View{buffer(n), 0, bhsd};
    for (i64 uid : {sd::kO, sd::kDO}) views[uid] = {buffer(n), 0, c.interleaved ? rows : bhsd};
    for (i64 uid : {sd::kStats, sd::kSoftmaxSum}) views[uid] = {buffer(c.b * c.h * c.s), 0, {c.h * c.s, c.s, 1, 0}};
    views[sd::kBias] = {buffer(c.b * c.s * c.s), 0, {c.s * c.s, c.s * c.s, c.s, 1}};  // read only with problem.bias
    views[sd::kDQAccum] = {buffer(n), 0, bhsd};  // the default backward's fp32 dQ accumulator
    sd::Problem& q = problem;
    q.q = views[sd::kQ].strides, q.k = views[sd::kK].strides, q.v = views[sd::kV].strides;
    q.dq = views[sd::kDQ].strides, q.dk = views[sd::kDK].strides, q.dv = views[sd::kDV].strides;
    q.o = views[sd::kO].strides, q.d_o = views[sd::kDO].strides;
  }

  // fn(element) for every element of a caller tensor in [BH, S, D] order ([BH, S] for Stats, SoftmaxSum).
  template <typename Fn>
  void for_each(i64 uid, Fn&& fn) {
    View& t = views.at(uid);
    const i64 d = uid == sd::kStats || uid == sd::kSoftmaxSum ? 1 : problem.d;
    const bool kv = uid == sd::kK || uid == sd::kV || uid == sd::kDK || uid == sd::kDV;
    for_each_index({problem.b, kv ? sd::kv_heads(problem) : problem.h, problem.s, d}, [&](const Index& c) {
      fn(t.data->at(static_cast<std::size_t>(t.offset + c[0] * t.strides[0] + c[1] * t.strides[1] +
                                             c[2] * t.strides[2] + c[3] * t.strides[3])));
    });
  }
  void scatter(i64 uid, const Vec& values) {
    std::size_t e = 0;
    for_each(uid, [&](double& x) { x = values.at(e++); });
  }
  Vec gather(i64 uid) {
    Vec out;
    for_each(uid, [&](double& x) { out.push_back(x); });
    return out;
  }
  void run(const sd::Graph& graph, const Vec& mask) {
    const i64 s = problem.s, h = problem.h;
    Interpreter interpreter(graph, [&mask, s, h](const Index& c) {
      return mask.at(static_cast<std::size_t>(((c[0] * h + c[1]) * s + c[2]) * s + c[3]));
    });
    for (i64 uid : graph.io_uids())  // the seed and offset feed only the rng op, here the mask above
      if (uid != sd::kSeed && uid != sd::kOffset) interpreter.bind(uid, views.at(uid).data, views.at(uid).offset);
    interpreter.run();
  }
};

struct Inputs {
  Vec q, k, v, dout;
};
Inputs make_inputs(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto randn = [&](i64 heads) {
    Vec v(static_cast<std::size_t>(c.b * heads * c.s * c.d));
    for (double& x : v) x = normal(rng);
    return v;
  };
  Inputs in;
  in.q = randn(c.h);
  in.k = randn(c.kv());
  in.v = randn(c.kv());
  in.dout = randn(c.h);
  return in;
}

struct Result {
  Vec o, stats, dq, dk, dv, softmax_sum;
};
using Edit = std::function<void(sd::Graph&)>;

// The graphs through the interpreter: forward, then backward reading the O and
// Stats the forward wrote into the same buffers. `edit` may corrupt a graph.
// bias (per-document masks), when not empty: the [b, 1, s, s] additive bias.
Result run_graphs(const Case& c, const Inputs& in, double p, const Vec& mask, const Edit& edit_fwd = {},
                  const Edit& edit_bwd = {}, bool deterministic = false, const Vec& bias = {}) {
  Io io(c, p);
  io.problem.deterministic = deterministic;
  io.problem.bias = !bias.empty();
  if (!bias.empty()) *io.views.at(sd::kBias).data = bias;
  io.scatter(sd::kQ, in.q);
  io.scatter(sd::kK, in.k);
  io.scatter(sd::kV, in.v);
  io.scatter(sd::kDO, in.dout);
  sd::Graph fwd = sd::forward_graph(io.problem), bwd = sd::backward_graph(io.problem);
  if (edit_fwd) edit_fwd(fwd);
  if (edit_bwd) edit_bwd(bwd);
  io.run(fwd, mask);
  io.run(bwd, mask);
  return {io.gather(sd::kO),  io.gather(sd::kStats), io.gather(sd::kDQ),
          io.gather(sd::kDK), io.gather(sd::kDV),    io.gather(sd::kSoftmaxSum)};
}

kernels::DropoutLayout layout(const Case& c) {  // as layers/attention.cpp's probs_layout() on one rank
  kernels::DropoutLayout l;
  l.samples = c.b;
  l.groups = l.global_groups = c.h;
  l.matrix_rows = l.matrix_cols = c.s;
  return l;
}

const std::shared_ptr<Device>& cpu() {
  static const auto device = make_device(DeviceKind::CPU);
  return device;
}
Tensor tensor(const Shape& shape, const Vec& values) {
  Tensor out = Tensor::empty(cpu(), shape, DType::F64, MemoryCategory::Other);
  out.copy_from_doubles(values);
  return out;
}

// Our keep mask for (kKey, layout) as 0/1 over [b, h, s, s]: dropout of ones.
Vec keep_mask(const Case& c, double p) {
  const Shape shape{c.b * c.h, c.s, c.s};
  Tensor ones = tensor(shape, Vec(static_cast<std::size_t>(c.b * c.h * c.s * c.s), 1.0));
  Tensor dropped = Tensor::empty(cpu(), shape, DType::F64, MemoryCategory::Other);
  kernels::dropout_forward(ones, p, kKey, layout(c), dropped);
  Vec mask = dropped.to_double_vector();
  for (double& m : mask) m = std::round(m * (1.0 - p));
  return mask;
}

// Per-query-head [b, h, s, d] gradients summed over each group of h / hk
// heads -> [b, hk, s, d] (what cuDNN's dK, dV are).
Vec sum_groups(const Case& c, const Vec& per_head) {
  const i64 g = c.kv(), per = c.h / g, block = c.s * c.d;
  Vec out(static_cast<std::size_t>(c.b * g * block), 0.0);
  for (i64 bh = 0; bh < c.b * c.h; ++bh)
    for (i64 e = 0; e < block; ++e)
      out[static_cast<std::size_t>((bh / per) * block + e)] += per_head[static_cast<std::size_t>(bh * block + e)];
  return out;
}

// kernels::fused_attention_* in fp64 on [BH, S, D] tensors (k, v grouped);
// starts: per-document masks' key starts [b * s], or none.
Result run_reference(const Case& c, const Inputs& in, double p, const std::vector<std::int64_t>& starts = {}) {
  const Shape shape{c.b * c.h, c.s, c.d}, kv_shape{c.b * c.kv(), c.s, c.d};
  const Tensor q = tensor(shape, in.q), k = tensor(kv_shape, in.k), v = tensor(kv_shape, in.v);
  const auto empty = [](const Shape& s) { return Tensor::empty(cpu(), s, DType::F64, MemoryCategory::Other); };
  Tensor out = empty(shape), lse = empty({c.b * c.h, c.s}), dq = empty(shape), dk = empty(shape), dv = empty(shape);
  Tensor key_starts;
  if (!starts.empty()) {
    key_starts = Tensor::empty(cpu(), {c.b * c.s}, DType::I64, MemoryCategory::Other);
    std::copy(starts.begin(), starts.end(), key_starts.host_data<std::int64_t>());
  }
  kernels::fused_attention_forward(q, k, v, kScale, p, kKey, layout(c), out, lse, key_starts);
  kernels::fused_attention_backward(q, k, v, out, tensor(shape, in.dout), lse, kScale, p, kKey, layout(c), dq, dk, dv,
                                    key_starts);
  return {out.to_double_vector(),
          lse.to_double_vector(),
          dq.to_double_vector(),
          sum_groups(c, dk.to_double_vector()),
          sum_groups(c, dv.to_double_vector()),
          {}};
}

double max_diff(const Vec& got, const Vec& want) {
  double m = got.size() == want.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    m = std::max(m, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
  return m;
}

// Forward and backward against the fused kernels for every case, with dropout p.
void expect_graphs_match(double p, double fwd_tol, double bwd_tol) {
  unsigned seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << "b=" << c.b << " h=" << c.h << " hk=" << c.kv() << " s=" << c.s << " d=" << c.d
                                    << " p=" << p << (c.interleaved ? " interleaved" : " contiguous"));
    const Inputs in = make_inputs(c, seed++);
    const Vec mask = p > 0 ? keep_mask(c, p) : Vec{};
    const Result want = run_reference(c, in, p);
    // The deterministic backward (dQ written directly) on every other case.
    const bool deterministic = seed % 2 == 0;
    SCOPED_TRACE(deterministic ? "deterministic backward" : "dQ through the fp32 accumulator");
    const Result got = run_graphs(c, in, p, mask, {}, {}, deterministic);
    EXPECT_LT(max_diff(got.o, want.o), fwd_tol) << "O";
    EXPECT_LT(max_diff(got.stats, want.stats), fwd_tol) << "Stats";
    EXPECT_LT(max_diff(got.dq, want.dq), bwd_tol) << "dQ";
    EXPECT_LT(max_diff(got.dk, want.dk), bwd_tol) << "dK";
    EXPECT_LT(max_diff(got.dv, want.dv), bwd_tol) << "dV";
    // rowsum(dO * O) * (1 - p): the workspace is in the units of the dropped dP.
    Vec softmax_sum(got.stats.size(), 0.0);
    for (std::size_t e = 0; e < got.o.size(); ++e) softmax_sum[e / c.d] += in.dout[e] * got.o[e] * (1.0 - p);
    EXPECT_LT(max_diff(got.softmax_sum, softmax_sum), bwd_tol) << "SoftmaxSum";
  }
}

// Per-document masks (--reset-attention-mask) as the frontend's additive bias
// [b, 1, s, s] after the scale: 0 from each row's document start on, the
// launcher's large negative before it. The graphs equal the fused kernels
// given the starts, with and without dropout, MHA and grouped, in place and
// copied; a graph that ignored the bias would not (checked).
TEST(SdpaGraph, DocumentMasksAsABiasMatchFusedAttention) {
  unsigned seed = 40;
  for (const Case& c : {Case{2, 3, 17, 16, true}, Case{2, 4, 17, 8, false, 2}})
    for (const double p : {0.0, 0.2}) {
      SCOPED_TRACE(testing::Message() << "b=" << c.b << " h=" << c.h << " hk=" << c.kv() << " p=" << p);
      std::vector<std::int64_t> starts;
      Vec bias;
      for (i64 b = 0; b < c.b; ++b)
        for (i64 i = 0, start = 0; i < c.s; ++i) {
          if (i == 5 + b || i == 6 + b || i == 12) start = i;  // documents [0, 5+b), one token, up to 12, the rest
          starts.push_back(start);
          for (i64 j = 0; j < c.s; ++j) bias.push_back(j >= start ? 0.0 : -1e9);
        }
      const Inputs in = make_inputs(c, seed++);
      const Vec mask = p > 0 ? keep_mask(c, p) : Vec{};
      const Result want = run_reference(c, in, p, starts);
      const Result got = run_graphs(c, in, p, mask, {}, {}, false, bias);
      EXPECT_LT(max_diff(got.o, want.o), 1e-12) << "O";
      EXPECT_LT(max_diff(got.stats, want.stats), 1e-12) << "Stats";
      EXPECT_LT(max_diff(got.dq, want.dq), 1e-10) << "dQ";
      EXPECT_LT(max_diff(got.dk, want.dk), 1e-10) << "dK";
      EXPECT_LT(max_diff(got.dv, want.dv), 1e-10) << "dV";
      const Result ignored = run_graphs(c, in, p, mask);
      EXPECT_GT(max_diff(ignored.o, want.o), 1e-3) << "the masks must change O";
    }
}

// The graph's op or tensor of this name.
template <typename T>
T& named(std::vector<T>& items, const std::string& item_name) {
  for (T& item : items)
    if (item.name == item_name) return item;
  throw std::logic_error("no op or tensor named " + item_name);
}

TEST(SdpaGraph, MatchesFusedAttentionWithoutDropout) { expect_graphs_match(0.0, 1e-12, 1e-10); }

TEST(SdpaGraph, MatchesFusedAttentionWithDropout) {
  // The rng op draws Bernoulli(1 - p) and the mask is not all ones or all zeros.
  const Case c = kCases[2];
  for (sd::Graph g : {sd::forward_graph(Io(c, 0.2).problem), sd::backward_graph(Io(c, 0.2).problem)})
    EXPECT_DOUBLE_EQ(named(g.ops, "rng").keep_probability, 0.8);
  double kept = 0;
  for (double m : keep_mask(c, 0.2)) kept += m;
  const auto total = static_cast<double>(c.b * c.h * c.s * c.s);
  EXPECT_GT(kept, 0.6 * total);
  EXPECT_LT(kept, 0.95 * total);
  expect_graphs_match(0.2, 1e-10, 1e-10);
}

// The same comparisons fail on a graph with one thing wrong.
TEST(SdpaGraph, CorruptedGraphsAreCaught) {
  const Case c = kCases[2];
  const Inputs in = make_inputs(c, 99);
  const Vec mask = keep_mask(c, 0.2);
  const Result want = run_reference(c, in, 0.2);
  // Anti-causal: keep col >= row instead of row >= col.
  const Result swapped = run_graphs(c, in, 0.2, mask, [](sd::Graph& g) {
    std::vector<i64>& x = named(g.ops, "row_ge_col").inputs;
    std::swap(x[0], x[1]);
  });
  EXPECT_GT(max_diff(swapped.o, want.o), 1e-3);
  // The backward graph's SoftmaxSum without its (1 - p): dQ and dK go wrong, dV does not.
  const Result unscaled =
      run_graphs(c, in, 0.2, mask, {}, [](sd::Graph& g) { named(g.tensors, "keep_probability").value = 1.0; });
  EXPECT_LT(max_diff(unscaled.o, want.o), 1e-10);
  EXPECT_LT(max_diff(unscaled.dv, want.dv), 1e-10);
  EXPECT_GT(max_diff(unscaled.dq, want.dq), 1e-3);
  EXPECT_GT(max_diff(unscaled.dk, want.dk), 1e-3);
  // dK from dS instead of dS^T: dropping the backward's transposing reshape.
  const Result untransposed = run_graphs(c, in, 0.2, mask, {}, [](sd::Graph& g) {
    const i64 ds = named(g.ops, "reshape_dS_t").inputs[0];
    named(g.ops, "matmul_dSt_q").inputs[0] = ds;
  });
  EXPECT_GT(max_diff(untransposed.dk, want.dk), 1e-3);
}

TEST(SdpaGraph, RejectsProblemsCudnnCannotRun) {
  sd::Problem p = Io(kCases[0], 0.0).problem;
  EXPECT_NO_THROW(sd::forward_graph(p));
  p.io = sd::ElementType::f32;
  EXPECT_THROW(sd::forward_graph(p), ConfigError);
  EXPECT_THROW(sd::backward_graph(p), ConfigError);
  p = Io({2, 3, 5, 12, false}, 0.0).problem;
  EXPECT_THROW(sd::forward_graph(p), ConfigError);
  EXPECT_THROW(sd::backward_graph(p), ConfigError);
}

// Every op names existing tensors; every virtual tensor is written by exactly
// one op before any op reads it; the caller's tensors are the expected ones.
void expect_well_formed(const sd::Graph& g, const std::set<i64>& io) {
  std::map<i64, const sd::GraphTensor*> by_uid;
  for (const sd::GraphTensor& t : g.tensors) {
    EXPECT_TRUE(by_uid.emplace(t.uid, &t).second) << "uid " << t.uid << " added twice";
    EXPECT_EQ(t.dims.size(), t.strides.size()) << t.name;
  }
  std::set<i64> written;
  for (const sd::GraphOp& op : g.ops) {
    for (i64 uid : op.inputs) {
      ASSERT_TRUE(by_uid.count(uid)) << op.name << " reads unknown uid " << uid;
      if (by_uid[uid]->is_virtual) {
        EXPECT_TRUE(written.count(uid)) << op.name << " reads " << by_uid[uid]->name << " before it is written";
      }
    }
    ASSERT_TRUE(by_uid.count(op.output)) << op.name << " writes unknown uid " << op.output;
    EXPECT_FALSE(by_uid[op.output]->by_value) << op.name;
    EXPECT_TRUE(written.insert(op.output).second) << by_uid[op.output]->name << " written twice";
  }
  for (const sd::GraphTensor& t : g.tensors)
    if (t.is_virtual) {
      EXPECT_TRUE(written.count(t.uid)) << t.name << " is never written";
    }
  const std::vector<i64> uids = g.io_uids();
  EXPECT_EQ(std::set<i64>(uids.begin(), uids.end()), io);
  EXPECT_EQ(uids.size(), io.size());
}

TEST(SdpaGraph, GraphsAreWellFormed) {
  for (double p : {0.0, 0.2}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    const sd::Problem problem = Io(kCases[1], p).problem;
    std::set<i64> fwd{sd::kQ, sd::kK, sd::kV, sd::kO, sd::kStats};
    std::set<i64> bwd{sd::kQ,  sd::kK,  sd::kV,          sd::kO,  sd::kDO,     sd::kStats,
                      sd::kDQ, sd::kDK, sd::kSoftmaxSum, sd::kDV, sd::kDQAccum};
    if (p > 0) {  // the rng's seed and offset, device tensors the caller binds
      for (auto* set : {&fwd, &bwd}) set->insert({sd::kSeed, sd::kOffset});
    }
    expect_well_formed(sd::forward_graph(problem), fwd);
    expect_well_formed(sd::backward_graph(problem), bwd);
    sd::Problem deterministic = problem;  // dQ directly: no accumulator
    deterministic.deterministic = true;
    bwd.erase(sd::kDQAccum);
    expect_well_formed(sd::backward_graph(deterministic), bwd);
    sd::Problem biased = problem;  // per-document masks: the bias is one more caller tensor
    biased.bias = true;
    fwd.insert(sd::kBias);
    bwd.insert({sd::kBias, sd::kDQAccum});
    expect_well_formed(sd::forward_graph(biased), fwd);
    expect_well_formed(sd::backward_graph(biased), bwd);
  }
}

}  // namespace
