// generate_text: a prompt's continuation from a pretrain_gpt checkpoint (or a
// Hugging Face import), on the CPU or a GPU (docs/GENERATION.md).
//   generate_text --load runs/ckpt --prompt "In the beginning" --vocab-file encoder.json
//       --merge-file vocab.bpe --max-new-tokens 40 --top-p 0.9 --seed 7
//   generate_text --load runs/ckpt --prompt-tokens 464,3290,318 --greedy
// One process runs the model at TP 1; under mpiexec -n N the model is split
// over the N ranks at TP N (a model too large for one device), every rank
// drawing the same tokens and rank 0 printing them. A checkpoint of any
// TP x DP x ZeRO layout loads.
//   mpiexec -n 2 generate_text --load runs/ckpt --prompt-tokens 464,3290 --device cuda
// --logprobs --max-new-tokens 0 scores a text: each token's log-probability.
#include <boost/program_options.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/data/gpt2_tokenizer.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"
#include "tools/generation_model.h"
#include "tools/text_generation.h"

namespace po = boost::program_options;
using namespace megazero;
using I = std::int64_t;

namespace {

std::string ids_text(const std::vector<I>& ids) {
  std::string s;
  for (I t : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(t);
  }
  return s;
}

// --output's JSON. Tokens may end inside a UTF-8 character (byte-level
// vocabularies): invalid bytes become U+FFFD.
void write_output(const std::string& output, const nlohmann::json& j) {
  std::ofstream out(output);
  MZ_REQUIRE(out.good(), "--output ", output, ": cannot be written");
  out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  out.close();
  MZ_REQUIRE(out.good(), "--output ", output, ": write failed (disk full?)");
}

// --beam-width: the hypotheses, best first, each with its score; --output gets them as JSON.
int run_beam_search(hf::CheckpointModel& model, const data::Tokenizer* tok, Communicator& world,
                    const std::vector<I>& ids, generation::BeamOptions beam, const generation::GenerateOptions& o,
                    const std::string& output) {
  const bool root = world.rank() == 0;
  beam.max_new_tokens = o.max_new_tokens;
  beam.stop_token = o.stop_token;
  beam.no_newline_after_colon = o.no_newline_after_colon;
  beam.lines = o.lines;
  const auto t0 = std::chrono::steady_clock::now();
  const auto hyps = generation::beam_search(model, ids, beam);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto text_of = [&](const std::vector<I>& tokens) {
    return tok ? tok->decode(std::vector<std::int32_t>(tokens.begin(), tokens.end())) : std::string();
  };
  if (root) {
    std::printf(
        "generate_text: %s (iteration %lld): beam search over %lld sequences, length penalty %g; prompt of "
        "%zu tokens; %zu hypotheses in %.2f s, best first\n",
        model.checkpoint().c_str(), static_cast<long long>(model.iteration()), static_cast<long long>(beam.width),
        beam.length_penalty, ids.size(), hyps.size(), seconds);
    for (std::size_t h = 0; h < hyps.size(); ++h) {
      const auto& y = hyps[h];
      std::printf("generate_text: hypothesis %zu: score %.6f (log-probability %.6f over %zu tokens%s): %s\n", h + 1,
                  y.score, y.sum_logprobs, y.tokens.size(), y.stopped ? ", stopped" : "", ids_text(y.tokens).c_str());
      if (tok) std::printf("%s%s\n", text_of(ids).c_str(), text_of(y.tokens).c_str());
    }
    std::fflush(stdout);
  }
  if (!output.empty())
    run_consistently(world, [&] {
      if (!root) return;
      nlohmann::json j;
      j["prompt_tokens"] = ids;
      j["hypotheses"] = nlohmann::json::array();
      for (const auto& y : hyps) {
        nlohmann::json h = {
            {"tokens", y.tokens}, {"score", y.score}, {"sum_logprobs", y.sum_logprobs}, {"stopped", y.stopped}};
        if (tok) h["text"] = text_of(y.tokens);
        j["hypotheses"].push_back(h);
      }
      write_output(output, j);
    });
  return 0;
}

int run(int argc, char** argv) {
  try {
    auto world = MpiCommunicator::world();
    const bool root = world->rank() == 0;
    generation::ModelOptions m;
    std::string prompt, prompt_tokens, output;
    I stop_token = -2;
    bool no_stop = false, no_kv_cache = false, stop_on_eol = false, stop_on_double_eol = false, add_bos = false;
    generation::GenerateOptions o;
    po::options_description d("generate_text options");
    generation::add_model_options(d, m);
    d.add_options()("prompt", po::value(&prompt),
                    "the text to continue (needs a tokenizer: --vocab-file and --merge-file, or "
                    "--tokenizer-type ByteLevel)")("prompt-tokens", po::value(&prompt_tokens),
                                                   "the prompt as comma-separated token ids, instead of --prompt")(
        "max-new-tokens", po::value(&o.max_new_tokens)->default_value(32),
        "tokens to generate at most; 0 with --logprobs scores the prompt alone")(
        "logprobs", po::bool_switch(&o.logprobs),
        "print each token's log-probability under the model (prompt and generated; Megatron's logprobs) and the "
        "total, mean and perplexity; --output gets them too")(
        "add-bos", po::bool_switch(&add_bos), "put the tokenizer's end-of-document token first (Megatron's add_BOS)")(
        "stop-on-eol", po::bool_switch(&stop_on_eol), "also stop after a line's end (Megatron's stop_on_eol)")(
        "stop-on-double-eol", po::bool_switch(&stop_on_double_eol),
        "also stop after an empty line (Megatron's stop_on_double_eol)")(
        "prevent-newline-after-colon", po::bool_switch(&o.no_newline_after_colon),
        "never draw a line break right after ':' (Megatron's prevent_newline_after_colon)")(
        "greedy", po::bool_switch(&o.sampling.greedy), "take the most likely token each step (no sampling)")(
        "temperature", po::value(&o.sampling.temperature)->default_value(1.0), "logits divided by it before sampling")(
        "top-k", po::value(&o.sampling.top_k)->default_value(0), "sample among the k most likely tokens; 0 = all")(
        "top-p", po::value(&o.sampling.top_p)->default_value(1.0),
        "sample among the most likely tokens up to this probability mass (nucleus); 1 = all")(
        "seed", po::value(&o.sampling.seed)->default_value(1234), "the sampler's seed: the same seed, the same text")(
        "top-p-decay", po::value(&o.sampling.top_p_decay)->default_value(0.0),
        "after each token multiply --top-p by this (Megatron's top_p_decay); 0 = off")(
        "top-p-bound", po::value(&o.sampling.top_p_bound)->default_value(0.0),
        "--top-p-decay never takes --top-p below this (Megatron's top_p_bound)")(
        "stop-token", po::value(&stop_token),
        "end after generating this token id; default: the tokenizer's end of text (GPT-2 BPE 50256, ByteLevel "
        "256, SentencePiece: the model's </s>)")("no-stop", po::bool_switch(&no_stop),
                                                 "never stop early: generate --max-new-tokens tokens")(
        "no-kv-cache", po::bool_switch(&no_kv_cache),
        "run the whole sequence every step instead of keeping each layer's keys and values (slower; the same "
        "tokens up to rounding: a check of the cache)")(
        "output", po::value(&output), "also write {prompt_tokens, tokens, stopped, text} as JSON to this file");
    generation::BeamOptions beam;
    d.add_options()("beam-width", po::value(&beam.width)->default_value(0),
                    "beam search (Megatron's beam_width): print the N most likely continuations by their summed "
                    "log-probabilities, best first; 0 = off (sample or --greedy)")(
        "length-penalty", po::value(&beam.length_penalty)->default_value(1.0),
        "with --beam-width: a hypothesis scores its summed log-probability / length^this (Megatron's "
        "length_penalty)");
    bool help = false;
    d.add_options()("help,h", po::bool_switch(&help), "print this help");
    const auto vm = parse_command_line(argc, argv, d, "generate_text");
    o.kv_cache = !no_kv_cache;
    if (help) {
      if (!root) return 0;
      std::cout << "usage: generate_text --load DIR (--prompt TEXT | --prompt-tokens IDS) [options]\n\n" << d << "\n";
      return 0;
    }
    MZ_REQUIRE(!m.load.empty(), "--load is required: a checkpoint directory (pretrain_gpt --save, or an import)");
    MZ_REQUIRE(prompt.empty() != prompt_tokens.empty(),
               prompt.empty() ? "give the prompt: --prompt TEXT (with a tokenizer) or --prompt-tokens IDS"
                              : "--prompt and --prompt-tokens both give the prompt; keep one");
    MZ_REQUIRE(!no_stop || stop_token == -2, "--no-stop and --stop-token contradict each other; keep one");
    MZ_REQUIRE(!(stop_on_eol && stop_on_double_eol),
               "--stop-on-eol (after a line) and --stop-on-double-eol (after an empty line) contradict each other; "
               "keep one");
    MZ_REQUIRE(!no_stop || !(stop_on_eol || stop_on_double_eol), "--no-stop and ",
               stop_on_eol ? "--stop-on-eol" : "--stop-on-double-eol", " contradict each other; keep one");
    MZ_REQUIRE(o.max_new_tokens > 0 || (o.max_new_tokens == 0 && o.logprobs), "--max-new-tokens must be positive",
               o.max_new_tokens == 0 ? " (0 scores the prompt alone: add --logprobs)" : "", ", got ", o.max_new_tokens);
    generation::validate(o.sampling);
    // Beam search ranks the model's own probabilities: what shapes sampling,
    // the log-probabilities' report and the line stops have no place in it.
    const auto given = [&](const char* flag) { return vm.count(flag) && !vm[flag].defaulted(); };
    MZ_REQUIRE(beam.width >= 0, "--beam-width must be 0 (off) or a number of hypotheses, got ", beam.width);
    MZ_REQUIRE(beam.width > 0 || !given("length-penalty"),
               "--length-penalty scores beam search's hypotheses: add --beam-width N, or drop it");
    if (beam.width > 0) {
      beam.max_new_tokens = o.max_new_tokens;
      generation::validate(beam);
    }
    if (beam.width > 0)
      for (const char* flag : {"greedy", "temperature", "top-k", "top-p", "seed", "top-p-decay", "top-p-bound",
                               "logprobs", "stop-on-eol", "stop-on-double-eol", "no-kv-cache"})
        MZ_REQUIRE(!given(flag) || (vm[flag].value().type() == typeid(bool) && !vm[flag].as<bool>()), "--", flag,
                   " has no effect on beam search (--beam-width ", beam.width,
                   "), which ranks the model's own probabilities with every sequence's key/value cache: drop it, "
                   "or drop --beam-width");
    const std::unique_ptr<data::Tokenizer> tok = generation::open_tokenizer(m);
    MZ_REQUIRE(tok || prompt.empty(),
               "--prompt is text: name its tokenizer with --vocab-file and --merge-file (GPT-2 BPE), "
               "--tokenizer-type ByteLevel, or --tokenizer-type Llama2Tokenizer --tokenizer-model FILE, or give "
               "--prompt-tokens");
    const bool lines_needed = stop_on_eol || stop_on_double_eol || o.no_newline_after_colon;
    MZ_REQUIRE(tok || !(add_bos || lines_needed),
               add_bos ? "--add-bos puts the tokenizer's end-of-document token first"
                       : "--stop-on-eol, --stop-on-double-eol and --prevent-newline-after-colon find the line tokens",
               ": name the tokenizer (--vocab-file and --merge-file, or --tokenizer-type)");
    std::vector<I> ids = prompt.empty() ? hf::parse_token_ids(prompt_tokens, "--prompt-tokens") : [&] {
      const auto enc = tok->encode(prompt);
      return std::vector<I>(enc.begin(), enc.end());
    }();
    if (add_bos) ids.insert(ids.begin(), tok->eod());

    const auto opened = generation::open_model(m, tok.get(), *world, "generate_text");
    hf::CheckpointModel& model = *opened;
    const auto& c = model.config();
    MZ_REQUIRE(!tok || tok->vocab_size() >= c.vocab_size, "the model's vocabulary of ", c.vocab_size,
               " tokens is larger than the ", tok ? tok->name() : "", " tokenizer's ", tok ? tok->vocab_size() : 0,
               ": its tokens could not be written as text; use the tokenizer the data was made with");
    for (I t : ids)
      MZ_REQUIRE(t >= 0 && t < c.vocab_size, "--prompt", prompt.empty() ? "-tokens" : "", ": token id ", t,
                 " is outside the model's vocabulary [0, ", c.vocab_size, ")");
    if (lines_needed) {
      o.lines = generation::line_tokens(*tok, c.vocab_size);
      o.line_stop = stop_on_eol          ? generation::LineStop::Line
                    : stop_on_double_eol ? generation::LineStop::DoubleLine
                                         : generation::LineStop::None;
      MZ_REQUIRE(!(stop_on_eol || stop_on_double_eol) || o.lines.newline >= 0 || o.lines.double_newline >= 0,
                 stop_on_eol ? "--stop-on-eol" : "--stop-on-double-eol", ": the ", tok->name(),
                 " tokenizer has no line-break token in the model's vocabulary");
      MZ_REQUIRE(!o.no_newline_after_colon || (o.lines.newline >= 0 && o.lines.colon >= 0),
                 "--prevent-newline-after-colon: the ", tok->name(),
                 " tokenizer has no \"\\n\" or no \":\" token in the model's vocabulary");
    }
    if (!no_stop)
      o.stop_token = generation::stop_token_of(stop_token == -2 ? std::nullopt : std::optional<I>(stop_token),
                                               "--stop-token", model, tok.get());
    if (beam.width > 0) return run_beam_search(model, tok.get(), *world, ids, beam, o, output);
    // Every rank draws the same tokens (generation.h); rank 0 prints them.
    if (root) {
      std::printf(
          "generate_text: %s (iteration %lld): %lld layers, hidden %lld, vocabulary %lld%s; prompt of %zu tokens; "
          "%s\n",
          model.checkpoint().c_str(), static_cast<long long>(model.iteration()), static_cast<long long>(c.num_layers),
          static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
          model.tensor_parallel_size() > 1
              ? detail::concat(", split over ", model.tensor_parallel_size(), " ranks (tensor parallel)").c_str()
              : "",
          ids.size(),
          o.sampling.greedy ? "greedy"
                            : detail::concat("sampling: temperature ", o.sampling.temperature, ", top-k ",
                                             o.sampling.top_k, ", top-p ", o.sampling.top_p, ", seed ", o.sampling.seed)
                                  .c_str());
      std::fflush(stdout);
    }
    if (tok && root) {
      std::printf("%s", tok->decode(std::vector<std::int32_t>(ids.begin(), ids.end())).c_str());
      std::fflush(stdout);
    }
    const auto g = generation::generate(model, ids, o, [&](I t) {
      if (tok && root) {
        std::printf("%s", tok->decode({static_cast<std::int32_t>(t)}).c_str());
        std::fflush(stdout);
      }
    });
    if (tok && root) std::printf("\n");
    if (root)
      std::printf("generate_text: %zu tokens in %.2f s (%.1f tokens/s)%s: %s\n", g.tokens.size(), g.seconds,
                  g.seconds > 0 ? static_cast<double>(g.tokens.size()) / g.seconds : 0.0,
                  g.stopped ? detail::concat(", stopped at token ", g.tokens.back()).c_str() : "",
                  ids_text(g.tokens).c_str());
    if (o.logprobs && root) {
      double total = 0;
      for (double lp : g.logprobs) total += lp;
      const auto n = static_cast<double>(g.logprobs.size());
      std::string values;
      for (double lp : g.logprobs) values += (values.empty() ? "" : ",") + detail::concat(lp);
      std::printf("generate_text: log-probabilities of the %zu tokens after the first: %s\n", g.logprobs.size(),
                  values.c_str());
      std::printf("generate_text: total %.6f, mean %.6f, perplexity %.4f\n", total, n > 0 ? total / n : 0.0,
                  n > 0 ? std::exp(-total / n) : 1.0);
    }
    if (!output.empty())
      run_consistently(*world, [&] {
        if (!root) return;
        nlohmann::json j;
        j["prompt_tokens"] = ids;
        j["tokens"] = g.tokens;
        j["stopped"] = g.stopped;
        if (o.logprobs) j["logprobs"] = g.logprobs;
        if (tok) {
          const std::vector<std::int32_t> all(g.tokens.begin(), g.tokens.end());
          j["text"] = tok->decode(all);
        }
        write_output(output, j);
      });
    return 0;
  } catch (const AgreedConfigError&) {
    throw;
  } catch (const ConfigError& e) {
    throw AgreedConfigError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) { return run_main("generate_text", argc, argv, run); }
