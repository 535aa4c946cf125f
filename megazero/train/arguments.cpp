#include "megazero/train/arguments.h"

#include "megazero/kernels/cudnn_attention.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/train/deepspeed_config.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>

#include <boost/program_options.hpp>

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "megazero/core/limits.h"
#include "megazero/train/megatron_compat.h"

namespace po = boost::program_options;

namespace megazero::train {
namespace {

// Registers each flag once: its Program_options entry (in a --help group) and
// a printer for the resolved configuration.
class OptionTable {
 public:
  po::options_description& group(const std::string& title) {
    auto it = groups_.find(title);
    if (it == groups_.end()) {
      order_.push_back(title);
      it = groups_.emplace(title, po::options_description(title)).first;
    }
    return it->second;
  }
  template <typename T>
  void add(const std::string& g, const char* name, T* field, const char* help) {
    group(g).add_options()(name, po::value<T>(field)->default_value(*field), help);
    printers_.emplace_back(name, [field] {
      if constexpr (std::is_floating_point_v<T>) {
        // As ostream prints it (6 significant digits) when that reads back as
        // the same double, else the shortest text that does: a stored
        // configuration (checkpoints, HF export) keeps every digit given.
        std::ostringstream os;
        os << *field;
        if (std::strtod(os.str().c_str(), nullptr) == static_cast<double>(*field)) return os.str();
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, *field);
        return std::string(buf, r.ptr);
      } else {
        std::ostringstream os;
        os << *field;
        return os.str();
      }
    });
  }
  // Several values: `--flag a b c` on the command line, `flag = a b c` in a file.
  void list(const std::string& g, const char* name, std::vector<std::string>* field, const char* help) {
    group(g).add_options()(name, po::value(field)->multitoken()->notifier([field](const std::vector<std::string>& v) {
      std::vector<std::string> split;
      for (const auto& item : v) {  // a config-file value arrives as one token
        std::istringstream is(item);
        for (std::string w; is >> w;) split.push_back(w);
      }
      *field = split;
    }),
                           help);
    printers_.emplace_back(name, [field] {
      std::string out;
      for (const auto& v : *field) out += (out.empty() ? "" : " ") + v;
      return out;
    });
  }
  // A value that may be left out: `--name` alone means `implicit`.
  void optional_value(const std::string& g, const char* name, std::string* field, const char* implicit,
                      const char* help) {
    group(g).add_options()(name, po::value(field)->default_value(*field)->implicit_value(implicit), help);
    printers_.emplace_back(name, [field] { return *field; });
  }
  void flag(const std::string& g, const char* name, bool* field, const char* help) {
    group(g).add_options()(name, po::bool_switch(field), help);
    printers_.emplace_back(name, [field] { return std::string(*field ? "true" : "false"); });
  }
  po::options_description all() const {
    po::options_description d("pretrain_gpt options");
    for (const auto& t : order_) d.add(groups_.at(t));
    return d;
  }
  std::string print() const {
    std::string out;
    for (const auto& [name, fn] : printers_) out += name + " = " + fn() + "\n";
    return out;
  }

