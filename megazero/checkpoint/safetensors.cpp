#include "megazero/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "megazero/core/error.h"

namespace megazero::checkpoint {

using json = nlohmann::json;

std::string safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::F64:
      return "F64";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

DType dtype_from_safetensors(const std::string& n) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8})
    if (safetensors_dtype(t) == n) return t;
  throw std::runtime_error("unsupported dtype '" + n + "'");
}

// ------------------------------------------------------------------ writer
void SafetensorsWriter::add_entry(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                                  const void* data, Device* device) {
  MZ_CHECK(name != "__metadata__", "reserved tensor name");
  MZ_CHECK(names_.insert(name).second, "tensor '", name, "' added twice");
  std::uint64_t numel = 1;
  for (auto d : shape) {
    MZ_CHECK(d >= 0, "negative dimension in '", name, "'");
    numel *= static_cast<std::uint64_t>(d);
  }
  const std::uint64_t bytes = numel * dtype_size(dtype);
  tensors_.push_back({name, {dtype, std::move(shape), data_bytes_, data_bytes_ + bytes}, data, device});
  data_bytes_ += bytes;
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                            const void* host_data) {
  add_entry(name, dtype, std::move(shape), host_data, nullptr);
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t, std::vector<std::int64_t> shape) {
  MZ_CHECK(t.is_contiguous(), "safetensors: '", name, "' is not contiguous");
  MZ_CHECK(shape_numel(shape) == t.numel(), "safetensors: '", name, "' has ", t.numel(), " elements, not ",
           shape_str(shape));
  MZ_CHECK(t.device().has_storage(), "safetensors: '", name, "' is on the meta device");
  if (t.device().host_accessible())
    add_entry(name, t.dtype(), std::move(shape), t.host_bytes(), nullptr);
  else
    add_entry(name, t.dtype(), std::move(shape), t.data(), &t.device());
}

void SafetensorsWriter::set_staging_bytes(std::size_t bytes) {
  MZ_CHECK(bytes > 0, "staging buffers need at least one byte");
  staging_bytes_ = bytes;
}

namespace {

class HashingFile {
 public:
  explicit HashingFile(const std::string& path) : path_(path), state_(XXH3_createState()) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    MZ_REQUIRE(fd_ >= 0, "cannot create '", path, "': ", std::strerror(errno));
    XXH3_64bits_reset(state_);
  }
  ~HashingFile() {
    if (fd_ >= 0) ::close(fd_);
    XXH3_freeState(state_);
  }
  void write(const void* p, std::size_t n) {
    XXH3_64bits_update(state_, p, n);
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd_, c, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      MZ_REQUIRE(w > 0, "cannot write '", path_, "': ", std::strerror(errno), " (is the disk full?)");
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  std::uint64_t finish() {
    MZ_REQUIRE(::fsync(fd_) == 0, "cannot flush '", path_, "' to storage: ", std::strerror(errno));
    MZ_REQUIRE(::close(fd_) == 0, "cannot close '", path_, "': ", std::strerror(errno));
    fd_ = -1;
    return XXH3_64bits_digest(state_);
  }

 private:
  std::string path_;
  int fd_ = -1;
  XXH3_state_t* state_;
};

}  // namespace

namespace {

// Device bytes out to the host in chunks: a thread copies chunk i + 1 into one
// staging buffer while the caller writes chunk i from the other. Chunks come
// out in the order they were listed.
class StagedReader {
 public:
  struct Piece {
    Device* device;
    const char* src;
    std::size_t bytes;
  };
  StagedReader(std::vector<Piece> pieces, std::size_t chunk) : pieces_(std::move(pieces)), chunk_(chunk) {
    if (pieces_.empty()) return;
    staging_ = pieces_.front().device->allocate_host_staging(2 * chunk_);
    worker_ = std::thread([this] { produce(); });
  }
  ~StagedReader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  // The next chunk (in piece order) as host bytes, valid until the next call.
  std::pair<const char*, std::size_t> next() {
    std::unique_lock<std::mutex> lock(mu_);
    if (consumed_ > 0) {  // the previous chunk's slot is free again
      --filled_;
      cv_.notify_all();
    }
    cv_.wait(lock, [&] { return filled_ > 0 || error_; });
    if (error_ && filled_ == 0) std::rethrow_exception(error_);
    const int slot = static_cast<int>(consumed_ % 2);
    ++consumed_;
    return {static_cast<const char*>(staging_.get()) + slot * chunk_, sizes_[slot]};
  }

 private:
  void produce() {
    std::uint64_t produced = 0;
    try {
      for (const Piece& p : pieces_)
        for (std::size_t off = 0; off < p.bytes; off += chunk_) {
          const int slot = static_cast<int>(produced % 2);
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return filled_ < 2 || stop_; });
            if (stop_) return;
          }
          const std::size_t n = std::min(chunk_, p.bytes - off);
          p.device->copy_to_host(static_cast<char*>(staging_.get()) + slot * chunk_, p.src + off, n);
          std::lock_guard<std::mutex> lock(mu_);
          sizes_[slot] = n;
          ++filled_;
          ++produced;
          cv_.notify_all();
        }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

