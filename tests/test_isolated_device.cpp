// The isolated CPU device (core/isolated_device.h) keeps a GPU's rule that host
// code cannot touch device memory, and the host-access guard turns a breach
// into a named InternalError. These tests prove: the guard fires (naming the
// tensor and the caller) on every non-host device; data moves only through
// copies and gives the CPU's bits; kernels and collectives on it agree with
// the CPU bit for bit; its capacity makes an out-of-memory error that reports
// what is really held; the checkpoint writer streams device tensors through
// bounded staging buffers into the same bytes as from host memory.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "megazero/checkpoint/safetensors.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/core/isolated_device.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/layernorm.h"
#include "megazero/kernels/optimizer_kernels.h"

namespace megazero {
namespace {

using MC = MemoryCategory;

std::shared_ptr<Device> isolated() { return std::make_shared<IsolatedCpuDevice>(); }
std::shared_ptr<Device> host() {
  static const auto h = make_device(DeviceKind::CPU);  // one object: a GEMM's operands share their device
  return h;
}

// A host tensor of n values f(i), and the same values on `dev`.
Tensor values(const std::shared_ptr<Device>& dev, const Shape& shape, DType dtype, double seed) {
  Tensor h = Tensor::empty(host(), shape, dtype, MC::Workspace, "values");
  std::vector<double> v(static_cast<std::size_t>(h.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(seed + 0.37 * static_cast<double>(i)) * 2.0;
  h.copy_from_doubles(v);
  if (dev->host_accessible()) return h;
  Tensor d = Tensor::empty(dev, shape, dtype, MC::Workspace, "values");
  d.copy_from(h);
  return d;
}

TEST(IsolatedDevice, IsNotHostMemoryButRunsTheCpuKernels) {
  auto d = isolated();
  EXPECT_EQ(d->kind(), DeviceKind::CPU);
  EXPECT_EQ(d->name(), "cpu-isolated");
  EXPECT_FALSE(d->host_accessible());
  EXPECT_TRUE(host()->host_accessible());
  EXPECT_FALSE(make_device(DeviceKind::Meta)->host_accessible());
  EXPECT_EQ(make_device("cpu-isolated")->name(), "cpu-isolated");
  Tensor t = Tensor::zeros(d, {1000}, DType::F32, MC::Activations, "probe");
  EXPECT_NE(t.data(), d->compute_address(t.data())) << "the kernel view is a second mapping";
}

TEST(IsolatedDevice, HostAccessIsAnInternalErrorNamingTheTensorAndTheCaller) {
  Tensor t = Tensor::zeros(isolated(), {3, 4}, DType::F32, MC::Parameters, "fp32-master");
  try {
    (void)t.host_data<float>();
    FAIL() << "host_data on device memory must throw";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fp32-master"), std::string::npos) << m;
    EXPECT_NE(m.find("test_isolated_device.cpp"), std::string::npos) << "names the caller: " << m;
    EXPECT_NE(m.find("cpu-isolated"), std::string::npos) << m;
    EXPECT_NE(m.find("copy_from"), std::string::npos) << "says what to do: " << m;
  }
  // A view is refused as well, and so is the meta device (no storage at all).
  EXPECT_THROW((void)t.narrow(0, 1, 1).host_bytes(), InternalError);
  Tensor meta = Tensor::empty(make_device(DeviceKind::Meta), {4}, DType::F32, MC::Activations);
  EXPECT_THROW((void)meta.host_data<float>(), InternalError);
  // Host memory passes.
  Tensor h = Tensor::zeros(host(), {4}, DType::F32, MC::Activations);
  EXPECT_EQ(h.host_data<float>()[3], 0.0f);
}

// The class of bug the first GPU save had: a raw device pointer handed to host
// code (there: the checkpoint writer's hash). On the isolated device it dies at
// once, saying what was touched, instead of passing CI and crashing on a GPU.
TEST(IsolatedDeviceDeathTest, HostCodeDereferencingADeviceAddressDiesSayingSo) {
  Tensor t = Tensor::zeros(isolated(), {1024}, DType::F32, MC::Parameters, "fp32-master");
  const auto* raw = static_cast<const volatile float*>(t.data());
  EXPECT_DEATH((void)raw[5], "host code touched cpu-isolated device memory at 0x[0-9a-f]+ .*Tensor::copy_from");
  // The same bytes through the device's copy are fine.
  float v = 1;
  t.device().copy_to_host(&v, t.data(), sizeof v);
  EXPECT_EQ(v, 0.0f);
}

TEST(IsolatedDevice, CopiesRoundTripEveryWayWithTheCpusBits) {
  auto d = isolated();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor ref = values(host(), {6, 5}, dt, 1.0);
    Tensor dev = values(d, {6, 5}, dt, 1.0);
    EXPECT_EQ(dev.to_double_vector(), ref.to_double_vector());
    // A strided view with a cast, on the device, against the same on the host.
    Tensor dev_t = Tensor::empty(d, {5, 6}, DType::F32, MC::Workspace);
    dev_t.copy_from(dev.transpose(0, 1));
    Tensor ref_t = Tensor::empty(host(), {5, 6}, DType::F32, MC::Workspace);
    ref_t.copy_from(ref.transpose(0, 1));
    EXPECT_EQ(dev_t.to_double_vector(), ref_t.to_double_vector());
    // Device -> host with a cast (staged), and isolated -> another isolated device.
    Tensor back = Tensor::empty(host(), {6, 5}, DType::F64, MC::Workspace);
    back.copy_from(dev);
    EXPECT_EQ(back.to_double_vector(), ref.to_double_vector());
    Tensor other = Tensor::empty(isolated(), {6, 5}, dt, MC::Workspace);
    other.copy_from(dev);
    EXPECT_EQ(other.to_double_vector(), ref.to_double_vector());
    // Views across the boundary (packed on their own side first): a device
    // view to host memory with and without a cast, a host view into a device
    // view, and a device view read back as doubles.
    EXPECT_EQ(dev.transpose(0, 1).to_double_vector(), ref.transpose(0, 1).to_double_vector());
    EXPECT_EQ(dev.narrow(1, 1, 3).to_double_vector(), ref.narrow(1, 1, 3).to_double_vector());
    for (DType to : {dt, DType::F64}) {
      Tensor h = Tensor::empty(host(), {5, 6}, to, MC::Workspace);
      h.copy_from(dev.transpose(0, 1));
      Tensor want = Tensor::empty(host(), {5, 6}, to, MC::Workspace);
      want.copy_from(ref.transpose(0, 1));
      EXPECT_EQ(h.to_double_vector(), want.to_double_vector()) << "to " << dtype_name(to);
    }
    Tensor into = Tensor::zeros(d, {6, 5}, dt, MC::Workspace);
    into.transpose(0, 1).copy_from(ref.transpose(0, 1));
    EXPECT_EQ(into.to_double_vector(), ref.to_double_vector());
  }
}

TEST(IsolatedDevice, KernelsGiveTheCpusBits) {
  auto d = isolated();
  // GEMM (OpenBLAS fp32, oneDNN bf16), LayerNorm, AdamW and the grad norm.
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = values(d, {7, 9}, dt, 0.5), b = values(d, {9, 4}, dt, 1.5);
    Tensor c = Tensor::zeros(d, {7, 4}, dt, MC::Activations);
    gemm(a, false, b, false, c);
    Tensor ha = values(host(), {7, 9}, dt, 0.5), hb = values(host(), {9, 4}, dt, 1.5);
    Tensor hc = Tensor::zeros(host(), {7, 4}, dt, MC::Activations);
    gemm(ha, false, hb, false, hc);
    EXPECT_EQ(c.to_double_vector(), hc.to_double_vector());
  }
  Tensor x = values(d, {3, 8}, DType::F32, 2.0), hx = values(host(), {3, 8}, DType::F32, 2.0);
  Tensor g = values(d, {8}, DType::F32, 3.0), hg = values(host(), {8}, DType::F32, 3.0);
  Tensor bta = values(d, {8}, DType::F32, 4.0), hbta = values(host(), {8}, DType::F32, 4.0);
  auto ln = [](const Tensor& in, const Tensor& gamma, const Tensor& beta) {
    auto dev = in.device_ptr();
    Tensor y = Tensor::empty(dev, in.shape(), DType::F32, MC::Activations);
    Tensor mean = Tensor::empty(dev, {3}, DType::F32, MC::Activations);
    Tensor rstd = Tensor::empty(dev, {3}, DType::F32, MC::Activations);
    kernels::layernorm_forward(in, gamma, beta, 1e-5, y, mean, rstd);
    return y.to_double_vector();
  };
  EXPECT_EQ(ln(x, g, bta), ln(hx, hg, hbta));

  const kernels::AdamStep step{0.9, 0.999, 1e-8, 0.1, 1e-2, 0.1, 0.001, 0.5};
  auto adam = [&](const std::shared_ptr<Device>& dev) {
    Tensor w = values(dev, {300}, DType::F32, 5.0), m = values(dev, {300}, DType::F32, 6.0);
    Tensor v = Tensor::zeros(dev, {300}, DType::F32, MC::OptimizerStates);
    Tensor grad = values(dev, {300}, DType::BF16, 7.0);
    kernels::adamw(w, m, v, grad, {{10, 290, true}}, step);
    Tensor sumsq = Tensor::zeros(dev, {1}, DType::F64, MC::Workspace);
    kernels::sum_of_squares(grad, {{0, 100}, {150, 300}}, sumsq);
    auto out = w.to_double_vector();
    for (double s : m.to_double_vector()) out.push_back(s);
    out.push_back(sumsq.to_double_vector()[0]);
    return out;
  };
  EXPECT_EQ(adam(d), adam(host()));
}

TEST(IsolatedDevice, KernelsRefuseAHostOperandAmongDeviceOnes) {
  Tensor x = values(isolated(), {2, 8}, DType::F32, 1.0);
  Tensor y = Tensor::empty(host(), {2, 8}, DType::F32, MC::Activations);
  EXPECT_THROW(kernels::gelu_forward(x, y), InternalError) << "a host tensor fed to a device kernel";
}

TEST(IsolatedDevice, CapacityGivesAnOutOfMemoryErrorThatReportsWhatIsHeld) {
  auto d = std::make_shared<IsolatedCpuDevice>(std::int64_t{10} << 20);  // 10 MiB
  ASSERT_TRUE(d->memory_info());
  EXPECT_EQ(d->memory_info()->total, 10 << 20);
  Tensor a = Tensor::empty(d, {1 << 20}, DType::F32, MC::Parameters);   // 4 MiB
  Tensor b = Tensor::empty(d, {1 << 19}, DType::F32, MC::Activations);  // 2 MiB
  EXPECT_EQ(d->held_bytes(), 6 << 20);
  EXPECT_EQ(d->memory_info()->free, 4 << 20);
  try {
    Tensor c = Tensor::empty(d, {2 << 20}, DType::F32, MC::Activations);  // 8 MiB: does not fit
    FAIL() << "allocated beyond the capacity";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    // The held bytes are the 6 MiB really held, not 14 MiB with the failed request counted.
    EXPECT_EQ(m.rfind("out of device memory on cpu-isolated: ", 0), 0u) << m;
    EXPECT_NE(m.find("requested 8388608 bytes (8.0 MiB) with 4.0 MiB free of 10.0 MiB; megazero holds 6.0 MiB"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--micro-batch-size"), std::string::npos) << m;
  }
  EXPECT_EQ(d->held_bytes(), 6 << 20) << "a failed allocation holds nothing";
  EXPECT_EQ(d->memory().total_live(), 6 << 20) << "and the tracker forgets it";
  { Tensor freed = std::move(b); }
  EXPECT_EQ(d->held_bytes(), 4 << 20);
}

TEST(IsolatedDevice, ArenaIsHeldAsOneBlock) {
  auto d = std::make_shared<IsolatedCpuDevice>();
  d->reserve_arena(1 << 20);
  EXPECT_EQ(d->held_bytes(), 1 << 20);
  {
    Tensor a = values(d, {1000}, DType::F32, 1.0);  // placed in the arena: held already
    EXPECT_EQ(d->held_bytes(), 1 << 20);
    EXPECT_EQ(a.to_double_vector(), values(host(), {1000}, DType::F32, 1.0).to_double_vector());
  }
  EXPECT_EQ(d->arena_stats().served, 1) << "values() made one device tensor; its staging is host memory";
  EXPECT_EQ(d->arena_stats().misses, 0);
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(IsolatedDevice, CheckpointWriterStreamsDeviceTensorsThroughBoundedStaging) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mz-iso-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto d = isolated();
  // Sizes around the chunk (100 bytes): smaller, equal, several chunks, empty.
  const std::vector<std::int64_t> sizes = {7, 25, 101, 0, 333};
  std::vector<Tensor> dev, hst;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    dev.push_back(values(d, {sizes[i]}, DType::F32, static_cast<double>(i)));
    hst.push_back(values(host(), {sizes[i]}, DType::F32, static_cast<double>(i)));
  }
  Tensor h16 = values(host(), {9}, DType::BF16, 9.0);
  checkpoint::SafetensorsWriter from_device, from_host;
  from_device.set_staging_bytes(100);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    from_device.add(name, dev[i], {sizes[i]});
    from_host.add(name, DType::F32, {sizes[i]}, hst[i].host_bytes());
    if (i == 2) {  // a host tensor between device ones keeps its place
      from_device.add("h", h16, {9});
      from_host.add("h", DType::BF16, {9}, h16.host_bytes());
    }
  }
  const auto a = from_device.write((dir / "dev.safetensors").string());
  const auto b = from_host.write((dir / "host.safetensors").string());
  EXPECT_EQ(a, b) << "same checksum";
  EXPECT_EQ(read_file((dir / "dev.safetensors").string()), read_file((dir / "host.safetensors").string()));
  EXPECT_EQ(from_device.staged_bytes(), (7 + 25 + 101 + 333) * 4u) << "every device byte went through staging";
  EXPECT_EQ(from_host.staged_bytes(), 0u);
  fs::remove_all(dir);
}

// The copies a communication thread stages collectives with (ordered after a
// mark taken at issue): on the isolated device, as on any host device, work
// has run by the time it is issued, so they are its plain copies, through its
// copy functions (the host never touches the device bytes).
TEST(IsolatedDevice, CopiesAfterAMarkMoveTheBytes) {
  auto d = isolated();
  Tensor t = values(d, {32}, DType::F32, 3.0);
  const auto issued = d->mark();
  std::vector<float> staged(32);
  d->copy_to_host_after(*issued, staged.data(), t.data(), t.nbytes());
  const auto want = values(host(), {32}, DType::F32, 3.0).to_double_vector();
  for (std::size_t i = 0; i < staged.size(); ++i) EXPECT_EQ(staged[i], static_cast<float>(want[i])) << i;
  for (auto& x : staged) x = -x;
  d->copy_from_host_after(*issued, t.data(), staged.data(), t.nbytes());
  const auto back = t.to_double_vector();
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i], -want[i]) << i;
}