 private:
  std::map<std::string, po::options_description> groups_;
  std::vector<std::string> order_;
  std::vector<std::pair<std::string, std::function<std::string()>>> printers_;
};

void define(OptionTable& t, TrainArgs& a) {
  const std::string M = "Model", P = "Parallelism", Z = "ZeRO", T = "Training", L = "Learning rate",
                    X = "Mixed precision", D = "Data", G = "Logging and evaluation", C = "Checkpointing",
                    F = "Faults and debugging", O = "Other";
  t.add(M, "num-layers", &a.model.num_layers, "transformer layers");
  t.add(M, "hidden-size", &a.model.hidden_size, "hidden size");
  t.add(M, "num-attention-heads", &a.model.num_attention_heads, "attention heads (divisible by TP)");
  t.add(M, "ffn-hidden-size", &a.model.ffn_hidden_size, "MLP width; 0 = 4 x hidden");
  t.add(M, "seq-length", &a.model.seq_length, "sequence length");
  t.add(M, "max-position-embeddings", &a.model.max_position_embeddings, "position table size (>= seq length)");
  t.add(M, "vocab-size", &a.model.vocab_size,
        "vocabulary size: the data's tokenizer's (GPT-2 BPE: 50257); a token id at or past it is an error");
  t.add(M, "make-vocab-size-divisible-by", &a.model.make_vocab_size_divisible_by, "vocab padded to this x TP");
  t.add(M, "hidden-dropout", &a.model.hidden_dropout, "dropout after attention and MLP");
  t.add(M, "attention-dropout", &a.model.attention_dropout, "dropout on attention probabilities");
  t.add(M, "init-method-std", &a.model.init_method_std, "init std (output layers scaled by 1/sqrt(2 layers))");
  t.flag(M, "init-method-xavier-uniform", &a.model.init_xavier_uniform,
         "every weight matrix and embedding U(-a, a), a = sqrt(6 / (fan_in + fan_out)) of its whole (TP 1) "
         "matrix, instead of normal with --init-method-std (Megatron's)");
  t.add(M, "attention-backend", &a.model.attention_backend,
        "unfused (scores and probabilities in memory, as Megatron's classic path), fused (flash-style: neither "
        "is kept; backward recomputes them; the exact reference for cudnn) or cudnn (cuDNN's fused attention, "
        "--device cuda, bf16/fp16; its own dropout mask; the fastest on a GPU: docs/PERFORMANCE.md); Megatron's "
        "auto and flash choose cudnn where it can run, else fused; its local is unfused");
  t.flag(M, "deterministic-mode", &a.model.deterministic,
         "deterministic kernels only: the same bits on every rerun (the other backends always are; with "
         "--attention-backend cudnn its deterministic backward, which needs a [B*heads, S, S] workspace)");
  t.flag(M, "recompute-activations", &a.model.recompute_activations,
         "full recompute: keep only each layer's input; recompute the layer in backward (= --recompute-granularity "
         "full; Megatron's --recompute-activations means selective)");
  t.add(M, "recompute-granularity", &a.recompute_granularity,
        "full (as --recompute-activations) or selective (only the unfused attention's [S, S] probabilities are "
        "dropped after forward and recomputed in backward: most of the memory for a fraction of the compute)");
  t.add(M, "recompute-method", &a.recompute_method,
        "with full recompute: uniform (every layer; in chunks of --recompute-num-layers layers that keep one input "
        "together, 1 by default) or block (only the first --recompute-num-layers layers; the rest keep their "
        "activations)");
  t.add(M, "recompute-num-layers", &a.recompute_num_layers,
        "with --recompute-method block: how many of the first layers recompute; with uniform: how many layers "
        "recompute together from one kept input (1 to --num-layers)");
  t.flag(M, "no-bias-gelu-fusion", &a.no_bias_gelu_fusion,
         "add the MLP's first bias and sum its gradient in passes of their own, not inside the GeLU kernels (the "
         "GeLU stays the tanh approximation; Megatron's unfused GeLU is the exact erf one unless --openai-gelu)");
  t.optional_value(M, "gemm-epilogues", &a.gemm_epilogues, "forward",
                   "none, forward (the bare flag: QKV's bias and the MLP's bias + GeLU inside their GEMMs, as "
                   "cuBLASLt epilogues on --device cuda; elsewhere the same math in separate passes) or all (also "
                   "the backward's GeLU and bias gradients: slower on the H200, docs/PERFORMANCE.md); write "
                   "--gemm-epilogues=all");
  t.flag(M, "gemm-autotune", &a.gemm_autotune,
         "time cuBLASLt's candidate algorithms for each GEMM problem on its first call and keep the fastest "
         "(--device cuda; the log says what it kept; runs may then differ in the last bits, so not with "
         "--deterministic-mode)");
  t.add(M, "position-embedding-type", &a.model.position_embedding_type,
        "learned_absolute (a trained position table, GPT-2) or rope (rotary embeddings of q and k, Llama)");
  t.add(M, "norm-epsilon", &a.model.layernorm_epsilon,
        "epsilon of every LayerNorm / RMSNorm (GPT-2 and Llama 2: 1e-5; Llama 1: 1e-6)");
  t.add(M, "rotary-base", &a.model.rotary_base, "rope's base period: theta = position x base^(-2i/head size)");
  t.add(M, "rotary-seq-len-interpolation-factor", &a.model.rotary_interpolation_factor,
        "rope's position interpolation (Megatron's; Hugging Face's linear rope_scaling): positions divided by it");
  t.flag(M, "use-rope-scaling", &a.model.use_rope_scaling,
         "Llama 3.x's rope scaling (Megatron's; Hugging Face's rope_type llama3): rope's frequencies whose "
         "wavelength exceeds 8192 positions divided by --rope-scaling-factor, those below 2048 kept, those between "
         "blended");
  t.add(M, "rope-scaling-factor", &a.model.rope_scaling_factor,
        "with --use-rope-scaling: what the low frequencies are divided by (Llama 3.1: 8, Llama 3.2: 32)");
  t.flag(M, "rotary-interleaved", &a.model.rotary_interleaved,
         "rope rotates pairs of adjacent dimensions (2i, 2i + 1; GPT-J's, Meta's Llama) instead of the head's two "
         "halves (i, i + D/2; Megatron's default, Hugging Face's Llama)");
  t.add(M, "normalization", &a.model.normalization, "LayerNorm (GPT-2) or RMSNorm (Llama)");
  t.flag(M, "swiglu", &a.model.swiglu,
         "SwiGLU MLP: fc2(silu(x W_gate) * (x W_up)); --ffn-hidden-size defaults to 2/3 x 4h, a multiple of 64");
  t.flag(M, "squared-relu", &a.model.squared_relu,
         "squared-ReLU MLP: fc2(relu(x W1 + b1)^2) (Megatron's; Primer, Nemotron); not with --swiglu");
  t.flag(M, "apply-layernorm-1p", &a.model.layernorm_1p,
         "every norm's weight stored as gamma - 1 (initialised to 0) and applied as 1 + weight (Megatron's; "
         "Transformer Engine's zero-centred gamma)");
  t.flag(M, "apply-residual-connection-post-layernorm", &a.model.residual_post_norm,
         "each sub-block adds its norm's output to its own output instead of its input (Megatron's; the residual "
         "stream passes through every norm)");
  t.flag(M, "qk-layernorm", &a.model.qk_layernorm,
         "normalise q and k per head (--normalization's kind, a weight of the head size each) before the rotary "
         "embedding and the scores (Megatron's)");
  t.flag(M, "group-query-attention", &a.group_query_attention,
         "grouped-query attention: --num-query-groups key/value heads, each shared by a group of query heads");
  t.add(M, "num-query-groups", &a.num_query_groups,
        "key/value heads with --group-query-attention (divides the head count; divisible by TP)");
  t.flag(M, "disable-bias-linear", &a.disable_bias_linear, "no bias in any linear layer (Llama)");
  t.flag(M, "add-qkv-bias", &a.model.add_qkv_bias,
         "with --disable-bias-linear: the query, key and value projection keeps its bias (Megatron's; Qwen2)");
  t.flag(M, "untie-embeddings-and-output-weights", &a.model.untie_embeddings,
         "the logits get an output-layer weight of their own instead of the word embedding's");
  t.add(P, "tensor-model-parallel-size", &a.parallel.tensor_model_parallel_size, "ranks per TP group (inside a node)");
  t.flag(P, "sequence-parallel", &a.model.sequence_parallel,
         "split norms, dropout and the residual stream along the tokens across the TP group (Megatron's sequence "
         "parallelism): their activations fall by the TP degree; TP all-reduces become reduce-scatter/all-gather");
  t.add(P, "ranks-per-node", &a.parallel.ranks_per_node, "0 = detect from MPI");
  t.flag(P, "allow-tp-across-nodes", &a.parallel.allow_tp_across_nodes, "accept TP groups spanning nodes (slow)");
  t.add(Z, "zero-stage", &a.zero.stage, "0 plain DP, 1 Pos, 2 Pos+g, 3 Pos+g+p");
  t.add(Z, "reduce-bucket-size", &a.zero.reduce_bucket_size, "gradient bucket, elements (the paper's CB)");
  t.add(Z, "overlap-comm", &a.zero.overlap_comm, "reduce buckets during backward (true/false)");
  t.optional_value(Z, "overlap-param-gather", &a.overlap_param_gather, "true",
                   "stages 1-2: the step's all-gather of the updated parameters runs in group-sized pieces during the "
                   "next forward, each waited for by its first layer (true/false; alone: true; false shows what it "
                   "hides, in the timers' exposed DP comm)");
  t.add(Z, "overlap-optimizer", &a.zero.overlap_optimizer,
        "stage 0: AdamW updates the parameters run by run of layers beside the next forward (a side stream on a "
        "GPU), each layer's forward waiting for its own run only; same bits (true/false)");
  t.flag(Z, "optimizer-cpu-offload", &a.zero.offload_optimizer,
         "ZeRO-Offload (DeepSpeed's offload_optimizer): keep the fp32 master weights and Adam moments of this rank's "
         "partition in host memory (page-locked on a GPU) and run AdamW on the host's cores; gradients go down and "
         "updated parameters up each step, overlapped chunk by chunk. Frees 12 bytes a parameter of device memory "
         "(/Nd at stages 1-3) for host memory and PCIe time; same bits");
  t.flag(Z, "param-cpu-offload", &a.zero.offload_params,
         "stage 3 with --optimizer-cpu-offload (DeepSpeed's offload_param, ZeRO-Infinity's CPU offload): the 16-bit "
         "parameter partition in host memory too, updated there by the host's AdamW, each rank's piece uploaded "
         "before each gather; the device keeps the gradient partition and the gathered layers (2 bytes a parameter "
         "/Nd less); same bits");
  t.add(Z, "stage3-prefetch", &a.zero.prefetch,
        "stage 3: gather the next parameter group while this one computes (true/false; false shows what the "
        "prefetch hides, in the timers' exposed DP comm)");
  t.add(Z, "zero-config", &a.zero_config,
        "the paper's C1..C5: C1 Pos+CB+MD, C2 +Pa, C3 Pos+g+CB+MD, C4 +Pa, C5 +Pa+cpu (expands to the flags below)");
  t.flag(Z, "partition-activations", &a.zero_r.partition_activations,
         "Pa: keep 1/TP of each checkpointed layer input per rank; all-gather before recompute");
  t.flag(Z, "cpu-checkpointing", &a.zero_r.cpu_checkpointing, "Pa+cpu: keep those slices in host memory");
  t.flag(Z, "contiguous-memory-optimization", &a.zero_r.contiguous_memory,
         "MD: checkpoints in one pre-allocated arena instead of separate allocations");
  t.flag(Z, "device-arena", &a.device_arena,
         "MD for all device memory: reserve this rank's planned first-fit peak as one block at start and place every "
         "tensor at the planner's offset, so training steps make no allocator call (what does not fit, e.g. a "
         "checkpoint save beyond the plan, is allocated as usual and counted as an arena miss)");
  t.add(T, "micro-batch-size", &a.micro_batch_size, "samples per rank per micro-batch");
  t.add(T, "global-batch-size", &a.global_batch_size, "samples per iteration; 0 = micro x DP");
  t.list(T, "rampup-batch-size", &a.rampup_batch_size,
         "START INCREMENT SAMPLES (Megatron's): the global batch starts at START and grows by INCREMENT in equal "
         "steps over the first SAMPLES samples to --global-batch-size; the learning-rate schedule then advances by "
         "samples (an iteration of a smaller batch moves it less), as Megatron's does");
  t.flag(T, "decrease-batch-size-if-needed", &a.decrease_batch_size_if_needed,
         "a --global-batch-size that is not a multiple of --micro-batch-size x data-parallel size trains the largest "
         "multiple below it instead of being refused (Megatron's; e.g. after losing nodes), with a note");
  t.add(T, "train-iters", &a.train_iters, "iterations to train");
  t.add(T, "clip-grad", &a.clip_grad, "global gradient-norm clip; 0 = off");
  t.add(T, "weight-decay", &a.adam.weight_decay, "AdamW decoupled weight decay");
  t.add(T, "start-weight-decay", &a.start_weight_decay,
        "with --weight-decay-incr-style linear or cosine: the weight decay at the start (Megatron's); -1 = "
        "--weight-decay");
  t.add(T, "end-weight-decay", &a.end_weight_decay,
        "with --weight-decay-incr-style linear or cosine: the weight decay reached after --weight-decay-incr-iters; "
        "-1 = --weight-decay");
  t.add(T, "weight-decay-incr-style", &a.weight_decay_incr_style,
        "constant, linear or cosine: how the weight decay goes from --start-weight-decay to --end-weight-decay");
  t.add(T, "weight-decay-incr-iters", &a.weight_decay_incr_iters,
        "iterations over which the weight decay changes; 0 = --train-iters (Megatron's)");
  t.add(T, "adam-beta1", &a.adam.beta1, "Adam beta1");
  t.add(T, "adam-beta2", &a.adam.beta2, "Adam beta2");
  t.add(T, "adam-eps", &a.adam.eps, "Adam epsilon");
  t.add(T, "seed", &a.seed, "seed of initialisation, dropout and data order");
  t.add(L, "lr", &a.lr.max_lr, "peak learning rate");
  t.add(L, "min-lr", &a.lr.min_lr, "learning rate after decay");
  t.add(L, "lr-warmup-iters", &a.lr.warmup_iters, "linear warmup iterations");
  t.add(L, "lr-warmup-init", &a.lr.init_lr, "the learning rate the linear warmup starts from (Megatron's)");
  t.add(L, "lr-warmup-style", &a.lr.warmup_style,
        "linear (Megatron's) or log (DeepSpeed's WarmupLR default: a logarithmic rise)");
  t.add(L, "lr-decay-iters", &a.lr.decay_iters, "iteration at which min-lr is reached; 0 = train-iters");
  t.add(L, "lr-decay-style", &a.lr.style,
        "cosine, linear, constant, inverse-square-root or WSD (warmup-stable-decay: --lr until the anneal of "
        "--lr-wsd-decay-iters that ends at --lr-decay-iters)");
  t.add(L, "lr-wsd-decay-iters", &a.lr.wsd_decay_iters,
        "with --lr-decay-style WSD: the anneal's iterations, the last before --lr-decay-iters");
  t.add(L, "lr-wsd-decay-style", &a.lr.wsd_style,
        "with --lr-decay-style WSD: the anneal's shape, exponential, linear, cosine or minus_sqrt (Megatron's)");
  t.flag(X, "fp16", &a.fp16, "fp16 params/grads, fp32 master, dynamic loss scaling");
  t.flag(X, "bf16", &a.bf16, "bf16 params/grads, fp32 master");
  t.add(X, "initial-loss-scale", &a.loss_scale.initial_scale, "fp16 initial loss scale (Megatron: 2^32)");
  t.add(X, "loss-scale-window", &a.loss_scale.window, "good steps before the scale grows");
  t.add(X, "hysteresis", &a.loss_scale.hysteresis, "overflows tolerated before the scale backs off");
  t.add(X, "min-loss-scale", &a.loss_scale.min_scale, "floor of the loss scale");
  t.add(X, "loss-scale", &a.loss_scale.constant_scale,
        "a constant loss scale for --fp16 or --bf16 (Megatron's): never grown or backed off, an overflowing step is "
        "skipped; 0 = dynamic scaling with --fp16, none otherwise");
  t.list(D, "data-path", &a.data_path,
         "prefix of a .bin/.idx dataset (tools/preprocess_data), or weight-prefix pairs to blend: 0.3 A 0.7 B");
  t.add(D, "split", &a.split, "train,valid,test weights, e.g. 969,30,1");
  t.list(D, "train-data-path", &a.train_data_path,
         "the training split's own dataset (or weight-prefix blend), read whole, instead of --data-path's share "
         "(Megatron's)");
  t.list(D, "valid-data-path", &a.valid_data_path, "with --train-data-path: the validation split's own dataset");
  t.list(D, "test-data-path", &a.test_data_path, "with --train-data-path: the test split's own dataset");
  t.flag(D, "mock-data", &a.mock_data, "synthetic tokens (benchmarks), no dataset");
  t.flag(D, "eod-mask-loss", &a.eod_mask_loss,
         "no loss where the input token is the end-of-document token (Megatron's): each micro-batch's loss is the "
         "mean over the tokens it keeps");
  t.add(D, "eod-token-id", &a.eod_token_id,
        "the end-of-document token for --eod-mask-loss, --reset-position-ids and --reset-attention-mask; default: "
        "--tokenizer-type's (GPT2BPETokenizer 50256, ByteLevel 256, the SentencePiece ones' --tokenizer-model's </s>)");
  t.flag(D, "reset-position-ids", &a.reset_position_ids,
         "positions restart at 0 after each end-of-document token (Megatron's): every document packed into a "
         "sample is positioned as if alone");
  t.flag(D, "reset-attention-mask", &a.reset_attention_mask,
         "tokens attend only to earlier tokens of their own document (Megatron's; the end-of-document token ends "
         "it)");
  t.add(G, "deepspeed-config", &a.deepspeed_config,
        "a DeepSpeed configuration (ds_config.json): its batch sizes, precision, zero_optimization, "
        "activation_checkpointing (ZeRO-R), optimizer and scheduler become these flags (docs/DEEPSPEED.md)");
  t.add(D, "vocab-file", &a.vocab_file, "GPT-2 encoder.json (for reports; data is pre-tokenized)");
  t.add(D, "merge-file", &a.merge_file, "GPT-2 vocab.bpe");
  t.add(G, "log-interval", &a.log_interval, "iterations between log lines");
  t.add(G, "eval-interval", &a.eval_interval, "iterations between validation runs; 0 = only at the end");
  t.add(G, "eval-iters", &a.eval_iters, "validation micro-batches per evaluation");
  t.flag(G, "skip-train", &a.skip_train,
         "evaluate the model (the checkpoint of --load, else the initial weights) on --eval-iters validation "
         "batches and exit: nothing is trained or saved (Megatron's flag)");
  t.add(G, "metrics-file", &a.metrics_file, "JSON-lines metrics, one record per logged iteration");
  t.flag(G, "log-params-norm", &a.log_params_norm,
         "log the global L2 norm of the fp32 master weights on each logged iteration (Megatron's flag; a pass over "
         "each rank's partition and two scalar all-reduces then)");
  t.flag(G, "log-num-zeros-in-grad", &a.log_num_zeros_in_grad,
         "log how many gradient elements are exactly zero on each logged iteration (Megatron's flag: over the "
         "whole model, TP-replicated parameters once; a pass over each rank's partition and two scalar all-reduces)");
  t.add(G, "peak-tflops", &a.peak_tflops, "peak TFLOP/s per rank for MFU; 0 = device default");
  t.add(G, "device", &a.device,
        "cpu, or cuda: each rank uses GPU (local rank mod visible GPUs); collectives of GPU tensors go over NCCL or "
        "MPI (--distributed-backend); cpu-isolated: a test device, the CPU kernels over memory host code cannot touch");
  t.add(G, "distributed-backend", &a.distributed_backend,
        "collectives of the TP and DP groups: auto (nccl with --device cuda when every rank has its own GPU, "
        "else mpi), nccl, mpi (GPU tensors staged through host memory), or shm (every rank on one machine: data "
        "through one shared-memory segment a group, no MPI messages; ranks sharing a GPU copy straight to it)");
  t.add(C, "save", &a.save, "checkpoint directory: saved every --save-interval, at the end and on SIGTERM/SIGUSR1");
  t.add(C, "load", &a.load, "resume from the newest good checkpoint in DIR (any TP/DP/stage); none yet = fresh start");
  t.add(C, "save-interval", &a.save_interval, "iterations between checkpoints; 0 = only at the end and on a signal");
  t.add(C, "keep-checkpoints", &a.keep_checkpoints, "keep the newest K checkpoints in --save; 0 = all");
  t.flag(C, "finetune", &a.finetune,
         "with --load: train from the checkpoint's weights as a new run (iteration 0; a fresh optimizer, LR "
         "schedule and data position)");
  t.flag(C, "no-load-optim", &a.no_load_optim,
         "with --load: the checkpoint's weights, iteration and data position; Adam's moments and step count and the "
         "fp16 loss scale start afresh, and this command line's LR schedule applies");
  t.add(C, "ckpt-step", &a.ckpt_step,
        "with --load: load that iteration's checkpoint (iter_N) and no other; it must exist and be whole; -1 = the "
        "newest usable");
  t.flag(C, "use-checkpoint-args", &a.use_checkpoint_args,
         "with --load: take the model's shape (layers, sizes, heads, positions, normalization, ...) from the "
         "checkpoint's stored configuration instead of this command line (Megatron's flag)");
  t.flag(C, "exit-on-missing-checkpoint", &a.exit_on_missing_checkpoint,
         "with --load: stop with an error when it holds no checkpoint, instead of starting from random weights");
  t.flag(C, "no-save-optim", &a.no_save_optim,
         "--save writes the fp32 master weights alone (a third of the bytes); such a checkpoint reloads with "
         "--no-load-optim or --finetune");
  t.add(F, "collective-timeout", &a.collective_timeout,
        "seconds a collective may take before the watchdog ends the job naming the rank; 0 = off");
  t.flag(F, "check-collectives", &a.check_collectives,
         "debug: ranks cross-check every collective's fingerprint and report the first divergence");
  t.add(F, "on-nan-loss", &a.on_nan_loss, "stop (default) or skip: what a NaN/Inf loss does outside fp16 scaling");
  t.add(T, "exit-duration-in-mins", &a.exit_duration_in_mins,
        "stop after this many minutes of training: save (with --save) and exit 0; 0 = off");
  t.add(T, "exit-interval", &a.exit_interval,
        "stop at the first iteration that is a multiple of this: save (with --save) and exit 0; 0 = off");
  t.flag(C, "use-checkpoint-opt-param-scheduler", &a.use_checkpoint_lr_schedule,
         "on --load, take the learning-rate schedule (--lr, --min-lr, warmup, decay iterations and style) from the "
         "checkpoint; by default a different schedule is refused");
  t.flag(C, "override-opt-param-scheduler", &a.override_lr_schedule,
         "on --load, use this command line's learning-rate schedule even if it differs from the checkpoint's");
  t.add(G, "tensorboard-dir", &a.tensorboard_dir,
        "write TensorBoard event files here (the logged scalars: loss, learning rate, grad norm, loss scale, "
        "throughput, memory, timers, validation)");
  t.flag(G, "profile", &a.profile,
         "record the GPU's kernels (CUPTI, --device cuda) over the iterations after --profile-step-start up to "
         "--profile-step-end, then print the device's busy share, its idle gaps and each kernel's time");
  t.add(G, "profile-step-start", &a.profile_step_start, "with --profile: the iteration after which recording starts");
  t.add(G, "profile-step-end", &a.profile_step_end, "with --profile: the iteration after which it stops");
  t.list(G, "profile-ranks", &a.profile_ranks, "with --profile: the world ranks that record (default 0)");
  t.add(G, "profile-file", &a.profile_file,
        "with --profile: also write every kernel's row as CSV to this file (.rankN added when several ranks "
        "record)");
  t.group(O).add_options()("config", po::value(&a.config_file),
                           "read options from FILE (key = value); the command line wins")(
      "dry-run", po::bool_switch(&a.dry_run), "validate and print the configuration, then exit")(
      "world-size", po::value(&a.world_size),
      "with --dry-run: validate and plan memory for a virtual world of N ranks")(
      "plan-rank", po::value(&a.plan_rank),
      "with --dry-run --world-size: the rank to plan (default 0; -1: every rank, showing the one with the largest "
      "peak)")("plan-fit-gib", po::value(&a.plan_fit_gib),
               "with --dry-run --world-size: the largest --num-layers whose planned peak fits this many GiB per rank")(
      "hardware", po::value(&a.hardware),
      "with --dry-run --world-size: estimate the step time on a hardware profile: dgx2-v100, h100-node, "
      "this-machine, or a JSON file like configs/hardware/dgx2-v100.json")(
      "plan-json", po::value(&a.plan_json),
      "with --dry-run --world-size: also write the plan (and the time estimate) to this JSON file")(
      "help,h", po::bool_switch(&a.help), "print this help");
}

// The paper's Table 3: C1..C5 as the flags they stand for. CB (constant-size
// fused buffers) is how the engine always works (--reduce-bucket-size). A
// flag the user set that contradicts the configuration is refused.
// A flag contradicts --zero-config only if given at the same level or above:
// --zero-config on the command line overrides the config file's zero-stage.
void expand_zero_config(TrainArgs& a, const po::variables_map& vm, const std::set<std::string>& on_command_line) {
  if (a.zero_config.empty()) return;
  struct C {
    const char* name;
    int stage;
    bool pa, cpu;
  };
  const C table[] = {{"C1", 1, false, false},
                     {"C2", 1, true, false},
                     {"C3", 2, false, false},
                     {"C4", 2, true, false},
                     {"C5", 2, true, true}};
  const C* c = nullptr;
  for (const auto& row : table)
    if (a.zero_config == row.name) c = &row;
  MZ_REQUIRE(c, "--zero-config must be one of C1, C2, C3, C4, C5 (the paper's Table 3), got '", a.zero_config, "'");
  const bool config_on_command_line = on_command_line.count("zero-config") > 0;
  auto given = [&](const char* flag) {
    return config_on_command_line ? on_command_line.count(flag) > 0 : vm.count(flag) && !vm[flag].defaulted();
  };
  MZ_REQUIRE(!given("zero-stage") || a.zero.stage == c->stage, "--zero-config ", c->name, " means --zero-stage ",
             c->stage, " but --zero-stage ", a.zero.stage, " was given; drop one of them");
  MZ_REQUIRE(!a.zero_r.partition_activations || c->pa || !given("partition-activations"), "--zero-config ", c->name,
             " has no Pa but --partition-activations was given; use C2, C4 or C5, or drop the flag");
  MZ_REQUIRE(!a.zero_r.cpu_checkpointing || c->cpu || !given("cpu-checkpointing"), "--zero-config ", c->name,
             " has no Pa+cpu but --cpu-checkpointing was given; use C5, or drop the flag");
  a.zero.stage = c->stage;
  a.model.recompute_activations = true;
  a.zero_r.contiguous_memory = true;
  a.zero_r.partition_activations = c->pa;
  a.zero_r.cpu_checkpointing = c->cpu;
  a.zero_config_expansion = std::string("--zero-config ") + c->name + " = --zero-stage " + std::to_string(c->stage) +
                            " --recompute-activations --contiguous-memory-optimization" +
                            (c->pa ? " --partition-activations" : "") + (c->cpu ? " --cpu-checkpointing" : "") +
                            " (CB: constant --reduce-bucket-size " + std::to_string(a.zero.reduce_bucket_size) + ")";
  if (c->pa && a.model.sequence_parallel && a.parallel.tensor_model_parallel_size > 1)
    a.zero_config_expansion +=
        "; with --sequence-parallel each rank's checkpoints are its own 1/TP of the tokens already, so Pa keeps "
        "them whole (what Pa saves, SP saved)";
}

}  // namespace

