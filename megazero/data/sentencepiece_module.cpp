// libmegazero_sentencepiece.so: SentencePiece behind a C interface, loaded by
// data/sentencepiece_tokenizer.cpp with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a module and not a plain link: Debian's libsentencepiece carries its own
// copy of protobuf's runtime and exports it. Linked into a process that also
// loads libprotobuf (pretrain_gpt's TensorBoard writer), one copy's symbols
// bind the other's calls, and the process crashes in protobuf's static
// initialisers before main. Loaded locally with deep binding, SentencePiece
// keeps to its own copy and nothing else sees it.
//
// Only C types cross the boundary; errors come back as text in a caller's
// buffer. Sizes too small for a result return the size needed.
#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "megazero/data/sentencepiece_module.h"

namespace {

void put_error(const std::string& msg, char* err, std::size_t cap) {
  if (!err || cap == 0) return;
  const std::size_t n = std::min(msg.size(), cap - 1);
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

int mz_sp_abi_version() { return MZ_SP_ABI_VERSION; }

void* mz_sp_load(const char* path, char* err, std::size_t err_cap) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    put_error(status.ToString(), err, err_cap);
    delete sp;
    return nullptr;
  }
  return sp;
}

void mz_sp_free(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

void mz_sp_info(void* handle, std::int32_t* pieces, std::int32_t* bos, std::int32_t* eos) {
  const auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  *pieces = sp->GetPieceSize();
  *bos = sp->bos_id();
  *eos = sp->eos_id();
}

long mz_sp_encode(void* handle, const char* text, std::size_t len, std::int32_t* out, std::size_t cap, char* err,
                  std::size_t err_cap) {
  const auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  std::vector<int> ids;
  const auto status = sp->Encode(std::string(text, len), &ids);
  if (!status.ok()) {
    put_error(status.ToString(), err, err_cap);
    return -1;
  }
  for (std::size_t i = 0; i < ids.size() && i < cap; ++i) out[i] = ids[i];
  return static_cast<long>(ids.size());
}

long mz_sp_decode(void* handle, const std::int32_t* ids, std::size_t n, char* out, std::size_t cap, char* err,
                  std::size_t err_cap) {
  const auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(handle);
  std::string text;
  const auto status = sp->Decode(std::vector<int>(ids, ids + n), &text);
  if (!status.ok()) {
    put_error(status.ToString(), err, err_cap);
    return -1;
  }
  if (text.size() <= cap) std::memcpy(out, text.data(), text.size());
  return static_cast<long>(text.size());
}

}  // extern "C"
