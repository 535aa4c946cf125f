#include "megazero/comm/nccl_communicator.h"

#include <nccl.h>

#include <cstring>
#include <optional>

#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/nccl_plan.h"
#include "megazero/comm/watchdog.h"
#include "megazero/core/error.h"

namespace megazero {
namespace {

void check_nccl(ncclResult_t r, const char* call, const std::string& comm, const char* file, int line) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);  // NCCL's own explanation, when it has one
  throw InternalError(detail::concat(file, ":", line, ": NCCL ", call, " failed on communicator '", comm,
                                     "': ", ncclGetErrorString(r), (last && *last ? ": " : ""), (last ? last : ""),
                                     " (rerun with NCCL_DEBUG=INFO for details)"));
}

// Inside NcclCommunicator members: names the communicator and the NCCL call.
#define MZ_NCCL_CHECK(expr, call) check_nccl((expr), call, this->name(), __FILE__, __LINE__)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  throw InternalError(detail::concat("nccl: no NCCL type for ", dtype_name(t)));
}

ncclRedOp_t nccl_op(DType t, ReduceOp op, const std::string& comm) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Avg:
      // As in the MPI backend: an integer average would silently truncate.
      MZ_CHECK(is_floating(t), comm, ": avg of a ", dtype_name(t), " tensor; use sum");
      return ncclAvg;
  }
  throw InternalError(detail::concat(comm, ": unknown reduce op"));
}

std::size_t count_of(const Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// ncclGroupStart/End. A group left open (an exception between the two) would
// swallow every later NCCL call of this thread, so the destructor closes it.
class NcclGroup {
 public:
  explicit NcclGroup(const std::string& comm) : comm_(comm) {
    check_nccl(ncclGroupStart(), "ncclGroupStart", comm_, __FILE__, __LINE__);
  }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    check_nccl(ncclGroupEnd(), "ncclGroupEnd", comm_, __FILE__, __LINE__);
  }

 private:
  const std::string& comm_;
  bool open_ = true;
};