namespace {

// A token that looks like a flag typed with a dash look-alike (en dash,
// em dash, minus sign, from a word processor or a web page): Program_options
// would take it for a stray word.
std::string dash_lookalike(const std::string& token) {
  for (const char* d : {"\xE2\x80\x93", "\xE2\x80\x94", "\xE2\x88\x92", "\xE2\x80\x90", "\xE2\x80\x91"})
    if (token.rfind(d, 0) == 0) return d;
  return "";
}

// Program_options reads "-1" into an unsigned flag as 2^64 - 1 (--seed -1 would
// silently train with seed 18446744073709551615).
void require_unsigned_not_negative(const std::vector<po::option>& options, const std::string& where) {
  for (const auto& o : options)
    if (o.string_key == "seed")
      for (const auto& v : o.value)
        MZ_REQUIRE(v.find('-') == std::string::npos, where, "--seed must be a non-negative whole number, got ", v);
}

std::vector<std::string> known_flags(const po::options_description& desc) {
  std::vector<std::string> names;
  for (const auto& o : desc.options()) names.push_back(o->long_name());
  return names;
}

}  // namespace

namespace {
using limits::kMaxBatch;
using limits::kMaxIterations;

// Every size the run computes from the flags (parameters, the largest
// activation) in floating point, where no product overflows: one that would
// overflow the int64 counters later is refused here, naming the flags.
void require_model_fits_in_counters(const TrainArgs& a) {
  using I = long double;
  const auto& m = a.model;
  const I h = m.hidden_size, L = m.num_layers, f = m.ffn(), V = m.vocab_size, P = m.max_position_embeddings;
  const I params = V * h + P * h + L * (4 * h * h + 2 * h * f + 9 * h + f);
  const I mbs = a.micro_batch_size, S = m.seq_length;
  const I heads = m.num_attention_heads;
  const I activation = mbs * S * std::max({V, f, 3 * h, heads * S});
  const I kMaxElements = std::ldexp(1.0L, 50);  // a PiB of bf16: beyond any memory
  MZ_REQUIRE(params <= kMaxElements, "the model would have about ", static_cast<double>(params),
             " parameters (--num-layers ", m.num_layers, ", --hidden-size ", m.hidden_size, ", --ffn-hidden-size ",
             m.ffn(), ", vocabulary ", m.vocab_size, "), more than any memory holds; check these flags");
  MZ_REQUIRE(activation <= kMaxElements, "one micro-batch's largest activation would have about ",
             static_cast<double>(activation), " elements (--micro-batch-size ", a.micro_batch_size, " x --seq-length ",
             m.seq_length,
             " x the widest of vocabulary, MLP width, 3 x hidden and heads x seq), more than any memory "
             "holds; check these flags");
}
}  // namespace

