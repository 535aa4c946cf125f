// Every collective x dtype x op on the launched rank count (CTest runs this
// binary on 1, 2, 3, 4 and 8 ranks), with sizes that do not divide evenly, in
// place and out of place, blocking and overlapped with compute. Inputs are
// small multiples of 1/4, so sums are exact even in bf16 and the expected
// values are exact; averaging rounds once, as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/comm/shm_collectives.h"
#include "megazero/kernels/gemm.h"

using namespace megazero;
using MC = MemoryCategory;

namespace {

// Values whose sums over up to 8 ranks are exact in every dtype.
double value(int rank, std::int64_t i) {
  return static_cast<double>((rank + 1) * (i % 7) - 3) * 0.25 + (i % 3 == 0 ? -0.5 : 0.0);
}

double round_to(DType t, double x) {
  std::vector<double> v{x};
  auto cpu = make_device(DeviceKind::CPU);
  Tensor s = Tensor::empty(cpu, {1}, t, MC::Other);
  s.copy_from_doubles(v);
  return s.to_double_vector()[0];
}

double expected_uncached(ReduceOp op, int size, std::int64_t i, DType t) {
  double sum = 0, mx = -1e300;
  for (int r = 0; r < size; ++r) {
    sum += value(r, i);
    mx = std::max(mx, value(r, i));
  }
  switch (op) {
    case ReduceOp::Sum:
      return sum;
    case ReduceOp::Max:
      return mx;
    case ReduceOp::Avg:
      // Implementation contract: exact sum, then one fp32 division (fp64
      // division for fp64), rounded once to the dtype.
      if (t == DType::F64) return sum / size;
      return round_to(t, static_cast<double>(static_cast<float>(sum) / static_cast<float>(size)));
  }
  return 0;
}

// value() repeats every 21 elements (i % 7, i % 3), so each residue's answer
// is worked out once: the all-reduce past the split checks millions of
// elements, and the rounding above makes a tensor per call.
double expected(ReduceOp op, int size, std::int64_t i, DType t) {
  static std::map<std::tuple<int, int, int, std::int64_t>, double> cache;
  const auto key = std::make_tuple(static_cast<int>(op), size, static_cast<int>(t), i % 21);
  const auto hit = cache.find(key);
  if (hit != cache.end()) return hit->second;
  return cache[key] = expected_uncached(op, size, i % 21, t);
}

Tensor filled(const std::shared_ptr<Device>& dev, std::int64_t n, DType t, int rank, std::int64_t first = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(rank, first + i);
  Tensor out = Tensor::empty(dev, {n}, t, MC::CommBuffers);
  out.copy_from_doubles(v);
  return out;
}

// MZ_TEST_COMM=shm (CTest's test_collectives_shm.*) runs every test on the
// shared-memory transport, MZ_TEST_DEVICE=cpu-isolated on device memory host
// code cannot touch; otherwise MPI's messages on host tensors.
bool shm_run() {
  const char* v = std::getenv("MZ_TEST_COMM");
  return v && std::string(v) == "shm";
}

class Collectives : public testing::Test {
 protected:
  void SetUp() override {
    const char* d = std::getenv("MZ_TEST_DEVICE");
    dev = make_device(d && *d ? d : "cpu");
    if (shm_run()) {
      bootstrap = MpiCommunicator::world("test-bootstrap");
      // The device's tensors through device slots where it shares memory
      // (the isolated device emulates a GPU's), unless MEGAZERO_SHM_DEVICE_SLOTS=0.
      world = MpiCommunicator::with_shared_memory(*bootstrap, "test-world", dev);
    } else {
      world = MpiCommunicator::world("test-world");
    }
  }
  void TearDown() override {
    world.reset();
    bootstrap.reset();
  }
  std::unique_ptr<MpiCommunicator> bootstrap, world;
  std::shared_ptr<Device> dev;
};

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
const std::int64_t kSizes[] = {0, 1, 7, 1031};

}  // namespace

