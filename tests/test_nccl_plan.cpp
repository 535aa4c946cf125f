// NcclCommunicator's reduce-scatter and all-gather as NCCL call plans
// (megazero/comm/nccl_plan.h), run for 1-4 ranks through a model of NCCL's
// documented semantics on the CPU: the calls of a collective must match
// across ranks (operation, count, root, in the same order), a send and a
// receive buffer may overlap only in NCCL's in-place forms (reduce-scatter:
// recv at the rank's chunk of send; all-gather: send at the rank's chunk of
// recv; reduce and broadcast: the same buffer), a group's calls run as one
// (every send read before any receive is written), and the results must be
// the collective's: even and uneven counts (zeros included), disjoint, in
// place and overlapping operands (which go through staging). A single GPU can
// run none of this with NCCL (it refuses two ranks on one GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "megazero/comm/nccl_plan.h"

using namespace megazero::nccl_plan;
using I = std::int64_t;

namespace {

constexpr std::size_t kElem = sizeof(float);

const float* f(const void* p) { return static_cast<const float*>(p); }
float* f(void* p) { return static_cast<float*>(p); }

bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const char *a0 = static_cast<const char*>(a), *b0 = static_cast<const char*>(b);
  return an > 0 && bn > 0 && a0 < b0 + bn && b0 < a0 + an;
}

// Every rank's plan through NCCL's semantics. Copies run where they stand in
// a rank's plan; the collective calls (a group's as one) must match across ranks.
void run(std::vector<Plan>& plans) {
  const int n = static_cast<int>(plans.size());
  std::vector<std::size_t> at(static_cast<std::size_t>(n), 0);
  auto local_copies = [&](int r) {
    auto& p = plans[static_cast<std::size_t>(r)];
    auto& k = at[static_cast<std::size_t>(r)];
    while (k < p.calls.size() && p.calls[k].op == Op::Copy) {
      const Call& c = p.calls[k++];
      ASSERT_FALSE(overlap(c.send, c.count, c.recv, c.count)) << "a copy between overlapping buffers";
      std::memcpy(c.recv, c.send, c.count);
    }
  };
  for (;;) {
    for (int r = 0; r < n; ++r) local_copies(r);
    const bool done = at[0] == plans[0].calls.size();
    for (int r = 1; r < n; ++r)
      ASSERT_EQ(at[static_cast<std::size_t>(r)] == plans[static_cast<std::size_t>(r)].calls.size(), done)
          << "rank " << r << " issues another number of collective calls than rank 0";
    if (done) return;
    // This step's calls of each rank: a group's run of collective calls, or one call.
    std::vector<std::vector<Call>> step(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      auto& p = plans[static_cast<std::size_t>(r)];
      auto& k = at[static_cast<std::size_t>(r)];
      do step[static_cast<std::size_t>(r)].push_back(p.calls[k++]);
      while (p.group && k < p.calls.size() && p.calls[k].op != Op::Copy);
    }
    const std::size_t calls = step[0].size();
    for (int r = 1; r < n; ++r) ASSERT_EQ(step[static_cast<std::size_t>(r)].size(), calls) << "rank " << r;
    // Every send read first (the group runs as one), then the receives written.
    std::vector<std::vector<std::vector<float>>> sent(calls,
                                                      std::vector<std::vector<float>>(static_cast<std::size_t>(n)));
    for (std::size_t c = 0; c < calls; ++c) {
      const Call& c0 = step[0][c];
      for (int r = 0; r < n; ++r) {
        const Call& x = step[static_cast<std::size_t>(r)][c];
        ASSERT_TRUE(x.op == c0.op && x.count == c0.count && x.root == c0.root)
            << "call " << c << " differs between rank 0 and rank " << r;
        const std::size_t bytes = x.count * kElem, total = bytes * static_cast<std::size_t>(n);
        switch (x.op) {
          case Op::ReduceScatter:
            ASSERT_TRUE(x.recv == f(x.send) + static_cast<std::size_t>(r) * x.count ||
                        !overlap(x.send, total, x.recv, bytes))
                << "reduce-scatter buffers overlap outside the in-place form";
            sent[c][static_cast<std::size_t>(r)].assign(f(x.send), f(x.send) + x.count * static_cast<std::size_t>(n));
            break;
          case Op::AllGather:
            ASSERT_TRUE(x.send == f(x.recv) + static_cast<std::size_t>(r) * x.count ||
                        !overlap(x.send, bytes, x.recv, total))
                << "all-gather buffers overlap outside the in-place form";
            sent[c][static_cast<std::size_t>(r)].assign(f(x.send), f(x.send) + x.count);
            break;
          case Op::Reduce:
            if (r == x.root) {
              ASSERT_NE(x.recv, nullptr) << "the root of a reduce receives nowhere";
              ASSERT_TRUE(x.send == x.recv || !overlap(x.send, bytes, x.recv, bytes)) << "reduce buffers overlap";
            }
            sent[c][static_cast<std::size_t>(r)].assign(f(x.send), f(x.send) + x.count);
            break;
          case Op::Broadcast:
            if (r == x.root) {
              ASSERT_TRUE(x.send == x.recv || !overlap(x.send, bytes, x.recv, bytes)) << "broadcast buffers overlap";
              sent[c][static_cast<std::size_t>(r)].assign(f(x.send), f(x.send) + x.count);
            }
            break;
          case Op::Copy:
            FAIL() << "a copy inside a group";
        }
      }
    }
    for (std::size_t c = 0; c < calls; ++c)
      for (int r = 0; r < n; ++r) {
        const Call& x = step[static_cast<std::size_t>(r)][c];
        const auto& all = sent[c];
        for (std::size_t i = 0; i < x.count; ++i) switch (x.op) {
            case Op::ReduceScatter: {
              float s = 0;
              for (int q = 0; q < n; ++q)
                s += all[static_cast<std::size_t>(q)][static_cast<std::size_t>(r) * x.count + i];
              f(x.recv)[i] = s;
              break;
            }
            case Op::AllGather:
              for (int q = 0; q < n; ++q)
                f(x.recv)[static_cast<std::size_t>(q) * x.count + i] = all[static_cast<std::size_t>(q)][i];
              break;
            case Op::Reduce:
              if (r == x.root) {
                float s = 0;
                for (int q = 0; q < n; ++q) s += all[static_cast<std::size_t>(q)][i];
                f(x.recv)[i] = s;
              }
              break;
            case Op::Broadcast:
              f(x.recv)[i] = all[static_cast<std::size_t>(x.root)][i];
              break;
            case Op::Copy:
              break;
          }
      }
  }
}