// A config file is short text: a directory is refused, and at most 1 MiB is
// read from anything else (so /dev/zero or a runaway pipe ends in an error,
// while `--config <(generate)` works); a UTF-8 byte-order mark is dropped.
std::string read_config_file(const std::string& file, const std::string& flag, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(file, ec);
  MZ_REQUIRE(!ec && fs::exists(status), flag, ": cannot read '", file, "': no such file; pass ", what);
  MZ_REQUIRE(!fs::is_directory(status), flag, ": '", file, "' is a directory; pass ", what, " in it");
  std::ifstream in(file, std::ios::binary);
  MZ_REQUIRE(in.good(), flag, ": cannot read '", file, "'; check its permissions");
  constexpr std::size_t kMaxConfigBytes = 1 << 20;
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  MZ_REQUIRE(text.size() <= kMaxConfigBytes, flag, ": '", file, "' is longer than 1 MiB; pass ", what);
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  MZ_REQUIRE(text.find('\0') == std::string::npos, flag, ": '", file, "' is not a text file (it holds NUL bytes)");
  return text;
}

std::string config_path_in(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string tok = argv[i];
    if (tok == "--config" && i + 1 < argc)
      path = argv[++i];
    else if (tok.rfind("--config=", 0) == 0)
      path = tok.substr(9);
  }
  return path;
}

std::optional<std::string> shared_config_text(Communicator& comm, int argc, char** argv) {
  const std::string mine = config_path_in(argc, argv);
  // Every rank runs the same three broadcasts, whatever its own command line.
  const std::string root_path = broadcast_string(comm, mine);
  std::string text, error;
  if (comm.rank() == 0 && !root_path.empty()) {
    try {
      text = read_config_file(root_path);
    } catch (const ConfigError& e) {
      error = e.what();
    }
  }
  error = broadcast_string(comm, error);
  if (!error.empty()) throw AgreedConfigError(error);
  text = broadcast_string(comm, text);
  if (root_path.empty() || mine != root_path) return std::nullopt;
  return text;
}

namespace {
// Megatron's recompute spellings into the model's fields, each combination
// that means nothing refused naming the flags; the flags are then rewritten
// from the fields, so a stored configuration says the same in both spellings.
void resolve_recompute_flags(TrainArgs& a) {
  const std::string& g = a.recompute_granularity;
  MZ_REQUIRE(g.empty() || g == "full" || g == "selective", "--recompute-granularity must be full or selective, got '",
             g, "'");
  MZ_REQUIRE(g != "selective" || !a.model.recompute_activations,
             "--recompute-granularity selective recomputes the attention probabilities only, --recompute-activations "
             "(or --zero-config, which implies it) whole layers: choose one");
  if (g == "full") a.model.recompute_activations = true;
  if (g == "selective") a.model.recompute_core_attention = true;
  const std::string& m = a.recompute_method;
  MZ_REQUIRE(m == "uniform" || m == "block", "--recompute-method must be uniform or block, got '", m, "'");
  MZ_REQUIRE(a.recompute_num_layers >= 0, "--recompute-num-layers must be positive, got ", a.recompute_num_layers);
  const bool chosen = m == "block" || a.recompute_num_layers > 0;
  MZ_REQUIRE(
      !chosen || !a.model.recompute_core_attention,
      "--recompute-method and --recompute-num-layers choose the layers of full recompute; --recompute-granularity "
      "selective recomputes the attention probabilities of every layer: drop them or use full");
  MZ_REQUIRE(!chosen || a.model.recompute_activations,
             "--recompute-method and --recompute-num-layers choose the layers of full recompute: add "
             "--recompute-activations (or --recompute-granularity full)");
  MZ_REQUIRE(m != "block" || a.recompute_num_layers >= 1,
             "--recompute-method block needs --recompute-num-layers N: how many of the first layers recompute");
  // block N: the first N layers, each from its own input; uniform N: every
  // layer, N at a time from one kept input (0 or 1: each its own).
  a.model.recompute_num_layers = m == "block" ? a.recompute_num_layers : 0;
  a.model.recompute_chunk = m == "uniform" ? std::max<std::int64_t>(1, a.recompute_num_layers) : 1;
  a.recompute_granularity = a.model.recompute_activations      ? "full"
                            : a.model.recompute_core_attention ? "selective"
                                                               : "";
}
}  // namespace

TrainArgs parse_train_args(int argc, char** argv, std::string* help_text) {
  return parse_train_args(argc, argv, help_text, std::nullopt);
}