// Every dtype, op and size, small ones and one just above
// split_all_reduce_bytes (from there an all-reduce is a reduce-scatter then an
// in-place all-gather, in slices that do not divide evenly): the exact values,
// and every rank holds the same bits (a Max of the result's negation must give
// that negation back).
TEST_F(Collectives, AllReduceEveryDtypeOpAndSize) {
  const int n = world->size(), me = world->rank();
  for (DType t : kFloatTypes) {
    std::vector<std::int64_t> sizes(std::begin(kSizes), std::end(kSizes));
    sizes.push_back(static_cast<std::int64_t>(MpiCommunicator::split_all_reduce_bytes(t) / dtype_size(t)) + 5);
    for (ReduceOp op : kOps)
      for (std::int64_t size : sizes) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " " << reduce_op_name(op) << " " << size);
        Tensor x = filled(dev, size, t, me);
        world->all_reduce(x, op).wait();
        const auto got = x.to_double_vector();
        for (std::int64_t i = 0; i < size; ++i)
          ASSERT_EQ(got[static_cast<std::size_t>(i)], expected(op, n, i, t)) << "element " << i;
        std::vector<double> neg(got.size());
        for (std::size_t i = 0; i < got.size(); ++i) neg[i] = -got[i];
        Tensor y = Tensor::empty(dev, {size}, t, MC::CommBuffers);
        y.copy_from_doubles(neg);
        world->all_reduce(y, ReduceOp::Max).wait();
        ASSERT_EQ(y.to_double_vector(), neg) << "ranks disagree";
      }
  }
}

TEST_F(Collectives, AllReduceIntegers) {
  for (DType t : {DType::I32, DType::I64}) {
    Tensor x = Tensor::empty(dev, {5}, t, MC::CommBuffers);
    x.copy_from_doubles({1, 2, 3, 4, static_cast<double>(world->rank())});
    world->all_reduce(x, ReduceOp::Sum).wait();
    const double n = world->size();
    EXPECT_EQ(x.to_double_vector(), (std::vector<double>{n, 2 * n, 3 * n, 4 * n, n * (n - 1) / 2}));
  }
}

TEST_F(Collectives, SixteenBitSumOfRandomValuesIsWithinRoundingOfTheTrueSum) {
  // Each pairwise combine rounds once: error <= (n - 1) * ulp/2 of the magnitude.
  const int n = world->size();
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::vector<double>> all(static_cast<std::size_t>(n), std::vector<double>(513));
  for (auto& v : all)
    for (auto& x : v) x = u(rng);
  for (DType t : {DType::F16, DType::BF16}) {
    Tensor x = Tensor::empty(dev, {513}, t, MC::CommBuffers);
    x.copy_from_doubles(all[static_cast<std::size_t>(world->rank())]);
    world->all_reduce(x, ReduceOp::Sum).wait();
    const auto got = x.to_double_vector();
    const double eps = t == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (std::size_t i = 0; i < 513; ++i) {
      double sum = 0, mag = 0;
      for (int r = 0; r < n; ++r) {
        const double v = round_to(t, all[static_cast<std::size_t>(r)][i]);
        sum += v;
        mag += std::fabs(v);
      }
      ASSERT_NEAR(got[i], sum, n * eps * mag + 1e-7) << dtype_name(t) << " element " << i;
    }
  }
}

TEST_F(Collectives, ReduceScatterEvenUnevenAndInPlace) {
  const int n = world->size(), me = world->rank();
  for (DType t : kFloatTypes)
    for (ReduceOp op : kOps)
      for (bool uneven : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " " << reduce_op_name(op) << " uneven " << uneven);
        // Uneven: rank r gets 2r + 1 elements, rank 1 gets none (ZeRO's padding-free tail).
        std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 5);
        if (uneven)
          for (int r = 0; r < n; ++r) counts[static_cast<std::size_t>(r)] = r == 1 ? 0 : 2 * r + 1;
        const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
        const std::int64_t offset = std::accumulate(counts.begin(), counts.begin() + me, std::int64_t{0});
        const std::int64_t mine = counts[static_cast<std::size_t>(me)];
        for (bool in_place : {false, true}) {
          Tensor input = filled(dev, total, t, me);
          Tensor output = in_place ? input.narrow(0, offset, mine) : Tensor::empty(dev, {mine}, t, MC::CommBuffers);
          world->reduce_scatter(input, output, op, uneven ? counts : std::vector<std::int64_t>{}).wait();
          const auto got = output.to_double_vector();
          for (std::int64_t i = 0; i < mine; ++i)
            ASSERT_EQ(got[static_cast<std::size_t>(i)], expected(op, n, offset + i, t)) << "in place " << in_place;
        }
      }
}

