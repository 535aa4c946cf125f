#include "megazero/train/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>

#include "megazero/core/error.h"
#include "megazero/train/tensorboard_event.pb.h"

namespace megazero::train {

namespace fs = std::filesystem;

namespace tfrecord {

// Debian has no C++ CRC32C package of its own (apt-cache search crc32c finds
// only python3-crc32c), but Boost.CRC, in the Boost headers megazero already
// builds with, computes any CRC: CRC32C is the Castagnoli polynomial
// 0x1EDC6F41, reflected in and out, initial value and final xor 0xffffffff.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

std::uint32_t crc32c(const void* data, std::size_t size) {
  Crc32c crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {
template <typename T>
void append_le(std::string& out, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
}  // namespace

std::string frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_le<std::uint64_t>(out, data.size());
  append_le<std::uint32_t>(out, masked_crc32c(out.data(), 8));
  out.append(data);
  append_le<std::uint32_t>(out, masked_crc32c(data.data(), data.size()));
  return out;
}

}  // namespace tfrecord

namespace {

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// double to float as IEEE round-to-nearest does it, without relying on the
// conversion of an out-of-range double (undefined in C++): beyond FLT_MAX by
// half an ulp or more is +-Inf, below that FLT_MAX. NaN and Inf pass through.
float to_float(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  if (std::isfinite(v) && std::fabs(v) > kMax) {
    const double overflow = std::ldexp(1.0, 128) - std::ldexp(1.0, 103);  // FLT_MAX + half an ulp
    const float magnitude =
        std::fabs(v) >= overflow ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::max();
    return std::copysign(magnitude, static_cast<float>(v > 0 ? 1 : -1));
  }
  return static_cast<float>(v);
}

// Writers of this process so far: the last part of the file name, as in
// TensorFlow's events.out.tfevents.<time>.<host>.<pid>.<uid>.
std::atomic<int> g_writers{0};

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) : dir_(dir) {
  MZ_REQUIRE(!dir.empty(), "--tensorboard-dir is empty: pass the directory for TensorBoard's event files");
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw ConfigError(detail::concat("--tensorboard-dir '", dir,
                                     "' is a file, not a directory: pass a directory (it is created if missing)"));
  fs::create_directories(dir, ec);
  if (!ec && !fs::is_directory(dir, ec) && !ec) ec = std::make_error_code(std::errc::not_a_directory);
  MZ_REQUIRE(!ec, "--tensorboard-dir: cannot create '", dir, "': ", ec.message(),
             "; pass a directory this process can create and write");

  const long long seconds = static_cast<long long>(std::time(nullptr));
  const std::string stem = detail::concat((fs::path(dir) / "events.out.tfevents.").string(), seconds, ".", hostname(),
                                          ".", static_cast<long long>(getpid()), ".");
  // Claim a name no other writer has (O_EXCL), then write it through a stream.
  for (;;) {
    path_ = stem + std::to_string(g_writers.fetch_add(1));
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    const int err = errno;
    if (fd >= 0) {
      ::close(fd);
      break;
    }
    MZ_REQUIRE(err == EEXIST, "--tensorboard-dir '", dir, "': cannot create '", path_, "': ", std::strerror(err),
               "; pass a directory this process can write");
  }
  errno = 0;
  out_.open(path_, std::ios::binary | std::ios::out | std::ios::trunc);
  check_stream("open");

  tensorboard::Event event;
  event.set_wall_time(wall_time_now());
  event.set_file_version("brain.Event:2");
  std::string data;
  MZ_CHECK(event.SerializeToString(&data), "serialising the file_version event");
  write_record(data);
  flush();  // the file is a valid event file from the start
}

TensorBoardWriter::~TensorBoardWriter() {
  if (!out_) return;  // a failed write threw already
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megazero: warning: %s\n", e.what());
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, std::int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(wall_time_now());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(to_float(value));
  std::string data;
  MZ_CHECK(event.SerializeToString(&data), "serialising the event of '", tag, "'");
  write_record(data);
}

void TensorBoardWriter::flush() {
  errno = 0;
  out_.flush();
  check_stream("flush");
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string record = tfrecord::frame(data);
  errno = 0;
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  check_stream("write");
}

void TensorBoardWriter::check_stream(const char* what) {
  if (out_) return;
  const int err = errno;
  throw ConfigError(detail::concat("--tensorboard-dir '", dir_, "': cannot ", what, " '", path_, "'",
                                   err != 0 ? ": " : "", err != 0 ? std::strerror(err) : "",
                                   "; check the directory's free space and permissions, or leave out "
                                   "--tensorboard-dir"));
}

}  // namespace megazero::train
