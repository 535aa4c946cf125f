#include "zero_harness.h"

#include "deferred_communicator.h"

#include "megazero/comm/consensus.h"
#include "test_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "megazero/core/error.h"

namespace megazero::testing_util {

namespace {
std::unique_ptr<MpiCommunicator> g_world;
class WorldTeardown : public testing::Environment {
 public:
  void TearDown() override { g_world.reset(); }
};
const auto* const g_teardown = testing::AddGlobalTestEnvironment(new WorldTeardown);
}  // namespace

MpiCommunicator& test_world() {
  if (!g_world) g_world = MpiCommunicator::world();
  return *g_world;
}

std::string shared_temp_dir(const std::string& prefix) {
  std::string d;
  if (test_world().rank() == 0) {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    d = ::mkdtemp(tmpl.data());
  }
  return broadcast_string(test_world(), d);
}

layers::GPTConfig zero_test_model(bool recompute, std::int64_t hidden, bool llama) {
  layers::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = hidden;
  c.num_attention_heads = 4;
  c.vocab_size = 97;
  c.max_position_embeddings = 16;
  c.seq_length = 8;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  c.make_vocab_size_divisible_by = 4;
  c.recompute_activations = recompute;
  if (llama) {
    c.num_attention_heads = 8;
    c.num_query_groups = 4;
    c.position_embedding_type = "rope";
    c.normalization = "RMSNorm";
    c.swiglu = true;
    c.ffn_hidden_size = 32;
    c.add_bias_linear = false;
    c.untie_embeddings = true;
  }
  return c;
}

ZeroRun::ZeroRun(Communicator& world, const ZeroRunSpec& s) : spec(s) {
  const int me = world.rank();
  tp = world.split(me / s.tp, me % s.tp, "tp");
  dp = world.split(me % s.tp, me / s.tp, "dp");
  if (s.deferred_dp) dp = std::make_unique<DeferredCommunicator>(std::move(dp));
  device = test_support::test_device();
  params = std::make_unique<layers::ParameterSet>();
  layers::TpContext ctx{tp.get(), device, s.dtype};
  layers::GPTConfig cfg = zero_test_model(s.recompute, s.hidden, s.llama);
  cfg.sequence_parallel = s.sequence_parallel;
  cfg.recompute_num_layers = s.recompute_first_layers;
  cfg.recompute_chunk = s.recompute_chunk;
  model = std::make_unique<layers::GPTModel>(cfg, ctx, *params);
  zero::ZeroConfig zc;
  zc.stage = s.stage;
  zc.param_dtype = s.dtype;
  zc.reduce_bucket_size = s.bucket;
  zc.overlap_comm = s.overlap;
  zc.prefetch = s.prefetch;
  zc.overlap_param_gather = s.overlap_param_gather;
  zc.overlap_optimizer = s.overlap_optimizer;
  zc.offload_optimizer = s.offload_optimizer;
  zc.offload_params = s.offload_params;
  zc.contiguous_gradients = s.zero_r.contiguous_memory;
  host = device->host_device();
  engine = std::make_unique<zero::ZeroEngine>(*params, *dp, *tp, device, zc, host);
  engine->initialize(77);
  if (s.zero_r.any()) {
    zero::ZeroRConfig zr = s.zero_r;
    zr.inputs_split_across_tp = s.sequence_parallel && s.tp > 1;
    checkpoints = std::make_unique<zero::PartitionedCheckpoints>(zr, *tp, device, host,
                                                                 static_cast<int>(model->config().checkpoint_slots()));
    model->set_checkpoint_store(checkpoints.get());
    checkpoints->reserve(s.micro_batch * model->config().seq_length * model->config().hidden_size /
                             (zr.inputs_split_across_tp ? s.tp : 1),
                         s.dtype);
  }
  optim::LossScalerConfig scaler_cfg;
  scaler_cfg.dynamic = s.dtype == DType::F16;  // fp16 needs loss scaling; bf16/fp32 do not
  scaler_cfg.initial_scale = 1024;
  scaler = std::make_unique<optim::LossScaler>(scaler_cfg);
}

ZeroRun::~ZeroRun() {
  engine.reset();
  model.reset();
  checkpoints.reset();
}

std::vector<double> ZeroRun::train(int first, int count) {
  const auto cfg = model->config();
  const std::int64_t S = cfg.seq_length, per_rank = spec.global_batch / spec.dp;
  // At large DP a rank may hold fewer samples than the requested micro-batch.
  spec.micro_batch = std::min(spec.micro_batch, per_rank);
  MZ_CHECK(per_rank > 0 && per_rank % spec.micro_batch == 0, "test batch arithmetic");
  train::OptimizerSettings opt;
  opt.lr.max_lr = 3e-3;
  opt.lr.min_lr = 3e-4;
  opt.lr.warmup_iters = 1;
  opt.lr.decay_iters = spec.steps;
  opt.clip_grad = 0.5;  // small enough to clip on some steps
  std::vector<double> losses;
  const int last = count < 0 ? spec.steps : first + count;
  for (int it = first; it < last; ++it) {
    std::vector<train::MicroBatch> mbs;
    for (std::int64_t m = 0; m < per_rank / spec.micro_batch; ++m) {
      train::MicroBatch mb;
      mb.step.iteration = static_cast<std::uint64_t>(it);
      mb.step.micro_batch = spec.micro_batch;
      mb.step.seq = S;
      mb.step.sample_offset = dp->rank() * per_rank + m * spec.micro_batch;
      const std::int64_t n = spec.micro_batch * S;
      // Token t of a sample is (sample * 131 + t^2 * 7 + t * 29) mod V; targets are the inputs shifted by one.
      const auto token = [&](std::int64_t i, std::int64_t shift) {
        const std::int64_t sample = it * spec.global_batch + mb.step.sample_offset + i / S, t = i % S + shift;
        return (sample * 131 + t * t * 7 + t * 29) % cfg.vocab_size;
      };
      mb.ids = test_support::int64_tensor(device, n, [&](std::int64_t i) { return token(i, 0); });
      mb.targets = test_support::int64_tensor(device, n, [&](std::int64_t i) { return token(i, 1); });
      mbs.push_back(std::move(mb));
    }
    results.push_back(train::train_step(*model, *engine, *dp, mbs, opt, *scaler, it));
    losses.push_back(results.back().loss);
  }
  return losses;
}

void ZeroRun::for_each_owned(const std::function<void(const layers::Parameter&, std::int64_t, double)>& fn) const {
  const auto m = engine->master().to_double_vector();
  const auto owned = engine->owned();
  const auto all = params->all();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto r = engine->layout().param(i).intersect(owned);
    for (std::int64_t f = r.begin; f < r.end; ++f)
      fn(*all[i], all[i]->global_index(f - engine->layout().param(i).begin),
         m[static_cast<std::size_t>(f - owned.begin)]);
  }
}

double ZeroRun::master_at(const std::string& name, std::int64_t global_index) const {
  // Reference runs are TP = 1, DP = 1, stage 0: local index = global index.
  const auto all = params->all();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->name == name) {
      const auto f = engine->layout().param(i).begin + global_index;
      return engine->master().flatten().narrow(0, f - engine->owned().begin, 1).to_double_vector()[0];
    }
  throw InternalError("no parameter " + name);
}

}  // namespace megazero::testing_util
