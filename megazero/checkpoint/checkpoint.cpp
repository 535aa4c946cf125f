#include "megazero/checkpoint/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "megazero/checkpoint/file_io.h"
#include "megazero/checkpoint/reshard.h"
#include "megazero/checkpoint/safetensors.h"
#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "megazero/core/limits.h"

namespace megazero::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kFormat = "megazero-checkpoint";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";
const char* const kStates[] = {"master", "exp_avg", "exp_avg_sq"};
// Bounds of what a manifest may claim (pretrain_gpt's own flag bounds).
using limits::kMaxBatch;
using limits::kMaxIterations;
using limits::kMaxRanks;

std::string shard_file_name(int tp, int dp) {
  char s[64];
  std::snprintf(s, sizeof s, "shard_tp%03d_dp%05d.safetensors", tp, dp);
  return s;
}

// A tensor piece in a shard file: elements [begin, begin + length) of the
// shard-local flat index space of one parameter's TP shard.
std::string piece_name(const std::string& state, const std::string& param, std::int64_t begin) {
  return state + "/" + param + "@" + std::to_string(begin);
}
bool parse_piece_name(const std::string& n, std::string& state, std::string& param, std::int64_t& begin) {
  const auto slash = n.find('/'), at = n.rfind('@');
  if (slash == std::string::npos || at == std::string::npos || at < slash) return false;
  state = n.substr(0, slash);
  param = n.substr(slash + 1, at - slash - 1);
  try {
    std::size_t used = 0;
    begin = std::stoll(n.substr(at + 1), &used);
    return used == n.size() - at - 1 && begin >= 0;
  } catch (...) {
    return false;
  }
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double max_over(Communicator& c, double v) { return all_reduce_value(c, v, ReduceOp::Max); }
double sum_over(Communicator& c, double v) { return all_reduce_value(c, v, ReduceOp::Sum); }

// Iteration of a directory named iter_NNNNNNN, or -1.
std::int64_t iteration_of(const std::string& name) {
  if (name.size() < 6 || name.rfind("iter_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) return -1;
  return std::stoll(digits);
}

// ------------------------------------------------------------ saved shards
// Index of the pieces in the shard files of one checkpoint, opened lazily per
// saved TP rank (a rank only maps the files it reads from).
class SavedShards {
 public:
  SavedShards(std::string dir, const Manifest& m) : dir_(std::move(dir)), m_(m) {}

  // Copies saved elements [src, src + n) of (state, param) on saved TP rank tp
  // to `dst`, an address of `device` (host memory on the CPU device; on a GPU
  // straight from the mapped file to device memory).
  void copy(int tp, const std::string& state, const std::string& param, std::int64_t src, std::int64_t n,
            Device& device, float* dst) {
    const auto& pieces = index(tp)[{state, param}];
    auto it =
        std::upper_bound(pieces.begin(), pieces.end(), src, [](std::int64_t v, const Piece& p) { return v < p.begin; });
    std::int64_t done = 0;
    if (it != pieces.begin()) --it;
    for (; done < n && it != pieces.end(); ++it) {
      const std::int64_t at = src + done;
      if (it->begin > at) break;
      if (it->begin + it->length <= at) continue;
      const std::int64_t take = std::min(n - done, it->begin + it->length - at);
      device.copy_from_host(dst + done, it->data + (at - it->begin), static_cast<std::size_t>(take) * sizeof(float));
      done += take;
      bytes_ += static_cast<std::uint64_t>(take) * sizeof(float);
    }
    MZ_REQUIRE(done == n, "checkpoint '", dir_, "' lacks elements [", src + done, ", ", src + n, ") of ", state,
               " of parameter '", param, "' (TP shard ", tp, "): the checkpoint is incomplete");
  }
  std::uint64_t bytes_copied() const { return bytes_; }

 private:
  struct Piece {
    std::int64_t begin, length;
    const float* data;
  };
  using Index = std::map<std::pair<std::string, std::string>, std::vector<Piece>>;

  Index& index(int tp) {
    auto found = by_tp_.find(tp);
    if (found != by_tp_.end()) return found->second;
    Index& idx = by_tp_[tp];
    for (const auto& f : m_.files) {
      if (f.tp_rank != tp) continue;
      files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir_) / f.name).string()));
      const SafetensorsFile& file = *files_.back();
      for (const auto& [name, e] : file.tensors()) {
        std::string state, param;
        std::int64_t begin = 0;
        MZ_REQUIRE(parse_piece_name(name, state, param, begin), "'", file.path(), "' holds a tensor named '", name,
                   "', which is not a megazero checkpoint piece");
        MZ_REQUIRE(e.dtype == DType::F32 && e.shape.size() == 1, "'", file.path(), "': piece '", name,
                   "' must be a 1-D F32 tensor");
        idx[{state, param}].push_back({begin, e.shape[0], reinterpret_cast<const float*>(file.data(e))});
      }
    }
    for (auto& [key, pieces] : idx) {
      std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
      for (std::size_t i = 1; i < pieces.size(); ++i)
        MZ_REQUIRE(pieces[i].begin >= pieces[i - 1].begin + pieces[i - 1].length, "checkpoint '", dir_,
                   "': overlapping pieces of ", key.first, " of '", key.second, "'");
    }
    return idx;
  }

  std::string dir_;
  const Manifest& m_;
  std::map<int, Index> by_tp_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::uint64_t bytes_ = 0;
};