TEST_F(Collectives, AllGatherEvenUnevenAndInPlace) {
  const int n = world->size(), me = world->rank();
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I64})
    for (bool uneven : {false, true})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " uneven " << uneven << " in place " << in_place);
        std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 4);
        if (uneven)
          for (int r = 0; r < n; ++r) counts[static_cast<std::size_t>(r)] = (r * 3) % 4;
        const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
        std::vector<std::int64_t> displ(static_cast<std::size_t>(n), 0);
        for (int r = 1; r < n; ++r)
          displ[static_cast<std::size_t>(r)] =
              displ[static_cast<std::size_t>(r - 1)] + counts[static_cast<std::size_t>(r - 1)];
        Tensor output = Tensor::zeros(dev, {total}, t, MC::CommBuffers);
        Tensor mine = filled(dev, counts[static_cast<std::size_t>(me)], t, me, displ[static_cast<std::size_t>(me)]);
        Tensor input = mine;
        if (in_place) {
          input = output.narrow(0, displ[static_cast<std::size_t>(me)], counts[static_cast<std::size_t>(me)]);
          input.copy_from(mine);
        }
        world->all_gather(input, output, uneven ? counts : std::vector<std::int64_t>{}).wait();
        const auto got = output.to_double_vector();
        for (int r = 0; r < n; ++r)
          for (std::int64_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i) {
            const std::int64_t g = displ[static_cast<std::size_t>(r)] + i;
            ASSERT_EQ(got[static_cast<std::size_t>(g)], round_to(t, value(r, g))) << "from rank " << r;
          }
      }
}

TEST_F(Collectives, BroadcastAndReduceFromEveryRoot) {
  const int n = world->size(), me = world->rank();
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int root = 0; root < n; ++root) {
      Tensor x = filled(dev, 9, t, me);
      world->broadcast(x, root).wait();
      const auto got = x.to_double_vector();
      for (std::int64_t i = 0; i < 9; ++i) ASSERT_EQ(got[static_cast<std::size_t>(i)], round_to(t, value(root, i)));
      for (ReduceOp op : kOps) {
        Tensor y = filled(dev, 9, t, me);
        world->reduce(y, root, op).wait();
        if (me != root) continue;
        const auto r = y.to_double_vector();
        for (std::int64_t i = 0; i < 9; ++i) ASSERT_EQ(r[static_cast<std::size_t>(i)], expected(op, n, i, t));
      }
    }
  world->barrier().wait();
}

TEST_F(Collectives, SendRecvRingDoesNotDeadlock) {
  const int n = world->size(), me = world->rank();
  if (n == 1) GTEST_SKIP() << "a ring needs two ranks";
  // Large enough for MPI's rendezvous protocol: both sides post before waiting.
  const std::int64_t count = 1 << 18;
  Tensor out = filled(dev, count, DType::F32, me);
  Tensor in = Tensor::empty(dev, {count}, DType::F32, MC::CommBuffers);
  Work s = world->send(out, (me + 1) % n, 7);
  Work r = world->recv(in, (me + n - 1) % n, 7);
  r.wait();
  s.wait();
  const auto got = in.to_double_vector();
  const int from = (me + n - 1) % n;
  for (std::int64_t i = 0; i < count; i += 4099) ASSERT_EQ(got[static_cast<std::size_t>(i)], value(from, i));
}

TEST_F(Collectives, NonBlockingOverlapsComputeAndCompletesInOrder) {
  const int n = world->size(), me = world->rank();
  const std::int64_t count = (1 << 20) + 3;
  Tensor big = filled(dev, count, DType::F32, me);
  Tensor small = filled(dev, 11, DType::BF16, me);
  Work w1 = world->all_reduce(big, ReduceOp::Sum);
  Work w2 = world->all_reduce(small, ReduceOp::Max);
  // Compute while both are in flight.
  Tensor a = Tensor::zeros(dev, {256, 256}, DType::F32, MC::Activations);
  Tensor c = Tensor::empty(dev, {256, 256}, DType::F32, MC::Activations);
  for (int i = 0; i < 4; ++i) gemm(a, false, a, false, c);
  w2.wait();
  EXPECT_TRUE(w1.test()) << "an earlier collective on the same communicator finished first";
  w1.wait();
  EXPECT_LT(w1.seq(), w2.seq());
  const auto got = big.to_double_vector();
  for (std::int64_t i = 0; i < count; i += 10007)
    ASSERT_EQ(got[static_cast<std::size_t>(i)], expected(ReduceOp::Sum, n, i, DType::F32));
  const auto s = small.to_double_vector();
  for (std::int64_t i = 0; i < 11; ++i)
    ASSERT_EQ(s[static_cast<std::size_t>(i)], expected(ReduceOp::Max, n, i, DType::BF16));
}