// Shared blocks (the shm transport's device slots; CUDA IPC on a GPU): a block
// opened by its handle — in another process in the transport, here through a
// second device object — is the same memory at another device address; both
// are device memory (host code faults on them, the copies and kernels reach
// them); the handle's name goes once every peer opened it, and a handle that
// names nothing, or a block smaller than asked, is a ConfigError.
TEST(IsolatedDevice, SharedBlocksAreOneMemoryAtTwoDeviceAddresses) {
  auto a = isolated(), b = isolated();
  auto mine = a->allocate_shared(1000);
  ASSERT_TRUE(mine);
  ASSERT_FALSE(mine->handle().empty());
  auto theirs = b->open_shared(mine->handle(), 1000);
  EXPECT_NE(theirs->data(), mine->data());
  EXPECT_EQ(theirs->bytes(), 1000u);
  std::vector<float> in(250), out(250, 0.0f);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  a->copy_from_host(mine->data(), in.data(), 1000);
  b->copy_to_host(out.data(), theirs->data(), 1000);
  EXPECT_EQ(out, in);
  // A device-to-device copy after a mark, from a tensor into the peer's view.
  Tensor t = values(b, {250}, DType::F32, 2.0);
  b->copy_within_after(*b->mark(), theirs->data(), t.data(), 1000);
  a->copy_to_host(out.data(), mine->data(), 1000);
  const auto want = t.to_double_vector();
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(want[i])) << i;
  EXPECT_THROW(b->open_shared(mine->handle(), 1 << 20), ConfigError) << "a block smaller than asked";
  mine->opened_by_all();
  EXPECT_THROW(b->open_shared(mine->handle(), 1000), ConfigError) << "the name is gone once every peer opened it";
  EXPECT_THROW(b->open_shared("cuda-ipc:00", 1000), ConfigError);
  EXPECT_EQ(host()->allocate_shared(1000), nullptr) << "host memory is shared as it is";
}