const std::vector<std::string>& checkpoint_model_keys() {
  static const std::vector<std::string> keys = {"num-layers",
                                                "hidden-size",
                                                "num-attention-heads",
                                                "ffn-hidden-size",
                                                "seq-length",
                                                "max-position-embeddings",
                                                "vocab-size",
                                                "make-vocab-size-divisible-by",
                                                "position-embedding-type",
                                                "rotary-base",
                                                "rotary-seq-len-interpolation-factor",
                                                "rotary-interleaved",
                                                "use-rope-scaling",
                                                "rope-scaling-factor",
                                                "normalization",
                                                "norm-epsilon",
                                                "swiglu",
                                                "squared-relu",
                                                "qk-layernorm",
                                                "apply-layernorm-1p",
                                                "apply-residual-connection-post-layernorm",
                                                "group-query-attention",
                                                "num-query-groups",
                                                "disable-bias-linear",
                                                "add-qkv-bias",
                                                "untie-embeddings-and-output-weights"};
  return keys;
}

TrainArgs parse_train_args(int argc, char** argv, std::string* help_text, const std::optional<std::string>& config_text,
                           const std::optional<std::string>& checkpoint_config) {
  TrainArgs a;
  OptionTable table;
  define(table, a);
  std::map<std::string, std::string> megatron;
  define_megatron_flags(table.group("Megatron compatibility (accepted spellings)"), megatron);
  const auto desc = table.all();
  const auto known = known_flags(desc);
  po::variables_map vm;
  std::set<std::string> on_command_line;
  for (int i = 1; i < argc; ++i) {
    const std::string tok = argv[i];
    if (!dash_lookalike(tok).empty()) {
      std::string name = tok;
      for (std::string d; !(d = dash_lookalike(name)).empty();) name.erase(0, d.size());
      while (!name.empty() && name[0] == '-') name.erase(0, 1);
      throw ConfigError("'" + tok +
                        "' starts with a dash look-alike (an en dash or similar, as word processors and web "
                        "pages replace '--'), not with '--': type --" +
                        name.substr(0, name.find('=')));
    }
  }
  try {
    // No prefix guessing: a misspelt flag (--num-layer) is an error, not an abbreviation.
    const auto parsed = po::command_line_parser(argc, argv)
                            .options(desc)
                            .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                            .allow_unregistered()
                            .run();
    // Every unknown flag and stray word at once (a word right after an unknown
    // flag is taken as its value, not reported twice).
    FlagProblems problems;
    bool after_unknown = false;
    for (const auto& o : parsed.options) {
      if (o.position_key >= 0) {
        for (const auto& v : o.value)
          if (!after_unknown) problems.stray.push_back(v);
        after_unknown = false;
        continue;
      }
      after_unknown = o.unregistered;
      if (o.unregistered) {
        std::string name = o.string_key;
        while (!name.empty() && name[0] == '-') name.erase(0, 1);
        problems.unknown.push_back(name.substr(0, name.find('=')));
      } else {
        on_command_line.insert(o.string_key);
      }
    }
    if (const auto msg = describe_flag_problems(problems, known); !msg.empty()) throw ConfigError(msg);
    require_unsigned_not_negative(parsed.options, "");
    if (checkpoint_config) {
      // The checkpoint's model keys are stored first: the first value stored
      // wins, so they replace the command line's and the config file's.
      const auto saved = config_values(*checkpoint_config);
      std::string lines;
      const auto gqa = saved.find("group-query-attention");
      for (const auto& key : checkpoint_model_keys()) {
        // The count of query groups is stored always, and given only with the switch.
        if (key == "num-query-groups" && (gqa == saved.end() || gqa->second != "true")) continue;
        if (auto it = saved.find(key); it != saved.end()) lines += key + " = " + it->second + "\n";
      }
      std::istringstream in(lines);
      po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
      for (const auto& o : parsed.options) {
        auto it = saved.find(o.string_key);
        if (it == saved.end() || o.value.empty() ||
            std::find(checkpoint_model_keys().begin(), checkpoint_model_keys().end(), o.string_key) ==
                checkpoint_model_keys().end() ||
            (o.value.empty() ? std::string("true") : o.value.front()) == it->second)
          continue;
        a.notes.push_back("--use-checkpoint-args: --" + o.string_key + " " + it->second + " from the checkpoint, not " +
                          (o.value.empty() ? std::string("true") : o.value.front()));
      }
    }
    po::store(parsed, vm);
    if (vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::istringstream in(config_text ? *config_text : read_config_file(file));
      try {
        const auto from_file = po::parse_config_file(in, desc, /*allow_unregistered=*/true);
        FlagProblems file_problems;
        file_problems.where = "--config " + file;
        for (const auto& o : from_file.options)
          if (o.unregistered) file_problems.unknown.push_back(o.string_key);
        if (const auto msg = describe_flag_problems(file_problems, known); !msg.empty())
          throw ConfigError(msg + " (keys are the flag names without '--')");
        require_unsigned_not_negative(from_file.options, "--config " + file + ": ");
        po::store(from_file, vm);  // command line stored first wins
      } catch (const po::error& e) {
        throw ConfigError("--config " + file + ": " + e.what() + "; keys are the flag names without '--'");
      }
    }
    po::notify(vm);
    // An explicit --world-size 0 is not "no virtual world".
    MZ_REQUIRE(!vm.count("world-size") || (a.world_size > 0 && a.world_size <= limits::kMaxRanks),
               "--world-size must be a number of ranks from 1 to ", limits::kMaxRanks, ", got ", a.world_size);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + "; run pretrain_gpt --help for the options");
  }
  std::vector<std::string> given;
  for (const auto& [name, v] : vm)
    if (!v.defaulted()) given.push_back(name);
  expand_zero_config(a, vm, on_command_line);
  apply_megatron_flags(a, megatron, given);
  if (!a.deepspeed_config.empty())
    apply_deepspeed_config(a, read_config_file(a.deepspeed_config, "--deepspeed-config"), a.deepspeed_config, given);
  resolve_recompute_flags(a);
  // Megatron's --recompute-activations means selective recompute; here (as in
  // the ZeRO paper's runs) it is full recompute: a Megatron script gets the
  // same results with more recompute and less memory, and is told the
  // spelling of what it meant.
  if (on_command_line.count("recompute-activations") && !on_command_line.count("recompute-method"))
    a.notes.push_back(
        "--recompute-activations recomputes whole layers here (full recompute, the ZeRO paper's activation "
        "checkpointing); in Megatron-LM it means selective recompute, which is --recompute-granularity selective "
        "here");
  MZ_REQUIRE(a.overlap_param_gather == "true" || a.overlap_param_gather == "false",
             "--overlap-param-gather takes true or false (alone: true), got '", a.overlap_param_gather, "'");
  a.zero.overlap_param_gather = a.overlap_param_gather == "true";
  // Refused where they mean nothing, if typed (a stored configuration lists every flag).
  MZ_REQUIRE(!on_command_line.count("overlap-param-gather") || a.zero.stage == 1 || a.zero.stage == 2,
             "--overlap-param-gather is for --zero-stage 1 or 2 (the step's all-gather of the updated parameters); "
             "stage ",
             a.zero.stage,
             a.zero.stage == 0 ? " gathers nothing (every rank keeps every parameter)"
                               : " gathers each group before its use and prefetches the next (--stage3-prefetch)",
             ": drop the flag");
  MZ_REQUIRE(!on_command_line.count("stage3-prefetch") || a.zero.stage == 3,
             "--stage3-prefetch is for --zero-stage 3 (the gather of the next parameter group ahead); stage ",
             a.zero.stage, " keeps every parameter on every rank", a.zero.stage == 0 ? "" : " of its TP shard",
             a.zero.stage == 0 ? "" : " (its all-gather after the step: --overlap-param-gather)", ": drop the flag");
  // Checked here, not in validate(): the first parse of --use-checkpoint-args
  // (before the checkpoint's flags are known) needs it.
  MZ_REQUIRE(!a.use_checkpoint_args || !a.load.empty(),
             "--use-checkpoint-args takes the model's flags from the checkpoint of --load DIR: add --load");
  a.model.bias_gelu_fusion = !a.no_bias_gelu_fusion;
  // "true"/"false": how configurations stored before the flag took a value
  // spelled it (true then meant every epilogue).
  a.model.gemm_epilogues = layers::parse_gemm_epilogues(a.gemm_epilogues == "true"    ? "all"
                                                        : a.gemm_epilogues == "false" ? "none"
                                                                                      : a.gemm_epilogues);
  a.gemm_epilogues = layers::gemm_epilogues_name(a.model.gemm_epilogues);
  a.model.add_bias_linear = !a.disable_bias_linear;
  a.zero_r.inputs_split_across_tp = a.model.sequence_parallel && a.parallel.tensor_model_parallel_size > 1;
  MZ_REQUIRE(a.group_query_attention || !vm.count("num-query-groups") || vm["num-query-groups"].defaulted(),
             "--num-query-groups is used only with --group-query-attention; add that switch (or drop the count)");
  MZ_REQUIRE(a.num_query_groups > 0, "--num-query-groups must be positive, got ", a.num_query_groups);
  a.model.num_query_groups = a.group_query_attention ? a.num_query_groups : 0;
  if (a.help && help_text) {
    std::ostringstream os;
    os << desc;
    *help_text = os.str();
  }
  // Checked before the default replaces it (0 or 1: decay over --train-iters).
  MZ_REQUIRE(a.lr.decay_iters >= 0, "--lr-decay-iters must be non-negative (0 = --train-iters), got ",
             a.lr.decay_iters);
  if (a.lr.decay_iters <= 1 && a.train_iters > 0) a.lr.decay_iters = a.train_iters;
  // WSD's anneal flags (or Megatron's --lr-wsd-decay-samples, now iterations) with another style.
  const bool wsd_style_given = vm.count("lr-wsd-decay-style") && !vm["lr-wsd-decay-style"].defaulted();
  MZ_REQUIRE(a.lr.style == "WSD" || (a.lr.wsd_decay_iters == 0 && !wsd_style_given), "--",
             wsd_style_given ? "lr-wsd-decay-style" : "lr-wsd-decay-iters (or --lr-wsd-decay-samples)",
             " shapes the anneal of --lr-decay-style WSD, but the decay style is ", a.lr.style,
             "; add --lr-decay-style WSD (or drop the anneal's flag)");
  // Megatron's weight-decay schedule: constant keeps --weight-decay (a given
  // start or end must equal it); linear and cosine need both ends.
  const bool ramped = a.weight_decay_incr_style != "constant";
  for (const auto& [flag, v] : {std::pair{"--start-weight-decay", &a.start_weight_decay},
                                std::pair{"--end-weight-decay", &a.end_weight_decay}}) {
    MZ_REQUIRE(!ramped || *v >= 0, "--weight-decay-incr-style ", a.weight_decay_incr_style, " goes from ",
               "--start-weight-decay to --end-weight-decay: give ", flag);
    MZ_REQUIRE(ramped || *v < 0 || *v == a.adam.weight_decay,
               "--weight-decay-incr-style constant keeps --weight-decay ", a.adam.weight_decay, ", but ", flag, " ", *v,
               " differs: choose linear or cosine, or drop ", flag);
    if (!ramped) *v = a.adam.weight_decay;
  }
  MZ_REQUIRE(a.weight_decay_incr_iters >= 0, "--weight-decay-incr-iters must not be negative (0 = --train-iters), got ",
             a.weight_decay_incr_iters);
  if (a.weight_decay_incr_iters == 0 && a.train_iters > 0) a.weight_decay_incr_iters = a.train_iters;
  return a;
}