// A plan's calls on `stream` (nccl_plan.h): copies as device-to-device
// copies, the collective calls in one NCCL group where the plan says so.
void issue(const nccl_plan::Plan& plan, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
           const std::string& name) {
  std::optional<NcclGroup> group;
  for (const auto& c : plan.calls) {
    if (c.op == nccl_plan::Op::Copy) {
      if (group) {
        group->end();
        group.reset();
      }
      MZ_CUDA_CHECK(cudaMemcpyAsync(c.recv, c.send, c.count, cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    if (plan.group && !group) group.emplace(name);
    switch (c.op) {
      case nccl_plan::Op::ReduceScatter:
        check_nccl(ncclReduceScatter(c.send, c.recv, c.count, type, op, comm, stream), "ncclReduceScatter", name,
                   __FILE__, __LINE__);
        break;
      case nccl_plan::Op::AllGather:
        check_nccl(ncclAllGather(c.send, c.recv, c.count, type, comm, stream), "ncclAllGather", name, __FILE__,
                   __LINE__);
        break;
      case nccl_plan::Op::Reduce:
        check_nccl(ncclReduce(c.send, c.recv, c.count, type, op, c.root, comm, stream),
                   "ncclReduce (uneven reduce_scatter)", name, __FILE__, __LINE__);
        break;
      case nccl_plan::Op::Broadcast:
        check_nccl(ncclBroadcast(c.send, c.recv, c.count, type, c.root, comm, stream),
                   "ncclBroadcast (uneven all_gather)", name, __FILE__, __LINE__);
        break;
      case nccl_plan::Op::Copy:
        break;
    }
  }
  if (group) group->end();
}

}  // namespace

// ---------------------------------------------------------------- work
CudaEventWork::CudaEventWork(std::string what, cudaStream_t consumer) : consumer_(consumer), what_(std::move(what)) {
  MZ_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEventWork::~CudaEventWork() {
  // Device memory is freed in stream order on the compute stream, which knows
  // nothing of the communication stream: buffers this operation still uses
  // may only go once it finished or the compute stream waits for it.
  if (!keep_alive_.empty() && !stream_ordered_) (void)cudaEventSynchronize(event_);
  keep_alive_.clear();
  // Safe while the event is pending: CUDA releases it once it completes.
  (void)cudaEventDestroy(event_);
}

void CudaEventWork::record(cudaStream_t stream) { MZ_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void CudaEventWork::wait() {
  // Everything that reads the result runs on the consumer (compute) stream,
  // host reads included (device copies go through it), so ordering that
  // stream is enough and the host runs on.
  wait_on_stream(consumer_);
  keep_alive_.clear();  // frees are stream-ordered on the consumer stream: safe now
}

void CudaEventWork::synchronize() {
  const cudaError_t err = cudaEventSynchronize(event_);
  if (err != cudaSuccess)
    throw InternalError(detail::concat(what_, ": waiting for the operation failed: ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")"));
  keep_alive_.clear();
}

bool CudaEventWork::test() {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) return false;
  if (err != cudaSuccess)
    throw InternalError(detail::concat(what_, ": polling the operation failed: ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")"));
  return true;
}

void CudaEventWork::wait_on_stream(cudaStream_t stream) const {
  MZ_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
  stream_ordered_ = true;
}

// ---------------------------------------------------------------- setup
NcclCommunicator::NcclCommunicator(Communicator& bootstrap, std::shared_ptr<CudaDevice> device, std::string name)
    : Communicator(bootstrap.rank(), bootstrap.size(), std::move(name)), device_(std::move(device)) {
  MZ_CHECK(device_ != nullptr, this->name(), ": NcclCommunicator needs a CUDA device");
  // Byte 0 says whether rank 0 made the id: if it failed, the other ranks
  // learn it from the broadcast instead of waiting in NCCL init forever.
  ncclUniqueId id{};
  Tensor msg = Tensor::empty(make_device(DeviceKind::CPU), Shape{static_cast<std::int64_t>(sizeof id + 1)}, DType::U8,
                             MemoryCategory::CommBuffers, "nccl unique id");
  auto* bytes = static_cast<unsigned char*>(msg.host_bytes());
  std::memset(bytes, 0, sizeof id + 1);
  ncclResult_t id_result = ncclSuccess;
  if (rank() == 0) {
    id_result = ncclGetUniqueId(&id);
    bytes[0] = id_result == ncclSuccess ? 1 : 0;
    std::memcpy(bytes + 1, &id, sizeof id);
  }
  bootstrap.broadcast(msg, 0).wait();
  MZ_NCCL_CHECK(id_result, "ncclGetUniqueId");
  MZ_CHECK(bytes[0] == 1, this->name(), ": rank 0 failed to create the NCCL unique id (see its error)");
  std::memcpy(&id, bytes + 1, sizeof id);

  CudaDeviceGuard guard(device_->index());
  ncclComm_t comm = nullptr;
  MZ_NCCL_CHECK(ncclCommInitRank(&comm, size(), id, rank()), "ncclCommInitRank");
  comm_ = comm;
  try {
    init_resources();
  } catch (...) {
    release();
    throw;
  }
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, int rank, int size, std::shared_ptr<CudaDevice> device,
                                   std::string name)
    : Communicator(rank, size, std::move(name)), device_(std::move(device)), comm_(comm) {
  try {
    CudaDeviceGuard guard(device_->index());
    init_resources();
  } catch (...) {
    release();
    throw;
  }
}

void NcclCommunicator::init_resources() {
  MZ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MZ_CUDA_CHECK(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
}

NcclCommunicator::~NcclCommunicator() { release(); }

void NcclCommunicator::release() noexcept {
  if (!device_) return;  // nothing was created without a device
  int previous = -1;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device_->index();
  (void)cudaSetDevice(device_->index());
  // Let queued operations finish before their communicator disappears.
  if (stream_) (void)cudaStreamSynchronize(stream_);
  if (comm_) (void)ncclCommDestroy(comm_);
  if (order_event_) (void)cudaEventDestroy(order_event_);
  if (stream_) (void)cudaStreamDestroy(stream_);
  comm_ = nullptr;
  order_event_ = nullptr;
  stream_ = nullptr;
  if (restore) (void)cudaSetDevice(previous);
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key, const std::string& name) {
  MZ_CHECK(color >= 0, this->name(), ": split needs a color >= 0, got ", color);
  CudaDeviceGuard guard(device_->index());
  ncclComm_t out = nullptr;
  MZ_NCCL_CHECK(ncclCommSplit(comm_, color, key, &out, nullptr), "ncclCommSplit");
  int new_rank = 0, new_size = 0;
  const ncclResult_t r1 = ncclCommUserRank(out, &new_rank);
  const ncclResult_t r2 = r1 == ncclSuccess ? ncclCommCount(out, &new_size) : r1;
  if (r2 != ncclSuccess) (void)ncclCommDestroy(out);
  MZ_NCCL_CHECK(r2, "ncclCommUserRank/ncclCommCount");
  // The constructor is private (it adopts a raw NCCL handle), hence no make_unique.
  return std::unique_ptr<Communicator>(new NcclCommunicator(out, new_rank, new_size, device_, name));
}

// ---------------------------------------------------------------- helpers
void NcclCommunicator::check_on_device(const Tensor& t, const char* what) const {
  MZ_CHECK(t.device_ptr().get() == static_cast<Device*>(device_.get()), name(), ": ", what, " of ", t.to_string(),
           ", but this NCCL communicator works on ", device_->name(),
           " (its own CudaDevice object); allocate the tensor on the communicator's device");
}

void NcclCommunicator::begin_op() {
  MZ_CUDA_CHECK(cudaEventRecord(order_event_, device_->stream()));
  MZ_CUDA_CHECK(cudaStreamWaitEvent(stream_, order_event_, 0));
}

std::shared_ptr<WorkImpl> NcclCommunicator::end_op(const char* what, std::vector<std::shared_ptr<Buffer>> keep_alive) {
  auto work = std::make_shared<CudaEventWork>(detail::concat(name(), ": ", what), device_->stream());
  work->record(stream_);
  for (auto& b : keep_alive)
    if (b) work->keep_alive(std::move(b));
  if (const auto ticket = watch_ticket(); ticket != 0) {
    if (collective_timeout() > 0) {
      // Owns a reference to the watch: the callback may run after this object is gone.
      struct Done {
        std::shared_ptr<detail::CollectiveWatch> watch;
        std::uint64_t ticket;
      };
      auto* done = new Done{watch(), ticket};
      const cudaError_t err = cudaLaunchHostFunc(
          stream_,
          [](void* p) {
            auto* d = static_cast<Done*>(p);
            d->watch->done(d->ticket);
            delete d;
          },
          done);
      if (err != cudaSuccess) delete done;
      MZ_CUDA_CHECK(err);
    } else {
      watch_done(ticket);  // the watchdog is off: nothing to report later
    }
  }
  return work;
}

void NcclCommunicator::wait_on_stream(cudaStream_t stream) {
  CudaDeviceGuard guard(device_->index());
  MZ_CUDA_CHECK(cudaEventRecord(order_event_, stream_));
  MZ_CUDA_CHECK(cudaStreamWaitEvent(stream, order_event_, 0));
}

// ---------------------------------------------------------------- collectives
std::shared_ptr<WorkImpl> NcclCommunicator::device_all_reduce(const Tensor& t, ReduceOp op) {
  check_on_device(t, "all_reduce");
  const ncclRedOp_t rop = nccl_op(t.dtype(), op, name());
  CudaDeviceGuard guard(device_->index());
  begin_op();
  MZ_NCCL_CHECK(ncclAllReduce(t.data(), t.data(), count_of(t), nccl_type(t.dtype()), rop, comm_, stream_),
                "ncclAllReduce");
  return end_op("all_reduce", {t.buffer()});
}

std::shared_ptr<WorkImpl> NcclCommunicator::device_reduce_scatter(const Tensor& input, const Tensor& output,
                                                                  ReduceOp op,
                                                                  const std::vector<std::int64_t>& counts) {
  check_on_device(input, "reduce_scatter input");
  check_on_device(output, "reduce_scatter output");
  const nccl_plan::Span in{input.data(), input.nbytes()}, out{output.data(), output.nbytes()};
  const std::size_t elem = dtype_size(input.dtype());
  CudaDeviceGuard guard(device_->index());
  std::shared_ptr<Buffer> staging;
  if (nccl_plan::reduce_scatter_staging(in, out, counts, elem, rank()))
    staging = device_->allocate(output.nbytes(), MemoryCategory::CommBuffers, "nccl reduce_scatter staging");
  begin_op();  // after the staging allocation, which is ordered on the compute stream
  issue(nccl_plan::reduce_scatter(in, out, counts, elem, rank(), staging ? staging->data() : nullptr),
        nccl_type(input.dtype()), nccl_op(input.dtype(), op, name()), comm_, stream_, name());
  return end_op("reduce_scatter", {std::move(staging), input.buffer(), output.buffer()});
}

std::shared_ptr<WorkImpl> NcclCommunicator::device_all_gather(const Tensor& input, const Tensor& output,
                                                              const std::vector<std::int64_t>& counts) {
  check_on_device(input, "all_gather input");
  check_on_device(output, "all_gather output");
  const nccl_plan::Span in{input.data(), input.nbytes()}, out{output.data(), output.nbytes()};
  const std::size_t elem = dtype_size(input.dtype());
  CudaDeviceGuard guard(device_->index());
  std::shared_ptr<Buffer> staging;
  if (nccl_plan::all_gather_staging(in, out, counts, elem, rank()))
    staging = device_->allocate(input.nbytes(), MemoryCategory::CommBuffers, "nccl all_gather staging");
  begin_op();  // after the staging allocation, which is ordered on the compute stream
  issue(nccl_plan::all_gather(in, out, counts, elem, rank(), staging ? staging->data() : nullptr),
        nccl_type(input.dtype()), ncclSum, comm_, stream_, name());
  return end_op("all_gather", {std::move(staging), input.buffer(), output.buffer()});
}

std::shared_ptr<WorkImpl> NcclCommunicator::device_broadcast(const Tensor& t, int root) {
  check_on_device(t, "broadcast");
  CudaDeviceGuard guard(device_->index());
  begin_op();
  MZ_NCCL_CHECK(ncclBroadcast(t.data(), t.data(), count_of(t), nccl_type(t.dtype()), root, comm_, stream_),
                "ncclBroadcast");
  return end_op("broadcast", {t.buffer()});
}

std::shared_ptr<WorkImpl> NcclCommunicator::device_reduce(const Tensor& t, int root, ReduceOp op) {
  check_on_device(t, "reduce");
  const ncclRedOp_t rop = nccl_op(t.dtype(), op, name());
  CudaDeviceGuard guard(device_->index());
  begin_op();
  MZ_NCCL_CHECK(ncclReduce(t.data(), t.data(), count_of(t), nccl_type(t.dtype()), rop, root, comm_, stream_),
                "ncclReduce");
  return end_op("reduce", {t.buffer()});
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_barrier() {
  CudaDeviceGuard guard(device_->index());
  // One int32, allocated and freed here: a transient allocation leaves the
  // device's first-fit heap as it found it, so a barrier anywhere in a run
  // (a checkpoint) does not move the offsets --device-arena planned. Under
  // Other: it is not a communication bucket.
  auto scratch = device_->allocate(sizeof(std::int32_t), MemoryCategory::Other, "nccl barrier scratch");
  begin_op();  // the comm stream first waits for the allocation (ordered on the compute stream)
  void* p = scratch->data();
  MZ_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(std::int32_t), stream_));
  MZ_NCCL_CHECK(ncclAllReduce(p, p, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
  // A barrier is a host-side rendezvous: return only once every rank got here.
  std::static_pointer_cast<CudaEventWork>(end_op("barrier", {scratch}))->synchronize();
  return nullptr;
}

std::shared_ptr<WorkImpl> NcclCommunicator::device_send(const Tensor& t, int peer, int /*tag: NCCL has none*/) {
  check_on_device(t, "send");
  CudaDeviceGuard guard(device_->index());
  begin_op();
  MZ_NCCL_CHECK(ncclSend(t.data(), count_of(t), nccl_type(t.dtype()), peer, comm_, stream_), "ncclSend");
  return end_op("send", {t.buffer()});
}

std::shared_ptr<WorkImpl> NcclCommunicator::device_recv(const Tensor& t, int peer, int /*tag: NCCL has none*/) {
  check_on_device(t, "recv");
  CudaDeviceGuard guard(device_->index());
  begin_op();
  MZ_NCCL_CHECK(ncclRecv(t.data(), count_of(t), nccl_type(t.dtype()), peer, comm_, stream_), "ncclRecv");
  return end_op("recv", {t.buffer()});
}

// ---------------------------------------------------------------- host tensors
// A host tensor (the logged loss, the stop-signal vote, checkpoint metadata)
// takes the mirror path of MpiCommunicator's GPU staging: copied to this GPU,
// the collective runs there, the result is copied back before the call
// returns. These are a few scalars per step, so the synchronisation costs
// nothing that matters, and callers need no second (host) communicator for
// them. A collective's staging copy is freed before the call returns (a send's
// when its Work completes); a transient allocation leaves the device's
// first-fit heap as it was (FirstFitHeap's transient test), so the offsets
// --device-arena planned do not move.

namespace {
bool on_host(const Tensor& t) { return t.device().host_accessible(); }
}  // namespace

Tensor NcclCommunicator::stage_in(const Tensor& t) {
  if (!on_host(t)) return t;
  Tensor d = Tensor::empty(device_, t.shape(), t.dtype(), MemoryCategory::CommBuffers, "nccl host-tensor staging");
  d.copy_from(t);
  return d;
}

std::shared_ptr<WorkImpl> NcclCommunicator::stage_out(std::shared_ptr<WorkImpl> work, const Tensor& host,
                                                      const Tensor& staged) {
  if (!on_host(host)) return work;
  if (work) work->wait();
  Tensor out = host;
  out.copy_from(staged);
  return work;
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_all_reduce(const Tensor& t, ReduceOp op) {
  const Tensor d = stage_in(t);
  return stage_out(device_all_reduce(d, op), t, d);
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                                              const std::vector<std::int64_t>& counts) {
  const Tensor in = stage_in(input), out = stage_in(output);
  return stage_out(device_reduce_scatter(in, out, op, counts), output, out);
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_all_gather(const Tensor& input, const Tensor& output,
                                                          const std::vector<std::int64_t>& counts) {
  const Tensor in = stage_in(input), out = stage_in(output);
  return stage_out(device_all_gather(in, out, counts), output, out);
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_broadcast(const Tensor& t, int root) {
  const Tensor d = stage_in(t);
  return stage_out(device_broadcast(d, root), t, d);
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_reduce(const Tensor& t, int root, ReduceOp op) {
  const Tensor d = stage_in(t);
  return stage_out(device_reduce(d, root, op), t, d);
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_send(const Tensor& t, int peer, int tag) {
  // No wait: the host data is already copied, the operation holds the staged copy.
  return device_send(stage_in(t), peer, tag);
}

std::shared_ptr<WorkImpl> NcclCommunicator::do_recv(const Tensor& t, int peer, int tag) {
  const Tensor d = stage_in(t);
  return stage_out(device_recv(d, peer, tag), t, d);
}

}  // namespace megazero
