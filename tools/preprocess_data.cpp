// preprocess_data: tokenizes a text corpus into Megatron's indexed dataset
// (PREFIX.bin + PREFIX.idx, docs/DATA.md), one document per blank-line-separated
// block of --input (or per line with --json-lines), each followed by the
// end-of-text token with --append-eod.
//   preprocess_data --input kjv.txt --output-prefix data/corpus/kjv_text_document
//     --tokenizer-type GPT2BPETokenizer --vocab-file encoder.json --merge-file vocab.bpe --append-eod
//   (or --tokenizer-type Llama2Tokenizer --tokenizer-model tokenizer.model, a SentencePiece model;
//    or --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR, a Hugging Face tokenizer.json)
// A single process: the output is written once, crash-safely.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iostream>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/data/gpt2_tokenizer.h"
#include "megazero/data/indexed_dataset.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;
using namespace megazero::data;

namespace {

struct Args {
  std::string input, output_prefix, tokenizer_type, vocab_file, merge_file, tokenizer_model, json_key = "text";
  bool json_lines = false, append_eod = false, help = false;
};

po::options_description describe_options(Args& a) {
  po::options_description d("preprocess_data options");
  d.add_options()("help,h", po::bool_switch(&a.help), "print this help")(
      "input", po::value(&a.input),
      "text corpus: documents separated by blank lines (or JSON lines, see --json-lines)")(
      "json-lines", po::bool_switch(&a.json_lines),
      "--input holds one JSON object per line; its --json-key string is a document")(
      "json-key", po::value(&a.json_key)->default_value("text"), "the field holding the text with --json-lines")(
      "output-prefix", po::value(&a.output_prefix), "write PREFIX.bin and PREFIX.idx")(
      "tokenizer-type", po::value(&a.tokenizer_type),
      "GPT2BPETokenizer, ByteLevel, Llama2Tokenizer (SentencePiece, <s> first in each document) or "
      "GPTSentencePieceTokenizer")(
      "tokenizer-model", po::value(&a.tokenizer_model),
      "the SentencePiece model (tokenizer.model) of Llama2Tokenizer and GPTSentencePieceTokenizer, or the directory "
      "of HuggingFaceTokenizer's tokenizer.json and tokenizer_config.json")("vocab-file", po::value(&a.vocab_file),
                                                                            "GPT-2's encoder.json (GPT2BPETokenizer)")(
      "merge-file", po::value(&a.merge_file), "GPT-2's vocab.bpe (GPT2BPETokenizer)")(
      "append-eod", po::bool_switch(&a.append_eod), "end every document with the end-of-text token");
  return d;
}

Args parse(int argc, char** argv) {
  Args a;
  auto desc = describe_options(a);
  parse_command_line(argc, argv, desc, "preprocess_data");
  if (a.help) {
    std::cout << desc << "\n";
    return a;
  }
  MZ_REQUIRE(!a.input.empty(), "--input is required: the text corpus to tokenize");
  MZ_REQUIRE(!a.output_prefix.empty(), "--output-prefix is required: PREFIX of the PREFIX.bin/.idx to write");
  MZ_REQUIRE(!a.tokenizer_type.empty(), "--tokenizer-type is required: one of ", kTokenizerTypes);
  return a;
}

// Calls doc(text, where) for each document of the input.
template <typename F>
void for_each_document(const Args& a, F&& doc) {
  {
    std::error_code ec;
    MZ_REQUIRE(std::filesystem::exists(a.input, ec), "--input ", a.input, ": no such file; check the path");
    MZ_REQUIRE(!std::filesystem::is_directory(a.input, ec), "--input ", a.input,
               " is a directory; pass the text (or JSON-lines) file to tokenize");
  }
  std::ifstream in(a.input, std::ios::binary);
  MZ_REQUIRE(in.good(), "--input ", a.input, ": cannot be read; check its permissions");
  std::string line, text;
  std::int64_t lineno = 0, start = 1;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (a.json_lines) {
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(detail::concat("--input ", a.input, ": line ", lineno, " is not a JSON object (", e.what(),
                                         "); drop --json-lines for plain text"));
      }
      MZ_REQUIRE(j.is_object(), "--input ", a.input, ": line ", lineno,
                 " is not a JSON object; drop --json-lines for plain text");
      const auto field = j.find(a.json_key);
      MZ_REQUIRE(field != j.end() && field->is_string(), "--input ", a.input, ": line ", lineno, " has no \"",
                 a.json_key, "\" string; set --json-key to the field holding the text");
      doc(field->get_ref<const std::string&>(), lineno);
    } else if (line.find_first_not_of(" \t") == std::string::npos) {  // a blank line ends a document
      if (!text.empty()) doc(text, start);
      text.clear();
      start = lineno + 1;
    } else {
      if (!text.empty()) text += '\n';
      text += line;
    }
  }
  if (!a.json_lines && !text.empty()) doc(text, start);
  MZ_REQUIRE(!in.bad(), "--input ", a.input, ": read error after line ", lineno);
}

int preprocess(const Args& a) {
  auto tok = make_tokenizer(a.tokenizer_type, a.vocab_file, a.merge_file, a.tokenizer_model);
  const TokenDType dtype = token_dtype_for_vocab(tok->vocab_size());
  IndexedDatasetBuilder out(a.output_prefix, dtype);
  std::int64_t docs = 0, bytes = 0;
  double encode_s = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for_each_document(a, [&](const std::string& text, std::int64_t) {
    const auto e0 = std::chrono::steady_clock::now();
    std::vector<std::int32_t> ids = tok->encode(text);
    encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    if (ids.empty()) return;  // nothing to learn from an empty document
    if (a.append_eod) ids.push_back(tok->eod());
    out.add_sequence(ids);
    out.end_document();
    ++docs;
    bytes += static_cast<std::int64_t>(text.size());
  });
  MZ_REQUIRE(docs > 0, "--input ", a.input, ": holds no documents; nothing to write");
  out.finalize();
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("preprocess_data: %s.{bin,idx}: %lld documents, %lld tokens (%s, %s) from %lld bytes of text\n",
              a.output_prefix.c_str(), static_cast<long long>(docs), static_cast<long long>(out.num_tokens()),
              tok->name().c_str(), token_dtype_name(dtype), static_cast<long long>(bytes));
  std::printf("preprocess_data: %.2f s in all; tokenizer %.0f tokens/s, %.2f MB/s\n", total_s,
              static_cast<double>(out.num_tokens()) / std::max(encode_s, 1e-9),
              static_cast<double>(bytes) / 1e6 / std::max(encode_s, 1e-9));
  return 0;
}

int run(int argc, char** argv) {
  // One process writes the output; any failure is this process's alone, so it
  // exits as an agreed error (clean message, exit 2) rather than an MPI abort.
  try {
    MZ_REQUIRE(MpiCommunicator::world()->size() == 1, "preprocess_data runs as one process; start it without mpiexec");
    Args a = parse(argc, argv);
    return a.help ? 0 : preprocess(a);
  } catch (const AgreedConfigError&) {
    throw;
  } catch (const ConfigError& e) {
    throw AgreedConfigError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) { return run_main("preprocess_data", argc, argv, run); }
