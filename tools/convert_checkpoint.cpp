// convert_checkpoint: megazero checkpoints <-> Hugging Face GPT-2 or Llama (docs/HF_EXPORT.md).
//   convert_checkpoint export --load runs/ckpt --output hf/ [--dtype bf16]
//       the newest checkpoint (or one iter_* directory) as hf/model.safetensors + hf/config.json,
//       loadable by transformers' GPT2LMHeadModel (a GPT-2-shaped model) or LlamaForCausalLM (rope,
//       RMSNorm, SwiGLU) .from_pretrained("hf/")
//   convert_checkpoint import --input hf/ --save runs/from_hf
//       an HF GPT-2 or Llama as an iteration-0 checkpoint: pretrain_gpt --load runs/from_hf fine-tunes it
//       at any TP / DP / ZeRO stage
//   convert_checkpoint logits --load runs/ckpt --tokens 1,2,3 --output logits.txt
//       (debugging) our model's logits for one sequence, one row per token
// One process: start it without mpiexec.
#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"
#include "tools/hf_gpt2.h"

namespace po = boost::program_options;
using namespace megazero;

namespace {

constexpr const char* kUsage =
    "usage: convert_checkpoint export --load DIR --output OUTDIR [--dtype fp32|fp16|bf16]\n"
    "       convert_checkpoint import --input HF_DIR_OR_FILE --save DIR [--seq-length N] [--num-attention-heads N] "
    "[--device D]\n"
    "       convert_checkpoint logits --load DIR --tokens 1,2,3 --output FILE [--device D]\n"
    "       convert_checkpoint COMMAND --help\n";

std::string describe(const layers::GPTConfig& c, hf::HfFormat format) {
  std::string s =
      detail::concat(c.num_layers, " layers, hidden ", c.hidden_size, ", ", c.num_attention_heads, " heads, ffn ",
                     c.ffn(), ", vocab ", c.vocab_size, ", positions ", c.max_position_embeddings);
  if (format == hf::HfFormat::Gpt2) return s + "; GPT-2";
  return s + detail::concat(c.qk_layernorm                         ? "; Qwen3 (a Llama with per-head q/k RMSNorms): "
                            : !c.add_bias_linear && c.add_qkv_bias ? "; Qwen2 (a Llama with q/k/v biases): "
                                                                   : "; Llama: ",
                            c.query_groups(), " key/value heads, rope base ", c.rotary_base, ", RMSNorm eps ",
                            c.layernorm_epsilon,
                            c.add_bias_linear ? ", biases"
                            : c.add_qkv_bias  ? ", q/k/v biases"
                                              : ", no biases",
                            c.untie_embeddings ? ", untied output layer" : ", tied output layer");
}

// Parses the flags of one subcommand (argv[0] is the subcommand). Returns false after --help.
bool parse(int argc, char** argv, po::options_description& d, const std::string& program) {
  bool help = false;
  d.add_options()("help,h", po::bool_switch(&help), "print this help");
  parse_command_line(argc, argv, d, program.c_str());
  if (help) std::cout << kUsage << "\n" << d << "\n";
  return !help;
}

int do_export(int argc, char** argv) {
  hf::ExportOptions o;
  std::string dtype = "fp32";
  po::options_description d("convert_checkpoint export options");
  d.add_options()("load", po::value(&o.load),
                  "a pretrain_gpt --save directory (its newest checkpoint) or one iter_NNNNNNN directory")(
      "output", po::value(&o.output),
      "directory to write model.safetensors and config.json into (GPT2LMHeadModel or LlamaForCausalLM, as the "
      "checkpoint's model is)")("dtype", po::value(&dtype)->default_value("fp32"),
                                "fp32, fp16 or bf16 (rounded to nearest even)")(
      "num-attention-heads", po::value(&o.num_attention_heads), "only for checkpoints whose configuration lacks it")(
      "vocab-file", po::value(&o.vocab_file),
      "GPT-2 encoder.json: written as the export's vocab.json (with --merge-file)")(
      "merge-file", po::value(&o.merge_file),
      "GPT-2 vocab.bpe: written as the export's merges.txt (with --vocab-file)");
  if (!parse(argc, argv, d, "convert_checkpoint export")) return 0;
  MZ_REQUIRE(dtype == "fp32" || dtype == "fp16" || dtype == "bf16", "--dtype must be fp32, fp16 or bf16, got '", dtype,
             "'");
  o.dtype = parse_dtype(dtype, "--dtype");
  const auto r = hf::export_checkpoint(o);
  std::printf(
      "convert_checkpoint: exported %s (iteration %lld; %s) to %s: %lld tensors, %.1f MiB %s, and config.json%s, "
      "in %.2f s\n",
      r.checkpoint.c_str(), static_cast<long long>(r.iteration), describe(r.model, r.format).c_str(),
      r.safetensors.c_str(), static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / 1048576.0,
      std::string(dtype_name(o.dtype)).c_str(), r.tokenizer ? ", vocab.json, merges.txt, tokenizer_config.json" : "",
      r.seconds);
  if (!r.tokenizer)
    std::printf(
        "convert_checkpoint: note: no tokenizer files written; pass --vocab-file and --merge-file (GPT-2's "
        "encoder.json and vocab.bpe, as given to pretrain_gpt) to include them\n");
  return 0;
}

int do_import(int argc, char** argv, Communicator& self) {
  hf::ImportOptions o;
  po::options_description d("convert_checkpoint import options");
  d.add_options()("input", po::value(&o.input),
                  "a Hugging Face GPT-2 or Llama directory (model.safetensors + config.json) or a .safetensors file")(
      "save", po::value(&o.save), "directory to write the megazero checkpoint into (must hold none yet)")(
      "seq-length", po::value(&o.seq_length),
      "recorded in the checkpoint's configuration; default n_positions / max_position_embeddings")(
      "num-attention-heads", po::value(&o.num_attention_heads), "needed when there is no config.json")(
      "make-vocab-size-divisible-by", po::value(&o.make_vocab_size_divisible_by), "vocab padding (default 128)")(
      "seed", po::value(&o.seed)->default_value(1234), "recorded as the run's --seed")(
      "device", po::value(&o.device)->default_value("cpu"),
      "where the model is built and saved from: cpu, cuda, cuda:N or cpu-isolated");
  if (!parse(argc, argv, d, "convert_checkpoint import")) return 0;
  const auto r = hf::import_checkpoint(o, self);
  for (const auto& n : r.notes) std::printf("convert_checkpoint: note: %s\n", n.c_str());
  if (!r.ignored.empty()) {
    std::string list;
    for (const auto& n : r.ignored) list += (list.empty() ? "" : ", ") + n;
    std::printf("convert_checkpoint: not imported (buffers or tied copies): %s\n", list.c_str());
  }
  std::printf("convert_checkpoint: imported %s%s (%s) as %s (iteration 0, Adam moments zero) in %.2f s\n",
              r.safetensors.c_str(), r.config.empty() ? " without config.json" : "",
              describe(r.model, r.format).c_str(), r.checkpoint.c_str(), r.seconds);
  return 0;
}

int do_logits(int argc, char** argv, Communicator& self) {
  std::string load, tokens, output, device;
  std::int64_t heads = 0;
  po::options_description d("convert_checkpoint logits options");
  d.add_options()("load", po::value(&load), "a checkpoint directory, as for export")(
      "tokens", po::value(&tokens), "comma-separated token ids: one sequence")(
      "output", po::value(&output), "text file: a line \"S V\", then S lines of V logits")(
      "num-attention-heads", po::value(&heads), "only for checkpoints whose configuration lacks it")(
      "device", po::value(&device)->default_value("cpu"), "where the model runs: cpu, cuda, cuda:N or cpu-isolated");
  if (!parse(argc, argv, d, "convert_checkpoint logits")) return 0;
  MZ_REQUIRE(!tokens.empty(), "--tokens is required, e.g. --tokens 464,3290,318");
  MZ_REQUIRE(!output.empty(), "--output is required: the file to write the logits to");
  const std::vector<std::int64_t> ids = hf::parse_token_ids(tokens, "--tokens");
  hf::CheckpointModel model(load, self, heads, device);
  for (const auto& r : model.rejected())
    std::fprintf(stderr, "convert_checkpoint: WARNING: skipped unusable checkpoint %s\n", r.c_str());
  const auto logits = model.logits(ids);
  const std::size_t V = logits.size() / ids.size();
  std::ofstream out(output);
  MZ_REQUIRE(out.good(), "--output ", output, ": cannot be written");
  out << ids.size() << " " << V << "\n";
  char buf[32];
  for (std::size_t s = 0; s < ids.size(); ++s)
    for (std::size_t v = 0; v < V; ++v) {
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(logits[s * V + v]));  // round-trips fp32
      out << buf << (v + 1 == V ? "\n" : " ");
    }
  out.close();
  MZ_REQUIRE(out.good(), "--output ", output, ": write failed (disk full?)");
  std::printf("convert_checkpoint: logits [%zu, %zu] written to %s\n", ids.size(), V, output.c_str());
  return 0;
}

int run(int argc, char** argv) {
  // One process; its errors are its own, so they end as agreed errors (message, exit 2), not an MPI abort.
  try {
    auto world = MpiCommunicator::world();
    MZ_REQUIRE(world->size() == 1, "convert_checkpoint runs as one process; start it without mpiexec");
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "-h" || cmd == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (cmd == "export") return do_export(argc - 1, argv + 1);
    if (cmd == "import") return do_import(argc - 1, argv + 1, *world);
    if (cmd == "logits") return do_logits(argc - 1, argv + 1, *world);
    throw ConfigError((cmd.empty() ? std::string("no command given") : "unknown command '" + cmd + "'") +
                      "; use export, import or logits\n" + kUsage);
  } catch (const AgreedConfigError&) {
    throw;
  } catch (const ConfigError& e) {
    throw AgreedConfigError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) { return run_main("convert_checkpoint", argc, argv, run); }
