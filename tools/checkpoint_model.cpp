#include "tools/checkpoint_model.h"

#include <algorithm>
#include <optional>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "tools/hf_gpt2.h"

namespace megazero::hf {

using layers::GPTConfig;
using I = std::int64_t;

Tp1Model::Tp1Model(const GPTConfig& cfg, Communicator& self, const std::string& device_spec)
    : device(make_device(device_spec)) {
  MZ_CHECK(self.size() == 1, "the TP 1 model runs on one rank");
  MZ_REQUIRE(device->has_storage(), "--device ", device_spec, ": the meta device holds no weights; use cpu or cuda");
  tp = self.split(0, 0, "convert-tp");
  dp = self.split(0, 0, "convert-dp");
  model = std::make_unique<layers::GPTModel>(cfg, layers::TpContext{tp.get(), device, DType::F32}, params);
  engine = std::make_unique<zero::ZeroEngine>(params, *dp, *tp, device, zero::ZeroConfig{});
}

void Tp1Model::set_master(std::size_t i, const std::vector<float>& values) {
  const I begin = engine->layout().param(i).begin - engine->owned().begin;
  const I n = engine->parameters()[i]->local_numel();
  Tensor host = Tensor::zeros(make_device(DeviceKind::CPU), {n}, DType::F32, MemoryCategory::Workspace);
  std::copy_n(values.begin(), std::min<std::size_t>(values.size(), static_cast<std::size_t>(n)),
              host.host_data<float>());
  engine->owned_state().master.narrow(0, begin, n).copy_from(host);
}

struct CheckpointModel::Impl {
  Communicator* group = nullptr;
  GPTConfig config;
  checkpoint::ChosenCheckpoint chosen;
  std::shared_ptr<Device> device;
  std::unique_ptr<Communicator> tp, dp;
  layers::ParameterSet params;
  std::unique_ptr<layers::GPTModel> model;
  std::unique_ptr<zero::ZeroEngine> engine;
  std::shared_ptr<Device> host = make_device(DeviceKind::CPU);
  // start_cache's, one a slot, and reorder_caches' second set; declared last: their buffers go first.
  std::vector<layers::KvCache> caches, spare;