TEST_F(Collectives, SplitCommunicatorsRunConcurrently) {
  const int n = world->size(), me = world->rank();
  auto half = world->split(me % 2, me, "test-parity");
  const int group_size = (n + 1 - me % 2) / 2;
  ASSERT_EQ(half->size(), group_size);
  ASSERT_EQ(half->rank(), me / 2);
  Tensor a = filled(dev, 100, DType::F32, me);
  Tensor b = filled(dev, 100, DType::F32, me);
  Work wa = half->all_reduce(a, ReduceOp::Sum);  // outstanding on two communicators at once
  Work wb = world->all_reduce(b, ReduceOp::Sum);
  wb.wait();
  wa.wait();
  const auto got = a.to_double_vector();
  for (std::int64_t i = 0; i < 100; ++i) {
    double sum = 0;
    for (int r = me % 2; r < n; r += 2) sum += value(r, i);
    ASSERT_EQ(got[static_cast<std::size_t>(i)], sum);
  }
}

TEST_F(Collectives, RecordsFingerprintsAndCountsBytes) {
  world->set_keep_records(true);
  std::vector<CollectiveRecord> hooked;
  world->set_record_hook([&](const CollectiveRecord& r) { hooked.push_back(r); });
  const std::uint64_t before = world->collectives_issued();
  Tensor x = filled(dev, 10, DType::BF16, world->rank());
  Tensor out = Tensor::empty(dev, {10L * world->size()}, DType::BF16, MC::CommBuffers);
  world->all_reduce(x, ReduceOp::Avg).wait();
  world->all_gather(x, out).wait();
  world->barrier().wait();
  ASSERT_EQ(world->records().size(), 3u);
  ASSERT_EQ(hooked.size(), 3u);
  const auto& r0 = world->records()[0];
  EXPECT_EQ(r0.group, "test-world");
  EXPECT_EQ(r0.type, CollectiveType::AllReduce);
  EXPECT_EQ(r0.op, ReduceOp::Avg);
  EXPECT_EQ(r0.dtype, DType::BF16);
  EXPECT_EQ(r0.count, 10);
  EXPECT_EQ(r0.seq, before + 1);
  EXPECT_EQ(world->records()[2].seq, before + 3);
  EXPECT_TRUE(r0.same_collective(hooked[0]));
  EXPECT_NE(r0.to_string().find("all_reduce(avg) bf16 x10"), std::string::npos) << r0.to_string();
  EXPECT_EQ(world->stats()[CollectiveType::AllReduce].bytes, 20);
  EXPECT_EQ(world->stats()[CollectiveType::AllGather].elements, 10L * world->size());
  // Every rank issued the same fingerprints: compare with rank 0's.
  Tensor fp = Tensor::empty(dev, {3}, DType::I64, MC::CommBuffers);
  std::vector<double> counts;
  for (std::size_t i = 0; i < 3; ++i) counts.push_back(static_cast<double>(world->records()[i].count));
  fp.copy_from_doubles(counts);
  Tensor ref = fp.clone(MC::CommBuffers);
  world->set_record_hook(nullptr);
  world->broadcast(ref, 0).wait();
  EXPECT_EQ(ref.to_double_vector(), fp.to_double_vector());
}

TEST_F(Collectives, AnErrorOnOneRankReachesEveryRank) {
  const int last = world->size() - 1;
  try {
    run_consistently(*world, [&] {
      if (world->rank() == last) throw ConfigError("--data-path: file 'x.bin' not found; pass an existing file");
    });
    FAIL() << "no rank threw";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--data-path"), std::string::npos) << msg;
    if (world->rank() != last) {
      EXPECT_NE(msg.find("rank " + std::to_string(last)), std::string::npos) << msg;
    }
  }
  // And when nobody fails, nobody throws.
  EXPECT_NO_THROW(agree_on_error(*world, ""));
}

TEST_F(Collectives, MisuseIsCaughtBeforeAnyCommunication) {
  Tensor x = Tensor::zeros(dev, {4, 4}, DType::F32, MC::CommBuffers);
  Tensor strided = x.narrow(1, 0, 2);
  EXPECT_THROW(world->all_reduce(strided), InternalError);
  Tensor out = Tensor::empty(dev, {3}, DType::F32, MC::CommBuffers);
  EXPECT_THROW(world->reduce_scatter(x, out), InternalError);  // 16 != 3 * size (for any size >= 1 here)
  EXPECT_THROW(world->broadcast(x, world->size()), InternalError);
  EXPECT_EQ(world->collectives_issued(), 0u);
}