void TrainArgs::validate() const {
  model.validate(parallel.tensor_model_parallel_size > 0 ? parallel.tensor_model_parallel_size : 1);
  zero.validate();
  lr.validate();
  MZ_REQUIRE(!(fp16 && bf16), "--fp16 and --bf16 conflict; choose one");
  MZ_REQUIRE(train_iters > 0, "--train-iters must be positive, got ", train_iters);
  MZ_REQUIRE(train_iters <= kMaxIterations, "--train-iters ", train_iters, " is beyond megazero's bound of ",
             kMaxIterations, "; check the value for extra digits");
  MZ_REQUIRE(micro_batch_size > 0, "--micro-batch-size must be positive, got ", micro_batch_size);
  MZ_REQUIRE(micro_batch_size <= kMaxBatch, "--micro-batch-size ", micro_batch_size, " is beyond megazero's bound of ",
             kMaxBatch, "; check the value for extra digits");
  MZ_REQUIRE(global_batch_size >= 0, "--global-batch-size must not be negative (0 means micro batch x DP), got ",
             global_batch_size);
  MZ_REQUIRE(global_batch_size <= kMaxBatch, "--global-batch-size ", global_batch_size,
             " is beyond megazero's bound of ", kMaxBatch, "; check the value for extra digits");
  require_model_fits_in_counters(*this);
  MZ_REQUIRE(parallel.tensor_model_parallel_size > 0, "--tensor-model-parallel-size must be positive, got ",
             parallel.tensor_model_parallel_size);
  MZ_REQUIRE(parallel.ranks_per_node >= 0, "--ranks-per-node must not be negative (0 detects it), got ",
             parallel.ranks_per_node);
  auto unit = [](double v) { return v >= 0 && v < 1; };
  MZ_REQUIRE(unit(adam.beta1), "--adam-beta1 must be in [0, 1), got ", adam.beta1);
  MZ_REQUIRE(unit(adam.beta2), "--adam-beta2 must be in [0, 1), got ", adam.beta2);
  MZ_REQUIRE(std::isfinite(adam.eps) && adam.eps > 0, "--adam-eps must be a positive number, got ", adam.eps);
  MZ_REQUIRE(std::isfinite(adam.weight_decay) && adam.weight_decay >= 0,
             "--weight-decay must be a finite non-negative number, got ", adam.weight_decay);
  weight_decay_schedule().validate();
  MZ_REQUIRE(std::isfinite(loss_scale.initial_scale) && loss_scale.initial_scale > 0,
             "--initial-loss-scale must be a positive number (Megatron's default 2^32), got ",
             loss_scale.initial_scale);
  MZ_REQUIRE(std::isfinite(loss_scale.min_scale) && loss_scale.min_scale > 0,
             "--min-loss-scale must be a positive number, got ", loss_scale.min_scale);
  MZ_REQUIRE(loss_scale.min_scale <= loss_scale.initial_scale, "--min-loss-scale ", loss_scale.min_scale,
             " is above --initial-loss-scale ", loss_scale.initial_scale, "; the floor must be at most the start");
  MZ_REQUIRE(loss_scale.window >= 1, "--loss-scale-window must be at least 1, got ", loss_scale.window);
  MZ_REQUIRE(std::isfinite(loss_scale.constant_scale) && loss_scale.constant_scale >= 0,
             "--loss-scale must be a positive number (0 = none), got ", loss_scale.constant_scale);
  if (loss_scale.constant_scale > 0) {
    MZ_REQUIRE(fp16 || bf16, "--loss-scale ", loss_scale.constant_scale,
               " scales the loss of 16-bit training (--fp16 or --bf16); an fp32 run has no loss scaling: drop it");
    const optim::LossScalerConfig d;
    for (const auto& [flag, changed] : {std::pair{"--initial-loss-scale", loss_scale.initial_scale != d.initial_scale},
                                        std::pair{"--loss-scale-window", loss_scale.window != d.window},
                                        std::pair{"--hysteresis", loss_scale.hysteresis != d.hysteresis},
                                        std::pair{"--min-loss-scale", loss_scale.min_scale != d.min_scale}})
      MZ_REQUIRE(!changed, "--loss-scale ", loss_scale.constant_scale, " is a constant scale, but ", flag,
                 " sets dynamic scaling; drop one of them");
  }
  MZ_REQUIRE(loss_scale.hysteresis >= 1, "--hysteresis must be at least 1, got ", loss_scale.hysteresis);
  MZ_REQUIRE(std::isfinite(peak_tflops) && peak_tflops >= 0, "--peak-tflops must be a finite non-negative number, got ",
             peak_tflops);
  MZ_REQUIRE(std::isfinite(exit_duration_in_mins) && exit_duration_in_mins >= 0,
             "--exit-duration-in-mins must be a finite non-negative number (0 = off), got ", exit_duration_in_mins);
  MZ_REQUIRE(exit_interval >= 0, "--exit-interval must not be negative (0 = off), got ", exit_interval);
  MZ_REQUIRE(profile || (profile_step_start == 10 && profile_step_end == 12 &&
                         profile_ranks == std::vector<std::string>{"0"} && profile_file.empty()),
             "--profile-step-start, --profile-step-end, --profile-ranks and --profile-file only mean something with "
             "--profile");
  MZ_REQUIRE(profile_step_start >= 0, "--profile-step-start must not be negative, got ", profile_step_start);
  MZ_REQUIRE(profile_step_end > profile_step_start, "--profile-step-end ", profile_step_end,
             " must be after --profile-step-start ", profile_step_start,
             " (the iterations after the start, up to and including the end, are recorded)");
  if (gemm_autotune) {
    MZ_REQUIRE(device == "cuda", "--gemm-autotune times cuBLASLt's algorithms: it needs --device cuda, got --device ",
               device);
    MZ_REQUIRE(!model.deterministic,
               "--gemm-autotune keeps whichever algorithm timed fastest, so reruns may differ in the last bits; "
               "--deterministic-mode promises the same bits: drop one of the two");
  }
  if (profile) {
    MZ_REQUIRE(device == "cuda",
               "--profile records the GPU's kernels (CUPTI's activity records): it needs --device "
               "cuda, got --device ",
               device);
    MZ_REQUIRE(profile_step_end <= train_iters, "--profile-step-end ", profile_step_end, " is past --train-iters ",
               train_iters, ": the run would end before the trace does; lower it or raise --train-iters");
    (void)profiled_ranks();  // each a number
  }
  for (const auto& [flag, set] : {std::pair{"--finetune", finetune}, std::pair{"--no-load-optim", no_load_optim}})
    MZ_REQUIRE(!set || !load.empty(), flag, " says what to load of a checkpoint: add --load DIR");
  MZ_REQUIRE(!no_save_optim || !save.empty(), "--no-save-optim says what to save: add --save DIR");
  MZ_REQUIRE(ckpt_step >= -1, "--ckpt-step must be an iteration (0 or more; -1 = the newest), got ", ckpt_step);
  MZ_REQUIRE(ckpt_step < 0 || !load.empty(), "--ckpt-step ", ckpt_step,
             " picks a checkpoint of --load DIR: add --load");
  MZ_REQUIRE(!exit_on_missing_checkpoint || !load.empty(),
             "--exit-on-missing-checkpoint says what to do when --load holds no checkpoint: add --load DIR");
  MZ_REQUIRE(!finetune || !(use_checkpoint_lr_schedule || override_lr_schedule),
             "--finetune starts a new learning-rate schedule at iteration 0: ",
             use_checkpoint_lr_schedule ? "--use-checkpoint-opt-param-scheduler" : "--override-opt-param-scheduler",
             " has no schedule to keep or override; drop it");
  if (finetune && !save.empty()) {
    // A fine-tuning job saving into the directory it fine-tunes from would, when
    // requeued with the same flags, fine-tune its own checkpoint again from
    // iteration 0, and `latest` would no longer name the pretrained weights.
    auto resolved = [](const std::string& dir) {  // absolute, no symlinks, no trailing '/'
      std::error_code ec;
      auto p = std::filesystem::weakly_canonical(dir, ec);
      return p.has_filename() ? p : p.parent_path();
    };
    const auto into = resolved(save), from = resolved(load);
    MZ_REQUIRE(into != from && into != from.parent_path(), "--finetune with --save '", save,
               "' writes into the checkpoints it fine-tunes from (--load '", load,
               "'): save the fine-tuned run to its own directory, and resume it from there without --finetune");
  }
  MZ_REQUIRE(!(use_checkpoint_lr_schedule && override_lr_schedule),
             "--use-checkpoint-opt-param-scheduler and --override-opt-param-scheduler conflict; choose one");
  MZ_REQUIRE(!(use_checkpoint_lr_schedule || override_lr_schedule) || !load.empty(),
             use_checkpoint_lr_schedule ? "--use-checkpoint-opt-param-scheduler" : "--override-opt-param-scheduler",
             " only means something with --load DIR");
  if (world_size == 0)
    for (const auto& [flag, set] :
         {std::pair{"--plan-rank", plan_rank != 0}, std::pair{"--plan-fit-gib", plan_fit_gib != 0},
          std::pair{"--hardware", !hardware.empty()}, std::pair{"--plan-json", !plan_json.empty()}})
      MZ_REQUIRE(!set, flag, " plans a virtual world: add --dry-run --world-size N (N ranks, e.g. 400)");
  MZ_REQUIRE(plan_fit_gib >= 0, "--plan-fit-gib must not be negative");
  MZ_REQUIRE(std::isfinite(clip_grad) && clip_grad >= 0,
             "--clip-grad must be a finite non-negative number (0 = off), got ", clip_grad);
  MZ_REQUIRE(log_interval > 0, "--log-interval must be positive");
  MZ_REQUIRE(!skip_train || eval_iters > 0,
             "--skip-train only evaluates, and --eval-iters 0 leaves nothing to evaluate: set --eval-iters N");
  MZ_REQUIRE(eval_iters >= 0 && eval_interval >= 0, "--eval-interval and --eval-iters must not be negative");
  const bool per_split = !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty();
  MZ_REQUIRE(!per_split || !train_data_path.empty(),
             "--valid-data-path and --test-data-path come with --train-data-path (the training data)");
  MZ_REQUIRE(!per_split || (data_path.empty() && !mock_data), "--train-data-path reads a dataset per split: drop ",
             mock_data ? "--mock-data" : "--data-path", " (or use --data-path with --split alone)");
  MZ_REQUIRE(!per_split || eval_iters == 0 || !valid_data_path.empty(), "--eval-iters ", eval_iters,
             " asks for validation, which --train-data-path's runs read from --valid-data-path: add it, or pass "
             "--eval-iters 0");
  MZ_REQUIRE(per_split || mock_data != !data_path.empty(),
             mock_data ? "--mock-data and --data-path conflict; choose one"
                       : "no data: pass --data-path PREFIX (a .bin/.idx pair from tools/preprocess_data), "
                         "--train-data-path PREFIX, or --mock-data");
  const bool by_document = eod_mask_loss || reset_position_ids || reset_attention_mask;
  const char* document_flag = eod_mask_loss        ? "--eod-mask-loss"
                              : reset_position_ids ? "--reset-position-ids"
                                                   : "--reset-attention-mask";
  MZ_REQUIRE(by_document || eod_token_id == -1, "--eod-token-id ", eod_token_id,
             " is only read by --eod-mask-loss, --reset-position-ids and --reset-attention-mask: add one, or drop "
             "--eod-token-id");
  if (by_document) {
    MZ_REQUIRE(eod_token_id >= 0, document_flag,
               " needs the end-of-document token: pass --tokenizer-type GPT2BPETokenizer (50256) or ByteLevel "
               "(256), --tokenizer-type Llama2Tokenizer --tokenizer-model FILE (its </s>), or --eod-token-id N");
    MZ_REQUIRE(eod_token_id < model.vocab_size, "--eod-token-id ", eod_token_id, " is outside the vocabulary of ",
               "--vocab-size ", model.vocab_size, ": the end-of-document token of the data's tokenizer is needed ",
               "(GPT-2 BPE: 50256 with --vocab-size 50257)");
  }
  if (!rampup_batch_size.empty()) {
    MZ_REQUIRE(global_batch_size > 0,
               "--rampup-batch-size ramps the batch up to --global-batch-size: set it (e.g. --global-batch-size 1536)");
    (void)BatchSchedule::parse(rampup_batch_size, global_batch_size);
  }
  MZ_REQUIRE(save_interval >= 0, "--save-interval must not be negative, got ", save_interval);
  MZ_REQUIRE(save_interval == 0 || !save.empty(), "--save-interval ", save_interval,
             " needs --save DIR (where to write the checkpoints)");
  MZ_REQUIRE(keep_checkpoints >= 0, "--keep-checkpoints must not be negative, got ", keep_checkpoints);
  MZ_REQUIRE(collective_timeout >= 0, "--collective-timeout must not be negative (0 turns the watchdog off), got ",
             collective_timeout);
  MZ_REQUIRE(on_nan_loss == "stop" || on_nan_loss == "skip", "--on-nan-loss must be stop or skip, got '", on_nan_loss,
             "'");
  zero_r.validate(model.recompute_activations);
  MZ_REQUIRE(distributed_backend == "auto" || distributed_backend == "mpi" || distributed_backend == "nccl" ||
                 distributed_backend == "shm",
             "--distributed-backend must be auto, mpi, nccl or shm, got '", distributed_backend, "'");
  MZ_REQUIRE(device == "cpu" || device == "cuda" || device == "cpu-isolated",
             "--device must be cpu, cuda or cpu-isolated (a test device: the CPU kernels over memory host code cannot "
             "touch), got '",
             device, "'");
  MZ_REQUIRE(distributed_backend != "nccl" || device == "cuda",
             "--distributed-backend nccl needs --device cuda (NCCL moves GPU tensors); use mpi on CPUs");
  if (device == "cuda" && model.fused_attention()) {
    const std::string why = kernels::fused_attention_unsupported(DeviceKind::CUDA, dtype(), model.head_dim());
    MZ_REQUIRE(why.empty(), "--attention-backend fused with --device cuda: ", why,
               "; or use --attention-backend unfused");
  }
  if (model.cudnn_attention()) {
    const DeviceKind kind = device == "cuda" ? DeviceKind::CUDA : DeviceKind::CPU;
    const std::string why = kernels::cudnn_attention_unsupported(kind, dtype(), model.head_dim());
    MZ_REQUIRE(why.empty(), why);
  }
}

