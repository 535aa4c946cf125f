// The safetensors layout (as Hugging Face defines it): an 8-byte little-endian
// header length N, N bytes of JSON naming each tensor's dtype, shape and
// [begin, end) byte offsets into the data that follows, then the raw data.
// Nothing in a file is ever executed: reading parses JSON and checks every
// bound (header inside the file, offsets inside the data, sizes matching shape
// x dtype, no overlap) before a byte of data is handed out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "megazero/core/dtype.h"

namespace megazero::checkpoint {

// "F32", "F16", "BF16", "F64", "I64", ... (safetensors' names).
std::string safetensors_dtype(DType t);
DType dtype_from_safetensors(const std::string& name);  // throws std::runtime_error

struct TensorEntry {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // bytes, relative to the data section
};

// Builds a file in memory order: add() tensors, then write(). The bytes are
// copied when write() runs, so the pointers must stay valid until then.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes to `path` (created or truncated), fsyncs it, and returns the file's
  // XXH3-64 checksum computed from the bytes as they were written.
  // Throws ConfigError naming the path on any I/O failure.
  std::uint64_t write(const std::string& path) const;
  std::uint64_t data_bytes() const { return data_bytes_; }

 private:
  struct Pending {
    std::string name;
    TensorEntry entry;
    const void* data;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_bytes_ = 0;
};

// A read-only, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  // Throws ConfigError naming the path and what is wrong for a missing,
  // truncated or malformed file.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;  // ConfigError if absent
  // The bytes of a tensor (bounds checked at open).
  const std::byte* data(const std::string& name) const;
  const std::byte* data(const TensorEntry& e) const { return data_ + e.begin; }

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  const std::byte* data_ = nullptr;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Largest header a reader accepts: a corrupt length must not make us map or
// parse gigabytes. (Hugging Face's reader uses the same 100 MB limit.)
inline constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

}  // namespace megazero::checkpoint
