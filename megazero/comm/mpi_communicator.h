// Communicator over MPI (Debian's MPICH): the CPU backend, and the fallback for
// several processes sharing one GPU (device tensors are staged through host).
//
// Collectives of one communicator run, in issue order, on that communicator's
// worker thread, so a non-blocking collective really overlaps the caller's
// compute (MPICH makes no progress without an MPI call in flight). Hence
// MPI_THREAD_MULTIPLE. Send/recv use MPI requests on the calling thread, so a
// pair of exchanges never deadlocks behind the worker. A collective that fails
// inside MPI aborts the job with the rank, host and communicator named: its
// peers are blocked in the same collective and would otherwise hang.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

#include "megazero/comm/communicator.h"

namespace megazero {

class ShmCollectives;

// Owns MPI's lifetime: initialises MPI with MPI_THREAD_MULTIPLE unless already
// initialised (then checks the level), finalises in the destructor if it
// initialised. Create it first in main(); destroy communicators before it.
class MpiEnvironment {
 public:
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

 private:
  bool owns_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // A duplicate of MPI_COMM_WORLD, so megazero's traffic never mixes with the
  // application's.
  static std::unique_ptr<MpiCommunicator> world(const std::string& name = "world");
  // Takes ownership of `comm` (freed in the destructor).
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;

  // --distributed-backend shm: a communicator of `group`'s ranks (collective
  // over them) whose collectives move data through one shared-memory segment
  // (shm_collectives.h) instead of MPI messages; barriers, send/recv and
  // splits stay MPI's, and its splits use shared memory too. All of the
  // group's ranks must share a machine: ConfigError on every rank otherwise.
  // `device`: the device whose tensors this group moves; where it can share
  // memory between processes (CUDA IPC), they move through device slots
  // (shm_collectives.h), else through the segment.
  static std::unique_ptr<MpiCommunicator> with_shared_memory(const MpiCommunicator& group, const std::string& name,
                                                             std::shared_ptr<Device> device = nullptr);
  // Whether this group's device tensors move through device slots.
  bool has_device_slots() const;

  std::string_view backend() const override { return shared_memory_ ? "shm" : "mpi"; }
  MPI_Comm native() const { return comm_; }

  // Ranks that share this rank's machine (MPI_COMM_TYPE_SHARED).
  std::unique_ptr<MpiCommunicator> split_node_local(const std::string& name);
  // This rank's host name.
  static std::string host_name();
  // From this many bytes an all-reduce runs as MPI's reduce-scatter then an
  // in-place all-gather (faster than MPICH's all-reduce of large messages).
  static std::size_t split_all_reduce_bytes(DType t);

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
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& name) override;

 private:
  static int rank_of(MPI_Comm c);
  static int size_of(MPI_Comm c);
  // Runs fn on the worker thread, after everything enqueued before it; the
  // worker then reports `ticket` (the watchdog's, see watch_ticket) done.
  std::shared_ptr<WorkImpl> enqueue(std::function<void()> fn, std::uint64_t ticket);
  void worker_loop();
  // Makes the shared-memory segment (collective; on the worker thread).
  void attach_shared_memory();
  void barrier_now();  // MPI barrier, on the worker thread

  MPI_Comm comm_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Task {
    std::function<void()> fn;
    std::shared_ptr<ThreadWork> work;
    std::uint64_t ticket;
  };
  std::deque<Task> queue_;
  bool stop_ = false;
  bool shared_memory_ = false;
  std::shared_ptr<Device> shm_device_;   // the device of with_shared_memory, for the splits too
  std::unique_ptr<ShmCollectives> shm_;  // groups of two or more ranks with shared memory
};

}  // namespace megazero