ShardLayout saved_layout(const ParameterInfo& p, int tp) { return {p.global_shape, p.split_dim, tp}; }

// Values a manifest can hold: what a run could have written. (Its checksum
// catches accidents; this catches a manifest written by something else.)
void validate(const Manifest& m, const std::string& path) {
  const auto& st = m.state;
  MZ_REQUIRE(st.iteration >= 0 && st.iteration <= kMaxIterations, "'", path, "': iteration ", st.iteration,
             " is not a completed iteration count");
  MZ_REQUIRE(st.consumed_samples >= 0 && st.consumed_samples / std::max<std::int64_t>(st.iteration, 1) <= kMaxBatch,
             "'", path, "': consumed samples ", st.consumed_samples, " cannot follow ", st.iteration, " iterations");
  const auto& ls = st.loss_scaler;
  MZ_REQUIRE(
      std::isfinite(ls.scale) && ls.scale > 0 && ls.good_steps >= 0 && ls.skipped >= 0 && ls.skipped <= st.iteration,
      "'", path, "': invalid loss scaler state (scale ", ls.scale, ", good steps ", ls.good_steps, ", skipped ",
      ls.skipped, ", hysteresis left ", ls.hysteresis_left, ")");
  MZ_REQUIRE(m.params_dtype == "fp32" || m.params_dtype == "fp16" || m.params_dtype == "bf16", "'", path,
             "': unknown params_dtype '", m.params_dtype, "'");
  MZ_REQUIRE(m.states == std::vector<std::string>(std::begin(kStates), std::end(kStates)) ||
                 m.states == std::vector<std::string>{kStates[0]},
             "'", path, "': states must be [master, exp_avg, exp_avg_sq] or [master] alone");
  MZ_REQUIRE(st.optimizer_start_iteration >= 0 && st.optimizer_start_iteration <= st.iteration, "'", path,
             "': optimizer start iteration ", st.optimizer_start_iteration, " is not within 0..", st.iteration);
  std::set<std::pair<int, int>> seen;
  for (const auto& f : m.files) {
    MZ_REQUIRE(f.tp_rank >= 0 && f.tp_rank < m.tp && f.dp_rank >= 0 && f.dp_rank < m.dp &&
                   f.name == shard_file_name(f.tp_rank, f.dp_rank) && seen.insert({f.tp_rank, f.dp_rank}).second,
               "'", path, "': file entry '", f.name, "' (TP rank ", f.tp_rank, ", DP rank ", f.dp_rank,
               ") does not fit TP ", m.tp, " x DP ", m.dp);
  }
  std::set<std::string> names;
  for (const auto& p : m.parameters)
    MZ_REQUIRE(names.insert(p.name).second, "'", path, "': parameter '", p.name, "' is listed twice");
}

// The manifest of a checkpoint directory, parsed, validated and checked
// against the directory's name (iter_N holds iteration N).
Manifest read_manifest(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / kManifest).string();
  Manifest m = Manifest::parse(read_small_file(mpath), mpath);
  const std::int64_t named = iteration_of(fs::path(dir).filename().string());
  MZ_REQUIRE(named < 0 || named == m.state.iteration, "'", mpath, "' says iteration ", m.state.iteration,
             " but its directory is named for iteration ", named);
  return m;
}

