#include "megazero/train/megatron_compat.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "megazero/core/error.h"
#include "megazero/data/gpt2_tokenizer.h"
#include "megazero/data/null_tokenizer.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/train/arguments.h"

namespace po = boost::program_options;

namespace megazero::train {
namespace {

enum class Kind { Switch, Value };
// What an accepted Megatron flag is here.
enum class Meaning {
  Translated,  // apply_megatron_flags turns it into our flags
  NoEffect,    // accepted; the note says why it changes nothing
  Refused,     // a feature megazero does not have; the note says so
};
struct CompatFlag {
  const char* name;
  Kind kind;
  Meaning meaning;
  const char* note;  // NoEffect: why nothing changes; Refused: what to do instead
};

// Megatron-LM's spellings (megatron/training/arguments.py) that a typical GPT
// script passes, beyond the flags arguments.cpp defines under the same name.
const CompatFlag kFlags[] = {
    {"use-distributed-optimizer", Kind::Switch, Meaning::Translated, "ZeRO stage 1 (Pos)"},
    {"use-torch-fsdp2", Kind::Switch, Meaning::Translated, "ZeRO stage 3 (Pos+g+p), what FSDP shards"},
    {"distribute-saved-activations", Kind::Switch, Meaning::Translated,
     "--partition-activations (ZeRO-R Pa: each TP rank keeps 1/TP of a recomputing layer's input)"},
    {"context-parallel-size", Kind::Value, Meaning::Translated, "1 only"},
    {"use-flash-attn", Kind::Switch, Meaning::Translated,
     "--attention-backend cudnn on --device cuda where cuDNN can run it, else fused"},
    {"checkpoint-activations", Kind::Switch, Meaning::Translated, "--recompute-activations"},
    {"overlap-grad-reduce", Kind::Switch, Meaning::Translated, "--overlap-comm true"},
    {"use-checkpoint-opt_param-scheduler", Kind::Switch, Meaning::Translated, "--use-checkpoint-opt-param-scheduler"},
    {"override-opt_param-scheduler", Kind::Switch, Meaning::Translated, "--override-opt-param-scheduler"},
    {"tokenizer-type", Kind::Value, Meaning::Translated,
     "GPT2BPETokenizer, ByteLevel, Llama2Tokenizer, GPTSentencePieceTokenizer, HuggingFaceTokenizer or NullTokenizer "
     "(the data's tokenizer; its end-of-text token is --eod-mask-loss's; with --tokenizer-model, or GPT-2's "
     "--vocab-file and --merge-file, it also gives --vocab-size; NullTokenizer's is --vocab-size + 1, as Megatron's)"},
    {"tokenizer-model", Kind::Value, Meaning::Translated,
     "with --tokenizer-type Llama2Tokenizer or GPTSentencePieceTokenizer the SentencePiece model, with "
     "HuggingFaceTokenizer the directory of tokenizer.json and tokenizer_config.json: read for the vocabulary size "
     "and the end-of-document token"},
    {"lr-warmup-fraction", Kind::Value, Meaning::Translated, "--lr-warmup-iters"},
    {"train-samples", Kind::Value, Meaning::Translated, "--train-iters"},
    {"lr-decay-samples", Kind::Value, Meaning::Translated, "--lr-decay-iters"},
    {"lr-warmup-samples", Kind::Value, Meaning::Translated, "--lr-warmup-iters"},
    {"lr-wsd-decay-samples", Kind::Value, Meaning::Translated, "--lr-wsd-decay-iters"},
    {"data-args-path", Kind::Value, Meaning::Translated, "--data-path, read from the file"},
    {"per-split-data-args-path", Kind::Value, Meaning::Translated,
     "--train-data-path, --valid-data-path, --test-data-path from the JSON file's train, valid, test"},
    {"distributed-timeout-minutes", Kind::Value, Meaning::Translated, "--collective-timeout"},
    {"pipeline-model-parallel-size", Kind::Value, Meaning::Translated, "1 only"},
    {"optimizer-offload-fraction", Kind::Value, Meaning::Translated,
     "1.0 only, with --optimizer-cpu-offload (the whole optimizer state in host memory)"},
    {"overlap-cpu-optimizer-d2h-h2d", Kind::Switch, Meaning::NoEffect,
     "--optimizer-cpu-offload always overlaps its copies with the host's update, chunk by chunk"},
    {"data-impl", Kind::Value, Meaning::Translated, "mmap only"},
    {"no-masked-softmax-fusion", Kind::Switch, Meaning::NoEffect, "the causal softmax is always one kernel"},
    {"openai-gelu", Kind::Switch, Meaning::NoEffect,
     "the GeLU is always the tanh approximation (--openai-gelu's, and Megatron's fused bias-GeLU's)"},
    {"no-bias-dropout-fusion", Kind::Switch, Meaning::NoEffect,
     "bias-dropout-add is always one pass (the result is the same either way)"},
    {"no-gradient-accumulation-fusion", Kind::Switch, Meaning::NoEffect,
     "weight gradients are accumulated by the GEMM itself"},
    {"no-async-tensor-model-parallel-allreduce", Kind::Switch, Meaning::NoEffect,
     "TP all-reduces are issued where the math needs them"},
    {"attention-softmax-in-fp32", Kind::Switch, Meaning::NoEffect, "softmax statistics are always fp32"},
    {"accumulate-allreduce-grads-in-fp32", Kind::Switch, Meaning::NoEffect,
     "gradient reductions follow the parameter dtype; the optimizer works on fp32 partitions"},
    {"use-mcore-models", Kind::Switch, Meaning::NoEffect, "megazero has one model implementation"},
    {"use-legacy-models", Kind::Switch, Meaning::NoEffect, "megazero has one model implementation"},
    {"log-throughput", Kind::Switch, Meaning::NoEffect, "tokens/s, TFLOP/s and MFU are always logged"},
    {"log-timers-to-tensorboard", Kind::Switch, Meaning::NoEffect, "--tensorboard-dir always receives the step timers"},
    {"log-validation-ppl-to-tensorboard", Kind::Switch, Meaning::NoEffect,
     "--tensorboard-dir always receives validation loss and perplexity"},
    {"log-memory-to-tensorboard", Kind::Switch, Meaning::NoEffect, "--tensorboard-dir always receives peak memory"},
    {"no-persist-layer-norm", Kind::Switch, Meaning::NoEffect, "LayerNorm is megazero's own kernel"},
    {"apply-query-key-layer-scaling", Kind::Switch, Meaning::NoEffect,
     "attention scores and softmax are computed in fp32, where the scaling changes nothing"},
    {"no-query-key-layer-scaling", Kind::Switch, Meaning::NoEffect,
     "attention scores and softmax are computed in fp32, where the scaling changes nothing"},
    {"use-cpu-initialization", Kind::Switch, Meaning::NoEffect,
     "initialisation is a pure function of (seed, name, global index) on any device"},
    {"empty-unused-memory-level", Kind::Value, Meaning::NoEffect,
     "the allocator keeps freed memory for reuse (--device-arena places it by plan)"},
    {"DDP-impl", Kind::Value, Meaning::NoEffect, "data parallelism is the ZeRO engine's"},
    {"ckpt-format", Kind::Value, Meaning::NoEffect,
     "checkpoints are megazero's own sharded format, which loads on any TP x DP layout (docs/CHECKPOINTS.md)"},
    {"use-dist-ckpt", Kind::Switch, Meaning::NoEffect,
     "checkpoints are always sharded per rank and load on any TP x DP layout (docs/CHECKPOINTS.md)"},
    {"async-save", Kind::Switch, Meaning::NoEffect,
     "a save is written, checked and renamed into place before training goes on"},
    {"tp-comm-overlap", Kind::Switch, Meaning::NoEffect,
     "TP collectives run where the math needs them, not split into the GEMMs (the same results)"},
    {"manual-gc", Kind::Switch, Meaning::NoEffect, "there is no garbage collector to pace"},
    {"no-shared-storage", Kind::Switch, Meaning::NoEffect,
     "no dataset cache is built: every rank memory-maps the .bin/.idx pair"},
    {"cross-entropy-loss-fusion", Kind::Switch, Meaning::NoEffect,
     "the vocabulary-parallel cross-entropy is always megazero's fused kernels"},
    {"fp8-format", Kind::Value, Meaning::Refused, "FP8 training is not implemented: use --bf16 or --fp16"},
    {"num-workers", Kind::Value, Meaning::NoEffect, "samples are read from the memory-mapped dataset in the step"},
    {"transformer-impl", Kind::Value, Meaning::NoEffect, "megazero's own layers"},
    {"timing-log-level", Kind::Value, Meaning::NoEffect, "per-step timers (min/max over ranks) are always logged"},
    {"use-rotary-position-embeddings", Kind::Switch, Meaning::Translated, "--position-embedding-type rope"},
    {"rotary-percent", Kind::Value, Meaning::Translated, "1.0 only (every dimension of a head rotates)"},
    {"no-load-rng", Kind::Switch, Meaning::NoEffect, "there is no RNG state: every random stream is counter-based"},
    {"num-layers-per-virtual-pipeline-stage", Kind::Value, Meaning::Refused,
     "megazero has no pipeline parallelism; TP x ZeRO-DP scale the model"},
    {"expert-model-parallel-size", Kind::Value, Meaning::Refused, "megazero has no mixture-of-experts models"},
    {"num-experts", Kind::Value, Meaning::Refused, "megazero has no mixture-of-experts models"},
    {"ddp-bucket-size", Kind::Value, Meaning::Translated, "--reduce-bucket-size (elements)"},
    {"no-position-embedding", Kind::Switch, Meaning::Translated,
     "with --position-embedding-type rope only (there is no learned position table then)"},
    {"main-grads-dtype", Kind::Value, Meaning::Translated, "fp32 only"},
    {"main-params-dtype", Kind::Value, Meaning::Translated, "fp32 only"},
    {"exp-avg-dtype", Kind::Value, Meaning::Translated, "fp32 only"},
    {"exp-avg-sq-dtype", Kind::Value, Meaning::Translated, "fp32 only"},
    {"local-rank", Kind::Value, Meaning::NoEffect, "MPI gives each rank its place on its host (launch/)"},
    {"local_rank", Kind::Value, Meaning::NoEffect, "MPI gives each rank its place on its host (launch/)"},
    {"calculate-per-token-loss", Kind::Switch, Meaning::Translated,
     "with --eod-mask-loss, the kept tokens' mean over the global batch (each micro-batch's mean otherwise); "
     "without it, no effect: every micro-batch holds as many tokens"},
    {"ddp-average-in-collective", Kind::Switch, Meaning::NoEffect,
     "gradients are averaged over DP by the backward's scale, once"},
    {"grad-reduce-in-bf16", Kind::Switch, Meaning::NoEffect,
     "gradient reductions follow the parameters' dtype (bf16 with --bf16)"},
    {"no-check-for-nan-in-loss-and-grad", Kind::Switch, Meaning::NoEffect,
     "a NaN/Inf loss still stops the run; --on-nan-loss skip skips such iterations instead"},
    {"async-tensor-model-parallel-allreduce", Kind::Switch, Meaning::NoEffect,
     "TP all-reduces are issued where the math needs them"},
    {"mmap-bin-files", Kind::Switch, Meaning::NoEffect, "the .bin files are always memory-mapped"},
    {"log-straggler", Kind::Switch, Meaning::NoEffect,
     "the timers' line names the slowest rank of each logged iteration"},
    {"log-progress", Kind::Switch, Meaning::NoEffect, "--metrics-file records every logged iteration"},
    {"enable-one-logger", Kind::Switch, Meaning::NoEffect, "no telemetry is sent"},
    {"one-logger-project", Kind::Value, Meaning::NoEffect, "no telemetry is sent"},
    {"auto-detect-ckpt-format", Kind::Switch, Meaning::NoEffect, "checkpoints have one format (docs/CHECKPOINTS.md)"},
    {"dist-ckpt-format", Kind::Value, Meaning::NoEffect,
     "checkpoints are megazero's own sharded format, which loads on any TP x DP layout (docs/CHECKPOINTS.md)"},
    {"ckpt-fully-parallel-save", Kind::Switch, Meaning::NoEffect, "every rank always writes its own shard in parallel"},
    {"ckpt-fully-parallel-load", Kind::Switch, Meaning::NoEffect, "every rank always reads what it owns in parallel"},
    {"ckpt-assume-constant-structure", Kind::Switch, Meaning::NoEffect,
     "each save writes the shards it owns; nothing is cached between saves"},
    {"align-grad-reduce", Kind::Switch, Meaning::NoEffect, "there are no pipeline stages to align"},
    {"no-align-grad-reduce", Kind::Switch, Meaning::NoEffect, "there are no pipeline stages to align"},
    {"use-ring-exchange-p2p", Kind::Switch, Meaning::NoEffect, "there are no pipeline stages to exchange"},
    {"tensorboard-queue-size", Kind::Value, Meaning::NoEffect, "events are written and flushed each logged iteration"},
    {"timing-log-option", Kind::Value, Meaning::NoEffect, "the timers print min/max over ranks and the slowest rank"},
    {"check-weight-hash-across-dp-replicas-interval", Kind::Value, Meaning::NoEffect,
     "ranks' configurations are cross-checked at start-up; --check-collectives cross-checks every collective"},
    {"init-model-with-meta-device", Kind::Switch, Meaning::NoEffect,
     "the memory plan already builds the model on a meta device before any allocation"},
    {"trust-remote-code", Kind::Switch, Meaning::NoEffect, "no tokenizer code is loaded: the data is tokenized"},
    {"use-precision-aware-optimizer", Kind::Switch, Meaning::Refused,
     "the optimizer's master weights and moments are fp32 (12 bytes a parameter, the paper's K)"},
    {"sgd-momentum", Kind::Value, Meaning::Refused, "megazero's optimizer is AdamW"},
    {"decoder-seq-length", Kind::Value, Meaning::Refused, "megazero trains decoder-only GPTs: --seq-length"},
    {"no-mmap-bin-files", Kind::Switch, Meaning::Refused, "the .bin files are always memory-mapped"},
    {"use-pytorch-profiler", Kind::Switch, Meaning::Refused,
     "there is no PyTorch: --profile records the GPU's kernels (CUPTI) over --profile-step-start..end"},
    {"record-memory-history", Kind::Switch, Meaning::Refused,
     "no allocator history is recorded: the iteration line prints the peak, the memory plan each category"},
    {"non-persistent-save-interval", Kind::Value, Meaning::Refused,
     "non-persistent (local) checkpoints are not implemented: --save-interval saves persistent ones"},
    {"wandb-save-dir", Kind::Value, Meaning::Refused,
     "Weights & Biases logging is not built in: --tensorboard-dir writes event files (`wandb sync` imports them)"},
    {"data-parallel-random-init", Kind::Switch, Meaning::Refused,
     "every data-parallel rank starts from the same weights (a function of the seed and the parameter)"},
    {"spec", Kind::Value, Meaning::Refused, "megazero has one GPT implementation (layers/)"},
    {"expert-tensor-parallel-size", Kind::Value, Meaning::Refused, "megazero has no mixture-of-experts models"},
    {"moe-router-topk", Kind::Value, Meaning::Refused, "megazero has no mixture-of-experts models"},
    // Megatron-DeepSpeed's spellings.
    {"deepspeed", Kind::Switch, Meaning::NoEffect,
     "ZeRO is megazero's own (--zero-stage); --deepspeed-config reads a DeepSpeed JSON"},
    {"deepspeed_config", Kind::Value, Meaning::Translated, "--deepspeed-config"},
    {"deepspeed-activation-checkpointing", Kind::Switch, Meaning::Translated,
     "--recompute-activations (the JSON's activation_checkpointing section: Pa, Pa+cpu, MD)"},
    {"optimizer", Kind::Value, Meaning::Translated, "adam only (AdamW, decoupled weight decay, as Megatron's)"},
    {"dataloader-type", Kind::Value, Meaning::Translated,
     "single only (samples in order from the data position, Megatron's pretraining sampler)"},
    {"kv-channels", Kind::Value, Meaning::Translated, "--hidden-size / --num-attention-heads only"},
    {"check-for-nan-in-loss-and-grad", Kind::Switch, Meaning::NoEffect,
     "always on: a NaN/Inf loss stops the run (--on-nan-loss), a non-finite gradient norm skips the step"},
    {"exit-signal-handler", Kind::Switch, Meaning::NoEffect,
     "always on: SIGTERM and SIGUSR1 save at the next step boundary (with --save) and exit 5"},
    {"data-cache-path", Kind::Value, Meaning::NoEffect, "no index cache is built: every rank memory-maps the .idx"},
    {"no-bias-swiglu-fusion", Kind::Switch, Meaning::NoEffect, "SwiGLU is one kernel either way (the same result)"},
    {"no-rope-fusion", Kind::Switch, Meaning::NoEffect, "rotary embeddings are one kernel either way"},
    {"tensorboard-log-interval", Kind::Value, Meaning::NoEffect,
     "TensorBoard receives every logged iteration (--log-interval)"},
    {"log-world-size-to-tensorboard", Kind::Switch, Meaning::NoEffect,
     "the world size is in the printed configuration and the metrics' first record"},
    {"log-loss-scale-to-tensorboard", Kind::Switch, Meaning::NoEffect, "--tensorboard-dir always receives loss-scale"},
    {"log-batch-size-to-tensorboard", Kind::Switch, Meaning::NoEffect, "--tensorboard-dir always receives batch-size"},
    {"log-learning-rate-to-tensorboard", Kind::Switch, Meaning::NoEffect,
     "--tensorboard-dir always receives learning-rate"},
    {"wandb-project", Kind::Value, Meaning::Refused,
     "Weights & Biases logging is not built in: --tensorboard-dir writes event files (`wandb sync` imports them)"},
    {"wandb-exp-name", Kind::Value, Meaning::Refused,
     "Weights & Biases logging is not built in: --tensorboard-dir writes event files (`wandb sync` imports them)"},
    {"fp32-residual-connection", Kind::Switch, Meaning::Refused,
     "an fp32 residual stream is not implemented: it is kept in the parameters' dtype"},
};

const CompatFlag* find(const std::string& name) {
  for (const auto& f : kFlags)
    if (name == f.name) return &f;
  return nullptr;
}

// Damerau-Levenshtein distance (adjacent transpositions count 1).
std::size_t distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::int64_t parse_int(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MZ_REQUIRE(used == v.size() && !v.empty(), "--", flag, " takes a whole number, got '", v, "'");
  return x;
}
double parse_real(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MZ_REQUIRE(used == v.size() && !v.empty() && std::isfinite(x), "--", flag, " takes a finite number, got '", v, "'");
  return x;
}

}  // namespace

void define_megatron_flags(po::options_description& group, std::map<std::string, std::string>& given) {
  for (const auto& f : kFlags) {
    const std::string name = f.name;
    std::string help = f.meaning == Meaning::Translated ? std::string("Megatron's spelling: ") + f.note
                       : f.meaning == Meaning::NoEffect ? std::string("accepted, no effect: ") + f.note
                                                        : std::string("refused: ") + f.note;
    if (f.kind == Kind::Switch)
      group.add_options()(f.name,
                          po::value<bool>()->zero_tokens()->implicit_value(true)->notifier([&given, name](bool on) {
                            if (on) given[name] = "true";  // "name = false" in a file: not given
                          }),
                          help.c_str());
    else
      group.add_options()(f.name,
                          po::value<std::string>()->notifier([&given, name](const std::string& v) { given[name] = v; }),
                          help.c_str());
  }
}

void apply_megatron_flags(TrainArgs& a, const std::map<std::string, std::string>& given,
                          const std::vector<std::string>& explicitly) {
  auto was_given = [&](const char* flag) {
    return std::find(explicitly.begin(), explicitly.end(), flag) != explicitly.end();
  };
  std::vector<std::string> refused;
  auto value = [&](const char* flag) -> const std::string* {
    auto it = given.find(flag);
    return it == given.end() ? nullptr : &it->second;
  };
  auto conflict = [&](const char* megatron, const char* ours) {
    MZ_REQUIRE(!was_given(ours), "--", megatron, " and --", ours, " both set the same thing; keep one");
  };
  for (const auto& [name, v] : given) {
    const CompatFlag* f = find(name);
    if (!f) continue;
    if (f->meaning == Meaning::NoEffect)
      a.notes.push_back("--" + name + " has no effect here: " + f->note);
    else if (f->meaning == Meaning::Refused)
      refused.push_back("--" + name + ": " + f->note);
  }
  // Values that only one setting of the flag makes sense for.
  auto only = [&](const char* flag, std::initializer_list<const char*> ok, const std::string& otherwise) {
    const std::string* v = value(flag);
    if (!v) return;
    for (const char* o : ok)
      if (*v == o) return;
    refused.push_back("--" + std::string(flag) + " " + *v + ": " + otherwise);
  };
  only("pipeline-model-parallel-size", {"1"},
       "megazero has no pipeline parallelism (TP x ZeRO-DP scale the model: raise --zero-stage or "
       "--tensor-model-parallel-size); use 1 or leave it out");
  only("context-parallel-size", {"1"},
       "megazero has no context parallelism (the sequence split over ranks inside attention); "
       "--sequence-parallel splits the activations outside it: use 1 or leave it out");
  only("rotary-percent", {"1", "1.0"},
       "partial rotary embeddings are not implemented: every dimension of a head rotates (use 1.0)");
  only("data-impl", {"mmap"}, "datasets are always memory-mapped Megatron .bin/.idx files: use mmap");
  only("optimizer-offload-fraction", {"1", "1.0"},
       "a partial offload is not implemented: --optimizer-cpu-offload moves the whole optimizer state of each "
       "rank's partition to host memory (use 1.0, or leave both out to keep it on the device)");
  only("optimizer", {"adam"}, "megazero's optimizer is AdamW (ZeRO partitions its states): use adam");
  for (const char* dtype : {"main-grads-dtype", "main-params-dtype", "exp-avg-dtype", "exp-avg-sq-dtype"})
    only(dtype, {"fp32"}, "the optimizer's master weights, gradients and moments are fp32: use fp32 or leave it out");
  if (value("no-position-embedding") && a.model.position_embedding_type != "rope")
    refused.push_back(
        "--no-position-embedding: a model without position information is not implemented; use "
        "--position-embedding-type rope (which has no position table)");
  only("dataloader-type", {"single"},
       "samples are read in order from the data position (Megatron's single); the cyclic sampler's per-epoch "
       "shuffle is not implemented: use single");
  if (const auto* v = value("kv-channels"); v && a.model.num_attention_heads > 0) {
    const std::int64_t head = a.model.hidden_size / a.model.num_attention_heads;
    if (parse_int("kv-channels", *v) != head)
      refused.push_back("--kv-channels " + *v + ": a head size other than --hidden-size / --num-attention-heads (" +
                        std::to_string(head) + ") is not implemented; use " + std::to_string(head) +
                        " or leave it out");
  }
  only("tokenizer-type",
       {"GPT2BPETokenizer", "ByteLevel", "Llama2Tokenizer", "GPTSentencePieceTokenizer", "HuggingFaceTokenizer",
        "NullTokenizer"},
       "the data is tokenized beforehand (tools/preprocess_data knows GPT2BPETokenizer, ByteLevel, Llama2Tokenizer, "
       "GPTSentencePieceTokenizer, HuggingFaceTokenizer and NullTokenizer; Megatron's tools/preprocess_data.py "
       "writes the same .bin/.idx): name one of those, or leave it out");
  const std::string* type = value("tokenizer-type");
  const std::string* model_file = value("tokenizer-model");
  // The types whose vocabulary is a model file: SentencePiece's, Hugging Face's.
  const bool model_based =
      type && (*type == "Llama2Tokenizer" || *type == "GPTSentencePieceTokenizer" || *type == "HuggingFaceTokenizer");
  if (model_file && !model_based)
    refused.push_back(
        "--tokenizer-model: read only with --tokenizer-type Llama2Tokenizer, GPTSentencePieceTokenizer (a "
        "SentencePiece model) or HuggingFaceTokenizer (a tokenizer.json's directory); name the type, or drop it");
  if (model_based && !model_file)
    refused.push_back("--tokenizer-type " + *type + ": needs --tokenizer-model, the " +
                      (*type == "HuggingFaceTokenizer" ? "directory of the tokenizer.json" : "SentencePiece model") +
                      " the data was tokenized with");
  const bool by_document = a.eod_mask_loss || a.reset_position_ids || a.reset_attention_mask;
  // GPT-2's files: read when given (a missing or broken file is an error here,
  // not at the first report).
  const bool gpt2_files = !a.vocab_file.empty() || !a.merge_file.empty();
  if (gpt2_files && type && *type != "GPT2BPETokenizer")
    refused.push_back(
        "--vocab-file and --merge-file: GPT-2 BPE's files, read with --tokenizer-type GPT2BPETokenizer, "
        "not " +
        *type + "; drop them");
  // The tokenizer whose files the flags name: its tokens are the vocabulary
  // and its end of text ends a document (data/sentencepiece_tokenizer.h,
  // data/hf_tokenizer.h, data/gpt2_tokenizer.h), as Megatron's tokenizer
  // reports them.
  std::unique_ptr<data::Tokenizer> files_tok;
  std::string source;
  if (model_based && model_file && refused.empty()) {
    files_tok = data::make_tokenizer(*type, "", "", *model_file);
    source = "--tokenizer-model " + *model_file;
  } else if (gpt2_files && refused.empty()) {
    MZ_REQUIRE(!a.vocab_file.empty() && !a.merge_file.empty(),
               "--vocab-file and --merge-file go together (GPT-2's encoder.json and vocab.bpe): pass both, or neither");
    files_tok = data::make_tokenizer("GPT2BPETokenizer", a.vocab_file, a.merge_file);
    source = "--vocab-file " + a.vocab_file;
  }
  if (files_tok) {
    if (!was_given("vocab-size")) {
      a.model.vocab_size = files_tok->vocab_size();
      a.notes.push_back("--vocab-size " + std::to_string(files_tok->vocab_size()) + " from " + source +
                        " (its tokens)");
    } else {
      MZ_REQUIRE(a.model.vocab_size >= files_tok->vocab_size(), "--vocab-size ", a.model.vocab_size,
                 " is smaller than ", source, "'s ", files_tok->vocab_size(),
                 " tokens: its token ids would fall outside the model; leave --vocab-size out to take its count");
    }
    if (by_document && a.eod_token_id == -1) a.eod_token_id = files_tok->eod();
  }
  // NullTokenizer (Megatron's): --vocab-size N ids in the data and one more,
  // N, that ends a document, so the model's vocabulary is N + 1.
  if (type && *type == "NullTokenizer") {
    if (!was_given("vocab-size"))
      refused.push_back(
          "--tokenizer-type NullTokenizer: needs --vocab-size N, the token ids the data holds (Megatron's "
          "NullTokenizer adds one more, N, the end of a document)");
    else if (refused.empty()) {
      const data::NullTokenizer tok(a.model.vocab_size);
      a.model.vocab_size = tok.vocab_size();
      a.notes.push_back("--tokenizer-type NullTokenizer: the model's vocabulary is --vocab-size + 1 = " +
                        std::to_string(tok.vocab_size()) + " (id " + std::to_string(tok.eod()) +
                        " ends a document), as Megatron builds it");
      if (by_document && a.eod_token_id == -1) a.eod_token_id = tok.eod();
    }
  }
  // The end-of-document token --eod-mask-loss masks: the tokenizer's end of
  // text, as tools/preprocess_data --append-eod writes it (data/gpt2_tokenizer.h).
  if (type && by_document && a.eod_token_id == -1)
    a.eod_token_id = *type == "ByteLevel" ? 256 : *type == "GPT2BPETokenizer" ? 50256 : -1;
  if (value("calculate-per-token-loss")) {
    if (a.eod_mask_loss)
      a.per_token_loss = true;
    else
      a.notes.push_back(
          "--calculate-per-token-loss has no effect here: without --eod-mask-loss every micro-batch holds as many "
          "tokens, so the loss is already the per-token mean over the global batch");
  }
  if (!refused.empty()) {
    std::string msg =
        refused.size() == 1 ? "" : std::to_string(refused.size()) + " Megatron flags cannot be honoured: ";
    for (std::size_t i = 0; i < refused.size(); ++i) msg += (i ? "; " : "") + refused[i];
    throw ConfigError(msg);
  }

  if (value("use-distributed-optimizer")) {
    MZ_REQUIRE(!was_given("zero-stage") || a.zero.stage >= 1,
               "--use-distributed-optimizer partitions the optimizer "
               "states (ZeRO stage 1) but --zero-stage 0 was given; drop one of them");
    if (!was_given("zero-stage") && a.zero_config.empty()) a.zero.stage = 1;
  }
  if (value("use-torch-fsdp2")) {
    MZ_REQUIRE(!was_given("zero-stage") || a.zero.stage == 3,
               "--use-torch-fsdp2 shards parameters, gradients and optimizer states (ZeRO stage 3) but --zero-stage ",
               a.zero.stage, " was given; drop one of them");
    MZ_REQUIRE(!value("use-distributed-optimizer"),
               "--use-torch-fsdp2 (ZeRO stage 3) and --use-distributed-optimizer (stage 1) choose two stages; keep "
               "one");
    MZ_REQUIRE(a.zero_config.empty(), "--use-torch-fsdp2 (ZeRO stage 3) and --zero-config ", a.zero_config,
               " choose two stages; keep one");
    a.zero.stage = 3;
  }
  if (value("distribute-saved-activations")) {
    MZ_REQUIRE(a.zero_config.empty() || a.zero_r.partition_activations, "--distribute-saved-activations is Pa, which ",
               "--zero-config ", a.zero_config, " does not have; use C2, C4 or C5, or drop the flag");
    a.zero_r.partition_activations = true;
  }
  // Megatron's fast fused attention: cuDNN's where it can run (on an H200 it
  // trained GPT-2 medium 1.8x faster than our flash kernel,
  // docs/PERFORMANCE.md), else our fused kernel.
  const bool cudnn = a.device == "cuda" && a.model.num_attention_heads > 0 &&  // bad heads: validate() says so
                     kernels::cudnn_attention_unsupported(DeviceKind::CUDA, a.dtype(), a.model.head_dim()).empty();
  // Per-document masks: cuDNN's attention takes them as an additive bias
  // that no GPU has run yet (docs/gpu-runs/NEXT_LEASE.md), so Megatron's
  // choice of the fast backend is our fused kernel there, noted;
  // --attention-backend cudnn asks for cuDNN's.
  const char* fast = cudnn && !a.reset_attention_mask ? "cudnn" : "fused";
  if (cudnn && a.reset_attention_mask &&
      (value("use-flash-attn") || a.model.attention_backend == "auto" || a.model.attention_backend == "flash"))
    a.notes.push_back(
        "--reset-attention-mask: the attention is megazero's fused kernel (--attention-backend fused); "
        "cuDNN's with the documents as an additive bias is --attention-backend cudnn (not yet timed)");
  // Megatron's other --attention-backend values: auto (its choice of the
  // fastest) and flash are the fast fused attention; local is its own
  // unfused attention.
  auto& backend = a.model.attention_backend;
  if (backend == "auto" || backend == "flash") backend = fast;
  if (backend == "local") backend = "unfused";
  if (value("use-flash-attn")) {
    MZ_REQUIRE(!was_given("attention-backend") || a.model.attention_backend != "unfused",
               "--use-flash-attn means a fused attention (--attention-backend ", fast,
               " here), but --attention-backend unfused was given; drop one of them");
    if (!was_given("attention-backend")) a.model.attention_backend = fast;
  }
  if (value("checkpoint-activations") || value("deepspeed-activation-checkpointing"))
    a.model.recompute_activations = true;
  if (const auto* v = value("ddp-bucket-size")) {
    conflict("ddp-bucket-size", "reduce-bucket-size");
    a.zero.reduce_bucket_size = parse_int("ddp-bucket-size", *v);
  }
  if (const auto* v = value("deepspeed_config")) {
    conflict("deepspeed_config", "deepspeed-config");
    a.deepspeed_config = *v;
  }
  if (value("overlap-grad-reduce")) a.zero.overlap_comm = true;
  if (value("use-rotary-position-embeddings")) {
    MZ_REQUIRE(!was_given("position-embedding-type") || a.model.position_embedding_type == "rope",
               "--use-rotary-position-embeddings means --position-embedding-type rope, but --position-embedding-type ",
               a.model.position_embedding_type, " was given; drop one of them");
    a.model.position_embedding_type = "rope";
  }
  if (value("use-checkpoint-opt_param-scheduler")) a.use_checkpoint_lr_schedule = true;
  if (value("override-opt_param-scheduler")) a.override_lr_schedule = true;
  if (const auto* v = value("distributed-timeout-minutes")) {
    conflict("distributed-timeout-minutes", "collective-timeout");
    const double minutes = parse_real("distributed-timeout-minutes", *v);
    MZ_REQUIRE(minutes > 0, "--distributed-timeout-minutes must be positive, got ", *v);
    a.collective_timeout = minutes * 60;
  }
  // Sample counts become iterations: Megatron's sample-based schedule with a
  // fixed global batch is the iteration-based one. With a batch-size ramp-up
  // the schedule is read in samples anyway (LrSchedule::at_samples), so its
  // spans translate alike; the number of iterations to train counts the
  // ramp's smaller batches (BatchSchedule::iterations_for, Megatron's count).
  auto samples_to_iters = [&](const char* flag, const char* ours, std::int64_t* field) {
    const auto* v = value(flag);
    if (!v) return;
    conflict(flag, ours);
    const std::int64_t samples = parse_int(flag, *v);
    MZ_REQUIRE(samples >= 0, "--", flag, " must not be negative, got ", samples);
    MZ_REQUIRE(a.global_batch_size > 0, "--", flag,
               " counts samples: it needs --global-batch-size to turn them into "
               "iterations");
    if (field == &a.train_iters && !a.rampup_batch_size.empty()) {
      *field = BatchSchedule::parse(a.rampup_batch_size, a.global_batch_size).iterations_for(samples);
      return;
    }
    MZ_REQUIRE(samples % a.global_batch_size == 0, "--", flag, " ", samples,
               " is not a multiple of --global-batch-size ", a.global_batch_size, "; use a multiple (or --", ours, ")");
    *field = samples / a.global_batch_size;
  };
  // Megatron's files of data arguments, for blends too long for a command
  // line: --data-path's words, or a JSON object of the three splits' lists.
  if (const auto* v = value("data-args-path")) {
    conflict("data-args-path", "data-path");
    const std::string text = read_config_file(*v, "--data-args-path", "a text file of --data-path's words");
    std::istringstream words(text);
    a.data_path.clear();
    for (std::string w; words >> w;) a.data_path.push_back(w);
    MZ_REQUIRE(!a.data_path.empty(), "--data-args-path: '", *v,
               "' holds no words; write --data-path's arguments in it (PREFIX, or WEIGHT PREFIX ...)");
  }
  if (const auto* v = value("per-split-data-args-path")) {
    MZ_REQUIRE(!value("data-args-path"),
               "--per-split-data-args-path and --data-args-path both name the data; keep one");
    const std::string file = *v;
    const std::string text = read_config_file(file, "--per-split-data-args-path",
                                              "a JSON file with train, valid and test lists of data arguments");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError("--per-split-data-args-path: '" + file + "' is not JSON (" + e.what() + ")");
    }
    MZ_REQUIRE(j.is_object(), "--per-split-data-args-path: '", file,
               "' must hold an object with \"train\", \"valid\" and \"test\" lists");
    const std::pair<const char*, std::vector<std::string>*> splits[] = {
        {"train", &a.train_data_path}, {"valid", &a.valid_data_path}, {"test", &a.test_data_path}};
    for (const auto& item : j.items()) {
      const std::string& key = item.key();
      const bool known =
          std::any_of(std::begin(splits), std::end(splits), [&](const auto& sp) { return key == sp.first; });
      MZ_REQUIRE(known, "--per-split-data-args-path: '", file, "' has the key \"", key,
                 "\"; the keys are train, valid and test");
    }
    for (const auto& [key, field] : splits) {
      const std::string flag = std::string(key) + "-data-path";
      if (!j.contains(key)) continue;
      conflict("per-split-data-args-path", flag.c_str());
      const auto& list = j.at(key);
      MZ_REQUIRE(list.is_array() || list.is_string(), "--per-split-data-args-path: '", file, "': \"", key,
                 "\" must be a list of --", flag, "'s words (or one string of them)");
      field->clear();
      auto add_words = [&](const std::string& words) {
        std::istringstream in(words);
        for (std::string w; in >> w;) field->push_back(w);
      };
      if (list.is_string()) add_words(list.get<std::string>());
      for (const auto& w : list.is_array() ? list : nlohmann::json::array()) {
        MZ_REQUIRE(w.is_string() || w.is_number(), "--per-split-data-args-path: '", file, "': \"", key, "\" holds ",
                   w.dump(), "; its items are prefixes and weights");
        add_words(w.is_string() ? w.get<std::string>() : w.dump());
      }
    }
    MZ_REQUIRE(!a.train_data_path.empty(), "--per-split-data-args-path: '", file,
               "' names no training data; give \"train\" a list of data arguments");
  }
  samples_to_iters("train-samples", "train-iters", &a.train_iters);
  samples_to_iters("lr-decay-samples", "lr-decay-iters", &a.lr.decay_iters);
  samples_to_iters("lr-warmup-samples", "lr-warmup-iters", &a.lr.warmup_iters);
  samples_to_iters("lr-wsd-decay-samples", "lr-wsd-decay-iters", &a.lr.wsd_decay_iters);
  if (const auto* v = value("lr-warmup-fraction")) {
    conflict("lr-warmup-fraction", "lr-warmup-iters");
    MZ_REQUIRE(!value("lr-warmup-samples"),
               "--lr-warmup-fraction and --lr-warmup-samples both set the warmup; keep one");
    const double f = parse_real("lr-warmup-fraction", *v);
    MZ_REQUIRE(f >= 0 && f <= 1, "--lr-warmup-fraction must be in [0, 1], got ", *v);
    const std::int64_t decay = a.lr.decay_iters > 1 ? a.lr.decay_iters : a.train_iters;
    a.lr.warmup_iters = static_cast<std::int64_t>(std::llround(f * static_cast<double>(decay)));
  }
}