  std::vector<Piece> pieces_;
  std::size_t chunk_;
  std::shared_ptr<void> staging_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  int filled_ = 0;  // slots holding a chunk not yet handed out (plus the one handed out)
  std::uint64_t consumed_ = 0;
  std::size_t sizes_[2] = {0, 0};
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::uint64_t SafetensorsWriter::write(const std::string& path) const {
  json header = json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  for (const auto& t : tensors_)
    header[t.name] = {{"dtype", safetensors_dtype(t.entry.dtype)},
                      {"shape", t.entry.shape},
                      {"data_offsets", {t.entry.begin, t.entry.end}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  HashingFile f(path);
  f.write(len, 8);
  f.write(text.data(), text.size());
  std::vector<StagedReader::Piece> pieces;
  for (const auto& t : tensors_)
    if (t.device && t.entry.end > t.entry.begin)
      pieces.push_back({t.device, static_cast<const char*>(t.data), t.entry.end - t.entry.begin});
  StagedReader staged(std::move(pieces), staging_bytes_);
  staged_bytes_ = 0;
  for (const auto& t : tensors_) {
    const std::size_t bytes = t.entry.end - t.entry.begin;
    if (!t.device) {
      f.write(t.data, bytes);
      continue;
    }
    for (std::size_t done = 0; done < bytes;) {
      const auto [chunk, n] = staged.next();
      f.write(chunk, n);
      done += n;
      staged_bytes_ += n;
    }
  }
  return f.finish();
}

// ------------------------------------------------------------------ reader
SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  MZ_REQUIRE(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (rc != 0 || size < 8) {
    ::close(fd);
    throw ConfigError(detail::concat("'", path, "' is truncated: ", size, " bytes, not even a safetensors header"));
  }
  map_size_ = static_cast<std::size_t>(size);
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MZ_REQUIRE(map_ != MAP_FAILED, "cannot map '", path, "': ", std::strerror(errno));
  const auto* bytes = static_cast<const std::uint8_t*>(map_);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  auto fail = [&](const std::string& why) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw ConfigError("'" + path + "' is not a valid safetensors file: " + why);
  };
  if (n > kMaxHeaderBytes) fail("its header claims " + std::to_string(n) + " bytes (corrupt length)");
  if (8 + n > size) fail("truncated: header of " + std::to_string(n) + " bytes in a file of " + std::to_string(size));
  const std::uint64_t data_size = size - 8 - n;
  data_ = reinterpret_cast<const std::byte*>(bytes + 8 + n);
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + n));
  } catch (const json::exception& e) {
    fail(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const auto& v = it.value();
    if (it.key() == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("__metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + it.key() + "': ";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail(where + "needs dtype, shape and data_offsets");
    TensorEntry e;
    try {
      e.dtype = dtype_from_safetensors(v.at("dtype").get<std::string>());
      const auto& off = v.at("data_offsets");
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        fail(where + "data_offsets must be two non-negative integers");
      e.begin = off[0].get<std::uint64_t>();
      e.end = off[1].get<std::uint64_t>();
      if (!v.at("shape").is_array()) fail(where + "shape is not an array");
      for (const auto& d : v.at("shape")) {
        if (!d.is_number_unsigned()) fail(where + "shape holds a non-integer or negative dimension");
        e.shape.push_back(d.get<std::int64_t>());
      }
    } catch (const json::exception& ex) {
      fail(where + ex.what());
    } catch (const std::runtime_error& ex) {
      if (dynamic_cast<const ConfigError*>(&ex)) throw;
      fail(where + ex.what());
    }
    if (e.end < e.begin || e.end > data_size)
      fail(where + "bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") lie outside the " +
           std::to_string(data_size) + " bytes of data (truncated file?)");
    // numel x dtype size must equal the span; stop multiplying once past the
    // data size so a huge shape cannot overflow.
    std::uint64_t expect = dtype_size(e.dtype);
    for (auto d : e.shape) {
      if (d != 0 && expect > data_size / static_cast<std::uint64_t>(d)) {
        expect = data_size + 1;
        break;
      }
      expect *= static_cast<std::uint64_t>(d);
    }
    if (expect != e.end - e.begin) fail(where + "its shape and dtype do not match its byte span");
    spans.push_back({e.begin, e.end});
    tensors_[it.key()] = e;
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) fail("two tensors overlap");
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  MZ_REQUIRE(it != tensors_.end(), "'", path_, "' has no tensor '", name, "'");
  return it->second;
}

const std::byte* SafetensorsFile::data(const std::string& name) const { return data(entry(name)); }

}  // namespace megazero::checkpoint