// A shard's header must be what the manifest says the file holds: pieces of
// the three states of its parameters, 1-D fp32, inside their TP shard. (The
// checksum proves the bytes are the saved ones, not that the saver was right.)
std::string check_shard_header(const std::string& file_path, const Manifest& m, const ShardFileInfo& f) {
  try {
    SafetensorsFile file(file_path);
    std::map<std::string, const ParameterInfo*> params;
    for (const auto& p : m.parameters) params[p.name] = &p;
    const auto& meta = file.metadata();
    auto meta_is = [&](const char* key, int v) {
      auto it = meta.find(key);
      return it != meta.end() && it->second == std::to_string(v);
    };
    if (!meta_is("tp_rank", f.tp_rank) || !meta_is("dp_rank", f.dp_rank))
      return "'" + file_path + "' is not the shard of TP rank " + std::to_string(f.tp_rank) + ", DP rank " +
             std::to_string(f.dp_rank) + " its name and the manifest say";
    for (const auto& [name, e] : file.tensors()) {
      std::string state, param;
      std::int64_t begin = 0;
      if (!parse_piece_name(name, state, param, begin) ||
          std::find(m.states.begin(), m.states.end(), state) == m.states.end())
        return "'" + file_path + "' holds '" + name + "', which is not a piece of a checkpointed state";
      auto it = params.find(param);
      if (it == params.end())
        return "'" + file_path + "' holds '" + name + "' of a parameter the manifest does not list";
      const std::int64_t numel = shard_numel(saved_layout(*it->second, m.tp));
      if (e.dtype != DType::F32 || e.shape.size() != 1 || begin < 0 || e.shape[0] > numel - begin)
        return "'" + file_path + "': piece '" + name + "' is not a 1-D fp32 run inside its " + std::to_string(numel) +
               "-element TP shard";
    }
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Checks that the files of a manifest exist with their sizes; verifies the
// checksums of the files with index % stride == offset. Returns "" or why not.
std::string verify_files(const std::string& dir, const Manifest& m, int offset, int stride) {
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const auto& f = m.files[i];
    const fs::path p = fs::path(dir) / f.name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) return "'" + p.string() + "' is missing";
    if (size != f.bytes)
      return "'" + p.string() + "' has " + std::to_string(size) + " bytes, the manifest says " +
             std::to_string(f.bytes) + " (truncated?)";
    if (static_cast<int>(i % static_cast<std::size_t>(stride)) != offset) continue;
    if (file_xxh3(p.string()) != f.xxh3) return "'" + p.string() + "' fails its checksum (corrupted)";
    if (auto why = check_shard_header(p.string(), m, f); !why.empty()) return why;
  }
  return "";
}

}  // namespace

std::string iteration_dir_name(std::int64_t iteration) {
  char s[32];
  std::snprintf(s, sizeof s, "iter_%07lld", static_cast<long long>(iteration));
  return s;
}

// ------------------------------------------------------------ manifest
std::string Manifest::to_json() const {
  json j;
  j["format"] = kFormat;
  j["version"] = version;
  j["iteration"] = state.iteration;
  j["consumed_samples"] = state.consumed_samples;
  j["rng"] = {{"seed", state.seed},
              {"generator",
               "philox4x32-10, counter-based: every stream is keyed on (seed, iteration, layer, "
               "purpose) and the sample index, so no generator state is stored"}};
  j["loss_scaler"] = {{"dynamic", state.loss_scaler.dynamic},
                      {"scale", state.loss_scaler.scale},
                      {"good_steps", state.loss_scaler.good_steps},
                      {"skipped_iterations", state.loss_scaler.skipped},
                      {"hysteresis_left", state.loss_scaler.hysteresis_left}};
  j["layout"] = {{"tensor_model_parallel_size", tp},
                 {"data_parallel_size", dp},
                 {"zero_stage", stage},
                 {"params_dtype", params_dtype}};
  j["states"] = states;
  j["optimizer_start_iteration"] = state.optimizer_start_iteration;
  j["parameters"] = json::array();
  for (const auto& p : parameters)
    j["parameters"].push_back({{"name", p.name},
                               {"global_shape", p.global_shape},
                               {"split_dim", p.split_dim},
                               {"padding_from_row", p.padding_from_row}});
  j["files"] = json::array();
  for (const auto& f : files)
    j["files"].push_back({{"name", f.name},
                          {"tp_rank", f.tp_rank},
                          {"dp_rank", f.dp_rank},
                          {"bytes", f.bytes},
                          {"xxh3_64", hex64(f.xxh3)}});
  j["config"] = state.config;
  // The manifest's own checksum, over its compact dump without this field: a
  // hand edit or a flipped bit in it is caught like one in a shard.
  j["manifest_xxh3_64"] = hex64(bytes_xxh3(j.dump()));
  return j.dump(1) + "\n";
}

