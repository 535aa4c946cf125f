// One transformer layer, forward + backward, as one rank of a TP group holds
// it: the layer is built for rank 0 of a virtual TP group of the given size,
// so it has exactly that rank's slice (heads / TP, ffn / TP) while the TP
// all-reduces move nothing (compute only: what one GPU of a TP-16 node does
// between its collectives). The paper's 100B layer on one of its 16 GPUs:
//   bench_layer --device cuda --hidden-size 8192 --num-attention-heads 64
//       --tensor-model-parallel-size 16 --seq-length 1024 --micro-batch-size 32 --dtype bf16
// FLOPs (Megatron's count, full S^2 attention): fwd+bwd = 3 x (24 B S h^2 + 4 B S^2 h) / TP.
// Prints the median step time, TFLOP/s and MFU against --peak-tflops, and a JSON line.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "megazero/kernels/gemm.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/kernels/linear_epilogues.h"
#include "layers/transformer_layer.h"
#include "megazero/comm/virtual_communicator.h"
#include "megazero/core/error.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;
using namespace megazero::layers;

namespace {

int run(int argc, char** argv) {
  GPTConfig cfg;
  cfg.num_layers = 1;
  cfg.hidden_size = 8192;
  cfg.num_attention_heads = 64;
  cfg.seq_length = 1024;
  cfg.max_position_embeddings = 1024;
  std::int64_t micro_batch = 32;
  int tp_size = 16, steps = 10, warmup = 2;
  std::string device_spec = "cuda", dtype_name_arg = "bf16";
  double dropout = 0.1, peak_tflops = 989.0;
  bool no_bias_gelu_fusion = false, profile = false, autotune = false;
  std::string epilogues = "none";
  po::options_description d("bench_layer");
  d.add_options()("hidden-size", po::value(&cfg.hidden_size))(
      "num-attention-heads", po::value(&cfg.num_attention_heads))("ffn-hidden-size", po::value(&cfg.ffn_hidden_size))(
      "tensor-model-parallel-size", po::value(&tp_size))("seq-length", po::value(&cfg.seq_length))(
      "micro-batch-size", po::value(&micro_batch))("dtype", po::value(&dtype_name_arg), "fp32, bf16 or fp16")(
      "device", po::value(&device_spec), "cpu or cuda[:N]")("dropout", po::value(&dropout))(
      "recompute-activations", po::bool_switch(&cfg.recompute_activations))("steps", po::value(&steps))(
      "warmup", po::value(&warmup))("profile", po::bool_switch(&profile),
                                    "trace the timed steps' kernels (CUPTI; cuda) and print where the time went")(
      "peak-tflops", po::value(&peak_tflops), "the device's dense peak for MFU")(
      "attention-backend", po::value(&cfg.attention_backend), "unfused, fused or cudnn (CUDA only)")(
      "deterministic-mode", po::bool_switch(&cfg.deterministic), "cudnn: cuDNN's deterministic backward")(
      "no-bias-gelu-fusion", po::bool_switch(&no_bias_gelu_fusion), "GeLU and fc1's bias in separate passes")(
      "gemm-epilogues", po::value(&epilogues)->implicit_value("forward"),
      "none, forward (bias, bias + GeLU in the GEMMs) or all (also the bias gradients): pretrain_gpt's flag")(
      "gemm-autotune", po::bool_switch(&autotune),
      "time cuBLASLt's algorithms for each GEMM problem in the warm-up and keep the fastest (cuda; "
      "pretrain_gpt's flag); prints what it kept");
  parse_command_line(argc, argv, d, "bench_layer");
  cfg.bias_gelu_fusion = !no_bias_gelu_fusion;
  cfg.gemm_epilogues = parse_gemm_epilogues(epilogues);
  const DType dt = dtype_name_arg == "fp32" ? DType::F32 : dtype_name_arg == "bf16" ? DType::BF16 : DType::F16;
  MZ_REQUIRE(dtype_name_arg == "fp32" || dtype_name_arg == "bf16" || dtype_name_arg == "fp16",
             "--dtype must be fp32, bf16 or fp16, got '", dtype_name_arg, "'");
  MZ_REQUIRE(steps > 0, "--steps must be positive");
  MZ_REQUIRE(!profile || device_spec.rfind("cuda", 0) == 0,
             "--profile traces the GPU's kernels (CUPTI): it needs --device cuda, got --device ", device_spec);
  MZ_REQUIRE(!autotune || device_spec.rfind("cuda", 0) == 0,
             "--gemm-autotune times cuBLASLt's algorithms: it needs --device cuda, got --device ", device_spec);
  MZ_REQUIRE(!(autotune && cfg.deterministic), "--gemm-autotune and --deterministic-mode: drop one of the two");
  MZ_REQUIRE(warmup > 0 || !autotune, "--gemm-autotune times in the first step: give it --warmup 1 or more");
  set_gemm_autotune(autotune);
  cfg.max_position_embeddings = cfg.seq_length;
  cfg.hidden_dropout = cfg.attention_dropout = dropout;
  cfg.validate(tp_size);
  auto device = make_device(device_spec);
  if (cfg.cudnn_attention()) {  // the kernels' host reference is for tests, not for timing
    const std::string why = kernels::cudnn_attention_unsupported(device->kind(), dt, cfg.head_dim());
    MZ_REQUIRE(why.empty(), why);
  }
  VirtualCommunicator tp(0, tp_size, "tp");
  TpContext ctx{&tp, device, dt};
  ctx.gemm_epilogues = cfg.gemm_epilogues;
  ParameterSet params;
  TransformerLayer layer(params, cfg, 0, ctx);
  params.allocate(device, dt);
  params.initialize(1);
  const std::int64_t B = micro_batch, S = cfg.seq_length, h = cfg.hidden_size;
  Tensor x = Tensor::empty(device, {B * S, h}, dt, MemoryCategory::Activations);
  Tensor dy = Tensor::empty(device, {B * S, h}, dt, MemoryCategory::Activations);
  // Random inputs made in fp32 on the host (a few seconds for the 100B
  // layer's 268M elements), cast on the way to the device.
  auto fill = [&](Tensor& t, double sd, std::uint64_t seed) {
    Tensor host = Tensor::empty(make_device(DeviceKind::CPU), t.shape(), DType::F32, MemoryCategory::Other);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, static_cast<float>(sd));
    float* p = host.host_data<float>();
    for (std::int64_t i = 0; i < host.numel(); ++i) p[i] = nd(rng);
    t.copy_from(host);
  };
  fill(x, 1.0, 7);
  fill(dy, 1e-3, 8);
  StepInfo step;
  step.micro_batch = B;
  step.seq = S;
  std::vector<double> ms;  // in the order run (printed so: a trend in it shows clocks, not kernels)
  for (int s = 0; s < warmup + steps; ++s) {
    step.iteration = static_cast<std::uint64_t>(s);
    // Before each step, outside the timed span (and the trace), as a training
    // step clears its gradients and torch_layer.py sets them to None: the
    // weight-gradient GEMMs then write (beta 0) rather than add, as theirs do.
    params.zero_grad();
    if (profile && s == warmup) device->start_kernel_trace();  // the timed steps only
    device->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor y = layer.forward(x, step);
    Tensor dx = layer.backward(dy);
    device->synchronize();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) ms.push_back(sec * 1e3);
  }
  std::string in_order;
  for (double t : ms) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.3f", in_order.empty() ? "" : " ", t);
    in_order += buf;
  }
  std::sort(ms.begin(), ms.end());
  // statistics.median's median (torch_layer.py's): the mean of the middle two of an even count.
  const std::size_t mid = ms.size() / 2;
  const double med = ms.size() % 2 == 1 ? ms[mid] : 0.5 * (ms[mid - 1] + ms[mid]);
  const double Bd = static_cast<double>(B), Sd = static_cast<double>(S), hd = static_cast<double>(h);
  const double ffn_ratio = static_cast<double>(cfg.ffn()) / hd;  // 4 for GPT
  // fwd GEMMs: QKV 6BSh^2, scores+context 4BS^2h, dense 2BSh^2, MLP 4*ffn_ratio*BSh^2; bwd twice fwd.
  const double fwd = (8.0 + 4.0 * ffn_ratio) * Bd * Sd * hd * hd + 4.0 * Bd * Sd * Sd * hd;
  const double flops = 3.0 * fwd / tp_size;
  const double tflops = flops / (med * 1e-3) / 1e12;
  // The JSON's "attention" names the variant (peer_ratios' row): "+epilogues"
  // with --gemm-epilogues (forward), "+epilogues-all" with --gemm-epilogues=all.
  // "+autotune" with --gemm-autotune.
  const std::string variant = cfg.attention_backend +
                              (backward_epilogues(cfg.gemm_epilogues)  ? "+epilogues-all"
                               : forward_epilogues(cfg.gemm_epilogues) ? "+epilogues"
                                                                       : "") +
                              (autotune ? "+autotune" : "");
  if (forward_epilogues(cfg.gemm_epilogues)) std::printf("%s\n", kernels::linear_epilogues_report(*device).c_str());
  if (autotune) std::printf("%s\n", gemm_autotune_report(true).c_str());
  std::printf(
      "layer h=%lld heads=%lld/%d ffn=%lld/%d S=%lld B=%lld %s on %s, dropout %.2f, recompute %d, attention %s\n",
      static_cast<long long>(h), static_cast<long long>(cfg.num_attention_heads), tp_size,
      static_cast<long long>(cfg.ffn()), tp_size, static_cast<long long>(S), static_cast<long long>(B),
      dtype_name_arg.c_str(), device->name().c_str(), dropout, cfg.recompute_activations ? 1 : 0, variant.c_str());
  std::printf(
      "median %.3f ms (min %.3f, max %.3f over %d steps), %.1f TFLOP/s, MFU %.1f%% of %.0f, peak "
      "activations %.0f MiB\n",
      med, ms.front(), ms.back(), steps, tflops, 100.0 * tflops / peak_tflops, peak_tflops,
      static_cast<double>(device->memory().peak(MemoryCategory::Activations)) / 1048576.0);
  std::printf("steps in order (ms): %s\n", in_order.c_str());
  if (profile)
    std::printf("%s", format_summary(summarize(device->stop_kernel_trace()),
                                     detail::concat("the timed steps (", steps, ")"), 40)
                          .c_str());
  std::printf(
      "{\"bench\": \"layer\", \"impl\": \"megazero\", \"attention\": \"%s\", \"dtype\": \"%s\", "
      "\"ms\": %.4f, \"tflops\": %.2f, \"mfu\": %.4f}\n",
      variant.c_str(), dtype_name_arg.c_str(), med, tflops, tflops / peak_tflops);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("bench_layer", argc, argv, run); }
