// preprocess_data: tokenizes a text corpus into Megatron's indexed dataset
// (PREFIX.bin + PREFIX.idx, docs/DATA.md), one document per blank-line-separated
// block of --input (or per line with --json-lines), each followed by the
// end-of-text token with --append-eod.
//   preprocess_data --input kjv.txt --output-prefix data/corpus/kjv_text_document
//     --tokenizer-type GPT2BPETokenizer --vocab-file encoder.json --merge-file vocab.bpe --append-eod
//   (or --tokenizer-type Llama2Tokenizer --tokenizer-model tokenizer.model, a SentencePiece model;
//    or --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR, a Hugging Face tokenizer.json)
// A single process (--workers threads tokenize at once): the output is
// written once, crash-safely. Megatron's tools/preprocess_data.py's flags are
// taken (--json-keys writes its PREFIX_KEY_document names) or refused by name.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <iostream>
#include <set>
#include <thread>

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
  std::vector<std::string> json_keys;  // Megatron's --json-keys: a dataset a key, PREFIX_KEY_document
  bool json_lines = false, append_eod = false, help = false;
  int workers = 1;
  std::int64_t log_interval = 0;
  std::int64_t vocab_size = 0;  // NullTokenizer's
  // Megatron's flags megazero does not do (refused) or needs not (noted).
  bool split_sentences = false, keep_newlines = false, keep_sequential_samples = false;
  std::string lang;
  int partitions = 1;
};

po::options_description describe_options(Args& a) {
  po::options_description d("preprocess_data options");
  d.add_options()("help,h", po::bool_switch(&a.help), "print this help")(
      "input", po::value(&a.input),
      "text corpus: documents separated by blank lines (or JSON lines, see --json-lines)")(
      "json-lines", po::bool_switch(&a.json_lines),
      "--input holds one JSON object per line; its --json-key string is a document")(
      "json-key", po::value(&a.json_key)->default_value("text"), "the field holding the text with --json-lines")(
      "json-keys", po::value(&a.json_keys)->multitoken(),
      "Megatron's: --input holds JSON lines, and each of these fields is a dataset of its own, "
      "PREFIX_KEY_document.{bin,idx}")("output-prefix", po::value(&a.output_prefix),
                                       "write PREFIX.bin and PREFIX.idx (with --json-keys: PREFIX_KEY_document.*)")(
      "tokenizer-type", po::value(&a.tokenizer_type),
      "GPT2BPETokenizer, ByteLevel, Llama2Tokenizer (SentencePiece, <s> first in each document), "
      "GPTSentencePieceTokenizer, HuggingFaceTokenizer or NullTokenizer (the text already ids, decimal and "
      "space-separated, below --vocab-size)")(
      "tokenizer-model", po::value(&a.tokenizer_model),
      "the SentencePiece model (tokenizer.model) of Llama2Tokenizer and GPTSentencePieceTokenizer, or the directory "
      "of HuggingFaceTokenizer's tokenizer.json and tokenizer_config.json")("vocab-file", po::value(&a.vocab_file),
                                                                            "GPT-2's encoder.json (GPT2BPETokenizer)")(
      "merge-file", po::value(&a.merge_file), "GPT-2's vocab.bpe (GPT2BPETokenizer)")(
      "vocab-size", po::value(&a.vocab_size),
      "NullTokenizer's vocabulary (Megatron's): ids 0 to N-1 in the text; --append-eod writes N")(
      "append-eod", po::bool_switch(&a.append_eod), "end every document with the end-of-text token")(
      "workers", po::value(&a.workers)->default_value(1),
      "threads that tokenize documents at once (Megatron's --workers); the output is the same for any number")(
      "log-interval", po::value(&a.log_interval)->default_value(0),
      "print progress every this many documents (Megatron's); 0 = only the summary")(
      "partitions", po::value(&a.partitions)->default_value(1),
      "Megatron's input split for its worker processes: accepted, no effect (--workers threads share the input)")(
      "split-sentences", po::bool_switch(&a.split_sentences), "Megatron's sentence splitting: refused (see the error)")(
      "keep-newlines", po::bool_switch(&a.keep_newlines), "Megatron's, with --split-sentences: refused")(
      "lang", po::value(&a.lang), "Megatron's, with --split-sentences: refused")(
      "keep-sequential-samples", po::bool_switch(&a.keep_sequential_samples),
      "Megatron's: accepted, no effect (documents are always written in the input's order)");
  return d;
}

