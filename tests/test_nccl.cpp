// The NCCL communicator (megazero/comm/nccl_communicator.h) on the GPUs this
// machine has: one rank per GPU (NCCL refuses two ranks on one GPU), so under
// `mpiexec -n N` the first min(N, GPUs) ranks form the NCCL group and the
// others watch. Every collective on GPU tensors against the value computed on
// the host, and host tensors (staged through the GPU, as the training loop's
// loss and grad-norm scalars are) alike. Skipped without a GPU; with one GPU
// it still proves NCCL initialisation over the MPI bootstrap and the staging.
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>

#include "megazero/comm/mpi_communicator.h"
#include "megazero/comm/nccl_communicator.h"
#include "megazero/cuda/cuda_device.h"

using namespace megazero;

namespace {

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    auto world = MpiCommunicator::world();
    const int gpus = cuda_device_count();
    // Every rank takes part in the split (it is collective); ranks without a GPU of their own sit out.
    const bool member = gpus > 0 && world->rank() < gpus;
    bootstrap_ = world->split(member ? 0 : 1, world->rank(), "nccl-bootstrap");
    if (gpus == 0) GTEST_SKIP() << "no GPU visible";
    if (!member) GTEST_SKIP() << "more ranks than GPUs: this rank has no GPU of its own";
    gpu_ = std::dynamic_pointer_cast<CudaDevice>(make_device(DeviceKind::CUDA, world->rank()));
    comm_ = std::make_unique<NcclCommunicator>(*bootstrap_, gpu_, "nccl-test");
  }
  Tensor on(const std::shared_ptr<Device>& dev, const std::vector<double>& v) {
    Tensor t = Tensor::empty(dev, {static_cast<std::int64_t>(v.size())}, DType::F32, MemoryCategory::Other);
    t.copy_from_doubles(v);
    return t;
  }
  std::unique_ptr<Communicator> bootstrap_;
  std::shared_ptr<CudaDevice> gpu_;
  std::unique_ptr<NcclCommunicator> comm_;
};

TEST_F(Nccl, CollectivesOnGpuAndHostTensors) {
  const int n = comm_->size(), me = comm_->rank();
  auto cpu = make_device(DeviceKind::CPU);
  for (const auto& dev : {std::static_pointer_cast<Device>(gpu_), cpu}) {
    SCOPED_TRACE(dev->name());
    // all_reduce: sum over ranks of (rank + 1) * [1, 2, 3]
    Tensor x = on(dev, {1.0 * (me + 1), 2.0 * (me + 1), 3.0 * (me + 1)});
    comm_->all_reduce(x).wait();
    const double s = n * (n + 1) / 2.0;
    EXPECT_EQ(x.to_double_vector(), (std::vector<double>{s, 2 * s, 3 * s}));
    // broadcast from the last rank
    Tensor b = on(dev, {static_cast<double>(me), -1.0});
    comm_->broadcast(b, n - 1).wait();
    EXPECT_EQ(b.to_double_vector(), (std::vector<double>{static_cast<double>(n - 1), -1.0}));
    // all_gather with uneven counts: rank r contributes r + 1 values equal to r
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
    std::iota(counts.begin(), counts.end(), 1);
    const auto total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    Tensor mine = on(dev, std::vector<double>(static_cast<std::size_t>(me + 1), static_cast<double>(me)));
    Tensor all = on(dev, std::vector<double>(static_cast<std::size_t>(total), -7.0));
    comm_->all_gather(mine, all, counts).wait();
    std::vector<double> want;
    for (int r = 0; r < n; ++r) want.insert(want.end(), static_cast<std::size_t>(r + 1), static_cast<double>(r));
    EXPECT_EQ(all.to_double_vector(), want);
    // reduce_scatter of equal chunks: every rank's input is [0, 1, ..., n-1] + rank
    std::vector<double> in;
    for (int r = 0; r < n; ++r) in.push_back(r + me);
    Tensor full = on(dev, in);
    Tensor part = on(dev, {0.0});
    comm_->reduce_scatter(full, part).wait();
    EXPECT_EQ(part.to_double_vector(), (std::vector<double>{n * me + n * (n - 1) / 2.0}));
  }
  comm_->barrier().wait();
}

}  // namespace