  // The ids on the model's device, each checked against the vocabulary (--tokens named).
  Tensor upload(const std::vector<I>& tokens) const {
    for (I t : tokens)
      MZ_REQUIRE(t >= 0 && t < config.vocab_size, "--tokens: id ", t, " is outside the vocabulary [0, ",
                 config.vocab_size, ")");
    const I S = static_cast<I>(tokens.size());
    Tensor host_ids = Tensor::empty(host, {S}, DType::I64, MemoryCategory::Activations);
    std::copy(tokens.begin(), tokens.end(), host_ids.host_data<I>());
    Tensor ids = Tensor::empty(device, {S}, DType::I64, MemoryCategory::Activations);
    ids.copy_from(host_ids);
    return ids;
  }
  // Rows [n, this rank's vocabulary columns] (fp32, on the model's device;
  // rank r holds columns [r * cols, (r + 1) * cols) of the padded vocabulary)
  // -> the real vocabulary of each row, on the host of every rank.
  std::vector<float> to_host(const Tensor& rows) const {
    const I n = rows.size(0), cols = rows.size(1), ranks = tp->size();
    Tensor gathered = rows;
    if (ranks > 1) {
      gathered = Tensor::empty(device, {ranks * n, cols}, DType::F32, MemoryCategory::Workspace);
      MZ_CHECK(rows.is_contiguous(), "logits rows must be contiguous");
      tp->all_gather(rows, gathered).wait();
    }
    Tensor host_logits = Tensor::empty(host, gathered.shape(), DType::F32, MemoryCategory::Workspace);
    host_logits.copy_from(gathered);
    const float* h = host_logits.host_data<float>();
    std::vector<float> out(static_cast<std::size_t>(n * config.vocab_size));
    for (I r = 0; r < ranks; ++r) {
      const I first = r * cols, count = std::min(cols, config.vocab_size - first);
      for (I s = 0; s < n && count > 0; ++s)
        std::copy_n(h + (r * n + s) * cols, count, out.begin() + s * config.vocab_size + first);
    }
    return out;
  }
};

CheckpointModel::CheckpointModel(const std::string& load, Communicator& group, I heads, const std::string& device)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.group = &group;
  MZ_REQUIRE(!load.empty(), "--load is required: a pretrain_gpt --save directory or one of its iter_* directories");
  // The newest usable checkpoint, its files verified by the ranks in parallel.
  m.chosen = checkpoint::choose_checkpoint(load, group, "--load");
  const int tp = group.size();
  run_consistently(group, [&] {
    GPTConfig c = model_config_of(m.chosen.manifest, m.chosen.dir, heads);
    // Forward passes of any length up to the positions; sequence length and
    // parallelism do not change the weights.
    c.seq_length = c.max_position_embeddings;
    c.hidden_dropout = c.attention_dropout = 0;
    c.attention_backend = "unfused";
    c.sequence_parallel = false;
    try {
      c.validate(tp);
    } catch (const ConfigError& e) {
      throw ConfigError(detail::concat("the checkpoint's model cannot run on ", tp,
                                       " ranks (tensor parallel): ", e.what(), tp > 1 ? "; start fewer ranks" : ""));
    }
    m.config = c;
    m.device = make_device(device);
    MZ_REQUIRE(m.device->has_storage(), "--device ", device, ": the meta device holds no weights; use cpu or cuda");
  });
  // Every rank in one TP group; each alone in its DP group.
  m.tp = group.split(0, group.rank(), "generate-tp");
  m.dp = group.split(group.rank(), 0, "generate-dp");
  m.model = std::make_unique<layers::GPTModel>(m.config, layers::TpContext{m.tp.get(), m.device, DType::F32}, m.params);
  m.engine = std::make_unique<zero::ZeroEngine>(m.params, *m.dp, *m.tp, m.device, zero::ZeroConfig{});
  // The master weights alone: resharded to this rank's TP shard, the saved
  // vocabulary padding's rows beyond the vocabulary 0.
  checkpoint::LoadOptions weights_only;
  weights_only.optimizer_state = false;
  checkpoint::load_chosen(m.chosen, *m.engine, {&group, group.rank(), tp}, weights_only);
  m.model->set_param_hooks(m.engine.get());
  m.model->keep_logits(true);  // the loss consumes its logits in place
}

CheckpointModel::~CheckpointModel() = default;
const GPTConfig& CheckpointModel::config() const { return impl_->config; }
const std::string& CheckpointModel::checkpoint() const { return impl_->chosen.dir; }
I CheckpointModel::iteration() const { return impl_->chosen.manifest.state.iteration; }
int CheckpointModel::tensor_parallel_size() const { return impl_->tp->size(); }
const std::vector<std::string>& CheckpointModel::rejected() const { return impl_->chosen.rejected; }

std::vector<float> CheckpointModel::logits(const std::vector<I>& tokens, bool last_only) {
  const GPTConfig& c = impl_->config;
  auto& model = *impl_->model;
  const I S = static_cast<I>(tokens.size());
  MZ_REQUIRE(S > 0 && S <= c.max_position_embeddings, "--tokens: give 1 to ", c.max_position_embeddings,
             " token ids (max-position-embeddings), got ", S);
  // Tokens are made on the host and copied to the model's device; the
  // targets (the next token, wrapping) only feed the loss the logits pass through.
  const Tensor ids = impl_->upload(tokens);
  std::vector<I> next(tokens.begin() + 1, tokens.end());
  next.push_back(tokens.front());
  const Tensor targets = impl_->upload(next);
  layers::StepInfo step;
  step.micro_batch = 1;
  step.seq = S;
  step.training = false;
  model.forward(ids, targets, step);
  // [S, vocabulary shard], fp32, on the model's device: the rows wanted, then the real vocabulary of each.
  return impl_->to_host(last_only ? model.logits().narrow(0, S - 1, 1) : model.logits());
}