Args parse(int argc, char** argv) {
  Args a;
  auto desc = describe_options(a);
  const auto vm = parse_command_line(argc, argv, desc, "preprocess_data");
  if (a.help) {
    std::cout << desc << "\n";
    return a;
  }
  MZ_REQUIRE(!a.input.empty(), "--input is required: the text corpus to tokenize");
  MZ_REQUIRE(!a.output_prefix.empty(), "--output-prefix is required: PREFIX of the PREFIX.bin/.idx to write");
  MZ_REQUIRE(!a.tokenizer_type.empty(), "--tokenizer-type is required: one of ", kTokenizerTypes);
  MZ_REQUIRE(!a.split_sentences && !a.keep_newlines && a.lang.empty(),
             a.split_sentences ? "--split-sentences"
             : a.keep_newlines ? "--keep-newlines"
                               : "--lang",
             ": Megatron's sentence splitting (NLTK's punkt, for BERT-style sentence datasets) is not implemented: "
             "each document is kept whole, as GPT training reads it; drop the flag");
  MZ_REQUIRE(a.workers >= 1 && a.workers <= 1024, "--workers must be 1 to 1024, got ", a.workers);
  MZ_REQUIRE(a.partitions >= 1, "--partitions must be positive, got ", a.partitions);
  MZ_REQUIRE(a.log_interval >= 0, "--log-interval must not be negative, got ", a.log_interval);
  if (!a.json_keys.empty()) {
    MZ_REQUIRE(vm["json-key"].defaulted(),
               "--json-keys (Megatron's: a dataset a key) and --json-key (one dataset at PREFIX) both name the "
               "fields; keep one");
    a.json_lines = true;
    std::set<std::string> seen;
    for (const auto& k : a.json_keys)
      MZ_REQUIRE(!k.empty() && seen.insert(k).second, "--json-keys: '", k, "' is empty or given twice");
  }
  if (a.partitions > 1)
    std::printf("preprocess_data: note: --partitions %d has no effect: --workers threads share the input\n",
                a.partitions);
  return a;
}

// The datasets written: PREFIX, or with --json-keys PREFIX_KEY_document (Megatron's names).
std::vector<std::string> output_prefixes(const Args& a) {
  if (a.json_keys.empty()) return {a.output_prefix};
  std::vector<std::string> out;
  for (const auto& k : a.json_keys) out.push_back(a.output_prefix + "_" + k + "_document");
  return out;
}

// A plain-text --input whose first line is a JSON object with a string field:
// JSON lines (Megatron's only input format) read as text would be tokenized
// with their braces and quotes, one document for the whole file.
void refuse_json_as_text(const Args& a, const std::string& first_line) {
  if (a.json_lines || first_line.empty() || first_line.front() != '{') return;
  const auto j = nlohmann::json::parse(first_line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  for (const auto& item : j.items())
    MZ_REQUIRE(!item.value().is_string(), "--input ", a.input, ": its first line is a JSON object (\"", item.key(),
               "\": a string): the file is JSON lines, Megatron's input format; add --json-lines "
               "(--json-key NAME for the text's field, \"text\" by default) or --json-keys NAME");
}

// Calls doc(texts, line) for each document of the input: one text, or one per --json-keys key.
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
  const std::vector<std::string> keys = a.json_keys.empty() ? std::vector<std::string>{a.json_key} : a.json_keys;
  std::vector<std::string> texts(keys.size());
  std::string line, text;
  std::int64_t lineno = 0, start = 1;
  bool first = true;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (first && line.find_first_not_of(" \t") != std::string::npos) {
      refuse_json_as_text(a, line);
      first = false;
    }
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
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const auto field = j.find(keys[k]);
        MZ_REQUIRE(field != j.end() && field->is_string(), "--input ", a.input, ": line ", lineno, " has no \"",
                   keys[k], "\" string; set ", a.json_keys.empty() ? "--json-key" : "--json-keys",
                   " to the field holding the text");
        texts[k] = field->get<std::string>();
      }
      doc(texts, lineno);
    } else if (line.find_first_not_of(" \t") == std::string::npos) {  // a blank line ends a document
      if (!text.empty()) doc(std::vector<std::string>{text}, start);
      text.clear();
      start = lineno + 1;
    } else {
      if (!text.empty()) text += '\n';
      text += line;
    }
  }
  if (!a.json_lines && !text.empty()) doc(std::vector<std::string>{text}, start);
  MZ_REQUIRE(!in.bad(), "--input ", a.input, ": read error after line ", lineno);
}

