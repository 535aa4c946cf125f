// Memory counters are exact for a known sequence of allocations (the ZeRO
// memory proofs depend on it), views never allocate, the meta device counts
// without storing, and strided copies with dtype conversion are right.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/gemm.h"

using namespace megazero;
using MC = MemoryCategory;

// Host devices run work as it is issued, so their marks are the host clock:
// the span across a 30 ms sleep is at least that, and a mark of another kind
// of device is refused rather than misread.
TEST(DeviceMarks, HostDevicesTimeWithTheHostClock) {
  for (DeviceKind kind : {DeviceKind::CPU, DeviceKind::Meta}) {
    auto dev = make_device(kind);
    const auto a = dev->mark();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const auto b = dev->mark();
    const double s = dev->seconds_between(*a, *b);
    EXPECT_GE(s, 0.029);
    EXPECT_LT(s, 30.0);
    EXPECT_LE(dev->seconds_between(*b, *a), 0.0);
  }
  struct ForeignMark final : Device::Mark {};
  const ForeignMark foreign;
  auto cpu = make_device(DeviceKind::CPU);
  EXPECT_THROW(cpu->seconds_between(*cpu->mark(), foreign), InternalError);
}

TEST(MemoryTracker, ExactLiveAndPeakForAKnownSequence) {
  auto dev = make_device(DeviceKind::CPU);
  auto& m = dev->memory();
  {
    Tensor p = Tensor::empty(dev, {1000}, DType::BF16, MC::Parameters, "params");      // 2000 B
    Tensor g = Tensor::empty(dev, {1000}, DType::BF16, MC::Gradients, "grads");        // 2000 B
    Tensor o = Tensor::empty(dev, {3, 250}, DType::F32, MC::OptimizerStates, "adam");  // 3000 B
    EXPECT_EQ(m.live(MC::Parameters), 2000);
    EXPECT_EQ(m.live(MC::Gradients), 2000);
    EXPECT_EQ(m.live(MC::OptimizerStates), 3000);
    EXPECT_EQ(m.total_live(), 7000);
    {
      Tensor a = Tensor::empty(dev, {7, 13}, DType::F32, MC::Activations);  // 364 B
      Tensor b = Tensor::empty(dev, {5}, DType::F16, MC::Activations);      // 10 B
      EXPECT_EQ(m.live(MC::Activations), 374);
      EXPECT_EQ(m.total_peak(), 7374);
      // Views share storage: no new bytes, no new allocation.
      Tensor v = a.narrow(0, 1, 3).transpose(0, 1);
      Tensor f = p.view({10, 100}).select(0, 4);
      EXPECT_EQ(m.snapshot()[MC::Activations].allocations, 2);
      EXPECT_EQ(m.total_live(), 7374);
    }
    EXPECT_EQ(m.live(MC::Activations), 0);
    EXPECT_EQ(m.peak(MC::Activations), 374);
    EXPECT_EQ(m.snapshot()[MC::Activations].live_allocations, 0);
    m.reset_peaks();
    EXPECT_EQ(m.peak(MC::Activations), 0);
    EXPECT_EQ(m.total_peak(), 7000);
    Tensor c = Tensor::empty(dev, {0}, DType::F32, MC::CommBuffers);  // zero bytes, still counted as a call
    EXPECT_EQ(m.snapshot()[MC::CommBuffers].allocations, 1);
    EXPECT_EQ(m.live(MC::CommBuffers), 0);
  }
  EXPECT_EQ(m.total_live(), 0);
  EXPECT_EQ(m.total_peak(), 7000);
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) EXPECT_EQ(m.snapshot().by_category[i].live_allocations, 0);
}

// The first-fit heap model: a hole left between two live blocks is reused
// only by something that fits, so an interleaved allocation order needs a
// larger span than its live bytes (fragmentation); coalescing and the top of
// the heap shrinking give the span back.
TEST(FirstFitHeap, HolesCoalescingAndTheTop) {
  FirstFitHeap h;
  const std::int64_t K = FirstFitHeap::kRound;
  EXPECT_EQ(h.allocate(4 * K), 0);      // A [0, 4K)
  EXPECT_EQ(h.allocate(K), 4 * K);      // B [4K, 5K)
  EXPECT_EQ(h.allocate(1), 5 * K);      // C rounds up to K: [5K, 6K)
  h.free(0, 4 * K);                     // hole [0, 4K)
  EXPECT_EQ(h.allocate(6 * K), 6 * K);  // does not fit the hole: grows
  EXPECT_EQ(h.span(), 12 * K);
  EXPECT_EQ(h.allocate(3 * K), 0);      // fits the hole (first fit)
  h.free(4 * K, K);                     // B merges with the free [3K, 4K) into [3K, 5K)
  EXPECT_EQ(h.allocate(2 * K), 3 * K);  // exactly the merged hole
  h.free(6 * K, 6 * K);                 // the top block: span shrinks
  EXPECT_EQ(h.span(), 6 * K);
  h.free(5 * K, K);
  h.free(3 * K, 2 * K);
  h.free(0, 3 * K);  // everything free: merged down to nothing
  EXPECT_EQ(h.span(), 0);
}

