// pretrain_gpt's command line and config files: one definition site per flag
// (Megatron's names where Megatron has one), grouped for --help, validated with
// messages that name the flag and the fix. A config file (--config FILE, or
// key = value lines) is read first; the command line overrides it; unknown or
// misspelt keys and flags are errors, never ignored.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "layers/gpt_config.h"
#include "megazero/comm/communicator.h"
#include "megazero/optim/adamw.h"
#include "megazero/optim/loss_scaler.h"
#include "megazero/train/batch_schedule.h"
#include "megazero/optim/lr_schedule.h"
#include "megazero/zero/partitioned_activations.h"
#include "megazero/zero/zero_engine.h"
#include "parallel_state/process_groups.h"

namespace megazero::train {

struct TrainArgs {
  layers::GPTConfig model;
  parallel_state::ParallelOptions parallel;
  zero::ZeroConfig zero;
  optim::AdamConfig adam;
  optim::LrSchedule lr;
  optim::LossScalerConfig loss_scale;
  double clip_grad = 1.0;
  std::int64_t micro_batch_size = 1;
  std::int64_t global_batch_size = 0;  // 0 = micro x DP (no accumulation)
  std::int64_t train_iters = 0;
  std::uint64_t seed = 1234;
  bool fp16 = false, bf16 = false;
  // data
  // One prefix, or weight-prefix pairs to blend ("0.3 wiki 0.7 books"), as Megatron.
  std::vector<std::string> data_path;
  // --deepspeed-config FILE (train/deepspeed_config.h): DeepSpeed's JSON,
  // translated into these flags; its gradient_accumulation_steps (0: none
  // given) is checked against the batch sizes at the layout.
  std::string deepspeed_config;
  std::int64_t gradient_accumulation_steps = 0;
  // Megatron's datasets per split (each read whole; instead of --data-path and --split).
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969,30,1";
  bool mock_data = false;
  std::string vocab_file, merge_file;
  // --eod-mask-loss (train/loss_mask.h): no loss where the input token is the
  // end-of-document token, --eod-token-id (from --tokenizer-type when that is
  // given: GPT-2 BPE's <|endoftext|> 50256, ByteLevel's 256); -1 = not known.
  bool eod_mask_loss = false;
  std::int64_t eod_token_id = -1;
  // Megatron's --calculate-per-token-loss with --eod-mask-loss: the kept
  // tokens' mean over the whole global batch instead of each micro-batch's.
  bool per_token_loss = false;
  // Megatron's --reset-position-ids and --reset-attention-mask
  // (train/documents.h): each end-of-document token (--eod-token-id) ends a
  // document; the next one's positions count from 0 / its tokens attend
  // within it only.
  bool reset_position_ids = false, reset_attention_mask = false;
  // logging and evaluation
  std::int64_t log_interval = 10, eval_interval = 0, eval_iters = 10;
  std::string metrics_file;            // JSON lines, one record per logged iteration
  bool log_params_norm = false;        // the fp32 master weights' global L2 norm on logged iterations
  bool log_num_zeros_in_grad = false;  // the gradients' exact zeros on logged iterations
  double peak_tflops = 0;              // for MFU; 0 = the device default (docs/PERFORMANCE.md)
  std::string device = "cpu";          // --device: cpu, cuda (one GPU per rank: local rank mod GPUs) or cpu-isolated
  // --distributed-backend of the TP and DP groups: mpi, nccl (GPU tensors, one
  // GPU per rank), shm (one machine: MPI's groups with the shared-memory
  // transport, comm/shm_collectives.h), or auto (nccl when --device cuda gives
  // every rank its own GPU, else mpi).
  std::string distributed_backend = "auto";
  // --device-arena: MD for all device memory (Device::reserve_arena), sized by
  // this rank's memory plan (its first-fit heap peak).
  bool device_arena = false;
  // --no-bias-gelu-fusion (Megatron's flag): sets model.bias_gelu_fusion = false.
  bool no_bias_gelu_fusion = false;
  // Megatron's recompute flags, resolved into model.recompute_*:
  // --recompute-granularity full|selective, --recompute-method uniform|block,
  // --recompute-num-layers N (0: not given).
  std::string recompute_granularity;
  std::string recompute_method = "uniform";
  std::int64_t recompute_num_layers = 0;
  // --gemm-epilogues[=none|forward|all], resolved into model.gemm_epilogues.
  std::string gemm_epilogues = "none";
  // --overlap-param-gather[=true|false] (alone: true, Megatron's switch), resolved into zero.overlap_param_gather.
  std::string overlap_param_gather = "true";
  // --gemm-autotune: each GEMM problem's cuBLASLt algorithms timed once, the
  // fastest kept (kernels/gemm.h); --device cuda, not with --deterministic-mode.
  bool gemm_autotune = false;
  // Megatron's spellings of the model's query groups and linear biases,
  // resolved into model.num_query_groups / model.add_bias_linear.
  bool group_query_attention = false;
  std::int64_t num_query_groups = 1;
  bool disable_bias_linear = false;
  // checkpoints (megazero/checkpoint/)
  std::string save, load;
  std::int64_t save_interval = 0;
  int keep_checkpoints = 0;
  // Megatron's: --finetune trains from a checkpoint's weights as a new run
  // (iteration 0: a fresh optimizer, LR schedule and data position);
  // --no-load-optim goes on from its iteration and data position with Adam's
  // moments, step count and the fp16 loss scale started afresh; --no-save-optim
  // saves the fp32 master weights alone (they reload with either of the two).
  bool finetune = false, no_load_optim = false, no_save_optim = false;
  // Megatron's: --ckpt-step N loads --load's iter_N and no other;
  // --exit-on-missing-checkpoint refuses to start from random weights when
  // --load holds no checkpoint.
  std::int64_t ckpt_step = -1;
  // Megatron's weight-decay schedule (optim::WeightDecaySchedule): -1 = not
  // given (--weight-decay); resolved by parse_train_args.
  double start_weight_decay = -1, end_weight_decay = -1;
  std::string weight_decay_incr_style = "constant";
  std::int64_t weight_decay_incr_iters = 0;  // 0 = --train-iters
  optim::WeightDecaySchedule weight_decay_schedule() const {
    return {start_weight_decay, end_weight_decay, weight_decay_incr_style, weight_decay_incr_iters};
  }
  bool skip_train = false;  // --skip-train (Megatron's): evaluate the loaded model, train nothing
  // --use-checkpoint-args (Megatron's): the model's shape flags come from the
  // checkpoint --load reads (parse_train_args' checkpoint_config).
  bool use_checkpoint_args = false;
  bool exit_on_missing_checkpoint = false;
  // --rampup-batch-size START INCREMENT SAMPLES (Megatron's): the global batch
  // ramps up to --global-batch-size (train/batch_schedule.h).
  std::vector<std::string> rampup_batch_size;
  // Megatron's --decrease-batch-size-if-needed: a global batch that is not a
  // multiple of micro batch x DP trains the largest multiple below it
  // (apply_decrease_batch_size), as Megatron's running global batch does.
  bool decrease_batch_size_if_needed = false;
  // The global batch of each iteration at data-parallel size dp.
  BatchSchedule batch_schedule(std::int64_t dp) const;
  // faults (megazero/comm/fault_tolerance.h)
  double collective_timeout = 600;  // a generous NCCL-like default: a slow save or eval never trips it
  bool check_collectives = false;
  std::string on_nan_loss = "stop";
  // Stopping on purpose, as Megatron's flags: after this many minutes of
  // training or at an iteration that is a multiple of the interval, save (with
  // --save) and exit 0.
  double exit_duration_in_mins = 0;
  std::int64_t exit_interval = 0;
  // Resuming with another LR schedule (Megatron's flags): by default a change
  // of --lr, --min-lr, --lr-warmup-iters, --lr-decay-iters or --lr-decay-style
  // against the checkpoint's is refused; --use-checkpoint-opt-param-scheduler
  // takes the checkpoint's, --override-opt-param-scheduler the command line's.
  bool use_checkpoint_lr_schedule = false, override_lr_schedule = false;
  std::string tensorboard_dir;  // --tensorboard-dir: TensorBoard event files of the logged scalars
  // --profile (Megatron's flags): the GPU's kernel trace over the iterations
  // after --profile-step-start up to --profile-step-end, on --profile-ranks,
  // summarised when it stops (megazero/trainer/kernel_profile.h).
  bool profile = false;
  std::int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<std::string> profile_ranks{"0"};
  std::string profile_file;                 // the rows as CSV too
  std::vector<int> profiled_ranks() const;  // profile_ranks as numbers (checked by validate())
  // Lines printed once at start (what an accepted-but-inert Megatron flag does).
  std::vector<std::string> notes;
  // ZeRO-R (megazero/zero/partitioned_activations.h) and the paper's C1..C5
  zero::ZeroRConfig zero_r;
  std::string zero_config;            // "" or C1..C5
  std::string zero_config_expansion;  // what --zero-config turned into, printed at start