int preprocess(const Args& a) {
  // One tokenizer a worker (their caches are their own): the files read once, then copied.
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(make_tokenizer(a.tokenizer_type, a.vocab_file, a.merge_file, a.tokenizer_model, a.vocab_size));
  while (toks.size() < static_cast<std::size_t>(a.workers)) toks.push_back(toks.front()->clone());
  const Tokenizer& tok = *toks.front();
  const TokenDType dtype = token_dtype_for_vocab(tok.vocab_size());
  const auto prefixes = output_prefixes(a);
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> outs;
  for (const auto& p : prefixes) outs.push_back(std::make_unique<IndexedDatasetBuilder>(p, dtype));
  std::vector<std::int64_t> docs(prefixes.size(), 0), bytes(prefixes.size(), 0);
  double encode_s = 0;
  std::int64_t read = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // Documents are tokenized a batch at a time, the batch's documents dealt to
  // the workers in turn, and written in the input's order.
  constexpr std::size_t kBatchDocs = 4096;
  std::vector<std::vector<std::string>> batch;
  std::vector<std::vector<std::vector<std::int32_t>>> ids;  // [document][key]
  auto flush = [&] {
    const auto e0 = std::chrono::steady_clock::now();
    ids.assign(batch.size(), {});
    auto encode = [&](std::size_t w) {
      for (std::size_t d = w; d < batch.size(); d += toks.size())
        for (const auto& text : batch[d]) ids[d].push_back(toks[w]->encode(text));
    };
    if (toks.size() == 1 || batch.size() == 1) {
      encode(0);
    } else {
      std::vector<std::thread> workers;
      std::vector<std::exception_ptr> errors(toks.size());
      for (std::size_t w = 0; w < toks.size(); ++w)
        workers.emplace_back([&, w] {
          try {
            encode(w);
          } catch (...) {
            errors[w] = std::current_exception();
          }
        });
      for (auto& t : workers) t.join();
      for (const auto& e : errors)
        if (e) std::rethrow_exception(e);
    }
    encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    for (std::size_t d = 0; d < batch.size(); ++d)
      for (std::size_t k = 0; k < outs.size(); ++k) {
        auto& doc_ids = ids[d][k];
        if (doc_ids.empty()) continue;  // nothing to learn from an empty document
        if (a.append_eod) doc_ids.push_back(tok.eod());
        outs[k]->add_sequence(doc_ids);
        outs[k]->end_document();
        ++docs[k];
        bytes[k] += static_cast<std::int64_t>(batch[d][k].size());
      }
    batch.clear();
  };
  for_each_document(a, [&](const std::vector<std::string>& texts, std::int64_t) {
    batch.push_back(texts);
    ++read;
    if (a.log_interval > 0 && read % a.log_interval == 0) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("preprocess_data: %lld documents read in %.1f s\n", static_cast<long long>(read), s);
      std::fflush(stdout);
    }
    if (batch.size() == kBatchDocs) flush();
  });
  flush();
  for (std::size_t k = 0; k < outs.size(); ++k)
    MZ_REQUIRE(docs[k] > 0, "--input ", a.input, ": holds no documents",
               a.json_keys.empty() ? std::string() : " with text in \"" + a.json_keys[k] + "\"", "; nothing to write");
  for (auto& o : outs) o->finalize();
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::int64_t all_tokens = 0, all_bytes = 0;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    std::printf("preprocess_data: %s.{bin,idx}: %lld documents, %lld tokens (%s, %s) from %lld bytes of text\n",
                prefixes[k].c_str(), static_cast<long long>(docs[k]), static_cast<long long>(outs[k]->num_tokens()),
                tok.name().c_str(), token_dtype_name(dtype), static_cast<long long>(bytes[k]));
    all_tokens += outs[k]->num_tokens();
    all_bytes += bytes[k];
  }
  std::printf("preprocess_data: %.2f s in all; tokenizer%s %.0f tokens/s, %.2f MB/s\n", total_s,
              a.workers > 1 ? detail::concat(" (", a.workers, " workers)").c_str() : "",
              static_cast<double>(all_tokens) / std::max(encode_s, 1e-9),
              static_cast<double>(all_bytes) / 1e6 / std::max(encode_s, 1e-9));
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
