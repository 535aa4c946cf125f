// pretrain_gpt --profile without a GPU: the trace summary (core/kernel_trace.h)
// on made-up records whose union, gaps and rows are worked out by hand, and
// the trainer's IterationProfile (trainer/kernel_profile.h) over a CPU device
// that hands out such a trace, so the window, the ranks, an early stop, the
// CSV file and a tracer that fails are all checked here; the CUPTI recorder
// itself runs on a GPU (test_cuda's KernelTraceRecordsTheQueuedKernels).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megazero/core/device.h"
#include "megazero/core/error.h"
#include "megazero/core/kernel_trace.h"
#include "megazero/train/arguments.h"
#include "megazero/trainer/kernel_profile.h"

namespace fs = std::filesystem;
using namespace megazero;
using namespace megazero::train;

namespace {

// A kernel's library as the CUDA recorder sets it: from the full name.
TraceRecord rec(const std::string& name, std::uint64_t a, std::uint64_t b, TraceKind k = TraceKind::Kernel) {
  return {name, k, a, b, k == TraceKind::Kernel ? kernel_library(name) : ""};
}

TEST(KernelTrace, KernelsAreTheirLibrarysByName) {
  EXPECT_EQ(kernel_library("void megazero::cuda::detail_k::layernorm_backward_fused_kernel<__nv_bfloat16, 2>(x)"),
            "megazero");
  EXPECT_EQ(kernel_library("void megazero::cuda::(anonymous namespace)::row_copy_kernel<float>(float const*)"),
            "megazero");
  EXPECT_EQ(kernel_library("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"), "cuBLAS");
  EXPECT_EQ(kernel_library("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn>"),
            "cuBLAS");
  EXPECT_EQ(kernel_library("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7"), "cuDNN");
  EXPECT_EQ(kernel_library("void cudnn::compute_dot_do_o_specialized<1, 64>(...)"), "cuDNN");
  EXPECT_EQ(kernel_library("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"), "NCCL");
  EXPECT_EQ(kernel_library("void cub::CUB_300001_SM_900::detail::radix_sort::DeviceRadixSortOnesweepKernel<>"), "CUB");
  EXPECT_EQ(kernel_library("some_kernel"), "other");
}

TEST(KernelTrace, BusyTimeIsTheUnionAndGapsAreBinnedByLength) {
  KernelTrace t;
  t.window_start_ns = 1000;
  t.window_end_ns = 101000;  // 100 us
  t.records = {
      rec("gemm", 1500, 21500),                         // idle 500 ns before it (bin 0)
      rec("gemm", 21500, 41500),                        // back to back: no gap
      rec("copy HtoD", 30000, 45000, TraceKind::Copy),  // overlaps: union to 45000
      rec("ln", 48000, 50000),                          // idle 3 us (bin 1)
      rec("ln", 49000, 49500),                          // inside the previous one
      rec("small", 51500, 52000),                       // idle 1.5 us (bin 0: under 2 us)
      rec("tail", 70000, 100000),                       // idle 18 us (bin 2), then 500 ns to the next (bin 0)
      rec("before", 0, 900),                            // wholly before the window: left out
      rec("clipped", 100500, 200000),                   // clipped to [100500, 101000)
  };
  const KernelTraceSummary s = summarize(t);
  EXPECT_EQ(s.window_ns, 100000u);
  // Union: [1500,45000) + [48000,50000) + [51500,52000) + [70000,100000) + [100500,101000).
  EXPECT_EQ(s.busy_ns, 43500u + 2000u + 500u + 30000u + 500u);
  EXPECT_EQ(s.kernels, 7);
  EXPECT_EQ(s.copies, 1);
  EXPECT_EQ(s.kernel_ns, 20000u + 20000u + 2000u + 500u + 500u + 30000u + 500u);
  EXPECT_EQ(s.gaps[0], 3);  // 500 ns at the start, 1.5 us before small, 500 ns between tail and clipped
  EXPECT_EQ(s.gap_ns[0], 2500u);
  EXPECT_EQ(s.gaps[1], 1);
  EXPECT_EQ(s.gap_ns[1], 3000u);
  EXPECT_EQ(s.gaps[2], 1);
  EXPECT_EQ(s.gap_ns[2], 18000u);
  EXPECT_EQ(s.busy_ns + s.gap_ns[0] + s.gap_ns[1] + s.gap_ns[2], s.window_ns);
  // Each gap with where it fell and between which records: longest first,
  // ties in window order; the record before a gap is the one whose end began
  // it (the copy that overlapped the gemms, not the gemm; not the "ln" inside
  // the other).
  const auto gap = [](std::uint64_t ns, std::uint64_t at, const char* after, const char* before) {
    return TraceGap{ns, at, after, before};
  };
  const std::vector<TraceGap> want = {gap(18000, 51000, "small", "tail"), gap(3000, 44000, "copy HtoD (copy)", "ln"),
                                      gap(1500, 49000, "ln", "small"), gap(500, 0, "(window start)", "gemm"),
                                      gap(500, 99000, "tail", "clipped")};
  ASSERT_EQ(s.longest_gaps.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(s.longest_gaps[i].ns, want[i].ns);
    EXPECT_EQ(s.longest_gaps[i].at_ns, want[i].at_ns);
    EXPECT_EQ(s.longest_gaps[i].after, want[i].after);
    EXPECT_EQ(s.longest_gaps[i].before, want[i].before);
  }
  // Only the one over 10 us is printed.
  const std::string text = format_summary(s, "w");
  EXPECT_NE(text.find("longest gaps"), std::string::npos) << text;
  EXPECT_NE(text.find("0.018 at    0.051: small -> tail"), std::string::npos) << text;
  EXPECT_EQ(text.find("-> ln"), std::string::npos) << text;
  ASSERT_EQ(s.rows.size(), 6u);
  EXPECT_EQ(s.rows[0].name, "gemm");
  EXPECT_EQ(s.rows[0].calls, 2);
  EXPECT_EQ(s.rows[0].total_ns, 40000u);
  EXPECT_EQ(s.rows[1].name, "tail");
  EXPECT_EQ(s.rows[2].name, "copy HtoD");
  EXPECT_EQ(s.rows[2].kind, TraceKind::Copy);
  EXPECT_EQ(s.rows[3].name, "ln");
  EXPECT_EQ(s.rows[3].calls, 2);
  EXPECT_EQ(s.rows[4].name, "clipped");  // 500 ns each: by name
  EXPECT_EQ(s.rows[4].total_ns, 500u);
  EXPECT_EQ(s.rows[5].name, "small");
  // By library: the "gemm" kernels are cuBLAS's (40 us), the rest other (33.5 us), then the copy.
  using Lib = std::pair<std::string, std::uint64_t>;
  EXPECT_EQ(s.by_library, (std::vector<Lib>{{"cuBLAS", 40000u}, {"other", 33500u}, {"copies", 15000u}}));
}

TEST(KernelTrace, AnEmptyWindowIsAllIdle) {
  KernelTrace t;
  t.window_start_ns = 5;
  t.window_end_ns = 15005;
  const KernelTraceSummary s = summarize(t);
  EXPECT_EQ(s.busy_ns, 0u);
  EXPECT_EQ(s.gaps[2], 1);
  EXPECT_EQ(s.gap_ns[2], 15000u);
  EXPECT_TRUE(s.rows.empty());
  ASSERT_EQ(s.longest_gaps.size(), 1u);
  EXPECT_EQ(s.longest_gaps[0].after, "(window start)");
  EXPECT_EQ(s.longest_gaps[0].before, "(window end)");
  const std::string text = format_summary(s, "empty");
  EXPECT_NE(text.find("busy 0.0% of 0.015 ms"), std::string::npos);
  EXPECT_NE(text.find("0.015 at    0.000: (window start) -> (window end)"), std::string::npos) << text;
}

// Only the kLongestGaps longest are kept, longest first, however many there are.
TEST(KernelTrace, TheLongestGapsAreKeptInOrder) {
  KernelTrace t;
  t.window_start_ns = 0;
  std::uint64_t at = 0;
  std::vector<std::uint64_t> lengths;
  for (int i = 0; i < 25; ++i) {
    const std::uint64_t gap = 1000 + static_cast<std::uint64_t>((i * 7) % 25) * 1000;  // 1-25 us, each once
    lengths.push_back(gap);
    at += gap;
    std::string name = "k";
    name += std::to_string(i);
    t.records.push_back(rec(name, at, at + 100));
    at += 100;
  }
  t.window_end_ns = at;  // no gap at the end
  const KernelTraceSummary s = summarize(t);
  ASSERT_EQ(s.longest_gaps.size(), KernelTraceSummary::kLongestGaps);
  std::sort(lengths.rbegin(), lengths.rend());
  for (std::size_t i = 0; i < s.longest_gaps.size(); ++i) EXPECT_EQ(s.longest_gaps[i].ns, lengths[i]) << i;
  EXPECT_EQ(s.longest_gaps[0].ns, 25000u);
}

TEST(KernelTrace, ReportAndCsv) {
  KernelTrace t;
  t.window_start_ns = 0;
  t.window_end_ns = 4000000;  // 4 ms
  for (int i = 0; i < 40; ++i) {
    std::string name = "k";
    name += std::to_string(i);
    t.records.push_back(rec(name, i * 100000, i * 100000 + 1000 + i));
  }
  t.records.push_back(rec("layer<float, 2>", 0, 0));  // zero length: not counted
  t.records.push_back(rec("a, \"quoted\" name", 3900000, 3950000));
  t.dropped = 3;
  const KernelTraceSummary s = summarize(t);
  const std::string text = format_summary(s, "rank 0, iterations 11-12", 5);
  EXPECT_NE(text.find("kernel trace, rank 0, iterations 11-12: the device busy"), std::string::npos) << text;
  EXPECT_NE(text.find("WARNING: 3 records were lost"), std::string::npos) << text;
  EXPECT_NE(text.find("(36 more names)"), std::string::npos) << text;     // 41 names, 5 shown
  EXPECT_NE(text.find("a, \"quoted\" name"), std::string::npos) << text;  // the longest, first
  const std::string csv = summary_csv(s);
  std::istringstream lines(csv);
  std::string header, first;
  std::getline(lines, header);
  std::getline(lines, first);
  EXPECT_EQ(header, "name,library,kind,calls,total_ms,ms_per_call,share_of_window");
  EXPECT_EQ(first, "\"a, \"\"quoted\"\" name\",other,kernel,1,0.050000,0.050000,0.012500");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 42);  // header + 41 rows
}

