#include "megazero/comm/mpi_dtypes.h"

#include <algorithm>
#include <mutex>

#include "megazero/core/error.h"

namespace megazero::mpi {
namespace {

struct Types {
  MPI_Datatype f16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op sum16 = MPI_OP_NULL, max16 = MPI_OP_NULL;
};
Types g_types;
std::once_flag g_once;

template <typename Bin>
void combine16(void* in, void* inout, MPI_Count* len, MPI_Datatype* dt, Bin bin) {
  const auto n = static_cast<std::size_t>(*len);
  if (*dt == g_types.f16) {
    auto* a = static_cast<const Half*>(in);
    auto* b = static_cast<Half*>(inout);
    for (std::size_t i = 0; i < n; ++i) b[i] = float_to_half(bin(half_to_float(a[i]), half_to_float(b[i])));
  } else {
    auto* a = static_cast<const BFloat16*>(in);
    auto* b = static_cast<BFloat16*>(inout);
    for (std::size_t i = 0; i < n; ++i) b[i] = float_to_bf16(bin(bf16_to_float(a[i]), bf16_to_float(b[i])));
  }
}

void sum16(void* in, void* inout, MPI_Count* len, MPI_Datatype* dt) {
  combine16(in, inout, len, dt, [](float a, float b) { return a + b; });
}
void max16(void* in, void* inout, MPI_Count* len, MPI_Datatype* dt) {
  // NaN-propagating, like fp32 max in NCCL.
  combine16(in, inout, len, dt, [](float a, float b) { return (a != a || a > b) ? a : b; });
}

// MPI calls attribute-delete callbacks on MPI_COMM_SELF first thing in
// MPI_Finalize: the standard hook to free our types and ops before MPI goes.
int release_types(MPI_Comm, int, void*, void*) {
  MPI_Type_free(&g_types.f16);
  MPI_Type_free(&g_types.bf16);
  MPI_Op_free(&g_types.sum16);
  MPI_Op_free(&g_types.max16);
  return MPI_SUCCESS;
}

void init_types() {
  std::call_once(g_once, [] {
    int keyval = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &release_types, &keyval, nullptr);
    MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    MPI_Comm_free_keyval(&keyval);
    MPI_Type_contiguous(2, MPI_BYTE, &g_types.f16);
    MPI_Type_commit(&g_types.f16);
    MPI_Type_contiguous(2, MPI_BYTE, &g_types.bf16);
    MPI_Type_commit(&g_types.bf16);
    MPI_Op_create_c(&sum16, /*commute=*/1, &g_types.sum16);
    MPI_Op_create_c(&max16, /*commute=*/1, &g_types.max16);
  });
}

}  // namespace

MPI_Datatype datatype(DType t) {
  init_types();
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::F16:
      return g_types.f16;
    case DType::BF16:
      return g_types.bf16;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  throw InternalError("no MPI datatype for this dtype");
}

MPI_Op reduce_op(DType t, ReduceOp op) {
  init_types();
  const bool is16 = t == DType::F16 || t == DType::BF16;
  MZ_CHECK(t != DType::U8 || op == ReduceOp::Max, "uint8 tensors reduce with max only");
  if (op == ReduceOp::Max) return is16 ? g_types.max16 : MPI_MAX;
  return is16 ? g_types.sum16 : MPI_SUM;
}

void check(int rc, const char* call, const std::string& comm_name) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw InternalError(
      detail::concat(comm_name, ": ", call, " failed: ", std::string(msg, static_cast<std::size_t>(len))));
}

}  // namespace megazero::mpi