TEST(IsolatedDeviceDeathTest, HostCodeTouchingAnOpenedSharedBlockDiesSayingSo) {
  auto a = isolated(), b = isolated();
  auto mine = a->allocate_shared(4096);
  auto theirs = b->open_shared(mine->handle(), 4096);
  const auto* raw = static_cast<const volatile float*>(theirs->data());
  EXPECT_DEATH((void)raw[3], "host code touched cpu-isolated device memory");
}

// Host waits (Device::host_waits), counted as a GPU would drain its queue:
// blocking copies to and from the host and synchronize() count; copies within
// the device, strided copies, zero fills and the *_after copies (a GPU's side
// stream) do not; the CPU device counts none.
TEST(IsolatedDevice, CountsTheHostWaitsAGpuWouldMake) {
  auto d = isolated();
  Tensor t = values(d, {32}, DType::F32, 3.0);  // one copy from the host
  Tensor u = Tensor::empty(d, {32}, DType::F32, MemoryCategory::Other);
  const std::int64_t w0 = d->host_waits();
  u.copy_from(t);
  u.zero_();
  u.view({4, 8}).copy_from(t.view({8, 4}).transpose(0, 1));
  std::vector<float> staged(32);
  d->copy_to_host_after(*d->mark(), staged.data(), t.data(), t.nbytes());
  d->copy_from_host_after(*d->mark(), t.data(), staged.data(), t.nbytes());
  EXPECT_EQ(d->host_waits(), w0) << "queued work: no wait";
  (void)t.to_double_vector();
  EXPECT_EQ(d->host_waits(), w0 + 1) << "a read-back";
  t.copy_from(values(host(), {32}, DType::F32, 1.0));
  EXPECT_EQ(d->host_waits(), w0 + 2) << "a blocking copy from the host";
  d->synchronize();
  EXPECT_EQ(d->host_waits(), w0 + 3);
  auto h = host();
  Tensor c = values(h, {32}, DType::F32, 1.0);
  (void)c.to_double_vector();
  h->synchronize();
  EXPECT_EQ(h->host_waits(), 0) << "host memory: nothing to wait for";
}

