#include "megazero/comm/mpi_communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/mpi_dtypes.h"
#include "megazero/comm/shm_collectives.h"
#include "megazero/core/error.h"

namespace megazero {

// ---------------------------------------------------------------- environment
MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    owns_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw ConfigError(
        "the MPI library does not provide MPI_THREAD_MULTIPLE, which megazero's communication threads need; "
        "use Debian's MPICH (tools/install_deps.sh installs it)");
}

MpiEnvironment::~MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

// ---------------------------------------------------------------- helpers
namespace {

// Host memory to stage `bytes` of a device's data through: from the device's
// host_device(), so page-locked on a GPU (DMA copies, not the driver's
// pageable bounce) with freed blocks reused, and never zero-filled. At least
// 8 bytes: MPI rejects a null buffer even for no elements.
std::shared_ptr<Buffer> host_staging(Device& device, std::size_t bytes) {
  return device.host_device()->allocate(std::max<std::size_t>(bytes, 8), MemoryCategory::Workspace, "mpi-staging");
}

// A host pointer MPI can use for a tensor: its own memory on the CPU, a staged
// host copy for device tensors (copied in first, written back by copy_out).
// With `issued` (a mark the caller's thread took when it issued the
// collective), the copies are ordered after that point only: the worker
// thread does not wait for compute queued after the collective (a stage-3
// prefetch would otherwise wait for the layer it is meant to overlap).
class HostView {
 public:
  HostView(const Tensor& t, bool copy_in, std::shared_ptr<Device::Mark> issued = nullptr)
      : t_(t), issued_(std::move(issued)) {
    if (t.device().host_accessible()) {
      ptr_ = t.data();
    } else {
      staging_ = host_staging(t.device(), t.nbytes());
      if (copy_in) {
        if (issued_)
          t.device().copy_to_host_after(*issued_, staging_->data(), t.data(), t.nbytes());
        else
          t.device().copy_to_host(staging_->data(), t.data(), t.nbytes());
      }
      ptr_ = staging_->data();
    }
  }
  void* ptr() const { return ptr_; }
  void copy_out() { copy_out(0, t_.nbytes()); }
  // Bytes [offset, offset + bytes) of the tensor only.
  void copy_out(std::size_t offset, std::size_t bytes) {
    if (!staging_ || bytes == 0) return;
    void* dst = static_cast<char*>(t_.data()) + offset;
    const void* src = static_cast<const char*>(staging_->data()) + offset;
    if (issued_)
      t_.device().copy_from_host_after(*issued_, dst, src, bytes);
    else
      t_.device().copy_from_host(dst, src, bytes);
  }

 private:
  Tensor t_;
  std::shared_ptr<Device::Mark> issued_;
  std::shared_ptr<Buffer> staging_;  // device tensors only
  void* ptr_ = nullptr;
};

// On the issuing thread: the mark a queued collective's staging copies wait
// for (none where MPI reads the tensor's memory itself).
std::shared_ptr<Device::Mark> issue_mark(const Tensor& t) {
  return t.device().host_accessible() ? nullptr : t.device().mark();
}

void divide_in_place(void* p, DType t, std::int64_t n, int by) {
  MZ_CHECK(is_floating(t), "avg of a ", dtype_name(t), " tensor; use sum");
  const auto count = static_cast<std::size_t>(n);
  if (t == DType::F64) {
    for (std::size_t i = 0; i < count; ++i) static_cast<double*>(p)[i] /= by;
    return;
  }
  const float inv_by = static_cast<float>(by);
  for (std::size_t i = 0; i < count; ++i)
    store_from_double(p, t, i, static_cast<double>(static_cast<float>(load_as_double(p, t, i)) / inv_by));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.buffer() != b.buffer()) return false;
  const auto* a0 = static_cast<const char*>(a.data());
  const auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

std::vector<MPI_Count> to_mpi_counts(const std::vector<std::int64_t>& c) { return {c.begin(), c.end()}; }
std::vector<MPI_Aint> displacements(const std::vector<std::int64_t>& c) {
  std::vector<MPI_Aint> d(c.size(), 0);
  for (std::size_t i = 1; i < c.size(); ++i) d[i] = d[i - 1] + static_cast<MPI_Aint>(c[i - 1]);
  return d;
}
}  // namespace