std::string nearest_flag(const std::string& name, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& k : known) {
    const std::size_t d = distance(name, k);
    if (d < best_d) best_d = d, best = k;
  }
  // Close enough to be a typo: a third of the name's length, at least 1, at most 3 edits.
  const std::size_t limit = std::clamp<std::size_t>(name.size() / 3, 1, 3);
  if (best_d <= limit) return best;
  // A prefix or a part of a longer name (--layers for --num-layers).
  for (const auto& k : known)
    if (name.size() >= 4 && k.find(name) != std::string::npos) return k;
  return "";
}

std::string describe_flag_problems(const FlagProblems& p, const std::vector<std::string>& known) {
  std::vector<std::string> items;
  const bool file = !p.where.empty();
  const std::string dashes = file ? "" : "--";
  for (const auto& u : p.unknown) {
    const std::string near = nearest_flag(u, known);
    items.push_back((file ? "'" + u + "' is not a pretrain_gpt key" : "--" + u + " is not a pretrain_gpt flag") +
                    (near.empty() ? "" : " (did you mean " + dashes + near + "?)"));
  }
  for (const auto& s : p.stray) items.push_back("'" + s + "' is not a flag or a flag's value (flags start with --)");
  if (items.empty()) return "";
  std::string msg = (p.where.empty() ? "" : p.where + ": ") +
                    (items.size() == 1 ? std::string() : std::to_string(items.size()) + " problems: ");
  for (std::size_t i = 0; i < items.size(); ++i) msg += (i ? "; " : "") + items[i];
  return msg + "; run pretrain_gpt --help for the options";
}

}  // namespace megazero::train
