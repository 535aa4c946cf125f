#include "megazero/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "megazero/core/error.h"

namespace megazero::data {

static_assert(std::endian::native == std::endian::little, "MMIDIDX files are little-endian");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::uint64_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, counts

bool valid_code(std::uint8_t c) { return c >= 1 && c <= 8; }

// A read-only mapping of a whole file; empty files map to nothing.
struct Mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (data) munmap(const_cast<std::byte*>(data), size);
  }
  // Returns an errno-style message on failure, empty on success.
  std::string map(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::strerror(errno);
    struct stat st {};
    std::string err;
    if (fstat(fd, &st) != 0) {
      err = std::strerror(errno);
    } else if (st.st_size > 0) {
      size = static_cast<std::size_t>(st.st_size);
      void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED)
        err = std::strerror(errno);
      else
        data = static_cast<const std::byte*>(p);
    }
    ::close(fd);
    return err;
  }
  std::byte* release() {
    auto* p = const_cast<std::byte*>(data);
    data = nullptr;
    return p;
  }
};

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void widen(const std::byte* src, std::int64_t n, std::int64_t* out) {
  for (std::int64_t k = 0; k < n; ++k)
    out[k] = static_cast<std::int64_t>(load<T>(src + k * static_cast<std::int64_t>(sizeof(T))));
}

}  // namespace

std::size_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::U8:
    case TokenDType::I8:
      return 1;
    case TokenDType::I16:
    case TokenDType::U16:
      return 2;
    case TokenDType::I32:
    case TokenDType::F32:
      return 4;
    case TokenDType::I64:
    case TokenDType::F64:
      return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::U8:
      return "uint8";
    case TokenDType::I8:
      return "int8";
    case TokenDType::I16:
      return "int16";
    case TokenDType::I32:
      return "int32";
    case TokenDType::I64:
      return "int64";
    case TokenDType::F64:
      return "float64";
    case TokenDType::F32:
      return "float32";
    case TokenDType::U16:
      return "uint16";
  }
  return "?";
}

TokenDType token_dtype_for_vocab(std::int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDType::U16 : TokenDType::I32;
}

// ------------------------------------------------------------------ reader

std::shared_ptr<const IndexedDataset> IndexedDataset::open(const std::string& prefix, const std::string& flag) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  auto bad = [&](const std::string& file, const std::string& what) {
    return ConfigError(detail::concat(flag, " ", prefix, ": ", file, " ", what,
                                      "; re-run tools/preprocess_data to rebuild ", prefix, ".{bin,idx}"));
  };
  MZ_REQUIRE(!prefix.empty(), flag, " is empty; pass the dataset prefix (PATH for PATH.bin and PATH.idx)");

  Mapping idx;
  if (auto err = idx.map(idx_path); !err.empty())
    throw ConfigError(detail::concat(flag, " ", prefix, ": cannot open ", idx_path, " (", err,
                                     "); pass the prefix without .bin/.idx, or build it with tools/preprocess_data"));
  const std::byte* p = idx.data;
  if (idx.size < kHeaderBytes)
    throw bad(idx_path, detail::concat("is truncated: it is ", idx.size, " bytes, the header alone is ", kHeaderBytes));
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
    throw bad(idx_path, "is not a Megatron indexed dataset index (bad magic; expected \"MMIDIDX\\0\\0\")");
  const auto version = load<std::uint64_t>(p + 9);
  if (version != kVersion)
    throw bad(idx_path, detail::concat("has index version ", version, "; megazero reads version ", kVersion));
  const auto code = load<std::uint8_t>(p + 17);
  if (!valid_code(code)) throw bad(idx_path, detail::concat("has unknown dtype code ", int(code), " (valid: 1..8)"));
  const auto dtype = static_cast<TokenDType>(code);
  if (dtype == TokenDType::F32 || dtype == TokenDType::F64)
    throw bad(idx_path, detail::concat("holds ", token_dtype_name(dtype), " values, not token ids"));
  const auto count = load<std::uint64_t>(p + 18), doc_count = load<std::uint64_t>(p + 26);

  // Bound the counts by the file size before multiplying, so no product overflows.
  const std::uint64_t body = idx.size - kHeaderBytes;
  const std::uint64_t need = (count <= body / 12 && doc_count <= body / 8) ? count * 12 + doc_count * 8
                                                                           : std::numeric_limits<std::uint64_t>::max();
  if (body < need)
    throw bad(idx_path, detail::concat("is truncated: ", idx.size, " bytes, but its header promises ", count,
                                       " sequences and ", doc_count, " document indices"));
  if (body > need)
    throw bad(idx_path, detail::concat("has ", body - need,
                                       " bytes after its arrays (a multimodal or corrupt index; megazero reads "
                                       "plain token indices)"));
  if (doc_count < 1) throw bad(idx_path, "has no document index entries (it needs at least the leading 0)");

  std::shared_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  ds->dtype_ = dtype;
  const std::size_t n = static_cast<std::size_t>(count);
  ds->lengths_.resize(n);
  ds->pointers_.resize(n);
  ds->doc_index_.resize(static_cast<std::size_t>(doc_count));
  std::memcpy(ds->lengths_.data(), p + kHeaderBytes, n * 4);
  std::memcpy(ds->pointers_.data(), p + kHeaderBytes + n * 4, n * 8);
  std::memcpy(ds->doc_index_.data(), p + kHeaderBytes + n * 12, ds->doc_index_.size() * 8);

  Mapping bin;
  if (auto err = bin.map(bin_path); !err.empty())
    throw ConfigError(detail::concat(flag, " ", prefix, ": cannot open ", bin_path, " (", err, ") although ", idx_path,
                                     " exists; re-run tools/preprocess_data to rebuild both"));
  const auto item = static_cast<std::int64_t>(token_dtype_size(dtype));
  const auto bin_size = static_cast<std::int64_t>(bin.size);
  // Megatron's writer lays sequences end to end from byte 0; anything else is
  // a corrupt length or pointer. Every sum stays below bin_size, so no overflow.
  std::int64_t expected = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t len = ds->lengths_[i], ptr = ds->pointers_[i];
    if (len < 0) throw bad(idx_path, detail::concat("gives sequence ", i, " a negative length ", len));
    if (ptr < 0 || ptr > bin_size || len > (bin_size - ptr) / item)
      throw bad(idx_path,
                detail::concat("places sequence ", i, " (", len, " tokens at byte ", ptr, ") past the end of ",
                               bin_path, " (", bin_size, " bytes): the .bin is truncated or from another run"));
    if (ptr != expected)
      throw bad(idx_path,
                detail::concat("places sequence ", i, " at byte ", ptr, " but the previous sequence ends at byte ",
                               expected, " (a corrupt length or pointer)"));
    expected = ptr + len * item;
  }
  if (expected != bin_size)
    throw bad(bin_path, detail::concat("is ", bin_size, " bytes but ", idx_path, " describes ", expected,
                                       ": the two files are from different runs"));
  const auto& d = ds->doc_index_;
  if (d.front() != 0) throw bad(idx_path, detail::concat("starts its document indices at ", d.front(), ", not 0"));
  for (std::size_t k = 1; k < d.size(); ++k)
    if (d[k] < d[k - 1])
      throw bad(idx_path, detail::concat("has decreasing document indices (entry ", k, " = ", d[k], " < entry ", k - 1,
                                         " = ", d[k - 1], ")"));
  if (d.back() != static_cast<std::int64_t>(count))
    throw bad(idx_path, detail::concat("ends its document indices at ", d.back(), " but holds ", count, " sequences"));

  ds->num_tokens_ = expected / item;
  ds->bin_size_ = bin.size;
  ds->bin_ = bin.release();
  return ds;
}