// Queued transfers (Pa+cpu's offload): deferred on the isolated device until
// the first queue_after/wait, as a GPU's copy lands some time after it is
// queued — code that reads before ordering sees stale bytes here too. The CPU
// device copies at once. Ordering device work after one is no host wait; the
// host waiting for one nothing has ordered yet is (as on a GPU, where it has
// not ended), and once is enough.
TEST(IsolatedDevice, QueuedTransfersLandAtTheirFirstWait) {
  auto d = isolated();
  Tensor t = values(d, {16}, DType::F32, 3.0);
  const auto want = values(host(), {16}, DType::F32, 3.0).to_double_vector();
  const std::int64_t w0 = d->host_waits();
  std::vector<float> staged(16, -1.0f);
  auto down = d->copy_to_host_queued(staged.data(), t.data(), t.nbytes());
  EXPECT_EQ(staged[0], -1.0f) << "not before an ordering";
  d->queue_after(*down);
  for (std::size_t i = 0; i < staged.size(); ++i) EXPECT_EQ(staged[i], static_cast<float>(want[i])) << i;
  std::vector<float> back(16, 7.0f);
  auto up = d->copy_from_host_queued(t.data(), back.data(), t.nbytes());
  EXPECT_EQ(t.to_double_vector(), want) << "not before an ordering";
  d->wait(*up);
  EXPECT_EQ(d->host_waits(), w0 + 2) << "a read-back and the host waiting for the copy up";
  d->wait(*up);    // once is enough; again is harmless and no wait
  d->wait(*down);  // ended: device work was ordered after it
  EXPECT_EQ(t.to_double_vector(), std::vector<double>(16, 7.0));
  EXPECT_EQ(d->host_waits(), w0 + 3) << "and the read-back above";
  auto h = host();
  Tensor c = values(h, {16}, DType::F32, 1.0);
  std::vector<float> now(16, 0.0f);
  auto done = h->copy_to_host_queued(now.data(), c.data(), c.nbytes());
  EXPECT_EQ(now[3], static_cast<float>(c.to_double_vector()[3])) << "host memory: at once";
  EXPECT_THROW(d->queue_after(*done), InternalError) << "a transfer of another device";
}

