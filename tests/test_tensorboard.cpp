// TensorBoard event files (megazero/train/tensorboard_writer.h): written by
// the writer, then read back here without it: the TFRecord framing parsed by
// hand, both CRCs checked with a bitwise CRC32C of this file's own (not the
// writer's Boost.CRC), every record parsed with the generated protobuf
// classes. Also decoded by Python's protobuf where /usr/bin/python3 has it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/train/tensorboard_event.pb.h"
#include "megazero/train/tensorboard_writer.h"

namespace fs = std::filesystem;
using megazero::ConfigError;
using megazero::train::TensorBoardWriter;

namespace {

// ---- An independent reader -------------------------------------------------

// CRC32C bit by bit (reflected Castagnoli polynomial 0x82F63B78): the
// definition, not the writer's table-driven Boost.CRC.
std::uint32_t crc32c_bitwise(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t crc = 0xffffffffu;
  for (std::size_t i = 0; i < size; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::uint32_t masked(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c_bitwise(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::uint64_t read_le(const std::string& s, std::size_t pos, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[pos + i]);
  return v;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct ReadResult {
  std::vector<tensorboard::Event> events;
  std::string error;  // empty when every record was intact
};

ReadResult parse_records(const std::string& bytes) {
  ReadResult r;
  std::size_t pos = 0;
  for (int index = 0; pos < bytes.size(); ++index) {
    auto fail = [&](const char* what) {
      r.error = "record " + std::to_string(index) + ": " + what;
      return r;
    };
    if (bytes.size() - pos < 12) return fail("truncated header");
    const std::uint64_t length = read_le(bytes, pos, 8);
    if (masked(bytes.data() + pos, 8) != read_le(bytes, pos + 8, 4)) return fail("length CRC mismatch");
    if (length > bytes.size() - pos - 12 || bytes.size() - pos - 12 - length < 4) return fail("truncated data");
    const std::string data = bytes.substr(pos + 12, length);
    if (masked(data.data(), data.size()) != read_le(bytes, pos + 12 + length, 4)) return fail("data CRC mismatch");
    tensorboard::Event event;
    if (!event.ParseFromString(data)) return fail("not a tensorboard.Event");
    r.events.push_back(std::move(event));
    pos += 12 + length + 4;
  }
  return r;
}

ReadResult read_event_file(const std::string& path) { return parse_records(read_bytes(path)); }

void flip(std::string& bytes, std::size_t pos, unsigned mask) {
  bytes[pos] = static_cast<char>(static_cast<unsigned char>(bytes[pos]) ^ mask);
}

std::uint32_t float_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// A fresh directory under /tmp, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> n{0};
    path_ = fs::temp_directory_path() /
            ("mz_tensorboard_test." + std::to_string(getpid()) + "." + std::to_string(n.fetch_add(1)));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  return files;
}

struct Scalar {
  std::string tag;
  std::int64_t step;
  double value;
};

// What the writer should store: the float nearest the double, as IEEE
// round-to-nearest has it (spelled out beyond float's range, where C++'s
// conversion is undefined): +-Inf from FLT_MAX + half an ulp on.
float expected_float(double v) {
  const double max = std::numeric_limits<float>::max();
  if (!std::isfinite(v) || std::fabs(v) <= max) return static_cast<float>(v);
  const float inf = std::numeric_limits<float>::infinity();
  const float magnitude = std::fabs(v) >= std::ldexp(1.0, 128) - std::ldexp(1.0, 103) ? inf : static_cast<float>(max);
  return v < 0 ? -magnitude : magnitude;
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

std::vector<Scalar> sample_scalars() {
  return {
      {"lm loss", 1, 10.8125},
      {"lm loss", 2, 0.1},
      {"learning-rate", 1, 6e-5},
      {"learning-rate", 2, 0.0},
      {"loss-scale", 3, 65536.0},
      {"grad-norm", -7, -2.5},
      {"grad-norm", 0, -0.0},
      {"grad-norm", std::numeric_limits<std::int64_t>::max(), 1e-40},  // a float denormal
      {"grad-norm", std::numeric_limits<std::int64_t>::min(), 3.0},
      {"nan", 4, kNaN},
      {"nan", 5, std::copysign(kNaN, -1.0)},
      {"inf", 6, kInf},
      {"inf", 7, -kInf},
      {"overflow", 8, 1e300},
      {"overflow", 9, -1e300},
      {"largest float", 10, static_cast<double>(std::numeric_limits<float>::max())},
      {"validation loss/\xce\xbb", 11, 1.25},  // a '/' groups tags in TensorBoard; UTF-8 tag
      // Just below and at FLT_MAX + half an ulp: FLT_MAX, then Inf.
      {"rounding", 12, std::ldexp(1.0, 128) - std::ldexp(1.0, 103) - std::ldexp(1.0, 90)},
      {"rounding", 13, std::ldexp(1.0, 128) - std::ldexp(1.0, 103)},
  };
}

void expect_scalar(const tensorboard::Event& e, const Scalar& s, const std::string& where) {
  ASSERT_EQ(e.what_case(), tensorboard::Event::kSummary) << where;
  EXPECT_EQ(e.step(), s.step) << where;
  ASSERT_EQ(e.summary().value_size(), 1) << where;
  const auto& v = e.summary().value(0);
  EXPECT_EQ(v.tag(), s.tag) << where;
  // A oneof member: present even when 0, which is how TensorBoard finds scalars.
  ASSERT_EQ(v.value_case(), tensorboard::Summary::Value::kSimpleValue) << where;
  EXPECT_EQ(float_bits(v.simple_value()), float_bits(expected_float(s.value)))
      << where << ": got " << v.simple_value() << ", wrote " << s.value;
}

void expect_file_version(const tensorboard::Event& e, double t0, double t1) {
  ASSERT_EQ(e.what_case(), tensorboard::Event::kFileVersion);
  EXPECT_EQ(e.file_version(), "brain.Event:2");
  EXPECT_GE(e.wall_time(), t0);
  EXPECT_LE(e.wall_time(), t1);
}

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

// ---- CRC32C ----------------------------------------------------------------

TEST(TensorBoardCrc, KnownAnswer) {
  const std::string check = "123456789";
  EXPECT_EQ(megazero::train::tfrecord::crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_bitwise(check.data(), check.size()), 0xE3069283u);  // the reader's own
  EXPECT_EQ(megazero::train::tfrecord::crc32c("", 0), 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of ones.
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(megazero::train::tfrecord::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(megazero::train::tfrecord::crc32c(ones.data(), 32), 0x62A8AB43u);
}

TEST(TensorBoardCrc, LibraryAgreesWithTheDefinition) {
  std::string bytes;
  std::uint32_t x = 12345;
  for (int n = 0; n < 300; ++n) {
    EXPECT_EQ(megazero::train::tfrecord::crc32c(bytes.data(), bytes.size()), crc32c_bitwise(bytes.data(), bytes.size()))
        << n << " bytes";
    EXPECT_EQ(megazero::train::tfrecord::masked_crc32c(bytes.data(), bytes.size()), masked(bytes.data(), bytes.size()));
    x = x * 1103515245u + 12345u;
    bytes.push_back(static_cast<char>(x >> 24));
  }
}

TEST(TensorBoardCrc, FrameLayout) {
  const std::string data = "hello";
  const std::string rec = megazero::train::tfrecord::frame(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(read_le(rec, 0, 8), data.size());
  EXPECT_EQ(read_le(rec, 8, 4), masked(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(read_le(rec, 12 + data.size(), 4), masked(data.data(), data.size()));
}

// ---- Writing and reading back -------------------------------------------------

TEST(TensorBoardWriter, FileNameAndFirstRecord) {
  TempDir tmp;
  const double t0 = now();
  const auto seconds0 = static_cast<long long>(std::time(nullptr));
  std::string path;
  {
    TensorBoardWriter w(tmp.path().string());
    path = w.path();
    // The file_version record is flushed at once: the file is valid from the start.
    const ReadResult r = read_event_file(path);
    ASSERT_EQ(r.error, "");
    ASSERT_EQ(r.events.size(), 1u);
    expect_file_version(r.events[0], t0 - 1, now() + 1);
  }
  const auto files = files_in(tmp.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].string(), path);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  std::smatch m;
  const std::string name = files[0].filename().string();
  ASSERT_TRUE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.(\d+))"))) << name;
  EXPECT_GE(std::stoll(m[1]), seconds0);
  EXPECT_LE(std::stoll(m[1]), static_cast<long long>(std::time(nullptr)));
  EXPECT_EQ(m[2], std::string(host));
  EXPECT_EQ(std::stoll(m[3]), static_cast<long long>(getpid()));
}

TEST(TensorBoardWriter, ScalarsReadBack) {
  TempDir tmp;
  const auto scalars = sample_scalars();
  const double t0 = now();
  std::string path;
  {
    TensorBoardWriter w(tmp.path().string());
    path = w.path();
    for (const auto& s : scalars) w.add_scalar(s.tag, s.step, s.value);
  }  // the destructor flushes
  const double t1 = now();
  const ReadResult r = read_event_file(path);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.events.size(), scalars.size() + 1);
  expect_file_version(r.events[0], t0 - 1, t1 + 1);
  double last_time = r.events[0].wall_time();
  for (std::size_t i = 0; i < scalars.size(); ++i) {
    const auto& e = r.events[i + 1];
    expect_scalar(e, scalars[i], "scalar " + std::to_string(i));
    EXPECT_GE(e.wall_time(), last_time);
    EXPECT_LE(e.wall_time(), t1 + 1);
    last_time = e.wall_time();
  }
  // The edge values, spelled out.
  EXPECT_TRUE(std::isnan(r.events[10].summary().value(0).simple_value()));
  EXPECT_TRUE(std::signbit(r.events[11].summary().value(0).simple_value()));
  EXPECT_EQ(r.events[12].summary().value(0).simple_value(), std::numeric_limits<float>::infinity());
  EXPECT_EQ(r.events[13].summary().value(0).simple_value(), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(r.events[14].summary().value(0).simple_value(), std::numeric_limits<float>::infinity());
  EXPECT_EQ(r.events[15].summary().value(0).simple_value(), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(r.events[16].summary().value(0).simple_value(), std::numeric_limits<float>::max());
  EXPECT_TRUE(std::signbit(r.events[7].summary().value(0).simple_value()));  // -0.0
  EXPECT_EQ(r.events[18].summary().value(0).simple_value(), std::numeric_limits<float>::max());
  EXPECT_EQ(r.events[19].summary().value(0).simple_value(), std::numeric_limits<float>::infinity());
}

TEST(TensorBoardWriter, ThousandRecords) {
  TempDir tmp;
  std::vector<Scalar> scalars;
  for (int i = 0; i < 1000; ++i) {
    const double v = std::sin(i * 0.37) * std::pow(10.0, (i % 13) - 6);
    scalars.push_back({i % 3 == 0 ? "lm loss" : i % 3 == 1 ? "learning-rate" : "iteration-time", i / 3 - 50, v});
  }
  std::string path;
  {
    TensorBoardWriter w(tmp.path().string());
    path = w.path();
    for (const auto& s : scalars) w.add_scalar(s.tag, s.step, s.value);
    w.flush();
    // Flushed: a reader sees everything while the writer is still open.
    const ReadResult r = read_event_file(path);
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.events.size(), 1001u);
  }
  const ReadResult r = read_event_file(path);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.events.size(), 1001u);
  EXPECT_EQ(r.events[0].file_version(), "brain.Event:2");
  for (std::size_t i = 0; i < scalars.size(); ++i) {
    expect_scalar(r.events[i + 1], scalars[i], "record " + std::to_string(i + 1));
    if (testing::Test::HasFailure()) break;
  }
}

// The records' bytes as TensorBoard's schema has them, spelled out by hand
// (not from our .proto): field 1 wall_time (fixed64, tag 0x09), 2 step
// (varint, 0x10), 3 file_version (bytes, 0x1a), 5 summary (bytes, 0x2a);
// Summary.value 1 (0x0a); Value.tag 1 (0x0a), Value.simple_value 2 (fixed32,
// 0x15), a oneof member and so written even when it is 0.0.
TEST(TensorBoardWriter, WireBytesAsTensorBoardsSchema) {
  TempDir tmp;
  std::string path;
  {
    TensorBoardWriter w(tmp.path().string());
    path = w.path();
    w.add_scalar("x", 3, 0.0);
    w.add_scalar("lm loss", 300, 1.0);
  }
  const std::string bytes = read_bytes(path);
  std::vector<std::string> data;
  for (std::size_t pos = 0; pos < bytes.size();) {
    const std::size_t n = read_le(bytes, pos, 8);
    data.push_back(bytes.substr(pos + 12, n));
    pos += 12 + n + 4;
  }
  ASSERT_EQ(data.size(), 3u);
  for (const auto& d : data) ASSERT_EQ(d[0], '\x09');  // then 8 bytes of wall_time
  EXPECT_EQ(data[0].substr(9), std::string("\x1a\x0d"
                                           "brain.Event:2"));
  EXPECT_EQ(data[1].substr(9), std::string("\x10\x03\x2a\x0a\x0a\x08\x0a\x01x\x15\x00\x00\x00\x00", 14));
  // step 300 = varint ac 02; 1.0f = 0x3f800000.
  EXPECT_EQ(data[2].substr(9), std::string("\x10\xac\x02\x2a\x10\x0a\x0e\x0a\x07lm loss\x15\x00\x00\x80\x3f", 21));
}

TEST(TensorBoardWriter, FlushHandsRecordsToTheOs) {
  TempDir tmp;
  TensorBoardWriter w(tmp.path().string());
  w.add_scalar("lm loss", 1, 2.0);
  w.flush();
  ReadResult r = read_event_file(w.path());
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.events.size(), 2u);
  w.add_scalar("lm loss", 2, 1.5);
  w.flush();
  r = read_event_file(w.path());
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.events.size(), 3u);
  expect_scalar(r.events[2], {"lm loss", 2, 1.5}, "second flush");
}

TEST(TensorBoardWriter, TwoWritersTwoFiles) {
  TempDir tmp;
  TensorBoardWriter a(tmp.path().string());
  TensorBoardWriter b(tmp.path().string());
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("a", 1, 1.0);
  b.add_scalar("b", 1, 2.0);
  a.flush();
  b.flush();
  EXPECT_EQ(files_in(tmp.path()).size(), 2u);
  expect_scalar(read_event_file(a.path()).events.at(1), {"a", 1, 1.0}, "writer a");
  expect_scalar(read_event_file(b.path()).events.at(1), {"b", 1, 2.0}, "writer b");
}

TEST(TensorBoardWriter, CreatesMissingDirectories) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "runs" / "gpt" / "tb";
  TensorBoardWriter w(dir.string());
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(fs::path(w.path()).parent_path(), dir);
}

// ---- The reader can fail --------------------------------------------------------

TEST(TensorBoardReader, DetectsCorruption) {
  TempDir tmp;
  std::string path;
  {
    TensorBoardWriter w(tmp.path().string());
    path = w.path();
    w.add_scalar("lm loss", 1, 3.25);
    w.add_scalar("lm loss", 2, 3.0);
  }
  const std::string good = read_bytes(path);
  ASSERT_EQ(parse_records(good).error, "");
  const std::size_t rec1 = 12 + read_le(good, 0, 8) + 4;
  const std::size_t len1 = read_le(good, rec1, 8);
  const std::size_t rec2 = rec1 + 12 + len1 + 4;

  // The last byte of record 1's data is the float's top byte: the protobuf
  // still parses, to another value; only the CRC tells.
  std::string bad = good;
  flip(bad, rec1 + 12 + len1 - 1, 0x01);
  tensorboard::Event parsed;
  ASSERT_TRUE(parsed.ParseFromString(bad.substr(rec1 + 12, len1)));
  EXPECT_NE(parsed.summary().value(0).simple_value(), 3.25f);
  EXPECT_EQ(parse_records(bad).error, "record 1: data CRC mismatch");

  bad = good;
  flip(bad, rec2 + 2, 0x40);  // record 2's length
  EXPECT_EQ(parse_records(bad).error, "record 2: length CRC mismatch");

  bad = good;
  flip(bad, rec1 + 9, 0x80);  // record 1's length CRC
  EXPECT_EQ(parse_records(bad).error, "record 1: length CRC mismatch");

  bad = good;
  flip(bad, rec2 + 12 + read_le(good, rec2, 8), 0x04);  // record 2's data CRC
  EXPECT_EQ(parse_records(bad).error, "record 2: data CRC mismatch");

  EXPECT_EQ(parse_records(good.substr(0, good.size() - 1)).error, "record 2: truncated data");
  EXPECT_EQ(parse_records(good.substr(0, rec2 + 5)).error, "record 2: truncated header");
}

// ---- Errors name --tensorboard-dir ---------------------------------------------

TEST(TensorBoardWriter, DirectoryIsARegularFile) {
  TempDir tmp;
  const fs::path file = tmp.path() / "not_a_dir";
  std::ofstream(file) << "x";
  try {
    TensorBoardWriter w(file.string());
    FAIL() << "no error for a regular file";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tensorboard-dir '" + file.string() + "' is a file, not a directory"), std::string::npos)
        << msg;
  }
  // ... and a directory under it cannot be created.
  try {
    TensorBoardWriter w((file / "tb").string());
    FAIL() << "no error for a directory under a regular file";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tensorboard-dir: cannot create '" + (file / "tb").string() + "'"), std::string::npos) << msg;
  }
}

// A write the OS refuses (here: beyond RLIMIT_FSIZE, with SIGXFSZ ignored, as
// on a full disk) is a ConfigError naming the flag; the destructor only warns.
TEST(TensorBoardWriter, WriteFailureNamesTheFlag) {
  TempDir tmp;
  struct Restore {
    rlimit limit{};
    void (*handler)(int) = nullptr;
    ~Restore() {
      setrlimit(RLIMIT_FSIZE, &limit);
      std::signal(SIGXFSZ, handler);
    }
  } restore;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &restore.limit), 0);
  restore.handler = std::signal(SIGXFSZ, SIG_IGN);
  TensorBoardWriter w(tmp.path().string());
  rlimit small = restore.limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    for (int i = 0; i < 10000; ++i) w.add_scalar("lm loss", i, 1.0);
    w.flush();
    FAIL() << "no error writing beyond RLIMIT_FSIZE";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tensorboard-dir '" + tmp.path().string() + "': cannot "), std::string::npos) << msg;
    EXPECT_NE(msg.find(w.path() + "': File too large; check the directory's free space"), std::string::npos) << msg;
  }
}

TEST(TensorBoardWriter, UncreatableDirectory) {
  // /proc refuses new directories, even to root.
  try {
    TensorBoardWriter w("/proc/megazero-tensorboard");
    FAIL() << "no error for /proc/megazero-tensorboard";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tensorboard-dir: cannot create '/proc/megazero-tensorboard'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pass a directory this process can create and write"), std::string::npos) << msg;
  }
  EXPECT_THROW(TensorBoardWriter(""), ConfigError);
}

// ---- Python's protobuf agrees -------------------------------------------------

#if defined(MZ_TEST_PYTHON) && defined(MZ_TENSORBOARD_PY_DIR)
namespace {
// Decodes an event file with Python alone: struct for the framing, a CRC32C of
// its own, the protobuf module (python3-protobuf) and tensorboard_event_pb2
// from protoc for the records. One JSON line per event.
constexpr const char* kDecodePy = R"PY(
import json, struct, sys
sys.path.insert(0, sys.argv[1])
import tensorboard_event_pb2 as pb

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283
raw = open(sys.argv[2], "rb").read()
pos = 0
while pos < len(raw):
    length, length_crc = struct.unpack_from("<QI", raw, pos)
    assert masked(raw[pos:pos + 8]) == length_crc, "length CRC at %d" % pos
    data = raw[pos + 12:pos + 12 + length]
    (data_crc,) = struct.unpack_from("<I", raw, pos + 12 + length)
    assert masked(data) == data_crc, "data CRC at %d" % pos
    event = pb.Event.FromString(data)
    if event.WhichOneof("what") == "file_version":
        print(json.dumps(["file_version", event.file_version]))
    else:
        for v in event.summary.value:
            assert v.WhichOneof("value") == "simple_value", v
            print(json.dumps([v.tag, event.step, struct.pack("<f", v.simple_value).hex()]))
    pos += 12 + length + 4
print("end")
)PY";

bool run(const std::string& cmd, std::string* output) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  return pclose(p) == 0;
}
}  // namespace