TEST_F(Collectives, RunsOnTheTransportAsked) {
  EXPECT_EQ(world->backend(), shm_run() ? "shm" : "mpi");
  auto half = world->split(world->rank() % 2, world->rank(), "test-half");
  EXPECT_EQ(half->backend(), world->backend()) << "a split keeps its parent's transport";
  // Device slots for a device that shares memory between processes (the
  // isolated device's emulation of CUDA IPC), unless turned off; never for
  // host memory, which the segment holds directly.
  const char* off = std::getenv("MEGAZERO_SHM_DEVICE_SLOTS");
  const bool want = shm_run() && world->size() > 1 && !dev->host_accessible() && !(off && std::string(off) == "0");
  EXPECT_EQ(world->has_device_slots(), want);
  if (auto* h = dynamic_cast<MpiCommunicator*>(half.get()); h && half->size() > 1) {
    EXPECT_EQ(h->has_device_slots(), want) << "a split keeps its parent's device slots";
  }
}

// Parts of several rounds of the shared-memory transport's slot (rounds of a
// reduce-scatter are a slot's 1/size section), uneven, one empty: every
// element lands where it belongs, with the exact sum and max.
TEST_F(Collectives, UnevenPartsOfManyRounds) {
  const int n = world->size(), me = world->rank();
  const char* env = std::getenv("MEGAZERO_SHM_SLOT_BYTES");
  const std::int64_t slot = env && *env ? std::atoll(env) : 4096;
  for (DType t : {DType::F32, DType::BF16, DType::F64}) {
    const std::int64_t per = slot / n / 64 * 64 / static_cast<std::int64_t>(dtype_size(t));
    std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<std::size_t>(r)] = r == 1 ? 0 : (2 + r % 3) * per + 3 * r + 1;
    std::vector<std::int64_t> displ(static_cast<std::size_t>(n), 0);
    for (int r = 1; r < n; ++r)
      displ[static_cast<std::size_t>(r)] =
          displ[static_cast<std::size_t>(r - 1)] + counts[static_cast<std::size_t>(r - 1)];
    const std::int64_t total = displ.back() + counts.back(), mine = counts[static_cast<std::size_t>(me)];
    const std::int64_t offset = displ[static_cast<std::size_t>(me)];
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " " << reduce_op_name(op));
      Tensor input = filled(dev, total, t, me);
      Tensor output = Tensor::empty(dev, {mine}, t, MC::CommBuffers);
      world->reduce_scatter(input, output, op, counts).wait();
      const auto got = output.to_double_vector();
      for (std::int64_t i = 0; i < mine; ++i)
        ASSERT_EQ(got[static_cast<std::size_t>(i)], expected(op, n, offset + i, t)) << "element " << i;
      Tensor gathered = Tensor::zeros(dev, {total}, t, MC::CommBuffers);
      world->all_gather(output, gathered, counts).wait();
      const auto all = gathered.to_double_vector();
      for (std::int64_t g = 0; g < total; ++g)
        ASSERT_EQ(all[static_cast<std::size_t>(g)], expected(op, n, g, t)) << "gathered element " << g;
    }
    // A broadcast and an all-reduce of several rounds too.
    const std::int64_t long_count = 3 * slot / static_cast<std::int64_t>(dtype_size(t)) + 5;
    Tensor b = filled(dev, long_count, t, me);
    world->broadcast(b, n - 1).wait();
    const auto bv = b.to_double_vector();
    for (std::int64_t i = 0; i < long_count; i += 13)
      ASSERT_EQ(bv[static_cast<std::size_t>(i)], round_to(t, value(n - 1, i)));
    Tensor a = filled(dev, long_count, t, me);
    world->all_reduce(a, ReduceOp::Sum).wait();
    const auto av = a.to_double_vector();
    for (std::int64_t i = 0; i < long_count; ++i)
      ASSERT_EQ(av[static_cast<std::size_t>(i)], expected(ReduceOp::Sum, n, i, t)) << "all-reduced element " << i;
  }
}

