#include "megazero/checkpoint/reshard.h"

#include <algorithm>

#include "megazero/core/error.h"

namespace megazero::checkpoint {

namespace {
// The split dimension as reshard sees it (replicated = dim 0 in one part).
int eff_dim(const ShardLayout& l) { return l.split_dim < 0 ? 0 : l.split_dim; }
int eff_parts(const ShardLayout& l) { return l.split_dim < 0 ? 1 : l.parts; }
}  // namespace

std::int64_t shard_numel(const ShardLayout& l) {
  std::int64_t n = 1;
  for (auto d : l.global_shape) n *= d;
  return l.global_shape.empty() ? 1 : n / eff_parts(l);
}

std::vector<CopyRun> map_shard_range(const ShardLayout& dst, int dst_part, const ShardLayout& src, std::int64_t begin,
                                     std::int64_t end) {
  const auto& G = dst.global_shape;
  const auto& Gs = src.global_shape;
  MZ_CHECK(G.size() == Gs.size(), "reshard: rank ", G.size(), " vs ", Gs.size());
  if (G.empty()) return {{begin, 0, begin, end - begin}};
  const int k = eff_dim(dst);
  MZ_CHECK(dst.split_dim == src.split_dim, "reshard: split dim ", dst.split_dim, " vs saved ", src.split_dim);
  for (std::size_t d = 1; d < G.size(); ++d) MZ_CHECK(G[d] == Gs[d], "reshard: dim ", d, " differs");
  MZ_CHECK(k == 0 || G[0] == Gs[0], "reshard: dim 0 differs on a parameter not split along it");
  std::int64_t inner = 1;
  for (std::size_t d = static_cast<std::size_t>(k) + 1; d < G.size(); ++d) inner *= G[d];
  const std::int64_t Ld = G[static_cast<std::size_t>(k)] / eff_parts(dst);   // dst rows along k
  const std::int64_t Ls = Gs[static_cast<std::size_t>(k)] / eff_parts(src);  // src rows along k
  const std::int64_t src_rows = Gs[static_cast<std::size_t>(k)];
  const std::int64_t dst_block = Ld * inner, src_block = Ls * inner;  // one outer index's span
  const std::int64_t start_row = dst.split_dim < 0 ? 0 : static_cast<std::int64_t>(dst_part) * Ld;
  MZ_CHECK(begin >= 0 && end <= shard_numel(dst) && begin <= end, "reshard: range [", begin, ", ", end, ")");

  std::vector<CopyRun> runs;
  for (std::int64_t l = begin; l < end;) {
    const std::int64_t o = l / dst_block, r = l % dst_block;
    const std::int64_t row = r / inner + start_row, j = r % inner;
    std::int64_t len = std::min(end - l, dst_block - r);
    CopyRun run;
    run.dst = l;
    if (row >= src_rows) {  // padding the saved layout did not have
      run.src_part = -1;
    } else {
      const std::int64_t s = row / Ls, srow = row - s * Ls;
      run.src_part = static_cast<int>(s);
      run.src = o * src_block + srow * inner + j;
      len = std::min(len, (Ls - srow) * inner - j);
    }
    run.length = len;
    // Merge with the previous run when both continue each other.
    if (!runs.empty()) {
      CopyRun& p = runs.back();
      if (p.src_part == run.src_part && p.dst + p.length == run.dst &&
          (run.src_part < 0 || p.src + p.length == run.src)) {
        p.length += len;
        l += len;
        continue;
      }
    }
    runs.push_back(run);
    l += len;
  }
  return runs;
}

}  // namespace megazero::checkpoint
