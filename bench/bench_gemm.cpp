// GEMM throughput on this CPU: megazero's gemm() against the libraries called
// directly — oneDNN with the primitive created once and reused (its best case)
// and OpenBLAS sgemm (Debian's OpenBLAS is built without its bf16 sbgemm). Best of --reps timed runs after a warm-up.
//   bench_gemm [--threads 1,2] [--sizes 512,1024,2048] [--reps 5]
#include <cblas.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>

#include "megazero/kernels/cpu_threads.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/openblas_core.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;

namespace {

// "1,2,4" -> {1, 2, 4}: positive whole numbers, or a ConfigError naming `flag`.
std::vector<int> parse_list(const std::string& s, const char* flag) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    int x = 0;
    try {
      x = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MZ_REQUIRE(used == item.size() && !item.empty() && x > 0, flag,
               " takes a comma list of positive whole numbers, got '", s, "'");
    v.push_back(x);
  }
  MZ_REQUIRE(!v.empty(), flag, " is empty");
  return v;
}

double best_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: primitive creation, page faults
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// oneDNN matmul with the primitive built once: the library's own best case.
std::function<void()> onednn_direct(const Tensor& a, const Tensor& b, Tensor& c) {
  using dt = dnnl::memory::data_type;
  auto to = [](DType t) { return t == DType::F32 ? dt::f32 : t == DType::BF16 ? dt::bf16 : dt::f16; };
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const auto m = a.size(0), k = a.size(1), n = b.size(1);
  dnnl::memory::desc a_md({m, k}, to(a.dtype()), dnnl::memory::format_tag::ab);
  dnnl::memory::desc b_md({k, n}, to(b.dtype()), dnnl::memory::format_tag::ab);
  dnnl::memory::desc c_md({m, n}, to(c.dtype()), dnnl::memory::format_tag::ab);
  auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  auto prim = std::make_shared<dnnl::matmul>(pd);
  auto args = std::make_shared<std::unordered_map<int, dnnl::memory>>(
      std::unordered_map<int, dnnl::memory>{{DNNL_ARG_SRC, dnnl::memory(a_md, eng, a.data())},
                                            {DNNL_ARG_WEIGHTS, dnnl::memory(b_md, eng, b.data())},
                                            {DNNL_ARG_DST, dnnl::memory(c_md, eng, c.data())}});
  return [prim, args] {
    dnnl::stream s(eng);
    prim->execute(s, *args);
    s.wait();
  };
}

}  // namespace

int run(int argc, char** argv) {
  std::string threads_s = "1,2", sizes_s = "512,1024,2048";
  int reps = 5;
  po::options_description d("bench_gemm");
  d.add_options()("threads", po::value(&threads_s), "comma list of math thread counts")(
      "sizes", po::value(&sizes_s), "comma list of square sizes M=N=K")("reps", po::value(&reps), "timed runs");
  parse_command_line(argc, argv, d, "bench_gemm");
  MZ_REQUIRE(reps > 0, "--reps must be positive, got ", reps);

  auto cpu = make_device(DeviceKind::CPU);
  std::printf("%-8s %-6s %-5s %-22s %10s\n", "threads", "size", "dtype", "implementation", "GFLOP/s");
  for (int threads : parse_list(threads_s, "--threads")) {
    set_cpu_math_threads(threads);
    for (int size : parse_list(sizes_s, "--sizes")) {
      const std::int64_t n = size;
      const double flops = 2.0 * static_cast<double>(n * n * n);
      for (DType t : {DType::F32, DType::BF16, DType::F16}) {
        Tensor a = Tensor::empty(cpu, {n, n}, t, MemoryCategory::Other);
        Tensor b = Tensor::empty(cpu, {n, n}, t, MemoryCategory::Other);
        a.copy_from(Tensor::zeros(cpu, {n, n}, DType::F32, MemoryCategory::Other));
        b.copy_from(a);
        Tensor c = Tensor::zeros(cpu, {n, n}, DType::F32, MemoryCategory::Other);
        auto report = [&](const char* impl, double s) {
          std::printf("%-8d %-6d %-5s %-22s %10.1f\n", threads, size, std::string(dtype_name(t)).c_str(), impl,
                      flops / s / 1e9);
        };
        report("megazero gemm()", best_seconds(reps, [&] { gemm(a, false, b, false, c); }));
        if (t != DType::F16 || cpu_gemm_path(DType::F16, DType::F32) == "onednn") {
          try {
            report("oneDNN direct", best_seconds(reps, onednn_direct(a, b, c)));
          } catch (const dnnl::error&) {
            std::printf("%-8d %-6d %-5s %-22s %10s\n", threads, size, std::string(dtype_name(t)).c_str(),
                        "oneDNN direct", "n/a");
          }
        }
        const auto bi = static_cast<blasint>(n);
        if (t == DType::F32) {
          report("OpenBLAS sgemm", best_seconds(reps, [&] {
                   cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi, bi, bi, 1.f, a.host_data<float>(), bi,
                               b.host_data<float>(), bi, 0.f, c.host_data<float>(), bi);
                 }));
        }
      }
    }
  }
  std::printf("path: bf16 %s, fp16 %s\n", cpu_gemm_path(DType::BF16, DType::F32).c_str(),
              cpu_gemm_path(DType::F16, DType::F32).c_str());
  const OpenBlasCore& core = openblas_core();
  std::printf("OpenBLAS kernels: %s (chosen at load: %s)%s%s\n", core.used.c_str(), core.loaded.c_str(),
              core.note.empty() ? "" : "; ", core.note.c_str());
  return 0;
}

int main(int argc, char** argv) { return run_main("bench_gemm", argc, argv, run); }