float value(int rank, I i) { return static_cast<float>(rank * 1000 + i); }

enum class Layout { Disjoint, InPlace, Overlapping };
const char* name(Layout l) {
  return l == Layout::Disjoint ? "disjoint" : l == Layout::InPlace ? "in place" : "overlapping";
}

const std::vector<std::vector<I>> kCounts = {{4},          {3, 3},       {5, 0, 2},   {0, 0, 1},
                                             {2, 7, 1, 3}, {6, 6, 6, 6}, {1, 0, 0, 1}};

// Rank r's memory: one arena holding the operands where the layout puts them, and a staging buffer.
struct Rank {
  std::vector<float> arena = std::vector<float>(256, -1.0f), staging;
};

}  // namespace

TEST(NcclPlan, ReduceScatterGivesEachRankItsChunkOfTheSum) {
  for (const auto& counts : kCounts)
    for (const Layout layout : {Layout::Disjoint, Layout::InPlace, Layout::Overlapping}) {
      const int n = static_cast<int>(counts.size());
      I total = 0;
      for (I c : counts) total += c;
      const auto displ = byte_displacements(counts, kElem);
      std::vector<Rank> ranks(static_cast<std::size_t>(n));
      std::vector<Plan> plans;
      std::vector<float*> outputs;
      for (int r = 0; r < n; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        float* in = ranks[ri].arena.data() + 8;
        for (I i = 0; i < total; ++i) in[i] = value(r, i);
        const std::size_t chunk = displ[ri] / kElem;
        float* out = layout == Layout::Disjoint  ? in + total + 8
                     : layout == Layout::InPlace ? in + chunk
                                                 : in + chunk + 1;
        const Span is{in, static_cast<std::size_t>(total) * kElem},
            os{out, static_cast<std::size_t>(counts[ri]) * kElem};
        const bool stage = reduce_scatter_staging(is, os, counts, kElem, r);
        // Staging exactly where the operands overlap outside the in-place form.
        EXPECT_EQ(stage, layout == Layout::Overlapping && overlap(is.data, is.bytes, os.data, os.bytes))
            << name(layout) << ", rank " << r;
        ranks[ri].staging.assign(static_cast<std::size_t>(counts[ri]) + 1, -2.0f);
        plans.push_back(reduce_scatter(is, os, counts, kElem, r, stage ? ranks[ri].staging.data() : nullptr));
        outputs.push_back(out);
      }
      SCOPED_TRACE(testing::Message() << n << " ranks, " << name(layout) << ", counts " << counts[0] << "...");
      run(plans);
      if (HasFatalFailure()) return;
      for (int r = 0; r < n; ++r)
        for (I i = 0; i < counts[static_cast<std::size_t>(r)]; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += value(q, static_cast<I>(displ[static_cast<std::size_t>(r)] / kElem) + i);
          EXPECT_EQ(outputs[static_cast<std::size_t>(r)][i], want) << "rank " << r << " element " << i;
        }
    }
}

