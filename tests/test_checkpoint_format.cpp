// Checkpoint building blocks on one process: the safetensors reader refuses
// every kind of damaged file with a message naming it (and never reads outside
// the file), checksums catch flipped data bits, the manifest round-trips, and
// resharding maps every element of every new shard to the right saved element
// (checked one element at a time against coordinates computed independently).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/checkpoint/file_io.h"
#include "megazero/checkpoint/reshard.h"
#include "megazero/checkpoint/safetensors.h"
#include "megazero/core/error.h"

using namespace megazero;
using namespace megazero::checkpoint;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  char tmpl[] = "/tmp/mz-ckpt-format-XXXXXX";
  return fs::path(::mkdtemp(tmpl));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A file with three tensors.
fs::path write_sample(const fs::path& dir, std::vector<float>& a, std::vector<std::int64_t>& b) {
  a = {1.5f, -2.25f, 3.0f, 4.0f, 5.0f, 6.0f};
  b = {7, -8, 9};
  const double c = 3.25;
  SafetensorsWriter w;
  w.set_metadata("format", "test");
  w.add("a", DType::F32, {2, 3}, a.data());
  w.add("b", DType::I64, {3}, b.data());
  w.add("c", DType::F64, {}, &c);
  const fs::path p = dir / "sample.safetensors";
  const std::uint64_t h = w.write(p.string());
  EXPECT_EQ(h, file_xxh3(p.string()));
  return p;
}

std::string expect_refused(const fs::path& p) {
  try {
    SafetensorsFile f(p.string());
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(p.string()), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "accepted a damaged file " << p;
  return "";
}

// Header text and data of a valid file, for crafting damaged ones.
std::string with_header(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return s + header + data;
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  const fs::path dir = temp_dir();
  std::vector<float> a;
  std::vector<std::int64_t> b;
  const fs::path p = write_sample(dir, a, b);
  SafetensorsFile f(p.string());
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "test");
  EXPECT_EQ(f.entry("a").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(f.entry("c").shape.size(), 0u);
  const auto* pa = reinterpret_cast<const float*>(f.data("a"));
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(pa[i], a[i]);
  const auto* pb = reinterpret_cast<const std::int64_t*>(f.data("b"));
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(pb[i], b[i]);
  EXPECT_EQ(*reinterpret_cast<const double*>(f.data("c")), 3.25);
  // Data starts 8-byte aligned, as the format asks.
  EXPECT_EQ((reinterpret_cast<std::uintptr_t>(f.data("a")) - reinterpret_cast<std::uintptr_t>(f.data("a")) % 8) % 8,
            0u);
  EXPECT_THROW(f.entry("nope"), ConfigError);
  fs::remove_all(dir);
}

TEST(Safetensors, EveryTruncationIsRefused) {
  const fs::path dir = temp_dir();
  std::vector<float> a;
  std::vector<std::int64_t> b;
  const std::string good = slurp(write_sample(dir, a, b));
  const fs::path p = dir / "cut.safetensors";
  for (std::size_t len = 0; len < good.size(); ++len) {
    spit(p, good.substr(0, len));
    SCOPED_TRACE(len);
    expect_refused(p);
  }
  fs::remove_all(dir);
}

TEST(Safetensors, DamagedHeadersAreRefused) {
  const fs::path dir = temp_dir();
  const fs::path p = dir / "bad.safetensors";
  const std::string data(24, 'x');
  struct Case {
    std::string header, expect;
  };
  const Case cases[] = {
      {"not json", "not JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"t": {"dtype": "F32", "shape": [2]}})", "needs dtype, shape and data_offsets"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}})", "outside"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}})", "outside"},
      {R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", "do not match"},
      {R"({"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", "negative"},
      {R"({"t": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 16]}})", "do not match"},
      {R"({"t": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 16]}})", "unsupported dtype"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [-1, 16]}})", "data_offsets"},
      {R"({"s": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
          "t": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
       "overlap"},
      {R"({"__metadata__": {"k": 3}})", "not a string"},
  };
  for (const auto& c : cases) {
    spit(p, with_header(c.header, data));
    const std::string what = expect_refused(p);
    EXPECT_NE(what.find(c.expect), std::string::npos) << c.header << " -> " << what;
  }
  // A header length that claims more than the limit or the file.
  std::string huge(8, '\xff');
  spit(p, huge + "{}");
  EXPECT_NE(expect_refused(p).find("corrupt length"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Safetensors, FlippedDataBitsChangeTheChecksum) {
  const fs::path dir = temp_dir();
  std::vector<float> a;
  std::vector<std::int64_t> b;
  const fs::path p = write_sample(dir, a, b);
  const std::uint64_t good = file_xxh3(p.string());
  std::string bytes = slurp(p);
  for (std::size_t pos : {bytes.size() - 1, bytes.size() / 2, std::size_t{9}}) {
    std::string flipped = bytes;
    flipped[pos] = static_cast<char>(flipped[pos] ^ 0x10);
    spit(p, flipped);
    EXPECT_NE(file_xxh3(p.string()), good) << "flip at " << pos;
  }
  fs::remove_all(dir);
}

TEST(Manifest, RoundTripsAndRefusesDamage) {
  Manifest m;
  m.state.iteration = 42;
  m.state.consumed_samples = 42 * 16;
  m.state.seed = 1234;
  m.state.loss_scaler = {true, 65536.0, 17, 3, 1};
  m.state.config = "num-layers = 2\nhidden-size = 64\n";
  m.tp = 2;
  m.dp = 1;
  m.stage = 3;
  m.params_dtype = "bf16";
  m.parameters.push_back({"embedding.word.weight", {256, 64}, 0, 97});
  m.parameters.push_back({"final_ln.bias", {64}, -1, -1});
  m.files.push_back({"shard_tp000_dp00000.safetensors", 0, 0, 1000, 0x0123456789abcdefULL});
  m.files.push_back({"shard_tp001_dp00000.safetensors", 1, 0, 1001, 0xfedcba9876543210ULL});
  const Manifest r = Manifest::parse(m.to_json(), "m.json");
  EXPECT_EQ(r.to_json(), m.to_json());
  EXPECT_EQ(r.state.loss_scaler.scale, 65536.0);
  EXPECT_EQ(r.files[1].xxh3, 0xfedcba9876543210ULL);
  EXPECT_EQ(r.parameters[0].padding_from_row, 97);
  EXPECT_THROW(Manifest::parse("{", "m.json"), ConfigError);
  EXPECT_THROW(Manifest::parse(R"({"format": "other"})", "m.json"), ConfigError);
  std::string escape = m.to_json();
  escape.replace(escape.find("shard_tp001"), 11, "../../etc/x");
  EXPECT_THROW(Manifest::parse(escape, "m.json"), ConfigError);
  std::string missing = m.to_json();
  missing.replace(missing.find("\"tp_rank\": 1"), 12, "\"tp_rank\": \"1\"");
  EXPECT_THROW(Manifest::parse(missing, "m.json"), ConfigError);
}

// ---------------------------------------------------------------- reshard
namespace {

std::vector<std::int64_t> local_shape(const ShardLayout& l) {
  auto s = l.global_shape;
  if (l.split_dim >= 0) s[static_cast<std::size_t>(l.split_dim)] /= l.parts;
  return s;
}

// Global coordinates of local element i of shard `part` (independent of reshard.cpp).
std::vector<std::int64_t> coords_of(const ShardLayout& l, int part, std::int64_t i) {
  const auto s = local_shape(l);
  std::vector<std::int64_t> c(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    c[d] = i % s[d];
    i /= s[d];
  }
  if (l.split_dim >= 0) c[static_cast<std::size_t>(l.split_dim)] += part * s[static_cast<std::size_t>(l.split_dim)];
  return c;
}

void check_mapping(const ShardLayout& dst, const ShardLayout& src, std::mt19937& rng) {
  const std::int64_t n = shard_numel(dst);
  for (int part = 0; part < (dst.split_dim < 0 ? 1 : dst.parts); ++part) {
    for (int trial = 0; trial < 4; ++trial) {
      std::int64_t b = trial == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<unsigned>(n));
      std::int64_t e = trial == 0 ? n : b + static_cast<std::int64_t>(rng() % static_cast<unsigned>(n - b + 1));
      const auto runs = map_shard_range(dst, part, src, b, e);
      std::int64_t at = b;
      const auto sl = local_shape(src);
      for (const auto& r : runs) {
        ASSERT_EQ(r.dst, at) << "runs must tile the range in order";
        ASSERT_GT(r.length, 0);
        for (std::int64_t k = 0; k < r.length; ++k) {
          const auto c = coords_of(dst, part, r.dst + k);
          if (c[0] >= src.global_shape[0]) {  // rows the saved layout did not have are padding
            ASSERT_EQ(r.src_part, -1);
            continue;
          }
          ASSERT_GE(r.src_part, 0);
          // The saved shard holding c, and c's local index there.
          auto cs = c;
          int sp = 0;
          if (src.split_dim >= 0) {
            const auto d = static_cast<std::size_t>(src.split_dim);
            sp = static_cast<int>(c[d] / sl[d]);
            cs[d] -= sp * sl[d];
          }
          std::int64_t li = 0;
          for (std::size_t d = 0; d < cs.size(); ++d) li = li * sl[d] + cs[d];
          ASSERT_EQ(r.src_part, sp);
          ASSERT_EQ(r.src + k, li);
        }
        at += r.length;
      }
      ASSERT_EQ(at, e);
    }
  }
}

}  // namespace