// run_queued: device work beside the compute stream (a GPU's side stream)
// runs here at the first queue_after/wait on its handle, so code that reads
// its result without ordering sees the old values; allocating or copying to
// the host inside the work is refused on every device (a GPU would race).
TEST(IsolatedDevice, QueuedWorkRunsAtItsFirstOrderingAndMayNotAllocate) {
  auto d = isolated();
  Tensor t = values(d, {16}, DType::F32, 1.0);
  const auto before = t.to_double_vector();
  Tensor scaled = t;
  auto work = d->run_queued([scaled]() mutable { kernels::scale(scaled, 2.0); });
  EXPECT_EQ(t.to_double_vector(), before) << "nothing ran before an ordering";
  d->queue_after(*work);
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(t.to_double_vector()[i], 2 * before[i]) << i;
  d->wait(*work);  // ran once: no second scaling
  EXPECT_EQ(t.to_double_vector()[1], 2 * before[1]);
  for (auto dev : {d, host()}) {
    SCOPED_TRACE(dev->name());
    // (The host device runs the work at once, the isolated one at the wait.)
    EXPECT_THROW(dev->wait(*dev->run_queued([dev] { Tensor::empty(dev, {4}, DType::F32, MC::Workspace, "inside"); })),
                 InternalError)
        << "an allocation inside queued work";
    Tensor u = values(dev, {4}, DType::F32, 1.0);
    EXPECT_NO_THROW(u.to_double_vector()) << "and outside it, allowed again after the throw";
  }
  Tensor u = values(d, {4}, DType::F32, 1.0);
  auto read = d->run_queued([u] { (void)u.to_double_vector(); });
  EXPECT_THROW(d->queue_after(*read), InternalError) << "a host copy inside queued work";
}

