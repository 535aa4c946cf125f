// Distributed checkpoints (format: docs/CHECKPOINTS.md).
//
// Save: every rank writes its own shard in parallel (its DP partition of its
// TP shard's fp32 master weights and Adam moments; nothing is gathered to rank
// 0) into a temporary directory; rank 0 then writes the manifest (global
// shapes, splits, layout, resolved config, iteration, data position, loss
// scaler, per-file sizes and XXH3 checksums), renames the directory into
// place and only then updates `latest`. A crash at any moment leaves the
// previous checkpoint and `latest` intact.
//
// Load: the newest checkpoint that is complete and whose every file matches
// its checksum (verified in parallel, each file by one rank); unusable ones
// are reported by name and skipped. Any layout loads any checkpoint: each rank
// reshards what it owns from the saved global shapes (reshard.h), so TP, DP
// and the ZeRO stage may all change between save and load.
//
// 16-bit parameters are not stored: they are the rounding of the fp32 master
// weights, recomputed on load, exactly as after an optimizer step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megazero/optim/loss_scaler.h"
#include "megazero/zero/zero_engine.h"
#include "parallel_state/process_groups.h"

namespace megazero::checkpoint {

// What, besides the optimizer state, a run needs to continue exactly. The RNG
// needs no state: every random stream is counter-based (Philox), keyed on
// (seed, iteration, layer, purpose) and the sample's global index.
struct TrainState {
  std::int64_t iteration = 0;         // completed iterations
  std::int64_t consumed_samples = 0;  // the data position
  std::uint64_t seed = 0;
  optim::LossScaler::State loss_scaler;
  std::string config;  // the resolved configuration ("key = value" lines)
  // The iteration the optimizer state began at: 0, or where a run loaded
  // weights without Adam's moments (--no-load-optim). Adam's bias correction
  // counts steps from it, so a resume of such a run continues exactly.
  std::int64_t optimizer_start_iteration = 0;
};

struct SaveOptions {
  int keep = 0;  // keep this many newest checkpoints (0 = all)
  // false (--no-save-optim): the master weights only, a third of the bytes;
  // such a checkpoint loads only without the optimizer state (LoadOptions).
  bool optimizer_state = true;
  // Fault injection for tests: this world rank dies (SIGKILL) with its shard
  // half written. -1 = never. Set from MEGAZERO_TEST_KILL_IN_SAVE.
  int kill_rank_midway = -1;
};

struct IoReport {
  std::string path;               // the checkpoint directory
  double seconds = 0;             // this rank, wall
  double max_seconds = 0;         // slowest rank
  std::uint64_t rank_bytes = 0;   // this rank's shard (save) or bytes copied (load)
  std::uint64_t total_bytes = 0;  // over all ranks
};

// Directory name of an iteration's checkpoint: iter_0000100.
std::string iteration_dir_name(std::int64_t iteration);

// Where this rank sits: the world (every rank takes part in save and load)
// and its TP coordinate; the DP coordinate is the engine's.
struct Placement {
  Communicator* world = nullptr;
  int tp_rank = 0, tp_size = 1;
  static Placement of(parallel_state::ProcessGroups& g) { return {&g.world(), g.tp_rank(), g.tp_size()}; }
};

// Collective over where.world. Errors (a full disk, no permission) are
// ConfigErrors raised on every rank together.
IoReport save_checkpoint(const std::string& dir, const TrainState& state, zero::ZeroEngine& engine,
                         const Placement& where, const SaveOptions& options = {});

struct LoadResult {
  bool loaded = false;  // false: no checkpoint in dir (a fresh start)
  TrainState state;
  IoReport io;
  std::vector<std::string> rejected;  // "<dir>: <why>" for each unusable checkpoint skipped
  int saved_tp = 0, saved_dp = 0, saved_stage = 0;
};

struct LoadOptions {
  // false (--no-load-optim, --finetune): the master weights only; Adam's
  // moments start at zero. true on a checkpoint saved without them is a
  // ConfigError naming both flags.
  bool optimizer_state = true;
};

// Collective over where.world. Loads the newest usable checkpoint under
// `dir` into the engine (master weights, Adam moments; 16-bit params
// recomputed). A model that does not match the checkpoint (names, shapes) is a
// ConfigError; so is a directory holding checkpoints none of which is usable.
LoadResult load_checkpoint(const std::string& dir, zero::ZeroEngine& engine, const Placement& where,
                           const LoadOptions& options = {});

// ---- for tools and tests ----
struct ParameterInfo {
  std::string name;
  std::vector<std::int64_t> global_shape;
  int split_dim = -1;
  std::int64_t padding_from_row = -1;
};
struct ShardFileInfo {
  std::string name;
  int tp_rank = 0, dp_rank = 0;
  std::uint64_t bytes = 0, xxh3 = 0;
};
struct Manifest {
  int version = 2;  // 2: the manifest carries the XXH3 of its own contents (1: read, unchecked)
  TrainState state;
  int tp = 1, dp = 1, stage = 0;
  std::string params_dtype;
  // What the shards hold: "master", "exp_avg", "exp_avg_sq", or "master"
  // alone (saved with --no-save-optim).
  std::vector<std::string> states = {"master", "exp_avg", "exp_avg_sq"};
  bool has_optimizer_state() const { return states.size() == 3; }
  std::vector<ParameterInfo> parameters;
  std::vector<ShardFileInfo> files;