TEST(Reshard, EveryElementLandsWhereItsCoordinatesSay) {
  std::mt19937 rng(5);
  struct Param {
    std::vector<std::int64_t> shape;
    int split;
  };
  const Param params[] = {{{24, 6}, 0}, {{6, 24}, 1},  {{4, 12, 3}, 1}, {{2, 3, 8}, 2},
                          {{24}, 0},    {{10, 4}, -1}, {{7}, -1}};
  for (const auto& p : params)
    for (int from : {1, 2, 4})
      for (int to : {1, 2, 4, 3}) {
        ShardLayout dst{p.shape, p.split, to}, src{p.shape, p.split, from};
        if (p.split >= 0 &&
            (p.shape[static_cast<std::size_t>(p.split)] % to || p.shape[static_cast<std::size_t>(p.split)] % from))
          continue;
        SCOPED_TRACE(testing::Message() << "split " << p.split << " TP " << from << " -> " << to);
        check_mapping(dst, src, rng);
      }
}

TEST(Reshard, PaddedVocabularyRowsBecomeZerosOrAreDropped) {
  std::mt19937 rng(7);
  // The vocabulary is padded to a multiple of 4 x TP: 100 rows at TP 1, 104 at TP 2, 112 at TP 4.
  for (auto [from, rows_from] : {std::pair{1, 100}, {2, 104}, {4, 112}})
    for (auto [to, rows_to] : {std::pair{1, 100}, {2, 104}, {4, 112}}) {
      SCOPED_TRACE(testing::Message() << "TP " << from << " -> " << to);
      check_mapping({{rows_to, 6}, 0, to}, {{rows_from, 6}, 0, from}, rng);
    }
}