TEST(IsolatedDevice, CollectivesStageDeviceTensorsThroughTheHost) {
  auto world = MpiCommunicator::world();
  auto d = isolated();
  const int n = world->size();
  Tensor t = values(d, {64}, DType::F32, 1.0);
  Tensor h = values(host(), {64}, DType::F32, 1.0);
  world->all_reduce(t, ReduceOp::Sum).wait();
  world->all_reduce(h, ReduceOp::Sum).wait();
  EXPECT_EQ(t.to_double_vector(), h.to_double_vector());
  // A 16-bit all-reduce past split_all_reduce_bytes (reduce-scatter, a move in
  // the staging buffer, all-gather), staged as well: the host tensors' bits.
  const std::int64_t big = static_cast<std::int64_t>(MpiCommunicator::split_all_reduce_bytes(DType::BF16) / 2) + 3;
  Tensor tb = values(d, {big}, DType::BF16, 3.0 + world->rank());
  Tensor hb = values(host(), {big}, DType::BF16, 3.0 + world->rank());
  world->all_reduce(tb, ReduceOp::Sum).wait();
  world->all_reduce(hb, ReduceOp::Sum).wait();
  EXPECT_EQ(tb.to_double_vector(), hb.to_double_vector());
  Tensor part = values(d, {16}, DType::F32, 2.0 + world->rank());
  Tensor full = Tensor::zeros(d, {16 * n}, DType::F32, MC::CommBuffers);
  world->all_gather(part, full).wait();
  const auto got = full.to_double_vector();
  for (int r = 0; r < n; ++r) {
    const auto want = values(host(), {16}, DType::F32, 2.0 + r).to_double_vector();
    EXPECT_EQ(std::vector<double>(got.begin() + 16 * r, got.begin() + 16 * (r + 1)), want) << "rank " << r;
  }
  // Reduce-scatter of the gathered buffer, against the same on host tensors.
  Tensor out = Tensor::zeros(d, {16}, DType::F32, MC::CommBuffers);
  world->reduce_scatter(full, out, ReduceOp::Sum).wait();
  Tensor hfull = Tensor::empty(host(), {16 * n}, DType::F32, MC::CommBuffers);
  hfull.copy_from(full);
  Tensor hout = Tensor::zeros(host(), {16}, DType::F32, MC::CommBuffers);
  world->reduce_scatter(hfull, hout, ReduceOp::Sum).wait();
  EXPECT_EQ(out.to_double_vector(), hout.to_double_vector());
}

}  // namespace
}  // namespace megazero
