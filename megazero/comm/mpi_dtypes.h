// MPI datatypes and reduction ops for megazero's dtypes. MPI has no 16-bit
// float types, so fp16 and bf16 travel as 2-byte derived types and reduce with
// user-defined ops that widen each pair to fp32 and round the result once to
// nearest even — the same arithmetic NCCL applies, so CPU and GPU runs reduce
// 16-bit data alike.
#pragma once

#include <mpi.h>

#include "megazero/comm/communicator.h"

namespace megazero::mpi {

MPI_Datatype datatype(DType t);
// MPI_SUM / MPI_MAX for native types, our ops for fp16/bf16. Avg is Sum here;
// the caller divides afterwards.
MPI_Op reduce_op(DType t, ReduceOp op);
// Throws InternalError naming the call and the communicator if rc != MPI_SUCCESS.
void check(int rc, const char* call, const std::string& comm_name);

}  // namespace megazero::mpi
