#include "megazero/train/documents.h"

#include "megazero/core/error.h"

namespace megazero::train {

std::vector<std::int64_t> document_starts(const Tensor& ids, std::int64_t seq, std::int64_t eod_token) {
  MZ_CHECK(ids.dtype() == DType::I64 && ids.dim() == 1 && ids.device().host_accessible(),
           "document boundaries take int64 [B*S] ids on the host, got ", ids.to_string());
  MZ_CHECK(seq > 0 && ids.numel() % seq == 0, ids.numel(), " tokens are not whole samples of ", seq);
  const std::int64_t* id = ids.host_data<std::int64_t>();
  std::vector<std::int64_t> starts(static_cast<std::size_t>(ids.numel()));
  for (std::int64_t b = 0; b < ids.numel() / seq; ++b) {
    std::int64_t start = 0;
    for (std::int64_t s = 0; s < seq; ++s) {
      starts[static_cast<std::size_t>(b * seq + s)] = start;
      if (id[b * seq + s] == eod_token) start = s + 1;  // the end belongs to its document; the next starts after it
    }
  }
  return starts;
}

namespace {
Tensor host_int64(const Tensor& like, const std::vector<std::int64_t>& v, const char* name) {
  Tensor t = Tensor::empty(like.device_ptr(), {like.numel()}, DType::I64, MemoryCategory::Activations, name);
  std::copy(v.begin(), v.end(), t.host_data<std::int64_t>());
  return t;
}
}  // namespace

void mark_documents(std::vector<MicroBatch>& mbs, const DocumentMasks& masks) {
  if (!masks.any()) return;
  for (auto& mb : mbs) {
    const std::int64_t S = mb.step.seq;
    std::vector<std::int64_t> starts = document_starts(mb.ids, S, masks.eod_token);
    if (masks.reset_attention) mb.step.key_starts = host_int64(mb.ids, starts, "document starts");
    if (masks.reset_positions) {
      for (std::size_t i = 0; i < starts.size(); ++i)
        starts[i] = static_cast<std::int64_t>(i) % S - starts[i];  // the position within the document
      mb.step.positions = host_int64(mb.ids, starts, "document positions");
    }
  }
}

}  // namespace megazero::train
