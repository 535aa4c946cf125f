// Forward + backward of a GPT on one rank (or a TP group under mpiexec):
// time per step, tokens/s and achieved GFLOP/s by the model-FLOPs formula
// (Narayanan et al. 2021, eq. 3: 72 B s l h^2 (1 + s/6h + V/16lh) per step
// without recompute, 96 with), against the machine's GEMM peak.
//   bench_gpt [--num-layers 6 --hidden-size 512 --num-attention-heads 8 --seq-length 256
//              --micro-batch-size 8 --vocab-size 50257 --steps 3 --recompute-activations]
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>

#include "layers/gpt_model.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;
using namespace megazero::layers;

namespace {

int run(int argc, char** argv) {
  GPTConfig cfg;
  cfg.num_layers = 6;
  cfg.hidden_size = 512;
  cfg.num_attention_heads = 8;
  cfg.seq_length = 256;
  cfg.max_position_embeddings = 1024;
  std::int64_t micro_batch = 8;
  int steps = 3;
  bool no_bias_gelu_fusion = false;
  std::string epilogues = "none";
  po::options_description d("bench_gpt");
  d.add_options()("num-layers", po::value(&cfg.num_layers))("hidden-size", po::value(&cfg.hidden_size))(
      "num-attention-heads", po::value(&cfg.num_attention_heads))("seq-length", po::value(&cfg.seq_length))(
      "micro-batch-size", po::value(&micro_batch))("vocab-size", po::value(&cfg.vocab_size))(
      "steps", po::value(&steps))("recompute-activations", po::bool_switch(&cfg.recompute_activations))(
      "no-bias-gelu-fusion", po::bool_switch(&no_bias_gelu_fusion))("gemm-epilogues",
                                                                    po::value(&epilogues)->implicit_value("forward"));
  parse_command_line(argc, argv, d, "bench_gpt");
  cfg.bias_gelu_fusion = !no_bias_gelu_fusion;
  cfg.gemm_epilogues = parse_gemm_epilogues(epilogues);
  auto world = MpiCommunicator::world();
  TpContext ctx{world.get(), make_device(DeviceKind::CPU), DType::F32};
  ParameterSet params;
  GPTModel model(cfg, ctx, params);
  params.allocate(ctx.device, DType::F32);
  params.initialize(1);
  StepInfo step;
  step.micro_batch = micro_batch;
  step.seq = cfg.seq_length;
  const std::int64_t n = micro_batch * cfg.seq_length;
  Tensor ids = Tensor::empty(ctx.device, {n}, DType::I64, MemoryCategory::Activations);
  for (std::int64_t i = 0; i < n; ++i) ids.host_data<std::int64_t>()[i] = (i * 7919) % cfg.vocab_size;
  double best = 1e30, loss = 0;
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up
    step.iteration = static_cast<std::uint64_t>(s);
    const auto t0 = std::chrono::steady_clock::now();
    loss = model.forward(ids, ids, step);
    model.backward(1.0);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::min(best, sec);
  }
  const double flops = model.flops_per_token(true) * static_cast<double>(n) / world->size();
  if (world->rank() == 0) {
    std::printf("GPT l=%lld h=%lld heads=%lld s=%lld B=%lld V=%lld TP=%d threads=%d recompute=%d\n",
                static_cast<long long>(cfg.num_layers), static_cast<long long>(cfg.hidden_size),
                static_cast<long long>(cfg.num_attention_heads), static_cast<long long>(cfg.seq_length),
                static_cast<long long>(micro_batch), static_cast<long long>(cfg.vocab_size), world->size(),
                cpu_math_threads(), cfg.recompute_activations ? 1 : 0);
    std::printf(
        "params/rank %lld, loss %.4f, best step %.3f s, %.0f tokens/s, %.1f GFLOP/s per rank, peak "
        "activations %.1f MiB\n",
        static_cast<long long>(params.local_numel()), loss, best, static_cast<double>(n) / best, flops / best / 1e9,
        static_cast<double>(ctx.device->memory().peak(MemoryCategory::Activations)) / 1048576.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("bench_gpt", argc, argv, run); }
