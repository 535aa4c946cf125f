// Step time and peak memory per rank of ZeRO stages 0-3 on a small GPT.
//   mpiexec -n 4 bench_zero --zero-stage 2 [--tensor-model-parallel-size 1] [--bf16]
//       [--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128
//        --micro-batch-size 4 --steps 4 --reduce-bucket-size 1000000]
// Prints the median step time (after one warm-up step) and, per memory
// category, the peak bytes (max over ranks).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "layers/gpt_model.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"
#include "megazero/train/train_step.h"

namespace po = boost::program_options;
using namespace megazero;

namespace {

int run(int argc, char** argv) {
  layers::GPTConfig cfg;
  cfg.num_layers = 4;
  cfg.hidden_size = 256;
  cfg.num_attention_heads = 8;
  cfg.seq_length = 128;
  cfg.max_position_embeddings = 128;
  cfg.vocab_size = 8192;
  std::int64_t micro_batch = 4, bucket = 1000000;
  int steps = 4, tp_size = 1, stage = 0;
  bool bf16 = false, prefetch = true, overlap_param_gather = true;
  po::options_description d("bench_zero");
  d.add_options()("zero-stage", po::value(&stage))("tensor-model-parallel-size", po::value(&tp_size))(
      "bf16", po::bool_switch(&bf16))("num-layers", po::value(&cfg.num_layers))(
      "hidden-size", po::value(&cfg.hidden_size))("num-attention-heads", po::value(&cfg.num_attention_heads))(
      "seq-length", po::value(&cfg.seq_length))("vocab-size", po::value(&cfg.vocab_size))(
      "micro-batch-size", po::value(&micro_batch))("steps", po::value(&steps))(
      "reduce-bucket-size", po::value(&bucket))("prefetch", po::value(&prefetch),
                                                "stage 3: prefetch the next group (true/false)")(
      "overlap-param-gather", po::value(&overlap_param_gather),
      "stages 1-2: the parameter all-gather waited for by the next forward (true/false)");
  parse_command_line(argc, argv, d, "bench_zero");
  cfg.max_position_embeddings = cfg.seq_length;
  auto world = MpiCommunicator::world();
  MZ_REQUIRE(world->size() % tp_size == 0, "--tensor-model-parallel-size must divide the world");
  const int me = world->rank();
  auto tp = world->split(me / tp_size, me % tp_size, "tp");
  auto dp = world->split(me % tp_size, me / tp_size, "dp");
  auto dev = make_device(DeviceKind::CPU);
  const DType dtype = bf16 ? DType::BF16 : DType::F32;
  layers::ParameterSet params;
  layers::GPTModel model(cfg, layers::TpContext{tp.get(), dev, dtype}, params);
  zero::ZeroConfig zc;
  zc.stage = stage;
  zc.param_dtype = dtype;
  zc.reduce_bucket_size = bucket;
  zc.prefetch = prefetch;
  zc.overlap_param_gather = overlap_param_gather;
  zero::ZeroEngine engine(params, *dp, *tp, dev, zc);
  engine.initialize(1);
  train::OptimizerSettings opt;
  opt.lr.max_lr = 1e-4;
  opt.lr.decay_iters = steps + 1;
  optim::LossScaler scaler(optim::LossScalerConfig{});
  const std::int64_t n = micro_batch * cfg.seq_length;
  train::MicroBatch mb;
  mb.ids = Tensor::empty(dev, {n}, DType::I64, MemoryCategory::Activations);
  mb.targets = Tensor::empty(dev, {n}, DType::I64, MemoryCategory::Activations);
  for (std::int64_t i = 0; i < n; ++i) {
    mb.ids.host_data<std::int64_t>()[i] = (i * 7919 + me) % cfg.vocab_size;
    mb.targets.host_data<std::int64_t>()[i] = (i * 104729 + me) % cfg.vocab_size;
  }
  mb.step.micro_batch = micro_batch;
  mb.step.seq = cfg.seq_length;
  mb.step.sample_offset = dp->rank() * micro_batch;
  std::vector<double> times, exposed;
  double loss = 0;
  for (int s = 0; s <= steps; ++s) {
    mb.step.iteration = static_cast<std::uint64_t>(s);
    world->barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = train::train_step(model, engine, *dp, {mb}, opt, scaler, s);
    loss = r.loss;
    if (s > 0) {
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      exposed.push_back(r.exposed_comm_s);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(exposed.begin(), exposed.end());
  // Peak bytes per category, max over ranks.
  const auto snap = dev->memory().snapshot();
  Tensor peaks = Tensor::empty(make_device(DeviceKind::CPU), {static_cast<std::int64_t>(kNumMemoryCategories) + 1},
                               DType::I64, MemoryCategory::Workspace);
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    peaks.host_data<std::int64_t>()[c] = snap.by_category[c].peak_bytes;
  peaks.host_data<std::int64_t>()[kNumMemoryCategories] = snap.total_peak_bytes;
  world->all_reduce(peaks, ReduceOp::Max).wait();
  if (me == 0) {
    std::printf(
        "stage %d TP %d DP %d %s params/rank %lld: median step %.3f s (exposed DP comm %.3f s on rank 0), loss "
        "%.4f, peak MiB (max over ranks):",
        stage, tp_size, dp->size(), bf16 ? "bf16" : "fp32", static_cast<long long>(params.local_numel()),
        times[times.size() / 2], exposed[exposed.size() / 2], loss);
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
      const auto v = peaks.host_data<std::int64_t>()[c];
      if (v)
        std::printf(" %s %.2f", std::string(memory_category_name(static_cast<MemoryCategory>(c))).c_str(),
                    static_cast<double>(v) / 1048576.0);
    }
    std::printf(" | total %.2f\n",
                static_cast<double>(peaks.host_data<std::int64_t>()[kNumMemoryCategories]) / 1048576.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("bench_zero", argc, argv, run); }