// A CPU device with a kernel trace: each stop hands back two kernels inside
// a 1 ms window, and start/stop calls are counted; `fail` makes start throw.
class TracingCpu final : public CpuDevice {
 public:
  bool has_kernel_trace() const override { return true; }
  void start_kernel_trace() override {
    if (fail) throw ConfigError("CUPTI's enable failed: test");
    ++starts;
  }
  KernelTrace stop_kernel_trace() override {
    ++stops;
    KernelTrace t;
    t.window_start_ns = 0;
    t.window_end_ns = 1000000;
    t.records = {rec("nvjet_sm90_gemm", 0, 600000), rec("megazero::layernorm", 700000, 800000)};
    return t;
  }
  int starts = 0, stops = 0;
  bool fail = false;
};

TrainArgs profile_args(std::vector<std::string> extra) {
  std::vector<std::string> all = {"pretrain_gpt", "--mock-data",   "--device", "cuda",
                                  "--profile",    "--train-iters", "20"};
  all.insert(all.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  TrainArgs a = parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr);
  a.validate();
  return a;
}

// Runs iterations first..last through the profile as the trainer's loop does.
void loop(IterationProfile& p, std::int64_t first, std::int64_t last) {
  for (std::int64_t it = first; it <= last; ++it) {
    p.before(it);
    p.after(it);
  }
}