std::vector<int> TrainArgs::profiled_ranks() const {
  std::vector<int> out;
  for (const std::string& r : profile_ranks) {
    int v = -1;
    const auto [end, ec] = std::from_chars(r.data(), r.data() + r.size(), v);
    MZ_REQUIRE(ec == std::errc() && end == r.data() + r.size() && v >= 0,
               "--profile-ranks takes world ranks (0, 1, ...), got '", r, "'");
    out.push_back(v);
  }
  MZ_REQUIRE(!out.empty(), "--profile-ranks needs at least one rank");
  return out;
}

void TrainArgs::apply_decrease_batch_size(int world) {
  const int tp = parallel.tensor_model_parallel_size;
  if (!decrease_batch_size_if_needed || global_batch_size <= 0 || tp <= 0 || world % tp != 0) return;
  MZ_REQUIRE(rampup_batch_size.empty(),
             "--decrease-batch-size-if-needed with --rampup-batch-size is not implemented: "
             "choose ramp batches that are multiples of --micro-batch-size x data-parallel size, and drop one flag");
  const std::int64_t step = micro_batch_size * (world / tp);
  if (global_batch_size % step == 0) return;
  const std::int64_t running = global_batch_size / step * step;
  MZ_REQUIRE(running > 0, "--decrease-batch-size-if-needed: --global-batch-size ", global_batch_size,
             " is below one micro-batch per data-parallel rank (--micro-batch-size ", micro_batch_size, " x ",
             world / tp, " = ", step, "); raise it or lower --micro-batch-size");
  notes.push_back(detail::concat("--decrease-batch-size-if-needed: --global-batch-size ", global_batch_size,
                                 " is not a multiple of --micro-batch-size ", micro_batch_size,
                                 " x data-parallel size ", world / tp, "; training with a global batch of ", running,
                                 " (", global_batch_size - running, " samples fewer each iteration)"));
  global_batch_size = running;
}

void TrainArgs::validate_layout(int world) const {
  if (profile)
    for (const int r : profiled_ranks())
      MZ_REQUIRE(r < world, "--profile-ranks ", r, " is not a rank of this world of ", world, " (ranks 0 to ",
                 world - 1, ")");
  const int tp = parallel.tensor_model_parallel_size;
  MZ_REQUIRE(tp > 0 && world % tp == 0, "--tensor-model-parallel-size ", tp, " does not divide the world size ", world);
  const std::int64_t dp = world / tp;
  const std::int64_t global = global_batch_size > 0 ? global_batch_size : micro_batch_size * dp;
  MZ_REQUIRE(global % (micro_batch_size * dp) == 0, "--global-batch-size ", global,
             " is not a multiple of --micro-batch-size ", micro_batch_size, " x data-parallel size ", dp, " (= world ",
             world, " / TP ", tp,
             "): global batch = micro batch x accumulation steps x DP; use "
             "a global batch of ",
             micro_batch_size * dp, " x k, or change --micro-batch-size");
  batch_schedule(dp).check_layout(micro_batch_size, dp);
  MZ_REQUIRE(gradient_accumulation_steps == 0 || global == micro_batch_size * gradient_accumulation_steps * dp,
             "--deepspeed-config ", deepspeed_config, ": gradient_accumulation_steps ", gradient_accumulation_steps,
             " x train_micro_batch_size_per_gpu ", micro_batch_size, " x data-parallel size ", dp, " (world ", world,
             " / TP ", tp, ") = ", micro_batch_size * gradient_accumulation_steps * dp,
             " samples, but the global batch (train_batch_size or --global-batch-size) is ", global,
             "; make them agree (DeepSpeed requires train_batch_size = micro x accumulation x data-parallel size)");
}

