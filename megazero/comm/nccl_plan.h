// The NCCL calls behind NcclCommunicator's reduce-scatter and all-gather, as
// data: which call, from which address to which, how many elements, which
// root, grouped or not, and whether a staging buffer stands in for an
// overlapping operand. The communicator issues a plan call by call
// (nccl_communicator.cpp); CI runs every rank's plan through a model of NCCL's
// documented semantics on the CPU (tests/test_nccl_plan.cpp), which no
// single-GPU machine can do for the uneven and in-place forms ZeRO uses.
// Free of CUDA and NCCL types: compiled in every build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megazero::nccl_plan {

enum class Op {
  ReduceScatter,  // recv = this rank's chunk of the sum of every rank's send ([size x count])
  AllGather,      // recv [size x count] = every rank's send, in rank order
  Reduce,         // root's recv = the sum of every rank's send (recv unused elsewhere: nullptr)
  Broadcast,      // every rank's recv = root's send
  Copy,           // a device-to-device copy of `count` bytes on the communication stream
};

struct Call {
  Op op;
  const void* send;
  void* recv;
  std::size_t count;  // elements (bytes for Copy)
  int root = -1;      // Reduce, Broadcast
};

struct Plan {
  bool group = false;  // the collective calls (not the copies) go between ncclGroupStart and ncclGroupEnd
  std::vector<Call> calls;
};

// A contiguous operand: its address and size in bytes.
struct Span {
  const void* data;
  std::size_t bytes;
};

// Each rank's chunk offset in bytes for per-rank element counts.
std::vector<std::size_t> byte_displacements(const std::vector<std::int64_t>& counts, std::size_t elem);

// reduce_scatter of input [sum counts] into output [counts[rank]]. In place
// (output is this rank's chunk of input) is NCCL's own in-place form; any
// other overlap must reduce into a staging buffer of output's size first:
// reduce_scatter_staging says whether, and `staging` is that buffer (nullptr
// when none is needed). Equal counts: one ncclReduceScatter; uneven: one
// ncclReduce per rank onto its chunk, in one group.
bool reduce_scatter_staging(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem,
                            int rank);
Plan reduce_scatter(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem, int rank,
                    void* staging);

// all_gather of input [counts[rank]] into output [sum counts]. In place
// (input sits at this rank's chunk of output) is NCCL's in-place form; any
// other overlap copies input to a staging buffer of input's size first.
// Equal counts: one ncclAllGather; uneven: every rank broadcasts its chunk to
// its displacement, in one group.
bool all_gather_staging(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem, int rank);
Plan all_gather(Span input, Span output, const std::vector<std::int64_t>& counts, std::size_t elem, int rank,
                void* staging);

}  // namespace megazero::nccl_plan
