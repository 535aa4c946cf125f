// The C interface of libmegazero_sentencepiece.so (data/sentencepiece_module.cpp),
// which data/sentencepiece_tokenizer.cpp loads at run time. A change to any
// signature raises MZ_SP_ABI_VERSION, so a stale module is refused by name.
#pragma once

#include <cstddef>
#include <cstdint>

#define MZ_SP_ABI_VERSION 1

extern "C" {
int mz_sp_abi_version();
// A loaded model, or null with the reason in err.
void* mz_sp_load(const char* path, char* err, std::size_t err_cap);
void mz_sp_free(void* handle);
void mz_sp_info(void* handle, std::int32_t* pieces, std::int32_t* bos, std::int32_t* eos);
// The ids of text (at most cap written); returns their count, or -1 with err.
long mz_sp_encode(void* handle, const char* text, std::size_t len, std::int32_t* out, std::size_t cap, char* err,
                  std::size_t err_cap);
// The text of ids (written when it fits cap); returns its length, or -1 with err.
long mz_sp_decode(void* handle, const std::int32_t* ids, std::size_t n, char* out, std::size_t cap, char* err,
                  std::size_t err_cap);
}