TEST(IterationProfile, RecordsTheIterationsAfterTheStartUpToTheEnd) {
  auto dev = std::make_shared<TracingCpu>();
  IterationProfile p(profile_args({"--profile-step-start", "3", "--profile-step-end", "5"}), 0, 1, dev);
  p.check_ready();  // a trial trace
  EXPECT_EQ(dev->starts, 1);
  EXPECT_EQ(dev->stops, 1);
  testing::internal::CaptureStdout();
  for (std::int64_t it = 1; it <= 8; ++it) {
    p.before(it);
    EXPECT_EQ(dev->starts, it >= 4 ? 2 : 1) << it;  // started before iteration 4
    p.after(it);
    EXPECT_EQ(dev->stops, it >= 5 ? 2 : 1) << it;  // stopped after iteration 5
  }
  p.finish(8);  // nothing left running
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(dev->stops, 2);
  EXPECT_NE(out.find("kernel trace, rank 0, iterations 4-5 (2), cpu: the device busy 70.0% of 1.000 ms"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("per iteration: 0.500 ms, the device busy 0.350 ms of it"), std::string::npos) << out;
  EXPECT_NE(out.find("by library: cuBLAS 0.600 ms (60.0%), megazero 0.100 ms (10.0%)"), std::string::npos) << out;
}

TEST(IterationProfile, OnlyTheListedRanksRecord) {
  auto dev = std::make_shared<TracingCpu>();
  IterationProfile p(profile_args({"--profile-ranks", "1", "3"}), 2, 4, dev);
  p.check_ready();
  loop(p, 1, 20);
  p.finish(20);
  EXPECT_EQ(dev->starts, 0);
  EXPECT_EQ(dev->stops, 0);
}

TEST(IterationProfile, AnEarlyStopReportsWhatWasRecorded) {
  auto dev = std::make_shared<TracingCpu>();
  IterationProfile p(profile_args({}), 0, 1, dev);  // 10..12 by default
  testing::internal::CaptureStdout();
  loop(p, 1, 11);
  p.finish(11);  // --exit-interval or a stop signal after iteration 11
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(dev->starts, 1);
  EXPECT_EQ(dev->stops, 1);
  EXPECT_NE(out.find("iterations 11-11 (1, stopped early)"), std::string::npos) << out;
}

TEST(IterationProfile, WritesTheRowsAsCsvWithARankSuffixWhenSeveralRecord) {
  const fs::path dir = fs::temp_directory_path() / ("mz-profile-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& [ranks, name] : {std::pair{std::vector<std::string>{"0"}, std::string("rows.csv")},
                                    std::pair{std::vector<std::string>{"0", "1"}, std::string("rows.csv.rank0")}}) {
    auto dev = std::make_shared<TracingCpu>();
    std::vector<std::string> flags = {"--profile-file", (dir / "rows.csv").string(), "--profile-ranks"};
    flags.insert(flags.end(), ranks.begin(), ranks.end());
    IterationProfile p(profile_args(flags), 0, 2, dev);
    p.check_ready();
    testing::internal::CaptureStdout();
    loop(p, 1, 12);
    const std::string out = testing::internal::GetCapturedStdout();
    std::ifstream in(dir / name);
    ASSERT_TRUE(in.good()) << name << "\n" << out;
    std::string header, first;
    std::getline(in, header);
    std::getline(in, first);
    EXPECT_EQ(header, "name,library,kind,calls,total_ms,ms_per_call,share_of_window");
    EXPECT_EQ(first, "nvjet_sm90_gemm,cuBLAS,kernel,1,0.600000,0.600000,0.600000");
    EXPECT_FALSE(fs::exists(dir / (name + ".tmp")));
    fs::remove(dir / name);
  }
  // A file that cannot be written is refused at set-up (inside run_consistently).
  auto dev = std::make_shared<TracingCpu>();
  IterationProfile bad(profile_args({"--profile-file", (dir / "no" / "such" / "dir.csv").string()}), 0, 1, dev);
  EXPECT_THROW(bad.check_ready(), ConfigError);
  fs::remove_all(dir);
}