// What lets a run take short-lived allocations the plan does not make (an
// NCCL barrier's int, a host scalar staged through the GPU) without moving
// the offsets --device-arena planned: an allocation freed before the next one
// leaves the heap as it found it, holes and top alike.
TEST(FirstFitHeap, ATransientAllocationLeavesLaterPlacementsUnchanged) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // A random heap with holes: allocate many, free a random half.
    struct Block {
      std::int64_t at, bytes;
    };
    FirstFitHeap a, b;
    std::vector<Block> live;
    std::uniform_int_distribution<std::int64_t> size(1, 20 * FirstFitHeap::kRound);
    for (int i = 0; i < 40; ++i) {
      const std::int64_t n = size(rng);
      const std::int64_t at = a.allocate(n);
      ASSERT_EQ(b.allocate(n), at);
      live.push_back({at, n});
    }
    std::shuffle(live.begin(), live.end(), rng);
    for (std::size_t i = 0; i < live.size() / 2; ++i) {
      a.free(live[i].at, live[i].bytes);
      b.free(live[i].at, live[i].bytes);
    }
    // b alone takes a transient allocation of any size, then the same future.
    const std::int64_t transient = std::uniform_int_distribution<std::int64_t>(1, 40 * FirstFitHeap::kRound)(rng);
    b.free(b.allocate(transient), transient);
    EXPECT_EQ(b.span(), a.span());
    for (int i = 0; i < 30; ++i) {
      const std::int64_t n = size(rng);
      ASSERT_EQ(b.allocate(n), a.allocate(n)) << "trial " << trial << ", allocation " << i;
    }
  }
}

TEST(MemoryTracker, HeapSpanShowsFragmentationOfAnInterleavedOrder) {
  auto cpu = make_device(DeviceKind::Meta);
  const std::int64_t K = FirstFitHeap::kRound;
  {
    // Keep every other block (like checkpoints among transient activations),
    // free the others, then ask for one block twice as large: no hole fits it.
    std::vector<Tensor> kept, transient;
    for (int i = 0; i < 8; ++i) {
      transient.push_back(Tensor::empty(cpu, {K}, DType::U8, MemoryCategory::Activations));
      kept.push_back(Tensor::empty(cpu, {K}, DType::U8, MemoryCategory::ActivationCheckpoints));
    }
    transient.clear();
    Tensor big = Tensor::empty(cpu, {2 * K}, DType::U8, MemoryCategory::Activations);
    const auto s = cpu->memory().snapshot();
    EXPECT_EQ(s.total_live_bytes, 10 * K);  // 8 kept + the 2K block
    EXPECT_EQ(s.heap_span_bytes, 18 * K);   // 8 holes of K below, the 2K block on top
    EXPECT_EQ(s.heap_peak_bytes, 18 * K);
  }
  EXPECT_EQ(cpu->memory().snapshot().heap_span_bytes, 0);
}

TEST(MemoryTracker, PeakOfTheSumIsNotTheSumOfPeaks) {
  auto dev = make_device(DeviceKind::CPU);
  { Tensor a = Tensor::empty(dev, {100}, DType::F32, MC::Activations); }
  { Tensor w = Tensor::empty(dev, {50}, DType::F32, MC::Workspace); }
  EXPECT_EQ(dev->memory().peak(MC::Activations), 400);
  EXPECT_EQ(dev->memory().peak(MC::Workspace), 200);
  EXPECT_EQ(dev->memory().total_peak(), 400);
}

TEST(MemoryTracker, DevicesCountIndependently) {
  auto a = make_device(DeviceKind::CPU), b = make_device(DeviceKind::CPU);
  Tensor t = Tensor::empty(a, {10}, DType::F64, MC::Parameters);
  EXPECT_EQ(a->memory().total_live(), 80);
  EXPECT_EQ(b->memory().total_live(), 0);
}

TEST(MetaDevice, CountsBytesButStoresNothing) {
  auto meta = make_device(DeviceKind::Meta);
  Tensor t = Tensor::empty(meta, {1 << 20, 1 << 12}, DType::BF16, MC::Parameters);  // 8 GiB, never allocated
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(meta->memory().live(MC::Parameters), std::int64_t{2} << 32);
  Tensor u = Tensor::zeros(meta, {4, 4}, DType::F32, MC::Activations);
  Tensor c = Tensor::empty(meta, {4, 4}, DType::F32, MC::Activations);
  gemm(u, false, u, true, c);  // shapes checked, nothing computed
  EXPECT_THROW(u.to_double_vector(), InternalError);
}