  std::string config_file;
  bool help = false;
  bool dry_run = false;
  int world_size = 0;       // with --dry-run: validate for this many ranks instead of the launched job
  int plan_rank = 0;        // with --dry-run --world-size: the rank whose memory is planned
  std::string hardware;     // with --dry-run --world-size: a hardware profile for the time estimate
  std::string plan_json;    // with --dry-run --world-size: write the plan (and estimate) as JSON here
  double plan_fit_gib = 0;  // with --dry-run --world-size: find the most layers whose plan fits this many GiB

  std::int64_t accumulation_steps(int dp) const { return global_batch_size / (micro_batch_size * dp); }
  DType dtype() const { return fp16 ? DType::F16 : bf16 ? DType::BF16 : DType::F32; }
  // The engine's configuration for this run (precision; MD covers gradients
  // too): the driver and the planner build the engine from the same one.
  zero::ZeroConfig engine_config() const {
    zero::ZeroConfig z = zero;
    z.param_dtype = dtype();
    z.contiguous_gradients = zero_r.contiguous_memory;
    return z;
  }
  // Elements of one layer's checkpointed input (micro-batch x seq x hidden).
  // A recomputing layer's input: micro-batch x seq x hidden, of which each
  // rank holds 1/TP under sequence parallelism.
  std::int64_t checkpoint_elements() const {
    const std::int64_t all = micro_batch_size * model.seq_length * model.hidden_size;
    const int tp = parallel.tensor_model_parallel_size;
    return model.sequence_parallel && tp > 1 ? all / tp : all;
  }
  // Checks everything that needs no knowledge of the world; dp/tp checks in validate_layout.
  void validate() const;
  void validate_layout(int world_size) const;
  // With --decrease-batch-size-if-needed, before validate_layout: lowers
  // --global-batch-size to the largest multiple of micro batch x DP for this
  // world and notes it (ConfigError when not even one micro-batch per rank fits).
  void apply_decrease_batch_size(int world_size);
  // The resolved configuration as "key = value" lines (printed at start and stored with outputs).
  std::string to_config() const;
  // to_config() plus the flags it leaves out (--help, --dry-run and the plan
  // flags): what every rank of a job must have been started with alike.
  std::string fingerprint() const;
};

// The "key = value" lines of a resolved configuration (to_config's format).
std::map<std::string, std::string> config_values(const std::string& config);

// On resume: the learning-rate schedule of this run against the one a
// checkpoint at `iteration` was trained with (`saved_config`, its resolved
// configuration). Nothing to check at iteration 0 (an imported model) or for a
// checkpoint that stored no schedule. A difference is a ConfigError naming each
// key, unless --use-checkpoint-opt-param-scheduler (the checkpoint's schedule
// replaces this run's: returns a note) or --override-opt-param-scheduler (this
// run's is kept: returns a note).
std::string reconcile_lr_schedule(TrainArgs& args, const std::string& saved_config, std::int64_t iteration);

// Loading a checkpoint (resume, --finetune, --skip-train): the options that
// change what the same weights compute without changing their shapes
// (--apply-layernorm-1p, --squared-relu, --norm-epsilon, rope's periods, ...)
// must be the checkpoint's, else a ConfigError naming each with both values.
// --finetune may change rope's periods (a longer context): a note then.
// Keys the checkpoint did not store are not compared.
std::string model_function_check(const TrainArgs& args, const std::string& saved_config, bool finetune);

// On resume: a note when the loss this run minimises is not the one the
// checkpoint was trained on (--eod-mask-loss or its --eod-token-id differ):
// the logged loss changes its definition
// at the resumed iteration. Not an error (Megatron does not check it either);
// "" when they agree or the checkpoint stored none of them.
std::string loss_definition_note(const TrainArgs& args, const std::string& saved_config);

// "" if `mine` (this rank's fingerprint) equals `reference` (rank 0's), else
// a message naming each differing key with both values.
std::string config_difference(const std::string& reference, const std::string& mine, int rank);

// Parses argv (and the --config file). Throws ConfigError; fills help text on --help.
TrainArgs parse_train_args(int argc, char** argv, std::string* help_text);

// As above with the --config file's text given (nullopt: read the file).
// checkpoint_config, with --use-checkpoint-args: the resolved configuration of
// the checkpoint to load (its manifest's); its model-shape keys
// (checkpoint_model_keys) replace this command line's and config file's, each
// replaced value named in a note.
TrainArgs parse_train_args(int argc, char** argv, std::string* help_text, const std::optional<std::string>& config_text,
                           const std::optional<std::string>& checkpoint_config = std::nullopt);

// The flags --use-checkpoint-args takes from a checkpoint: the model's shape
// (as Megatron's takes num_layers, hidden_size, ...), not how it is trained.
const std::vector<std::string>& checkpoint_model_keys();

// The value of --config in argv ("--config F" or "--config=F"; the last one
// wins, as for any flag), "" when there is none. No checks: parsing reports a
// malformed command line.
std::string config_path_in(int argc, char** argv);

// A --config file's text: ConfigError naming the file when it is missing, a
// directory, unreadable, longer than 1 MiB or not text.
std::string read_config_file(const std::string& file, const std::string& flag = "--config",
                             const std::string& what = "a config file (see configs/)");

// Collective over `comm`: rank 0 reads its --config file and every rank whose
// command line names the same file gets that text, so a file only rank 0 can
// read (`--config <(generate)` under mpiexec, where the ranks would race for
// one pipe, or a path on rank 0's node only) configures every rank alike. A
// rank naming another file (or none) gets nullopt and parses its own (the
// fingerprint check then reports the difference). An unreadable file on rank
// 0 is an AgreedConfigError on every rank.
std::optional<std::string> shared_config_text(Communicator& comm, int argc, char** argv);

}  // namespace megazero::train