std::size_t MpiCommunicator::split_all_reduce_bytes(DType t) {
  const bool is16 = t == DType::BF16 || t == DType::F16;
  return is16 ? std::size_t{1} << 20 : std::size_t{16} << 20;
}

namespace {

// n elements in `parts` slices as even as can be (the first n % parts one longer).
std::vector<std::int64_t> slice_counts(std::int64_t n, int parts) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(parts), n / parts);
  for (std::int64_t i = 0; i < n % parts; ++i) ++c[static_cast<std::size_t>(i)];
  return c;
}

// MPICH's all-reduce of a large message runs below its own reduce-scatter
// plus all-gather, far below with our 16-bit sum (a user-defined op): 64 MiB
// of bf16 on 2 ranks 60.1 ms against 27.2 ms split, on 4 ranks 195 against
// 80 ms; fp32 34.9 against 20.8 ms (2 ranks) and 80.8 against 64.6 ms (4);
// below 16 MiB of fp32 MPICH's own is as fast or faster (bench_collectives,
// docs/PERFORMANCE.md). Small messages keep MPI's algorithm: latency bound.
bool reduce_scatter_all_gather(const Tensor& t, int ranks) {
  return ranks > 1 && t.nbytes() >= MpiCommunicator::split_all_reduce_bytes(t.dtype()) && t.numel() >= ranks;
}

bool all_equal(const std::vector<std::int64_t>& c) {
  for (auto x : c)
    if (x != c.front()) return false;
  return true;
}

// Waits for a request without holding a core. MPICH's blocking calls
// busy-poll: with more ranks than cores (the CPU tests; the main job runs 4
// ranks on 2 cores) a rank waiting for a slower peer takes the core that peer
// needs, and a 64-byte all-reduce at 4 ranks on 2 cores took 16 ms; it takes
// 0.13 ms with this wait (bench_collectives, docs/PERFORMANCE.md). So: test a
// few times (a peer that is already there answers within microseconds), then
// yield the core between tests. With a core to spare, sched_yield returns at
// once and this is the busy poll it replaces. It never sleeps: MPICH moves a
// large message in pipelined steps, each needing a test on every rank, and a
// 50 us sleep between tests made a 1 MiB all-reduce twice as slow. (Only
// communicator creation -- MPI_Comm_split/_split_type, once per group at
// start-up -- still blocks in MPICH's own wait.)
void wait_for(MPI_Request& req, const char* call, const std::string& comm) {
  constexpr int kSpinTests = 64;
  for (int spins = 0;;) {
    int done = 0;
    mpi::check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), call, comm);
    if (done) return;
    if (spins < kSpinTests)
      ++spins;
    else
      sched_yield();
  }
}

// Send/recv in flight: an MPI request on the caller's thread.
class RequestWork final : public WorkImpl {
 public:
  RequestWork(MPI_Request req, std::unique_ptr<HostView> view, bool copy_out, std::string comm)
      : req_(req), view_(std::move(view)), copy_out_(copy_out), comm_(std::move(comm)) {}
  void wait() override {
    if (done_) return;
    wait_for(req_, "MPI_Wait", comm_);
    complete();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    mpi::check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test", comm_);
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    if (copy_out_) view_->copy_out();
    done_ = true;
  }
  MPI_Request req_;
  std::unique_ptr<HostView> view_;
  bool copy_out_;
  std::string comm_;
  bool done_ = false;
};

}  // namespace