Manifest Manifest::parse(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    const json j = json::parse(text);
    MZ_REQUIRE(j.value("format", "") == kFormat, "'", path, "' is not a megazero checkpoint manifest");
    m.version = j.at("version").get<int>();
    MZ_REQUIRE(m.version == 1 || m.version == 2, "'", path, "' has format version ", m.version,
               "; this megazero reads versions 1 and 2 (upgrade megazero)");
    if (m.version >= 2) {
      json body = j;
      const std::string recorded = body.at("manifest_xxh3_64").get<std::string>();
      body.erase("manifest_xxh3_64");
      MZ_REQUIRE(parse_hex64(recorded) == bytes_xxh3(body.dump()), "'", path,
                 "' fails its own checksum (edited or corrupted)");
    }
    m.state.iteration = j.at("iteration").get<std::int64_t>();
    m.state.consumed_samples = j.at("consumed_samples").get<std::int64_t>();
    m.state.seed = j.at("rng").at("seed").get<std::uint64_t>();
    const auto& ls = j.at("loss_scaler");
    m.state.loss_scaler = {ls.at("dynamic").get<bool>(), ls.at("scale").get<double>(),
                           ls.at("good_steps").get<std::int64_t>(), ls.at("skipped_iterations").get<std::int64_t>(),
                           ls.at("hysteresis_left").get<int>()};
    m.state.config = j.at("config").get<std::string>();
    // Both written since 2026-11-27; before, every checkpoint held all three
    // states and its optimizer started at iteration 0.
    if (j.contains("states")) m.states = j.at("states").get<std::vector<std::string>>();
    m.state.optimizer_start_iteration = j.value("optimizer_start_iteration", std::int64_t{0});
    const auto& l = j.at("layout");
    m.tp = l.at("tensor_model_parallel_size").get<int>();
    m.dp = l.at("data_parallel_size").get<int>();
    m.stage = l.at("zero_stage").get<int>();
    m.params_dtype = l.at("params_dtype").get<std::string>();
    MZ_REQUIRE(m.tp > 0 && m.dp > 0 && m.tp <= kMaxRanks && m.dp <= kMaxRanks && m.stage >= 0 && m.stage <= 3, "'",
               path, "': invalid layout (TP ", m.tp, ", DP ", m.dp, ", ZeRO stage ", m.stage, ")");
    for (const auto& p : j.at("parameters")) {
      ParameterInfo info{p.at("name").get<std::string>(), p.at("global_shape").get<std::vector<std::int64_t>>(),
                         p.at("split_dim").get<int>(), p.at("padding_from_row").get<std::int64_t>()};
      for (auto d : info.global_shape) MZ_REQUIRE(d >= 0, "'", path, "': negative dimension in '", info.name, "'");
      MZ_REQUIRE(info.split_dim >= -1 && info.split_dim < static_cast<int>(info.global_shape.size()), "'", path,
                 "': bad split_dim of '", info.name, "'");
      m.parameters.push_back(std::move(info));
    }
    for (const auto& f : j.at("files")) {
      ShardFileInfo info{f.at("name").get<std::string>(), f.at("tp_rank").get<int>(), f.at("dp_rank").get<int>(),
                         f.at("bytes").get<std::uint64_t>(), parse_hex64(f.at("xxh3_64").get<std::string>())};
      MZ_REQUIRE(info.name.find('/') == std::string::npos && info.name.find("..") == std::string::npos, "'", path,
                 "': file name '", info.name, "' leaves the checkpoint directory");
      m.files.push_back(std::move(info));
    }
    MZ_REQUIRE(static_cast<int>(m.files.size()) >= m.tp * m.dp, "'", path, "' lists ", m.files.size(),
               " shard files for TP ", m.tp, " x DP ", m.dp);
    validate(m, path);
  } catch (const json::exception& e) {
    throw ConfigError("'" + path + "' is not a valid manifest: " + e.what());
  } catch (const std::invalid_argument& e) {
    throw ConfigError("'" + path + "' is not a valid manifest: " + e.what());
  } catch (const std::out_of_range& e) {
    throw ConfigError("'" + path + "' is not a valid manifest: " + e.what());
  } catch (const ConfigError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw ConfigError("'" + path + "' is not a valid manifest: " + e.what());
  }
  return m;
}