void CheckpointModel::start_cache(I capacity, I slots) {
  MZ_CHECK(slots >= 1, "start_cache: ", slots, " slots");
  impl_->caches.clear();  // the old buffers go first
  impl_->spare.clear();
  for (I s = 0; s < slots; ++s) impl_->caches.push_back(impl_->model->make_kv_cache(capacity));
}

void CheckpointModel::reorder_caches(const std::vector<I>& parents) {
  auto& caches = impl_->caches;
  MZ_CHECK(parents.size() == caches.size(), "reorder_caches: ", parents.size(), " parents for ", caches.size(),
           " slots");
  bool identity = true;
  for (std::size_t i = 0; i < parents.size(); ++i) {
    MZ_CHECK(parents[i] >= 0 && parents[i] < static_cast<I>(caches.size()), "reorder_caches: parent ", parents[i]);
    identity = identity && parents[i] == static_cast<I>(i);
  }
  if (identity) return;
  // Into the second set (made once, the first reorder's), then the sets swap:
  // a slot may be a parent of several and its own child at once.
  auto& spare = impl_->spare;
  if (spare.empty())
    for (std::size_t i = 0; i < caches.size(); ++i) spare.push_back(impl_->model->make_kv_cache(caches[i].capacity));
  for (std::size_t i = 0; i < parents.size(); ++i) {
    const layers::KvCache& from = caches[static_cast<std::size_t>(parents[i])];
    for (std::size_t l = 0; l < from.keys.size(); ++l) {
      spare[i].keys[l].copy_from(from.keys[l]);
      spare[i].values[l].copy_from(from.values[l]);
    }
    spare[i].length = from.length;
  }
  std::swap(caches, spare);
}

std::vector<float> CheckpointModel::extend(const std::vector<I>& tokens, bool all_rows, I slot) {
  MZ_CHECK(slot >= 0 && slot < static_cast<I>(impl_->caches.size()), "CheckpointModel::extend of slot ", slot, " with ",
           impl_->caches.size(), " caches started");
  auto& cache = impl_->caches[static_cast<std::size_t>(slot)];
  const I T = static_cast<I>(tokens.size());
  MZ_REQUIRE(T > 0 && cache.length + T <= cache.capacity, "--tokens: ", T, " more token ids after ", cache.length,
             " do not fit the ", cache.capacity, " positions of the key/value cache");
  const Tensor logits = impl_->model->decode(impl_->upload(tokens), cache);
  return impl_->to_host(all_rows ? logits : logits.narrow(0, T - 1, 1));
}

I CheckpointModel::rank0_token(I token) { return rank0_values({token}).front(); }

std::vector<I> CheckpointModel::rank0_values(std::vector<I> values) {
  Communicator& group = *impl_->group;
  if (group.size() == 1) return values;
  // The count first (a rank whose choice differed could hold another number of values).
  Tensor n = Tensor::empty(impl_->host, {1}, DType::I64, MemoryCategory::Workspace);
  *n.host_data<I>() = static_cast<I>(values.size());
  group.broadcast(n, 0).wait();
  values.resize(static_cast<std::size_t>(*n.host_data<I>()));
  if (values.empty()) return values;
  Tensor t = Tensor::empty(impl_->host, {static_cast<I>(values.size())}, DType::I64, MemoryCategory::Workspace);
  std::copy(values.begin(), values.end(), t.host_data<I>());
  group.broadcast(t, 0).wait();
  std::copy_n(t.host_data<I>(), values.size(), values.begin());
  return values;
}

std::vector<float> checkpoint_logits(const std::string& load, const std::vector<I>& tokens, Communicator& group,
                                     I heads, const std::string& device) {
  return CheckpointModel(load, group, heads, device).logits(tokens);
}

std::vector<I> parse_token_ids(const std::string& list, const std::string& flag) {
  std::vector<I> ids;
  for (std::size_t b = 0; b <= list.size();) {
    const std::size_t e = std::min(list.find(',', b), list.size());
    try {
      std::size_t used = 0;
      ids.push_back(std::stoll(list.substr(b, e - b), &used));
      if (used != e - b) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw ConfigError(flag + " '" + list + "': '" + list.substr(b, e - b) + "' is not a token id");
    }
    b = e + 1;
  }
  return ids;
}

}  // namespace megazero::hf