// ---------------------------------------------------------------- communicator
int MpiCommunicator::rank_of(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int MpiCommunicator::size_of(MPI_Comm c) {
  int s = 0;
  MPI_Comm_size(c, &s);
  return s;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world(const std::string& name) {
  MPI_Comm dup;
  mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup", name);
  return std::make_unique<MpiCommunicator>(dup, name);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : Communicator(rank_of(comm), size_of(comm), std::move(name)), comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  worker_ = std::thread([this] { worker_loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();  // drains the queue first
  MPI_Comm_free(&comm_);
}

void MpiCommunicator::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task.fn();
      // Drop what the operation captured (its tensors) before anyone waiting
      // on it goes on: a buffer whose owner let go of it is freed when the
      // collective completes, not whenever this thread next wakes. Otherwise
      // it stays counted while the caller allocates the next ones, and the
      // peaks depend on thread timing (the planner's virtual collectives
      // hold nothing, and tests/test_plan_vs_run.cpp compares the two).
      task.fn = nullptr;
      // Before finish(): once wait() returns, the watchdog no longer sees it.
      watch_done(task.ticket);
      task.work->finish();
    } catch (const std::exception& e) {
      // A collective that failed on this rank leaves its peers waiting inside
      // it: nothing can recover the group, and waiting would hang the job.
      // End the whole job now, saying where and why (NCCL's watchdog does the same).
      std::fprintf(stderr,
                   "megazero: collective failed on rank %d (host %s), communicator '%s': %s; aborting the job\n",
                   rank(), host_name().c_str(), name().c_str(), e.what());
      std::fflush(stderr);
      abort_world(kExitInternalError);
    }
  }
}

std::shared_ptr<WorkImpl> MpiCommunicator::enqueue(std::function<void()> fn, std::uint64_t ticket) {
  auto work = std::make_shared<ThreadWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{std::move(fn), work, ticket});
  }
  cv_.notify_one();
  return work;
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_all_reduce(const Tensor& t, ReduceOp op) {
  if (shm_)
    return enqueue([this, t, op, issued = issue_mark(t)] { shm_->all_reduce(t, op, issued.get()); }, watch_ticket());
  return enqueue(
      [this, t, op, issued = issue_mark(t)] {
        HostView h(t, true, issued);
        const auto type = mpi::datatype(t.dtype());
        const auto mop = mpi::reduce_op(t.dtype(), op);
        MPI_Request req;
        if (!reduce_scatter_all_gather(t, size())) {
          mpi::check(MPI_Iallreduce_c(MPI_IN_PLACE, h.ptr(), t.numel(), type, mop, comm_, &req), "MPI_Iallreduce",
                     name());
          wait_for(req, "MPI_Iallreduce", name());
        } else {
          // Each rank reduces one slice (the reduced slice lands at the start
          // of the buffer, MPI's in-place reduce-scatter), moves it to its
          // place, and the slices are gathered in place: every rank ends with
          // the same bits, each element summed once by its slice's owner.
          const auto counts = slice_counts(t.numel(), size());
          const auto c = to_mpi_counts(counts);
          const auto d = displacements(counts);
          mpi::check(MPI_Ireduce_scatter_c(MPI_IN_PLACE, h.ptr(), c.data(), type, mop, comm_, &req),
                     "MPI_Ireduce_scatter", name());
          wait_for(req, "MPI_Ireduce_scatter", name());
          const auto esize = dtype_size(t.dtype());
          const auto mine = static_cast<std::size_t>(rank());
          std::memmove(static_cast<char*>(h.ptr()) + static_cast<std::size_t>(d[mine]) * esize, h.ptr(),
                       static_cast<std::size_t>(counts[mine]) * esize);
          mpi::check(
              MPI_Iallgatherv_c(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h.ptr(), c.data(), d.data(), type, comm_, &req),
              "MPI_Iallgatherv", name());
          wait_for(req, "MPI_Iallgatherv", name());
        }
        if (op == ReduceOp::Avg) divide_in_place(h.ptr(), t.dtype(), t.numel(), size());
        h.copy_out();
      },
      watch_ticket());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                                             const std::vector<std::int64_t>& counts) {
  if (shm_)
    return enqueue([this, input, output, op, counts,
                    issued = issue_mark(input)] { shm_->reduce_scatter(input, output, op, counts, issued.get()); },
                   watch_ticket());
  return enqueue(
      [this, input, output, op, counts, issued = issue_mark(input)] {
        HostView in(input, true, issued);
        // MPI cannot reduce-scatter into a part of its own input: use a temporary.
        // An empty output counts too: its pointer may equal the input's, and MPI
        // rejects aliased buffers even for zero elements.
        const bool alias = output.numel() == 0 || overlaps(input, output) || !output.device().host_accessible();
        const std::shared_ptr<Buffer> tmp = alias ? host_staging(output.device(), output.nbytes()) : nullptr;
        void* out = alias ? tmp->data() : output.data();
        const auto type = mpi::datatype(input.dtype());
        const auto mop = mpi::reduce_op(input.dtype(), op);
        MPI_Request req;
        const bool even = all_equal(counts);
        const auto c = even ? std::vector<MPI_Count>{} : to_mpi_counts(counts);  // outlives the request
        const char* call = even ? "MPI_Ireduce_scatter_block" : "MPI_Ireduce_scatter";
        if (even) {
          mpi::check(MPI_Ireduce_scatter_block_c(in.ptr(), out, counts.front(), type, mop, comm_, &req), call, name());
        } else {
          mpi::check(MPI_Ireduce_scatter_c(in.ptr(), out, c.data(), type, mop, comm_, &req), call, name());
        }
        wait_for(req, call, name());
        if (op == ReduceOp::Avg) divide_in_place(out, output.dtype(), output.numel(), size());
        if (alias) {
          if (issued)
            output.device().copy_from_host_after(*issued, output.data(), tmp->data(), output.nbytes());
          else
            output.device().copy_from_host(output.data(), tmp->data(), output.nbytes());
        }
      },
      watch_ticket());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_all_gather(const Tensor& input, const Tensor& output,
                                                         const std::vector<std::int64_t>& counts) {
  if (shm_)
    return enqueue([this, input, output, counts,
                    issued = issue_mark(output)] { shm_->all_gather(input, output, counts, issued.get()); },
                   watch_ticket());
  return enqueue(
      [this, input, output, counts, issued = issue_mark(output)] {
        HostView out(output, false, issued);
        const auto displ = displacements(counts);
        const auto esize = static_cast<std::ptrdiff_t>(dtype_size(output.dtype()));
        const auto my_displ = displ[static_cast<std::size_t>(rank())] * esize;
        // ZeRO gathers partitions that already sit at their place in the full
        // buffer: that is MPI's in-place form.
        const bool in_place =
            output.device().host_accessible() && input.data() == static_cast<char*>(output.data()) + my_displ;
        std::unique_ptr<HostView> in;
        const void* send = MPI_IN_PLACE;
        if (!in_place) {
          if (!output.device().host_accessible()) {
            in = std::make_unique<HostView>(input, true, issued);
            std::memcpy(static_cast<char*>(out.ptr()) + my_displ, in->ptr(), input.nbytes());
          } else {
            // MPI forbids overlapping send and receive buffers; copy into place.
            std::memmove(static_cast<char*>(out.ptr()) + my_displ, input.data(), input.nbytes());
          }
        }
        const auto type = mpi::datatype(output.dtype());
        MPI_Request req;
        const bool even = all_equal(counts);
        const auto c = even ? std::vector<MPI_Count>{} : to_mpi_counts(counts);  // outlives the request
        const char* call = even ? "MPI_Iallgather" : "MPI_Iallgatherv";
        if (even) {
          mpi::check(MPI_Iallgather_c(send, 0, type, out.ptr(), counts.front(), type, comm_, &req), call, name());
        } else {
          mpi::check(MPI_Iallgatherv_c(send, 0, type, out.ptr(), c.data(), displ.data(), type, comm_, &req), call,
                     name());
        }
        wait_for(req, call, name());
        // On a device, a partition that already sits at its place in the full
        // buffer (ZeRO's) need not travel back: only the other ranks' parts do.
        const auto mine = static_cast<std::size_t>(my_displ);
        if (!output.device().host_accessible() && input.data() == static_cast<char*>(output.data()) + my_displ) {
          out.copy_out(0, mine);
          out.copy_out(mine + input.nbytes(), output.nbytes() - mine - input.nbytes());
        } else {
          out.copy_out();
        }
      },
      watch_ticket());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_broadcast(const Tensor& t, int root) {
  if (shm_)
    return enqueue([this, t, root, issued = issue_mark(t)] { shm_->broadcast(t, root, issued.get()); }, watch_ticket());
  return enqueue(
      [this, t, root, issued = issue_mark(t)] {
        HostView h(t, rank() == root, issued);
        MPI_Request req;
        mpi::check(MPI_Ibcast_c(h.ptr(), t.numel(), mpi::datatype(t.dtype()), root, comm_, &req), "MPI_Ibcast", name());
        wait_for(req, "MPI_Ibcast", name());
        h.copy_out();
      },
      watch_ticket());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_reduce(const Tensor& t, int root, ReduceOp op) {
  if (shm_)
    return enqueue([this, t, root, op, issued = issue_mark(t)] { shm_->reduce(t, root, op, issued.get()); },
                   watch_ticket());
  return enqueue(
      [this, t, root, op, issued = issue_mark(t)] {
        HostView h(t, true, issued);
        const bool is_root = rank() == root;
        MPI_Request req;
        mpi::check(MPI_Ireduce_c(is_root ? MPI_IN_PLACE : h.ptr(), is_root ? h.ptr() : nullptr, t.numel(),
                                 mpi::datatype(t.dtype()), mpi::reduce_op(t.dtype(), op), root, comm_, &req),
                   "MPI_Ireduce", name());
        wait_for(req, "MPI_Ireduce", name());
        if (is_root) {
          if (op == ReduceOp::Avg) divide_in_place(h.ptr(), t.dtype(), t.numel(), size());
          h.copy_out();
        }
      },
      watch_ticket());
}

void MpiCommunicator::barrier_now() {
  MPI_Request req;
  mpi::check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", name());
  wait_for(req, "MPI_Ibarrier", name());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_barrier() {
  return enqueue([this] { barrier_now(); }, watch_ticket());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_send(const Tensor& t, int peer, int tag) {
  auto view = std::make_unique<HostView>(t, true);
  MPI_Request req;
  mpi::check(MPI_Isend_c(view->ptr(), t.numel(), mpi::datatype(t.dtype()), peer, tag, comm_, &req), "MPI_Isend",
             name());
  return std::make_shared<RequestWork>(req, std::move(view), false, name());
}

std::shared_ptr<WorkImpl> MpiCommunicator::do_recv(const Tensor& t, int peer, int tag) {
  auto view = std::make_unique<HostView>(t, false);
  MPI_Request req;
  mpi::check(MPI_Irecv_c(view->ptr(), t.numel(), mpi::datatype(t.dtype()), peer, tag, comm_, &req), "MPI_Irecv",
             name());
  return std::make_shared<RequestWork>(req, std::move(view), true, name());
}

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key, const std::string& name) {
  // On the worker, so it is ordered with this communicator's queued collectives.
  MPI_Comm out = MPI_COMM_NULL;
  enqueue([&] { mpi::check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split", this->name()); }, watch_ticket())
      ->wait();
  auto child = std::make_unique<MpiCommunicator>(out, name);
  if (shared_memory_) {
    child->shm_device_ = shm_device_;
    child->attach_shared_memory();
  }
  return child;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::with_shared_memory(const MpiCommunicator& group,
                                                                     const std::string& name,
                                                                     std::shared_ptr<Device> device) {
  MPI_Comm dup = MPI_COMM_NULL;
  mpi::check(MPI_Comm_dup(group.comm_, &dup), "MPI_Comm_dup", group.name());
  auto comm = std::make_unique<MpiCommunicator>(dup, name);
  comm->shm_device_ = std::move(device);
  comm->attach_shared_memory();
  return comm;
}

bool MpiCommunicator::has_device_slots() const { return shm_ && shm_->has_device_slots(); }

void MpiCommunicator::attach_shared_memory() {
  shared_memory_ = true;
  // Every rank of the group on one machine, or every rank refuses alike.
  // A refusal is the caller's to throw: the worker ends the job on errors.
  MPI_Comm local = MPI_COMM_NULL;
  std::exception_ptr refused;
  auto ticket = watch_split();
  enqueue(
      [&] {
        try {
          mpi::check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &local),
                     "MPI_Comm_split_type", name());
          int local_size = 0, all_local = 0;
          MPI_Comm_size(local, &local_size);
          MPI_Comm_free(&local);
          int mine = local_size == size() ? 1 : 0;
          mpi::check(MPI_Allreduce(&mine, &all_local, 1, MPI_INT, MPI_LAND, comm_), "MPI_Allreduce", name());
          if (!all_local)
            throw ConfigError(detail::concat("--distributed-backend shm: group '", name(),
                                             "' has ranks on more than one machine (this one, ", host_name(),
                                             ", holds ", local_size, " of its ", size(),
                                             "); shared memory joins the ranks of one machine; use ",
                                             "--distributed-backend mpi, or nccl with a GPU per rank"));
          if (size() < 2) return;  // nothing to share (on every rank of the group alike)
          // Raw MPI, not broadcast_string() and friends (consensus.h): this
          // runs on the worker, which this communicator's own collectives wait for.
          ShmBootstrap boot;
          boot.broadcast_from_0 = [this](const std::string& text) {
            long long len = static_cast<long long>(text.size());
            mpi::check(MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, comm_), "MPI_Bcast", name());
            std::string out = rank() == 0 ? text : std::string(static_cast<std::size_t>(len), '\0');
            mpi::check(MPI_Bcast(out.data(), static_cast<int>(len), MPI_CHAR, 0, comm_), "MPI_Bcast", name());
            return out;
          };
          boot.all_ok = [this](bool ok) {
            int in = ok ? 1 : 0, all = 0;
            mpi::check(MPI_Allreduce(&in, &all, 1, MPI_INT, MPI_LAND, comm_), "MPI_Allreduce", name());
            return all != 0;
          };
          boot.barrier = [this] { barrier_now(); };
          boot.all_gather = [this](const std::string& text) {
            const int own_len = static_cast<int>(text.size());
            std::vector<int> lens(static_cast<std::size_t>(size())), displs(lens.size(), 0);
            mpi::check(MPI_Allgather(&own_len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_), "MPI_Allgather", name());
            for (std::size_t q = 1; q < lens.size(); ++q) displs[q] = displs[q - 1] + lens[q - 1];
            std::string all(static_cast<std::size_t>(displs.back() + lens.back()), '\0');
            mpi::check(
                MPI_Allgatherv(text.data(), own_len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm_),
                "MPI_Allgatherv", name());
            std::vector<std::string> out;
            for (std::size_t q = 0; q < lens.size(); ++q)
              out.push_back(all.substr(static_cast<std::size_t>(displs[q]), static_cast<std::size_t>(lens[q])));
            return out;
          };
          shm_ = std::make_unique<ShmCollectives>(rank(), size(), name(), boot, shm_device_);
        } catch (const ConfigError&) {
          refused = std::current_exception();
        }
      },
      ticket)
      ->wait();
  if (refused) std::rethrow_exception(refused);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_node_local(const std::string& name) {
  MPI_Comm out = MPI_COMM_NULL;
  enqueue(
      [&] {
        mpi::check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &out), "MPI_Comm_split_type",
                   this->name());
      },
      watch_split())
      ->wait();
  return std::make_unique<MpiCommunicator>(out, name);
}

std::string MpiCommunicator::host_name() {
  char buf[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

}  // namespace megazero