// ------------------------------------------------------------ find
std::vector<std::string> checkpoint_candidates(const std::string& load, const std::string& flag) {
  std::error_code ec;
  const auto st = fs::status(load, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw ConfigError(flag + " '" + load + "': cannot read it: " + ec.message());
  if (!fs::exists(st)) return {};
  MZ_REQUIRE(fs::is_directory(st), flag, " '", load,
             "' is not a directory; pass the checkpoint directory (the --save "
             "DIR of a run, or one of its iter_NNNNNNN directories)");
  // One checkpoint named directly: that one, with no fallback (it was asked for).
  if (fs::exists(fs::path(load) / kManifest, ec) || iteration_of(fs::path(load).filename().string()) >= 0)
    return {load};
  std::vector<std::pair<std::int64_t, std::string>> found;
  fs::directory_iterator it(load, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::int64_t iteration = iteration_of(name);
    std::error_code dir_ec;
    if (iteration >= 0 && it->is_directory(dir_ec) && !dir_ec) found.push_back({iteration, it->path().string()});
  }
  if (ec) throw ConfigError(flag + " '" + load + "': cannot list it: " + ec.message());
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  const fs::path marker = fs::path(load) / kLatest;
  if (fs::exists(marker, ec)) {
    std::string latest;
    try {
      latest = read_small_file(marker.string(), 4096);
    } catch (const ConfigError&) {
    }
    while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
    if (iteration_of(latest) >= 0 && latest.find('/') == std::string::npos)
      out.push_back((fs::path(load) / latest).string());
  }
  for (auto& [iteration, path] : found)
    if (out.empty() || path != out.front()) out.push_back(path);
  return out;
}

std::string stored_configuration(const std::string& load, const std::string& flag) {
  std::string why;
  for (const auto& c : checkpoint_candidates(load, flag)) {
    std::error_code ec;
    if (!fs::exists(fs::path(c) / kManifest, ec)) continue;
    try {
      return read_manifest(c).state.config;
    } catch (const ConfigError& e) {
      why += std::string("\n  ") + e.what();
    }
  }
  throw ConfigError(flag + " " + load + ": no checkpoint with a readable manifest to take the model's flags from" +
                    (why.empty() ? std::string(" (none saved there yet)") : why));
}

std::string find_latest(const std::string& dir) {
  std::error_code ec;
  for (const auto& c : checkpoint_candidates(dir))
    if (fs::exists(fs::path(c) / kManifest, ec)) return c;
  return "";
}

// ------------------------------------------------------------ save
IoReport save_checkpoint(const std::string& dir, const TrainState& state, zero::ZeroEngine& engine,
                         const Placement& where, const SaveOptions& options) {
  Communicator& world = *where.world;
  const int tp_rank = where.tp_rank, dp_rank = engine.dp_rank();
  const auto t0 = Clock::now();
  const std::string final_name = iteration_dir_name(state.iteration);
  const fs::path final_dir = fs::path(dir) / final_name;
  const fs::path tmp_dir = fs::path(dir) / ("." + final_name + ".tmp");
  // Rank 0 prepares an empty temporary directory (and clears debris of saves
  // that crashed: those never became checkpoints).
  run_consistently(world, [&] {
    if (world.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(dir, ec);
    MZ_REQUIRE(!ec, "--save: cannot create '", dir, "': ", ec.message());
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 5 && n[0] == '.' && n.rfind(".iter_", 0) == 0) fs::remove_all(e.path(), ec);
    }
    fs::create_directories(tmp_dir, ec);
    MZ_REQUIRE(!ec, "--save: cannot create '", tmp_dir.string(), "': ", ec.message());
  });

  // Every rank writes its DP partition of its TP shard. (Stage 0 holds the
  // whole flat buffer on every DP rank; writing only the partition splits the
  // work and stores each element once.)
  const zero::FlatLayout& layout = engine.layout();
  const zero::Range part = engine.partition(), owned = engine.owned();
  const auto st = engine.owned_state();
  const Tensor* states[] = {&st.master, &st.exp_avg, &st.exp_avg_sq};
  const std::string file = shard_file_name(tp_rank, dp_rank);
  std::uint64_t hash = 0, bytes = 0;
  run_consistently(world, [&] {
    SafetensorsWriter w;
    w.set_metadata("format", kFormat);
    w.set_metadata("tp_rank", std::to_string(tp_rank));
    w.set_metadata("dp_rank", std::to_string(dp_rank));
    const auto& params = engine.parameters();
    for (int s = 0; s < (options.optimizer_state ? 3 : 1); ++s)
      for (std::size_t i = 0; i < params.size(); ++i) {
        const zero::Range r = layout.param(i).intersect(part);
        if (r.empty()) continue;
        // Device memory is streamed out through the writer's staging buffers, never read in place.
        w.add(piece_name(kStates[s], params[i]->name, r.begin - layout.param(i).begin),
              states[s]->narrow(0, r.begin - owned.begin, r.size()), {r.size()});
      }
    const std::string path = (tmp_dir / file).string();
    hash = w.write(path);
    bytes = fs::file_size(path);
    if (options.kill_rank_midway == world.rank()) {  // a crash mid-write: half a file on disk, then death
      fs::resize_file(path, bytes / 2);
      std::cerr << "megazero: test fault injection: rank " << world.rank() << " killed while saving\n" << std::flush;
      ::raise(SIGKILL);
    }
  });

  // Sizes and checksums reach every rank; rank 0 writes the manifest.
  Tensor info = Tensor::empty(make_device(DeviceKind::CPU), {4 * world.size()}, DType::I64, MemoryCategory::Workspace);
  Tensor mine = Tensor::empty(make_device(DeviceKind::CPU), {4}, DType::I64, MemoryCategory::Workspace);
  auto* m4 = mine.host_data<std::int64_t>();
  m4[0] = tp_rank;
  m4[1] = dp_rank;
  m4[2] = static_cast<std::int64_t>(bytes);
  std::memcpy(&m4[3], &hash, sizeof hash);
  world.all_gather(mine, info).wait();
  run_consistently(world, [&] {
    if (world.rank() != 0) return;
    Manifest m;
    m.state = state;
    m.tp = where.tp_size;
    m.dp = engine.layout().dp_size();
    m.stage = engine.config().stage;
    m.params_dtype = std::string(dtype_name(engine.config().param_dtype));
    if (!options.optimizer_state) m.states = {kStates[0]};
    for (const auto* p : engine.parameters())
      m.parameters.push_back({p->name, p->global_shape, p->split_dim, p->padding_from_row});
    const auto* all = info.host_data<std::int64_t>();
    for (int r = 0; r < world.size(); ++r) {
      ShardFileInfo f;
      f.tp_rank = static_cast<int>(all[4 * r]);
      f.dp_rank = static_cast<int>(all[4 * r + 1]);
      f.name = shard_file_name(f.tp_rank, f.dp_rank);
      f.bytes = static_cast<std::uint64_t>(all[4 * r + 2]);
      std::memcpy(&f.xxh3, &all[4 * r + 3], sizeof f.xxh3);
      m.files.push_back(f);
    }
    write_file_atomically((tmp_dir / kManifest).string(), m.to_json());
    fsync_path(tmp_dir.string());
    // Into place: a checkpoint of the same iteration (a re-run) is moved aside
    // first and removed only after the new one is in place.
    std::error_code ec;
    const fs::path old = fs::path(dir) / ("." + final_name + ".old");
    if (fs::exists(final_dir)) {
      fs::remove_all(old, ec);
      fs::rename(final_dir, old, ec);
      MZ_REQUIRE(!ec, "--save: cannot move the old '", final_dir.string(), "' aside: ", ec.message());
    }
    fs::rename(tmp_dir, final_dir, ec);
    MZ_REQUIRE(!ec, "--save: cannot rename '", tmp_dir.string(), "' to '", final_dir.string(), "': ", ec.message());
    fsync_path(dir);
    write_file_atomically((fs::path(dir) / kLatest).string(), final_name + "\n");
    fs::remove_all(old, ec);
    if (options.keep > 0) {  // prune the oldest beyond `keep`, never the one just written
      auto all_dirs = checkpoint_candidates(dir, "--save");
      std::vector<std::pair<std::int64_t, fs::path>> by_iter;
      for (const auto& c : all_dirs) by_iter.push_back({iteration_of(fs::path(c).filename().string()), c});
      std::sort(by_iter.rbegin(), by_iter.rend());
      for (std::size_t i = static_cast<std::size_t>(options.keep); i < by_iter.size(); ++i)
        if (by_iter[i].second != final_dir) fs::remove_all(by_iter[i].second, ec);
    }
  });
  IoReport rep;
  rep.path = final_dir.string();
  rep.seconds = seconds_since(t0);
  rep.max_seconds = max_over(world, rep.seconds);
  rep.rank_bytes = bytes;
  rep.total_bytes = static_cast<std::uint64_t>(sum_over(world, static_cast<double>(bytes)));
  return rep;
}