// The shared-memory transport's reduction: in rank order, in fp32 (fp64 for
// fp64, exact integers), rounded once.
TEST(ReduceHost, SumsInFp32AndRoundsOnce) {
  // 1 + 2^-8 + 2^-8 in bf16: rounding after each add (ties to even) gives 1,
  // rounding once gives 1 + 2^-7, which bf16 holds.
  std::vector<BFloat16> x{float_to_bf16(1.0f)}, y{float_to_bf16(std::ldexp(1.0f, -8))}, out(1);
  reduce_host(DType::BF16, ReduceOp::Sum, out.data(), {x.data(), y.data(), y.data()}, 1, 3);
  EXPECT_EQ(bf16_to_float(out[0]), 1.0f + std::ldexp(1.0f, -7));
  // Avg: the rounded sum, one fp32 division, rounded once.
  std::vector<float> f{1.0f}, g{2.0f}, h{4.0f}, fo(1);
  reduce_host(DType::F32, ReduceOp::Avg, fo.data(), {f.data(), g.data(), h.data()}, 1, 3);
  EXPECT_EQ(fo[0], 7.0f / 3.0f);
  // Integers: exact beyond 2^53.
  std::vector<std::int64_t> i1{(std::int64_t{1} << 60) + 1}, i2{1}, io(1);
  reduce_host(DType::I64, ReduceOp::Sum, io.data(), {i1.data(), i2.data()}, 1, 2);
  EXPECT_EQ(io[0], (std::int64_t{1} << 60) + 2);
  // Max propagates NaN from any rank; dst may be a source.
  std::vector<float> m1{1.0f, NAN, 3.0f}, m2{NAN, 2.0f, -1.0f};
  reduce_host(DType::F32, ReduceOp::Max, m1.data(), {m1.data(), m2.data()}, 3, 2);
  EXPECT_TRUE(std::isnan(m1[0]));
  EXPECT_TRUE(std::isnan(m1[1]));
  EXPECT_EQ(m1[2], 3.0f);
  // Blocks of 1024 and a tail, every element its own sum.
  std::vector<Half> a(2500), b(2500), c(2500);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float_to_half(static_cast<float>(i % 97));
    b[i] = float_to_half(-0.5f * static_cast<float>(i % 13));
  }
  reduce_host(DType::F16, ReduceOp::Sum, c.data(), {a.data(), b.data()}, a.size(), 2);
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(half_to_float(c[i]), static_cast<float>(i % 97) - 0.5f * static_cast<float>(i % 13)) << i;
  // Shared among threads (from 2^18 elements): the same bits as one thread.
  const std::size_t big = (std::size_t{1} << 19) + 77;
  std::vector<BFloat16> p(big), q(big), one(big), three(big);
  for (std::size_t i = 0; i < big; ++i) {
    p[i] = float_to_bf16(std::sin(static_cast<float>(i)));
    q[i] = float_to_bf16(std::cos(static_cast<float>(i) * 0.7f));
  }
  reduce_host(DType::BF16, ReduceOp::Sum, one.data(), {p.data(), q.data(), p.data()}, big, 3, 1);
  reduce_host(DType::BF16, ReduceOp::Sum, three.data(), {p.data(), q.data(), p.data()}, big, 3, 3);
  for (std::size_t i = 0; i < big; ++i) ASSERT_EQ(one[i].bits, three[i].bits) << i;
  std::vector<std::uint8_t> u(1), v(1);
  EXPECT_THROW(reduce_host(DType::U8, ReduceOp::Sum, v.data(), {u.data()}, 1, 1), InternalError);
  EXPECT_THROW(reduce_host(DType::I32, ReduceOp::Avg, v.data(), {u.data()}, 1, 1), InternalError);
}

// --check-collectives exchanges each collective's fingerprint through the
// communicator's own all-gather first: on either transport, matching
// collectives pass and every one is checked.
TEST_F(Collectives, CheckedCollectivesPassWhenTheyMatch) {
  world->enable_collective_checking(true);
  const int n = world->size(), me = world->rank();
  Tensor x = filled(dev, 37, DType::F32, me);
  Tensor all = Tensor::empty(dev, {37L * n}, DType::F32, MC::CommBuffers);
  Tensor part = Tensor::empty(dev, {37}, DType::F32, MC::CommBuffers);
  EXPECT_NO_THROW(world->all_reduce(x, ReduceOp::Sum).wait());
  EXPECT_NO_THROW(world->all_gather(x, all).wait());
  EXPECT_NO_THROW(world->reduce_scatter(all, part, ReduceOp::Max).wait());
  EXPECT_NO_THROW(world->barrier().wait());
  EXPECT_EQ(world->fingerprints_checked(), 4u);
  const auto got = part.to_double_vector();
  for (std::int64_t i = 0; i < 37; ++i)
    ASSERT_EQ(got[static_cast<std::size_t>(i)], expected(ReduceOp::Sum, n, i, DType::F32));
  world->enable_collective_checking(false);
}