TEST(TensorBoardPython, DecodesWithGoogleProtobuf) {
  const std::string python = MZ_TEST_PYTHON;
  if (std::system((python + " -c 'import google.protobuf' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << python << " has no google.protobuf (Debian: python3-protobuf, tools/install_deps.sh)";
  TempDir tmp;
  const fs::path script = tmp.path() / "decode.py";
  std::ofstream(script) << kDecodePy;
  const fs::path dir = tmp.path() / "tb";
  std::vector<Scalar> scalars;
  for (const auto& s : sample_scalars())
    if (s.tag.find('\xce') == std::string::npos) scalars.push_back(s);  // ASCII tags: the JSON below is plain
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    for (const auto& s : scalars) w.add_scalar(s.tag, s.step, s.value);
  }
  std::string expected = "[\"file_version\", \"brain.Event:2\"]\n";
  for (const auto& s : scalars) {
    const std::uint32_t b = float_bits(expected_float(s.value));
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%02x%02x%02x%02x", b & 0xff, (b >> 8) & 0xff, (b >> 16) & 0xff, b >> 24);
    expected += "[\"" + s.tag + "\", " + std::to_string(s.step) + ", \"" + hex + "\"]\n";
  }
  expected += "end\n";
  std::string out;
  const bool ok = run(python + " '" + script.string() + "' '" MZ_TENSORBOARD_PY_DIR "' '" + path + "' 2>&1", &out);
  EXPECT_TRUE(ok) << out;
  EXPECT_EQ(out, expected);
}
#endif