// ------------------------------------------------------------ load
namespace {

// The model this run built must be the model the checkpoint holds.
void check_compatible(const Manifest& m, const std::vector<layers::Parameter*>& params, const std::string& path) {
  std::map<std::string, const ParameterInfo*> saved;
  for (const auto& p : m.parameters) saved[p.name] = &p;
  MZ_REQUIRE(saved.size() == params.size(), "checkpoint '", path, "' holds ", saved.size(),
             " parameters but this model has ", params.size(),
             "; --num-layers and the model flags must match the run that saved it (its configuration is in the "
             "manifest)");
  for (const auto* p : params) {
    auto it = saved.find(p->name);
    MZ_REQUIRE(it != saved.end(), "checkpoint '", path, "' has no parameter '", p->name,
               "'; the model flags must match the run that saved it");
    const ParameterInfo& s = *it->second;
    bool same = s.global_shape.size() == p->global_shape.size() && s.split_dim == p->split_dim;
    for (std::size_t d = 0; same && d < s.global_shape.size(); ++d)
      same = s.global_shape[d] == p->global_shape[d] ||
             (d == 0 && s.padding_from_row >= 0 && s.padding_from_row == p->padding_from_row);
    MZ_REQUIRE(same, "parameter '", p->name, "' is ", shape_str(p->global_shape), " in this model but ",
               shape_str(s.global_shape), " in checkpoint '", path,
               "'; --hidden-size, --num-attention-heads, --ffn-hidden-size, --max-position-embeddings and the "
               "vocabulary must match the run that saved it");
  }
}

}  // namespace

