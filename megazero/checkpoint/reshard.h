// Resharding on load: which elements of which saved TP shard land where in a
// parameter shard of the new layout. Pure integer math over global shapes, so
// a checkpoint saved at TP a loads at TP c with no offline converter.
//
// A parameter is a row-major tensor of `global_shape`, split along `split_dim`
// into `parts` equal contiguous blocks (split_dim -1: every rank holds all of
// it, treated as one part along dim 0). Shard-local flat indices are row-major
// over the shard's local shape. The saved and the new global shape may differ
// in dim 0 only when that dim carries padding (the vocabulary is padded to a
// multiple of 128 x TP): rows past the saved ones are padding and read as zero.
#pragma once

#include <cstdint>
#include <vector>

namespace megazero::checkpoint {

struct ShardLayout {
  std::vector<std::int64_t> global_shape;
  int split_dim = -1;
  int parts = 1;
};

struct CopyRun {
  std::int64_t dst = 0;  // destination shard-local flat index
  int src_part = -1;     // saved TP shard; -1 = padding, fill with zeros
  std::int64_t src = 0;  // source shard-local flat index
  std::int64_t length = 0;
};

// Runs covering destination elements [begin, end) of shard `dst_part` of
// `dst`, read from the saved layout `src`. Throws InternalError if the shapes
// are incompatible (the caller checks the model matches first).
std::vector<CopyRun> map_shard_range(const ShardLayout& dst, int dst_part, const ShardLayout& src, std::int64_t begin,
                                     std::int64_t end);

// Elements in shard `part` of a layout.
std::int64_t shard_numel(const ShardLayout& l);

}  // namespace megazero::checkpoint