TEST(Tensor, ViewsNarrowSelectTranspose) {
  auto dev = make_device(DeviceKind::CPU);
  Tensor t = Tensor::empty(dev, {2, 3, 4}, DType::F32, MC::Other);
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[static_cast<std::size_t>(i)] = i;
  t.copy_from_doubles(v);
  Tensor n = t.narrow(2, 1, 2);  // [:, :, 1:3]
  EXPECT_EQ(n.shape(), (Shape{2, 3, 2}));
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_EQ(n.to_double_vector(), (std::vector<double>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22}));
  Tensor s = t.select(0, 1).select(1, 3);  // t[1, :, 3]
  EXPECT_EQ(s.to_double_vector(), (std::vector<double>{15, 19, 23}));
  Tensor tr = t.select(0, 0).transpose(0, 1);  // (4, 3)
  EXPECT_EQ(tr.to_double_vector(), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(t.view({6, -1}).shape(), (Shape{6, 4}));
  EXPECT_THROW(n.view({12}), InternalError);
  EXPECT_THROW(t.narrow(1, 2, 2), InternalError);
  EXPECT_THROW(t.view({5, 5}), InternalError);
}

TEST(Tensor, StridedCopyWithDtypeConversionRoundsOnce) {
  auto dev = make_device(DeviceKind::CPU);
  Tensor src = Tensor::empty(dev, {3, 5}, DType::F32, MC::Other);
  std::vector<double> v;
  for (int i = 0; i < 15; ++i) v.push_back(1.0 + i / 3.0 + 1e-5);
  src.copy_from_doubles(v);
  Tensor dst = Tensor::zeros(dev, {5, 3}, DType::BF16, MC::Other);
  dst.copy_from(src.transpose(0, 1));  // strided source, converting
  auto got = dst.to_double_vector();
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 3; ++c) {
      const float f = static_cast<float>(v[static_cast<std::size_t>(c * 5 + r)]);
      EXPECT_EQ(got[static_cast<std::size_t>(r * 3 + c)], static_cast<double>(bf16_to_float(float_to_bf16(f))));
    }
  // A strided destination: write into every other column of a wider tensor.
  Tensor wide = Tensor::zeros(dev, {3, 10}, DType::F16, MC::Other);
  Tensor cols = wide.view({3, 5, 2}).select(2, 1);
  cols.copy_from(src);
  auto w = wide.to_double_vector();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) {
      const auto i = static_cast<std::size_t>(r * 10 + 2 * c);
      EXPECT_EQ(w[i], 0.0);
      EXPECT_EQ(w[i + 1], static_cast<double>(half_to_float(
                              float_to_half(static_cast<float>(v[static_cast<std::size_t>(r * 5 + c)])))));
    }
}

TEST(Tensor, CloneAndToCountUnderTheirCategory) {
  auto dev = make_device(DeviceKind::CPU);
  Tensor p = Tensor::zeros(dev, {64}, DType::F32, MC::Parameters);
  Tensor master = p.clone(MC::OptimizerStates);
  Tensor half = p.to(DType::F16, MC::Parameters);
  EXPECT_EQ(dev->memory().live(MC::OptimizerStates), 256);
  EXPECT_EQ(dev->memory().live(MC::Parameters), 256 + 128);
  EXPECT_NE(master.data(), p.data());
}

TEST(Gemm, WorkspaceIsCountedAndReleased) {
  // bf16 runs on oneDNN (scratchpad) or is widened to fp32 (temporaries):
  // either way through the device, counted as workspace, released after.
  auto dev = make_device(DeviceKind::CPU);
  Tensor a = Tensor::zeros(dev, {64, 64}, DType::BF16, MC::Activations);
  Tensor c = Tensor::empty(dev, {64, 64}, DType::F32, MC::Activations);
  gemm(a, false, a, false, c);
  EXPECT_EQ(dev->memory().live(MC::Workspace), 0);
  EXPECT_GE(dev->memory().snapshot()[MC::Workspace].allocations, 1);
}

TEST(Device, ParsesSpecsAndRefusesUnknownOnes) {
  EXPECT_EQ(make_device("cpu")->kind(), DeviceKind::CPU);
  EXPECT_EQ(make_device("meta")->kind(), DeviceKind::Meta);
  EXPECT_THROW(make_device("tpu"), ConfigError);
  EXPECT_THROW(make_device("cuda:x"), ConfigError);
#ifndef MEGAZERO_WITH_CUDA
  try {
    make_device("cuda");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MEGAZERO_CUDA"), std::string::npos);
  }
#endif
}

// core never names the CUDA backend: it is registered by the entry points
// (runtime/entry.h). In a CUDA build without a GPU, make_device("cuda") must
// come from the registered backend ("no CUDA GPU is visible"), not from core's
// fallback ("built without the CUDA backend"); in a CPU build, the fallback.
TEST(DeviceFactory, TheBuildsCudaBackendIsRegistered) {
  std::string what;
  try {
    make_device("cuda");
  } catch (const ConfigError& e) {
    what = e.what();
  }
#ifdef MEGAZERO_WITH_CUDA
  if (what.empty()) GTEST_SKIP() << "a GPU is visible: the backend made a device";
  EXPECT_EQ(what.find("built without the CUDA backend"), std::string::npos) << what;
  EXPECT_NE(what.find("no CUDA GPU is visible"), std::string::npos) << what;
#else
  EXPECT_NE(what.find("built without the CUDA backend"), std::string::npos) << what;
#endif
}