namespace {
std::string no_checkpoint_there(const std::string& load, const std::string& flag) {
  return detail::concat(flag, " ", load, ": no checkpoint there", fs::exists(load) ? "" : " (the path does not exist)",
                        "; pass the --save directory of a pretrain_gpt run or one of its iter_NNNNNNN directories");
}
}  // namespace

ChosenCheckpoint choose_checkpoint(const std::string& dir, Communicator& world, const std::string& required_by) {
  ChosenCheckpoint res;
  // Rank 0 lists; everybody tries the same candidates in the same order.
  std::string listing;
  run_consistently(world, [&] {
    if (world.rank() == 0)
      for (const auto& c : checkpoint_candidates(dir)) listing += c + "\n";
  });
  listing = broadcast_string(world, listing);
  std::vector<std::string> cands;
  for (std::size_t b = 0, e; (e = listing.find('\n', b)) != std::string::npos; b = e + 1)
    cands.push_back(listing.substr(b, e - b));
  // The listing is the same on every rank: so is this verdict.
  if (cands.empty() && !required_by.empty()) throw AgreedConfigError(no_checkpoint_there(dir, required_by));

  Manifest m;
  std::string chosen;
  for (const auto& c : cands) {
    std::string why;
    try {
      std::error_code ec;
      if (!fs::exists(fs::path(c) / kManifest, ec)) {
        why = "no manifest (the save did not finish)";
      } else {
        m = read_manifest(c);
        why = verify_files(c, m, world.rank(), world.size());
      }
    } catch (const ConfigError& e) {
      why = e.what();
    }
    try {
      agree_on_error(world, why);
      chosen = c;
      break;
    } catch (const AgreedConfigError& e) {
      res.rejected.push_back(c + ": " + e.what());
    }
  }
  if (chosen.empty() && !cands.empty()) {  // every rank knows this alike: the verdicts were agreed
    std::string s = "--load: no usable checkpoint in '" + dir + "':\n";
    for (const auto& r : res.rejected) s += "  " + r + "\n";
    throw AgreedConfigError(s + "  remove the broken directories or point --load elsewhere");
  }
  res.dir = chosen;  // empty: nothing saved yet (a fresh start)
  res.manifest = std::move(m);
  return res;
}

LoadResult load_chosen(const ChosenCheckpoint& checkpoint, zero::ZeroEngine& engine, const Placement& where,
                       const LoadOptions& options) {
  Communicator& world = *where.world;
  const auto t0 = Clock::now();
  LoadResult res;
  res.rejected = checkpoint.rejected;
  if (checkpoint.dir.empty()) return res;  // nothing saved yet: a fresh start
  const std::string& chosen = checkpoint.dir;
  const Manifest& m = checkpoint.manifest;
  run_consistently(world, [&] {
    check_compatible(m, engine.parameters(), chosen);
    MZ_REQUIRE(!options.optimizer_state || m.has_optimizer_state(), "checkpoint '", chosen,
               "' holds the weights without the optimizer state (saved with --no-save-optim): add --no-load-optim "
               "to go on from its iteration with fresh Adam moments, or --finetune to train from its weights at "
               "iteration 0");
  });
  const int states_loaded = options.optimizer_state ? 3 : 1;
  SavedShards shards(chosen, m);
  run_consistently(world, [&] {
    const zero::FlatLayout& layout = engine.layout();
    const zero::Range owned = engine.owned();
    const auto st = engine.owned_state();
    const Tensor* states[] = {&st.master, &st.exp_avg, &st.exp_avg_sq};
    std::map<std::string, const ParameterInfo*> saved;
    for (const auto& p : m.parameters) saved[p.name] = &p;
    const auto& params = engine.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const layers::Parameter& p = *params[i];
      const zero::Range r = layout.param(i).intersect(owned);
      if (r.empty()) continue;
      const std::int64_t local0 = r.begin - layout.param(i).begin;
      const ShardLayout dst{p.global_shape, p.split_dim, where.tp_size};
      const auto runs =
          map_shard_range(dst, where.tp_rank, saved_layout(*saved.at(p.name), m.tp), local0, local0 + r.size());
      for (int s = 0; s < 3; ++s) {
        // A device address: written only through the device's copies.
        Device& device = states[s]->device();
        float* base = static_cast<float*>(states[s]->data()) + (r.begin - owned.begin) - local0;
        for (const auto& run : runs) {
          if (run.src_part < 0 || s >= states_loaded)  // padding, or Adam's moments not loaded: zero
            device.fill_zero(base + run.dst, static_cast<std::size_t>(run.length) * sizeof(float));
          else
            shards.copy(run.src_part, kStates[s], p.name, run.src, run.length, device, base + run.dst);
        }
      }
    }
  });
  engine.load_finished();
  res.loaded = true;
  res.state = m.state;
  res.saved_tp = m.tp;
  res.saved_dp = m.dp;
  res.saved_stage = m.stage;
  res.io.path = chosen;
  res.io.seconds = seconds_since(t0);
  res.io.max_seconds = max_over(world, res.io.seconds);
  res.io.rank_bytes = shards.bytes_copied();
  res.io.total_bytes = static_cast<std::uint64_t>(sum_over(world, static_cast<double>(res.io.rank_bytes)));
  return res;
}