  std::string to_json() const;
  // Throws ConfigError naming `path` for anything malformed.
  static Manifest parse(const std::string& text, const std::string& path);
};

// load_checkpoint in two halves, for a caller that needs the manifest (the
// model's configuration) before it builds the engine to load into
// (tools/checkpoint_model.h). choose_checkpoint: collective over `world`,
// the newest usable checkpoint under `dir`, its files verified in parallel
// (each by one rank); dir empty when nothing is saved there, and the same
// ConfigError as load_checkpoint's when nothing saved is usable. With a
// `required_by` flag (--load), nothing saved is that flag's ConfigError too.
struct ChosenCheckpoint {
  std::string dir;  // the iter_* directory
  Manifest manifest;
  std::vector<std::string> rejected;  // "<dir>: <why>" for each unusable one skipped
};
ChosenCheckpoint choose_checkpoint(const std::string& dir, Communicator& world, const std::string& required_by = "");
// Collective over where.world: the chosen checkpoint into the engine, as load_checkpoint.
LoadResult load_chosen(const ChosenCheckpoint& checkpoint, zero::ZeroEngine& engine, const Placement& where,
                       const LoadOptions& options = {});

// Reads a checkpoint directory on one process, e.g. to consolidate it.
// Verifies sizes and checksums of every file first.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& checkpoint_dir);
  ~CheckpointReader();
  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const;
  // The global tensor of a parameter's state ("master", "exp_avg",
  // "exp_avg_sq") as fp32, row-major over its saved global shape.
  std::vector<float> global_tensor(const std::string& param, const std::string& state);

 private:
  struct Impl;
  Manifest manifest_;
  Impl* impl_;
};

// The newest complete checkpoint directory under `dir` (by `latest`, else by
// name), or "" if none. Does not verify checksums.
// The checkpoint directories `load` names, in the order a load tries them:
// `load` itself if it is one (it holds manifest.json or is named iter_N), else
// its iter_* directories, the one `latest` names first, then newest first.
// A regular file, or a path the file system cannot list (a symlink loop, no
// permission), is a ConfigError naming `flag` (--load).
std::vector<std::string> checkpoint_candidates(const std::string& load, const std::string& flag = "--load");

// The newest usable checkpoint of `load` (as checkpoint_candidates orders
// them), for tools: each unusable one is skipped with its reason appended to
// `rejected`. ConfigError listing every reason if none is usable.
std::unique_ptr<CheckpointReader> open_newest_usable(const std::string& load, std::vector<std::string>* rejected,
                                                     const std::string& flag = "--load");

std::string find_latest(const std::string& dir);

// The resolved configuration stored in the newest checkpoint of `load` that
// has a valid manifest (its own checksum checked; the shards are not read):
// what --use-checkpoint-args takes the model's flags from. ConfigError naming
// `flag` when there is none.
std::string stored_configuration(const std::string& load, const std::string& flag = "--load");

}  // namespace megazero::checkpoint