BatchSchedule TrainArgs::batch_schedule(std::int64_t dp) const {
  return BatchSchedule::parse(rampup_batch_size, global_batch_size > 0 ? global_batch_size : micro_batch_size * dp);
}

std::string TrainArgs::to_config() const {
  TrainArgs copy = *this;
  OptionTable table;
  define(table, copy);
  return table.print();
}

std::string TrainArgs::fingerprint() const {
  std::ostringstream os;
  os << to_config() << "help = " << help << "\ndry-run = " << dry_run << "\nworld-size = " << world_size
     << "\nplan-rank = " << plan_rank << "\nplan-fit-gib = " << plan_fit_gib << "\nhardware = " << hardware
     << "\nplan-json = " << plan_json << "\n";
  return os.str();
}

std::map<std::string, std::string> config_values(const std::string& config) {
  auto trim = [](const std::string& s) {
    const auto b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  std::map<std::string, std::string> kv;
  std::istringstream is(config);
  for (std::string line; std::getline(is, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) kv[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return kv;
}

namespace {
using ConfigValues = std::map<std::string, std::string>;
// "--key now (checkpoint: then)" for each of `keys` whose values differ,
// comma-separated; keys either side lacks are not compared.
std::string changed_keys(const ConfigValues& saved, const ConfigValues& now, std::initializer_list<const char*> keys) {
  std::string diff;
  for (const char* k : keys) {
    const auto s = saved.find(k), n = now.find(k);
    if (s == saved.end() || n == now.end() || s->second == n->second) continue;
    diff += std::string(diff.empty() ? "" : ", ") + "--" + k + " " + n->second + " (checkpoint: " + s->second + ")";
  }
  return diff;
}
}  // namespace

std::string loss_definition_note(const TrainArgs& args, const std::string& saved_config) {
  const std::string diff =
      changed_keys(config_values(saved_config), config_values(args.to_config()),
                   {"eod-mask-loss", "eod-token-id", "reset-position-ids", "reset-attention-mask"});
  if (diff.empty()) return "";
  return "the loss is not the one the checkpoint was trained on: " + diff +
         "; the logged loss changes its definition from here (compare losses across the two with care)";
}

std::string model_function_check(const TrainArgs& args, const std::string& saved_config, bool finetune) {
  const auto saved = config_values(saved_config), now = config_values(args.to_config());
  // What the weights compute, beyond their shapes (which the load checks).
  std::string refused = changed_keys(
      saved, now,
      {"apply-layernorm-1p", "squared-relu", "swiglu", "qk-layernorm", "normalization", "position-embedding-type",
       "norm-epsilon", "rotary-interleaved", "apply-residual-connection-post-layernorm"});
  // Rope's periods: a fine-tuning may change them on purpose (a longer context).
  const std::string periods = changed_keys(
      saved, now, {"rotary-base", "rotary-seq-len-interpolation-factor", "use-rope-scaling", "rope-scaling-factor"});
  if (!finetune && !periods.empty()) refused += (refused.empty() ? "" : ", ") + periods;
  MZ_REQUIRE(refused.empty(), "the checkpoint's model computes something else with the same weights: ", refused,
             "; loaded into this model they would change their meaning. Pass the checkpoint's values (or "
             "--use-checkpoint-args, which takes them from it)",
             finetune ? ""
                      : "; --finetune may change rope's --rotary-base, --rotary-seq-len-interpolation-factor and "
                        "--use-rope-scaling / --rope-scaling-factor");
  if (!finetune || periods.empty()) return "";
  return "--finetune with rope's periods changed: " + periods + " (the weights were trained with the checkpoint's)";
}

std::string reconcile_lr_schedule(TrainArgs& args, const std::string& saved_config, std::int64_t iteration) {
  if (iteration == 0) return "";
  const auto saved = config_values(saved_config), now = config_values(args.to_config());
  // The learning rate's and the weight decay's (Megatron's optimizer-parameter scheduler checks both).
  const char* const keys[] = {"lr",
                              "min-lr",
                              "lr-warmup-iters",
                              "lr-warmup-init",
                              "lr-warmup-style",
                              "lr-decay-iters",
                              "lr-decay-style",
                              "lr-wsd-decay-iters",
                              "lr-wsd-decay-style",
                              "weight-decay",
                              "start-weight-decay",
                              "end-weight-decay",
                              "weight-decay-incr-style",
                              "weight-decay-incr-iters"};
  // A constant weight decay (both runs; configurations saved before the
  // schedule had no style) is --weight-decay alone: its ends and its span,
  // resolved from --train-iters, say nothing.
  const auto style = [](const std::map<std::string, std::string>& c) {
    const auto it = c.find("weight-decay-incr-style");
    return it == c.end() ? std::string("constant") : it->second;
  };
  const bool constant_decay = style(saved) == "constant" && style(now) == "constant";
  std::string diff;
  for (const char* k : keys) {
    const auto s = saved.find(k), n = now.find(k);
    if (s == saved.end() || n == now.end() || s->second == n->second) continue;
    if (constant_decay && std::string(k) != "weight-decay" && std::string(k).find("weight-decay") != std::string::npos)
      continue;
    diff += std::string(diff.empty() ? "" : ", ") + "--" + k + " " + n->second + " (checkpoint: " + s->second + ")";
  }
  if (diff.empty()) return "";
  if (args.override_lr_schedule)
    return "--override-opt-param-scheduler: this run's learning-rate schedule replaces the checkpoint's: " + diff;
  if (args.no_load_optim && !args.use_checkpoint_lr_schedule)
    return "--no-load-optim: the optimizer and its schedule are not loaded, this run's learning-rate schedule "
           "applies: " +
           diff;
  if (args.use_checkpoint_lr_schedule) {
    auto number = [&](const char* k) { return std::stod(saved.at(k)); };
    auto whole = [&](const char* k) { return std::stoll(saved.at(k)); };
    if (saved.count("lr")) args.lr.max_lr = number("lr");
    if (saved.count("min-lr")) args.lr.min_lr = number("min-lr");
    if (saved.count("lr-warmup-iters")) args.lr.warmup_iters = whole("lr-warmup-iters");
    if (saved.count("lr-warmup-init")) args.lr.init_lr = number("lr-warmup-init");
    if (saved.count("lr-warmup-style")) args.lr.warmup_style = saved.at("lr-warmup-style");
    if (saved.count("lr-decay-iters")) args.lr.decay_iters = whole("lr-decay-iters");
    if (saved.count("lr-decay-style")) args.lr.style = saved.at("lr-decay-style");
    if (saved.count("lr-wsd-decay-iters")) args.lr.wsd_decay_iters = whole("lr-wsd-decay-iters");
    if (saved.count("lr-wsd-decay-style")) args.lr.wsd_style = saved.at("lr-wsd-decay-style");
    if (saved.count("weight-decay")) args.adam.weight_decay = number("weight-decay");
    if (saved.count("start-weight-decay")) args.start_weight_decay = number("start-weight-decay");
    if (saved.count("end-weight-decay")) args.end_weight_decay = number("end-weight-decay");
    if (saved.count("weight-decay-incr-style")) args.weight_decay_incr_style = saved.at("weight-decay-incr-style");
    if (saved.count("weight-decay-incr-iters")) args.weight_decay_incr_iters = whole("weight-decay-incr-iters");
    args.lr.validate();
    args.weight_decay_schedule().validate();
    return "--use-checkpoint-opt-param-scheduler: the checkpoint's learning-rate schedule is kept, not " + diff;
  }
  throw ConfigError("the learning-rate schedule differs from the checkpoint's (at iteration " +
                    std::to_string(iteration) + "): " + diff +
                    "; resuming would change the learning rate or the weight decay mid-run (a different --train-iters "
                    "changes --lr-decay-iters and --weight-decay-incr-iters when they are not set). Pass "
                    "--use-checkpoint-opt-param-scheduler to keep the "
                    "checkpoint's schedule, or --override-opt-param-scheduler to use this one (Megatron's flags)");
}

std::string config_difference(const std::string& reference, const std::string& mine, int rank) {
  if (reference == mine) return "";
  const auto ref = config_values(reference), own = config_values(mine);
  std::string diff;
  int shown = 0;
  for (const auto& [key, value] : own) {
    const auto it = ref.find(key);
    const std::string other = it == ref.end() ? "(none)" : it->second;
    if (other == value) continue;
    if (shown++ < 8)
      diff += std::string(diff.empty() ? "" : ", ") + key + " (rank 0: '" + other + "', rank " + std::to_string(rank) +
              ": '" + value + "')";
  }
  if (shown > 8) diff += " and " + std::to_string(shown - 8) + " more";
  return "ranks were started with different configurations: rank " + std::to_string(rank) + " differs from rank 0 in " +
         (diff.empty() ? std::string("the order of its options") : diff) +
         "; start every rank with the same flags and config file";
}

}  // namespace megazero::train