LoadResult load_checkpoint(const std::string& dir, zero::ZeroEngine& engine, const Placement& where,
                           const LoadOptions& options) {
  const auto t0 = Clock::now();
  LoadResult res = load_chosen(choose_checkpoint(dir, *where.world), engine, where, options);
  // The verification of the candidates counts as loading.
  res.io.seconds = seconds_since(t0);
  res.io.max_seconds = max_over(*where.world, res.io.seconds);
  return res;
}

// ------------------------------------------------------------ reader
struct CheckpointReader::Impl {
  std::string dir;
  std::unique_ptr<SavedShards> shards;
};

CheckpointReader::CheckpointReader(const std::string& checkpoint_dir) : impl_(new Impl) {
  impl_->dir = checkpoint_dir;
  manifest_ = read_manifest(checkpoint_dir);
  const std::string why = verify_files(checkpoint_dir, manifest_, 0, 1);
  MZ_REQUIRE(why.empty(), "checkpoint '", checkpoint_dir, "' is unusable: ", why);
  impl_->shards = std::make_unique<SavedShards>(checkpoint_dir, manifest_);
}

CheckpointReader::~CheckpointReader() { delete impl_; }

const std::string& CheckpointReader::dir() const { return impl_->dir; }

std::vector<float> CheckpointReader::global_tensor(const std::string& param, const std::string& state) {
  const ParameterInfo* info = nullptr;
  for (const auto& p : manifest_.parameters)
    if (p.name == param) info = &p;
  MZ_REQUIRE(info, "checkpoint '", impl_->dir, "' has no parameter '", param, "'");
  MZ_REQUIRE(std::find(manifest_.states.begin(), manifest_.states.end(), state) != manifest_.states.end(),
             "checkpoint '", impl_->dir, "' holds no '", state,
             "' (saved with --no-save-optim: the master weights only)");
  // The global tensor is shard 0 of the same parameter split into one part.
  const ShardLayout whole{info->global_shape, info->split_dim, 1};
  const std::int64_t n = shard_numel(whole);
  std::vector<float> out(static_cast<std::size_t>(n));
  const auto host = make_device(DeviceKind::CPU);
  for (const auto& run : map_shard_range(whole, 0, saved_layout(*info, manifest_.tp), 0, n)) {
    if (run.src_part < 0)
      std::fill(out.begin() + run.dst, out.begin() + run.dst + run.length, 0.0f);
    else
      impl_->shards->copy(run.src_part, state, param, run.src, run.length, *host, out.data() + run.dst);
  }
  return out;
}

std::unique_ptr<CheckpointReader> open_newest_usable(const std::string& load, std::vector<std::string>* rejected,
                                                     const std::string& flag) {
  const auto cands = checkpoint_candidates(load, flag);
  MZ_REQUIRE(!cands.empty(), no_checkpoint_there(load, flag));
  std::vector<std::string> why;
  for (const auto& c : cands) {
    try {
      std::error_code ec;
      MZ_REQUIRE(fs::exists(fs::path(c) / kManifest, ec), "no manifest (the save did not finish)");
      return std::make_unique<CheckpointReader>(c);
    } catch (const ConfigError& e) {
      why.push_back(c + ": " + e.what());
      if (rejected) rejected->push_back(why.back());
    }
  }
  std::string s = flag + ": no usable checkpoint in '" + load + "':\n";
  for (const auto& w : why) s += "  " + w + "\n";
  throw ConfigError(s + "  remove the broken directories or point " + flag + " elsewhere");
}

}  // namespace megazero::checkpoint