IndexedDataset::~IndexedDataset() {
  if (bin_) munmap(const_cast<std::byte*>(bin_), bin_size_);
}

std::int64_t IndexedDataset::sequence_length(std::int64_t i) const {
  MZ_CHECK(i >= 0 && i < num_sequences(), "sequence ", i, " of ", num_sequences());
  return lengths_[static_cast<std::size_t>(i)];
}

void IndexedDataset::read(std::int64_t i, std::int64_t offset, std::int64_t count, std::int64_t* out) const {
  const std::int64_t len = sequence_length(i);
  MZ_CHECK(offset >= 0 && count >= 0 && offset + count <= len, "tokens [", offset, ", +", count, ") of a ", len,
           "-token sequence");
  const std::byte* src = bin_ + pointer(i) + offset * static_cast<std::int64_t>(token_dtype_size(dtype_));
  switch (dtype_) {
    case TokenDType::U8:
      return widen<std::uint8_t>(src, count, out);
    case TokenDType::I8:
      return widen<std::int8_t>(src, count, out);
    case TokenDType::I16:
      return widen<std::int16_t>(src, count, out);
    case TokenDType::U16:
      return widen<std::uint16_t>(src, count, out);
    case TokenDType::I32:
      return widen<std::int32_t>(src, count, out);
    case TokenDType::I64:
      return widen<std::int64_t>(src, count, out);
    default:
      MZ_CHECK(false, "float dataset passed validation");
  }
}

std::vector<std::int64_t> IndexedDataset::sequence(std::int64_t i) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(sequence_length(i)));
  read(i, 0, static_cast<std::int64_t>(out.size()), out.data());
  return out;
}

void IndexedDataset::check_view(std::int64_t i, TokenDType t) const {
  sequence_length(i);
  MZ_CHECK(t == dtype_, "typed view as ", token_dtype_name(t), " of a ", token_dtype_name(dtype_), " dataset");
}

// ------------------------------------------------------------------ writer