TEST(NcclPlan, AllGatherPutsEveryRanksPartAtItsPlace) {
  for (const auto& counts : kCounts)
    for (const Layout layout : {Layout::Disjoint, Layout::InPlace, Layout::Overlapping}) {
      const int n = static_cast<int>(counts.size());
      I total = 0;
      for (I c : counts) total += c;
      const auto displ = byte_displacements(counts, kElem);
      std::vector<Rank> ranks(static_cast<std::size_t>(n));
      std::vector<Plan> plans;
      std::vector<float*> outputs;
      for (int r = 0; r < n; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        float* out = ranks[ri].arena.data() + 8;
        const std::size_t chunk = displ[ri] / kElem;
        float* in = layout == Layout::Disjoint  ? out + total + 8
                    : layout == Layout::InPlace ? out + chunk
                                                : out + chunk + 1;
        for (I i = 0; i < counts[ri]; ++i) in[i] = value(r, i);
        const Span is{in, static_cast<std::size_t>(counts[ri]) * kElem},
            os{out, static_cast<std::size_t>(total) * kElem};
        const bool stage = all_gather_staging(is, os, counts, kElem, r);
        EXPECT_EQ(stage, layout == Layout::Overlapping && overlap(is.data, is.bytes, os.data, os.bytes))
            << name(layout) << ", rank " << r;
        ranks[ri].staging.assign(static_cast<std::size_t>(counts[ri]) + 1, -2.0f);
        plans.push_back(all_gather(is, os, counts, kElem, r, stage ? ranks[ri].staging.data() : nullptr));
        outputs.push_back(out);
      }
      SCOPED_TRACE(testing::Message() << n << " ranks, " << name(layout) << ", counts " << counts[0] << "...");
      run(plans);
      if (HasFatalFailure()) return;
      for (int r = 0; r < n; ++r)
        for (int q = 0; q < n; ++q)
          for (I i = 0; i < counts[static_cast<std::size_t>(q)]; ++i)
            EXPECT_EQ(outputs[static_cast<std::size_t>(r)]
                             [displ[static_cast<std::size_t>(q)] / kElem + static_cast<std::size_t>(i)],
                      value(q, i))
                << "rank " << r << " holds rank " << q << "'s element " << i;
    }
}

TEST(NcclPlan, EvenCountsAreOneCallUnevenOnesAGroup) {
  float buf[64] = {};
  const Span in{buf, 12 * kElem}, out{buf + 32, 4 * kElem};
  const Plan even = reduce_scatter(in, out, {4, 4, 4}, kElem, 1, nullptr);
  ASSERT_EQ(even.calls.size(), 1u);
  EXPECT_FALSE(even.group);
  EXPECT_EQ(even.calls[0].op, Op::ReduceScatter);
  const Plan uneven = reduce_scatter(in, Span{buf + 32, 5 * kElem}, {3, 5, 4}, kElem, 1, nullptr);
  ASSERT_EQ(uneven.calls.size(), 3u);
  EXPECT_TRUE(uneven.group);
  EXPECT_EQ(uneven.calls[0].recv, nullptr) << "a reduce's result lands at its root only";
  EXPECT_EQ(uneven.calls[1].recv, buf + 32);
  EXPECT_EQ(uneven.calls[2].send, buf + 8);
  // A staging buffer must be given exactly when the plan needs one.
  EXPECT_ANY_THROW(reduce_scatter(in, Span{buf + 5, 4 * kElem}, {4, 4, 4}, kElem, 1, nullptr));
  EXPECT_ANY_THROW(reduce_scatter(in, out, {4, 4, 4}, kElem, 1, buf + 60));
}
