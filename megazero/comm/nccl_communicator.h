// Communicator over NCCL: the GPU backend. One NCCL communicator, one
// communication stream and one CUDA device per object.
//
// Ordering: each operation first makes the communication stream wait (on the
// GPU, via an event) for everything already queued on the device's compute
// stream, so it sees finished gradients/parameters; then it is launched on the
// communication stream and a completion event is recorded. The host is never
// blocked at issue time, so compute issued afterwards overlaps the transfer.
// Work::wait() does not block the host either (as PyTorch's NCCL work.wait()):
// it makes the device's compute stream wait for the operation, and every
// consumer of the result runs there (kernels, frees, and host reads, which
// are device copies on that stream). barrier() is the one host rendezvous.
//
// Watchdog: when a collective timeout is set, a CUDA host function queued
// after each collective reports it complete to the watchdog (in stream order,
// so the watchdog's "done up to ticket t" stays exact).
//
// Buffers: CudaDevice frees in stream order on its compute stream, which does
// not see this communicator's stream. So every operation holds the buffers it
// touches (CudaEventWork::keep_alive) until Work::wait() returned or a stream
// was made to wait for it; a Work dropped before either synchronises first.
//
// Host tensors are accepted too: staged through this GPU and copied back
// before the call returns (the few host scalars of a step: the logged loss,
// the stop-signal vote; the grad-norm sum stays on the device).
//
// Send/recv: NCCL has no tags (the tag is ignored; messages between a pair of
// ranks match in issue order) and a send only completes once the peer posts
// the matching recv on its stream, so two ranks exchanging data must issue
// send and recv in opposite orders (e.g. the lower rank sends first).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "megazero/comm/communicator.h"
#include "megazero/cuda/cuda_device.h"

// nccl.h's communicator type (ncclComm_t is `ncclComm*`); declared here so that
// users of this header need not see NCCL's headers.
struct ncclComm;

namespace megazero {

// The Work of an NCCL operation: a CUDA event recorded after it on the
// communication stream. Also holds temporaries the operation reads or writes.
class CudaEventWork final : public WorkImpl {
 public:
  // Creates the event on the current device; `what` names it in errors.
  // `consumer`: the stream wait() orders after the operation (the compute stream).
  CudaEventWork(std::string what, cudaStream_t consumer);
  ~CudaEventWork() override;
  CudaEventWork(const CudaEventWork&) = delete;
  CudaEventWork& operator=(const CudaEventWork&) = delete;

  void record(cudaStream_t stream);
  // Buffers the operation reads or writes: held until it completed, or until
  // a stream waits for it (then later stream-ordered frees are safe).
  void keep_alive(std::shared_ptr<Buffer> buffer) { keep_alive_.push_back(std::move(buffer)); }

  // Orders the consumer stream after the operation; the host does not block.
  void wait() override;
  // Blocks the host until the operation finished (cudaEventSynchronize).
  void synchronize();
  // Polls (cudaEventQuery).
  bool test() override;
  // Makes `stream` wait for the operation on the GPU, without blocking the host.
  void wait_on_stream(cudaStream_t stream) const;
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  cudaStream_t consumer_ = nullptr;
  std::vector<std::shared_ptr<Buffer>> keep_alive_;
  mutable bool stream_ordered_ = false;  // a stream waits for the operation (wait_on_stream)
  std::string what_;
};

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (an MpiCommunicator of the same ranks, in the
  // same order): rank 0 creates the NCCL id and broadcasts it through
  // `bootstrap`, then every rank joins with its bootstrap rank.
  NcclCommunicator(Communicator& bootstrap, std::shared_ptr<CudaDevice> device, std::string name);
  ~NcclCommunicator() override;

  std::string_view backend() const override { return "nccl"; }
  ncclComm* native() const { return comm_; }
  const std::shared_ptr<CudaDevice>& cuda_device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Makes `stream` (default: the device's compute stream) wait on the GPU for
  // every operation issued so far on this communicator, without blocking the
  // host. For one operation's Work, see CudaEventWork::wait_on_stream.
  void wait_on_stream(cudaStream_t stream);
  void wait_on_stream() { wait_on_stream(device_->stream()); }

 protected:
  std::shared_ptr<WorkImpl> do_all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<WorkImpl> do_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                              const std::vector<std::int64_t>& counts) override;
  std::shared_ptr<WorkImpl> do_all_gather(const Tensor& input, const Tensor& output,
                                          const std::vector<std::int64_t>& counts) override;
  std::shared_ptr<WorkImpl> do_broadcast(const Tensor& t, int root) override;
  std::shared_ptr<WorkImpl> do_reduce(const Tensor& t, int root, ReduceOp op) override;
  std::shared_ptr<WorkImpl> do_barrier() override;
  std::shared_ptr<WorkImpl> do_send(const Tensor& t, int peer, int tag) override;
  std::shared_ptr<WorkImpl> do_recv(const Tensor& t, int peer, int tag) override;
  // Collective over this communicator (ncclCommSplit). color must be >= 0.
  // The new communicator shares this one's device.
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& name) override;
  // The --check-collectives exchange runs on this communicator's GPU.
  std::shared_ptr<Device> scratch_device() const override { return device_; }

 private:
  // Adopts `comm` (from ncclCommSplit); rank and size come from it.
  NcclCommunicator(ncclComm* comm, int rank, int size, std::shared_ptr<CudaDevice> device, std::string name);

  void init_resources();    // stream, event, barrier scratch
  void release() noexcept;  // everything init_resources and the NCCL init made
  void check_on_device(const Tensor& t, const char* what) const;
  // The collectives on tensors of this communicator's GPU (do_* stage host tensors through them).
  std::shared_ptr<WorkImpl> device_all_reduce(const Tensor& t, ReduceOp op);
  std::shared_ptr<WorkImpl> device_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                                  const std::vector<std::int64_t>& counts);
  std::shared_ptr<WorkImpl> device_all_gather(const Tensor& input, const Tensor& output,
                                              const std::vector<std::int64_t>& counts);
  std::shared_ptr<WorkImpl> device_broadcast(const Tensor& t, int root);
  std::shared_ptr<WorkImpl> device_reduce(const Tensor& t, int root, ReduceOp op);
  std::shared_ptr<WorkImpl> device_send(const Tensor& t, int peer, int tag);
  std::shared_ptr<WorkImpl> device_recv(const Tensor& t, int peer, int tag);
  // Host tensors: a copy on this GPU (or t itself when it is already there),
  // and after the operation, its result copied back (blocking) into `host`.
  Tensor stage_in(const Tensor& t);
  std::shared_ptr<WorkImpl> stage_out(std::shared_ptr<WorkImpl> work, const Tensor& host, const Tensor& staged);
  // Call with a CudaDeviceGuard held: the communication stream waits for the
  // compute stream, then the caller launches on stream_ and calls end_op().
  void begin_op();
  std::shared_ptr<WorkImpl> end_op(const char* what, std::vector<std::shared_ptr<Buffer>> keep_alive = {});

  std::shared_ptr<CudaDevice> device_;
  ncclComm* comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // Orders one stream after another: cudaStreamWaitEvent snapshots the event's
  // latest record at call time, so one event serves every hand-off.
  cudaEvent_t order_event_ = nullptr;
};

}  // namespace megazero