TEST(IterationProfile, ATracerThatFailsMidRunWarnsAndTrainingGoesOn) {
  auto dev = std::make_shared<TracingCpu>();
  IterationProfile p(profile_args({}), 0, 1, dev);
  dev->fail = true;
  testing::internal::CaptureStdout();
  EXPECT_NO_THROW(loop(p, 1, 20));
  p.finish(20);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("WARNING: rank 0: --profile stopped, training goes on without it: CUPTI's enable failed"),
            std::string::npos)
      << out;
  EXPECT_EQ(dev->stops, 0);
  // At set-up the same failure is an error (every rank stops alike there).
  IterationProfile fresh(profile_args({}), 0, 1, dev);
  EXPECT_THROW(fresh.check_ready(), ConfigError);
}

TEST(IterationProfile, AResumedRunPastTheWindowIsRefused) {
  auto dev = std::make_shared<TracingCpu>();
  const TrainArgs a = profile_args({"--profile-step-start", "4", "--profile-step-end", "6"});
  try {
    IterationProfile p(a, 0, 1, dev, 5);  // the checkpoint is at iteration 5
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-step-start 4 is before this run's first iteration 6"),
              std::string::npos)
        << e.what();
  }
  IterationProfile at_start(a, 0, 1, dev, 4);  // iterations 5 and 6 are still ahead
  testing::internal::CaptureStdout();
  loop(at_start, 5, 6);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("iterations 5-6 (2)"), std::string::npos) << out;
}

TEST(IterationProfile, DevicesWithoutATraceSayWhatToDo) {
  auto cpu = make_device(DeviceKind::CPU);
  EXPECT_FALSE(cpu->has_kernel_trace());
  try {
    cpu->start_kernel_trace();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
