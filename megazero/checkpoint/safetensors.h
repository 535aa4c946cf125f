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
#include <unordered_set>
#include <vector>

#include "megazero/core/dtype.h"
#include "megazero/core/tensor.h"

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
// read when write() runs, so the memory must stay valid until then.
//
// A tensor in device memory (a GPU's, the isolated device's) is never read by
// host code: write() streams it out through two staging buffers of
// staging_bytes() each (page-locked on a GPU), a copy thread filling one while
// the other is hashed and written, so a shard costs that much host memory
// whatever its size, and the device-to-host copies overlap the disk writes.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* host_data);
  // A contiguous tensor on any device, as a 1-D or shaped entry of its dtype.
  void add(const std::string& name, const Tensor& t, std::vector<std::int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Size of each of the two staging buffers (default 8 MiB; tests make it small
  // to cross chunk boundaries).
  void set_staging_bytes(std::size_t bytes);
  std::size_t staging_bytes() const { return staging_bytes_; }
  // Writes to `path` (created or truncated), fsyncs it, and returns the file's
  // XXH3-64 checksum computed from the bytes as they were written.
  // Throws ConfigError naming the path on any I/O failure.
  std::uint64_t write(const std::string& path) const;
  std::uint64_t data_bytes() const { return data_bytes_; }
  // Bytes that went through the staging buffers in the last write().
  std::uint64_t staged_bytes() const { return staged_bytes_; }

 private:
  struct Pending {
    std::string name;
    TensorEntry entry;
    const void* data;          // host memory, or a device address when `device` is set
    Device* device = nullptr;  // non-null: streamed through the staging buffers
  };
  void add_entry(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data,
                 Device* device);
  std::vector<Pending> tensors_;
  std::unordered_set<std::string> names_;  // duplicate check in O(1): a checkpoint has pieces per parameter
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_bytes_ = 0;
  std::size_t staging_bytes_ = std::size_t{8} << 20;
  mutable std::uint64_t staged_bytes_ = 0;
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
