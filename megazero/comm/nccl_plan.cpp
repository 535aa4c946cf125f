#include "megazero/comm/nccl_plan.h"

#include "megazero/core/error.h"

namespace megazero::nccl_plan {

namespace {
bool overlaps(Span a, Span b) {
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a.bytes > 0 && b.bytes > 0 && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}
bool all_equal(const std::vector<std::int64_t>& c) {
  for (auto x : c)
    if (x != c.front()) return false;
  return true;
}
void check(const std::vector<std::int64_t>& counts, int rank) {
  MZ_CHECK(!counts.empty() && rank >= 0 && rank < static_cast<int>(counts.size()), "nccl plan: rank ", rank, " of ",
           counts.size(), " counts");
}
}  // namespace

std::vector<std::size_t> byte_displacements(const std::vector<std::int64_t>& counts, std::size_t elem) {
  std::vector<std::size_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + static_cast<std::size_t>(counts[i - 1]) * elem;
  return d;
}

bool reduce_scatter_staging(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem,
                            int rank) {
  check(counts, rank);
  const auto displ = byte_displacements(counts, elem);
  const bool in_place = output.data == static_cast<const char*>(input.data) + displ[static_cast<std::size_t>(rank)];
  return !in_place && overlaps(input, output);
}

Plan reduce_scatter(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem, int rank,
                    void* staging) {
  const bool stage = reduce_scatter_staging(input, output, counts, elem, rank);
  MZ_CHECK(stage == (staging != nullptr), "nccl plan: reduce_scatter ", stage ? "needs" : "takes no",
           " staging buffer");
  const auto displ = byte_displacements(counts, elem);
  const auto* in = static_cast<const char*>(input.data);
  void* recv = stage ? staging : const_cast<void*>(output.data);
  Plan p;
  if (all_equal(counts)) {
    p.calls.push_back({Op::ReduceScatter, in, recv, static_cast<std::size_t>(counts.front())});
  } else {
    p.group = true;
    for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
      const auto ri = static_cast<std::size_t>(r);
      p.calls.push_back(
          {Op::Reduce, in + displ[ri], r == rank ? recv : nullptr, static_cast<std::size_t>(counts[ri]), r});
    }
  }
  // Out of the group: the copy needs the reduction's result.
  if (stage) p.calls.push_back({Op::Copy, staging, const_cast<void*>(output.data), output.bytes});
  return p;
}

bool all_gather_staging(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem, int rank) {
  check(counts, rank);
  const auto displ = byte_displacements(counts, elem);
  const bool in_place = input.data == static_cast<const char*>(output.data) + displ[static_cast<std::size_t>(rank)];
  return !in_place && overlaps(input, output);
}

Plan all_gather(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem, int rank,
                void* staging) {
  const bool stage = all_gather_staging(input, output, counts, elem, rank);
  MZ_CHECK(stage == (staging != nullptr), "nccl plan: all_gather ", stage ? "needs" : "takes no", " staging buffer");
  const auto displ = byte_displacements(counts, elem);
  auto* out = static_cast<char*>(const_cast<void*>(output.data));
  const void* send = stage ? staging : input.data;
  Plan p;
  if (stage) p.calls.push_back({Op::Copy, input.data, staging, input.bytes});
  if (all_equal(counts)) {
    p.calls.push_back({Op::AllGather, send, out, static_cast<std::size_t>(counts.front())});
  } else {
    p.group = true;
    for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
      const auto ri = static_cast<std::size_t>(r);
      char* dst = out + displ[ri];
      p.calls.push_back({Op::Broadcast, r == rank ? send : dst, dst, static_cast<std::size_t>(counts[ri]), r});
    }
  }
  return p;
}

}  // namespace megazero::nccl_plan