namespace {
constexpr std::size_t kFlushBytes = 4 << 20;

// write(2) until done; false with errno set on failure.
bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string prefix, TokenDType dtype, std::string flag)
    : prefix_(std::move(prefix)), flag_(std::move(flag)), dtype_(dtype) {
  MZ_REQUIRE(dtype != TokenDType::F32 && dtype != TokenDType::F64, flag_, " ", prefix_,
             ": token datasets hold integers, not ", token_dtype_name(dtype));
  const std::string tag = ".tmp-" + std::to_string(::getpid());
  bin_tmp_ = prefix_ + ".bin" + tag;
  idx_tmp_ = prefix_ + ".idx" + tag;
  bin_fd_ = ::open(bin_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (bin_fd_ < 0) fail(bin_tmp_, "cannot be created");
  buffer_.reserve(kFlushBytes + 65536);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  if (!finalized_) {
    ::unlink(bin_tmp_.c_str());
    ::unlink(idx_tmp_.c_str());
  }
}

void IndexedDatasetBuilder::fail(const std::string& file, const std::string& what) const {
  throw ConfigError(detail::concat(flag_, " ", prefix_, ": ", file, " ", what, " (", std::strerror(errno),
                                   "); check that the directory exists, is writable and has space"));
}

void IndexedDatasetBuilder::add_sequence_i64(const std::vector<std::int64_t>& tokens) {
  MZ_CHECK(!finalized_, "add_sequence after finalize");
  MZ_REQUIRE(tokens.size() <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), flag_, " ", prefix_,
             ": a sequence of ", tokens.size(), " tokens exceeds the format's int32 length; split the document");
  const std::size_t item = token_dtype_size(dtype_);
  std::int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case TokenDType::U8:
      hi = 255;
      break;
    case TokenDType::I8:
      lo = -128;
      hi = 127;
      break;
    case TokenDType::I16:
      lo = -32768;
      hi = 32767;
      break;
    case TokenDType::U16:
      hi = 65535;
      break;
    case TokenDType::I32:
      lo = std::numeric_limits<std::int32_t>::min();
      hi = std::numeric_limits<std::int32_t>::max();
      break;
    default:
      lo = std::numeric_limits<std::int64_t>::min();
      hi = std::numeric_limits<std::int64_t>::max();
  }
  for (const std::int64_t t : tokens) {
    MZ_REQUIRE(t >= lo && t <= hi, flag_, " ", prefix_, ": token id ", t, " does not fit ", token_dtype_name(dtype_),
               "; write the dataset with a wider dtype (int32)");
    char bytes[8];
    std::memcpy(bytes, &t, 8);  // little-endian: the low `item` bytes are the narrow value
    buffer_.insert(buffer_.end(), bytes, bytes + item);
  }
  if (buffer_.size() >= kFlushBytes) flush();
  lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
  num_tokens_ += static_cast<std::int64_t>(tokens.size());
}

void IndexedDatasetBuilder::flush() {
  if (!write_all(bin_fd_, buffer_.data(), buffer_.size())) fail(bin_tmp_, "could not be written");
  buffer_.clear();
}

void IndexedDatasetBuilder::end_document() { doc_index_.push_back(num_sequences()); }

void IndexedDatasetBuilder::finalize() {
  MZ_CHECK(!finalized_, "finalize twice");
  if (doc_index_.back() != num_sequences()) end_document();
  flush();
  if (::fsync(bin_fd_) != 0) fail(bin_tmp_, "could not be synced to disk");
  ::close(bin_fd_);
  bin_fd_ = -1;

  // The index: header, then lengths, byte pointers and document indices.
  const std::uint64_t count = lengths_.size(), doc_count = doc_index_.size();
  const auto code = static_cast<std::uint8_t>(dtype_);
  std::vector<char> idx;
  auto put = [&idx](const void* p, std::size_t n) {
    idx.insert(idx.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  };
  put(kMagic, sizeof kMagic);
  put(&kVersion, 8);
  put(&code, 1);
  put(&count, 8);
  put(&doc_count, 8);
  put(lengths_.data(), lengths_.size() * 4);
  std::int64_t ptr = 0;
  for (const auto len : lengths_) {
    put(&ptr, 8);
    ptr += len * static_cast<std::int64_t>(token_dtype_size(dtype_));
  }
  put(doc_index_.data(), doc_index_.size() * 8);
  const int fd = ::open(idx_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(idx_tmp_, "cannot be created");
  const bool ok = write_all(fd, idx.data(), idx.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) fail(idx_tmp_, "could not be written");

  // Old .idx out first: until the new one lands, readers see "no index", never
  // an old index over a new .bin.
  const std::string idx_final = prefix_ + ".idx", bin_final = prefix_ + ".bin";
  if (::unlink(idx_final.c_str()) != 0 && errno != ENOENT) fail(idx_final, "could not be replaced");
  if (::rename(bin_tmp_.c_str(), bin_final.c_str()) != 0) fail(bin_final, "could not be renamed into place");
  if (::rename(idx_tmp_.c_str(), idx_final.c_str()) != 0) fail(idx_final, "could not be renamed into place");
  const int dir = ::open(directory_of(prefix_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {  // make the renames durable
    ::fsync(dir);
    ::close(dir);
  }
  finalized_ = true;
}

}  // namespace megazero::data
