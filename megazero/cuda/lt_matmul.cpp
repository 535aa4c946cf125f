// cuBLASLt matmuls with epilogues (lt_matmul.h). 16-bit and fp32 operands
// compute in fp32 (CUBLAS_COMPUTE_32F, no TF32: what gemm_cuda.cpp does), fp32
// alpha/beta on the host. The bias and its gradient have D's type, and so
// does the GeLU input (aux): cuBLASLt's defaults, left unset.
#include "megazero/cuda/lt_matmul.h"

#include <cublasLt.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "megazero/core/error.h"
#include "megazero/cuda/blas_types.h"
#include "megazero/cuda/cuda_device.h"

namespace megazero::cuda {
namespace {

// fp64 never gets here (lt_eligible).
cudaDataType_t lt_type(DType t) { return blas_type(t, "cuBLASLt epilogue"); }

cublasLtEpilogue_t lt_code(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::None:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::GeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::DGeluBGrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case LtEpilogue::BGradB:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool has_aux(LtEpilogue e) { return e == LtEpilogue::GeluAuxBias || e == LtEpilogue::DGeluBGrad; }
bool has_bias(LtEpilogue e) { return e != LtEpilogue::None; }

// The largest power of two up to 256 dividing the address: what the
// heuristics assume of a pointer (they read its value) and what the
// preference's minimum alignments say, so a cached algorithm is reused only
// for pointers at least as aligned as the ones it was chosen for.
std::uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 1;
  while (a < 256 && v % (a * 2) == 0) a *= 2;
  return a;
}

std::string describe(const LtMatmul& p) {
  std::ostringstream s;
  s << lt_epilogue_name(p.epilogue) << " m " << p.m << " n " << p.n << " k " << p.k << (p.trans_a ? " A^T" : " A")
    << (p.trans_b ? " B^T" : " B") << " ld " << p.lda << "/" << p.ldb << "/" << p.ldd;
  if (has_aux(p.epilogue)) s << " aux ld " << p.aux_ld;
  s << ", " << dtype_name(p.in) << " -> " << dtype_name(p.out) << (p.beta != 0.0f ? ", accumulating" : "");
  return s.str();
}

// The cuBLASLt objects of one problem, destroyed together.
struct Descriptors {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (d) (void)cublasLtMatrixLayoutDestroy(d);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (matmul) (void)cublasLtMatmulDescDestroy(matmul);
  }
};

// Creates every descriptor of `p`; on failure returns the call that failed
// and cuBLASLt's status (the descriptors made so far are destroyed with `ds`).
std::string build(const LtMatmul& p, std::size_t workspace_bytes, Descriptors& ds) {
  std::string error;
  const auto ok = [&](cublasStatus_t st, const char* call) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    error = detail::concat(call, ": ", cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st), ")");
    return false;
  };
  const auto set = [&](auto attribute, const auto& value, const char* name) {
    return ok(cublasLtMatmulDescSetAttribute(ds.matmul, attribute, &value, sizeof(value)), name);
  };
  const cudaDataType_t in = lt_type(p.in), out = lt_type(p.out);
  if (!ok(cublasLtMatmulDescCreate(&ds.matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"))
    return error;
  const std::int32_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::uint32_t epilogue = lt_code(p.epilogue);
  if (!set(CUBLASLT_MATMUL_DESC_TRANSA, ta, "TRANSA") || !set(CUBLASLT_MATMUL_DESC_TRANSB, tb, "TRANSB") ||
      !set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, "EPILOGUE") ||
      (has_bias(p.epilogue) && !set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, "BIAS_POINTER")))
    return error;
  if (has_aux(p.epilogue)) {
    const std::int64_t aux_ld = p.aux_ld;
    if (!set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux, "EPILOGUE_AUX_POINTER") ||
        !set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, "EPILOGUE_AUX_LD"))
      return error;
  }
  // Stored shapes: op(A) is m x k, so A itself is k x m when transposed.
  const auto rows_a = static_cast<std::uint64_t>(p.trans_a ? p.k : p.m);
  const auto cols_a = static_cast<std::uint64_t>(p.trans_a ? p.m : p.k);
  const auto rows_b = static_cast<std::uint64_t>(p.trans_b ? p.n : p.k);
  const auto cols_b = static_cast<std::uint64_t>(p.trans_b ? p.k : p.n);
  if (!ok(cublasLtMatrixLayoutCreate(&ds.a, in, rows_a, cols_a, p.lda), "cublasLtMatrixLayoutCreate(A)") ||
      !ok(cublasLtMatrixLayoutCreate(&ds.b, in, rows_b, cols_b, p.ldb), "cublasLtMatrixLayoutCreate(B)") ||
      !ok(cublasLtMatrixLayoutCreate(&ds.d, out, static_cast<std::uint64_t>(p.m), static_cast<std::uint64_t>(p.n),
                                     p.ldd),
          "cublasLtMatrixLayoutCreate(D)"))
    return error;
  if (!ok(cublasLtMatmulPreferenceCreate(&ds.pref), "cublasLtMatmulPreferenceCreate")) return error;
  const auto pref = [&](auto attribute, const auto& value, const char* name) {
    return ok(cublasLtMatmulPreferenceSetAttribute(ds.pref, attribute, &value, sizeof(value)), name);
  };
  const std::uint64_t ws = workspace_bytes;
  const std::uint32_t al_a = alignment(p.a), al_b = alignment(p.b), al_d = alignment(p.d);
  if (!pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws, "PREF_MAX_WORKSPACE_BYTES") ||
      !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a, "PREF_MIN_ALIGNMENT_A_BYTES") ||
      !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b, "PREF_MIN_ALIGNMENT_B_BYTES") ||
      !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d, "PREF_MIN_ALIGNMENT_C_BYTES") ||
      !pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d, "PREF_MIN_ALIGNMENT_D_BYTES"))
    return error;
  return {};
}

void check_lt(cublasStatus_t st, const char* call, const LtMatmul& p) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw InternalError(detail::concat("cuBLASLt ", call, " failed for ", describe(p), ": ", cublasLtGetStatusName(st),
                                       " (", cublasLtGetStatusString(st), ")"));
}

// One problem's descriptors and algorithm (or the heuristics' refusal).
struct Plan {
  Descriptors ds;
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;
};

// The problem without its pointers, plus every pointer's alignment and the
// device: what the heuristics' answer depends on.
std::string plan_key(const LtMatmul& p, std::size_t ws_bytes, int device) {
  const std::int64_t v[] = {static_cast<std::int64_t>(p.epilogue),
                            p.m,
                            p.n,
                            p.k,
                            p.trans_a,
                            p.trans_b,
                            p.lda,
                            p.ldb,
                            p.ldd,
                            p.aux_ld,
                            static_cast<std::int64_t>(p.in),
                            static_cast<std::int64_t>(p.out),
                            p.beta != 0.0f,
                            alignment(p.a),
                            alignment(p.b),
                            alignment(p.d),
                            alignment(p.bias),
                            alignment(p.aux),
                            static_cast<std::int64_t>(ws_bytes),
                            device,
                            lt_autotune()};
  std::string key(sizeof(v), '\0');
  std::memcpy(key.data(), v, sizeof(v));
  float ab[2] = {p.alpha, p.beta};
  key.append(reinterpret_cast<const char*>(ab), sizeof(ab));
  return key;
}

// Handles and plans belong to a thread (cuBLASLt handles are not thread
// safe, and a plan's descriptor gets each call's pointers); destroyed at
// thread exit, errors ignored (the runtime may be unloading).
class ThreadState {
 public:
  ~ThreadState() {
    plans_.clear();
    for (auto& [index, h] : handles_) (void)cublasLtDestroy(h);
  }
  cublasLtHandle_t handle(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cublasLtHandle_t h = nullptr;
    const cublasStatus_t st = cublasLtCreate(&h);  // on the current device: the caller holds a guard
    if (st != CUBLAS_STATUS_SUCCESS)
      throw InternalError(detail::concat("cublasLtCreate failed: ", cublasLtGetStatusName(st)));
    handles_.emplace(device, h);
    return h;
  }
  std::unordered_map<std::string, std::unique_ptr<Plan>> plans_;

 private:
  std::unordered_map<int, cublasLtHandle_t> handles_;
};

// Every problem seen, for lt_report (all threads).
std::mutex report_mutex;
std::set<std::string> fused_seen, refused_seen;
struct Tuned {
  std::string problem;
  int kept, candidates;
  double first_ms, kept_ms;
};
std::vector<Tuned> tuned;

constexpr int kAutotuneReps = 3;  // timed runs of each candidate, after one untimed

// The heuristics' candidates for `plan`, each run once untimed and then
// kAutotuneReps times between two events, D (and C when beta is 0) in a
// scratch buffer: an accumulating problem reads its C from p.d and never writes
// it. A candidate whose launch fails is skipped (-1 ms). Empty when the scratch
// cannot be had (the heuristics' first is kept then).
std::vector<double> time_candidates(cublasLtHandle_t h, Plan& plan, const LtMatmul& p,
                                    const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                                    kernels::GpuScratch ws, cudaStream_t stream) {
  const std::size_t elem = dtype_size(p.out);
  const std::size_t d_bytes =
      (static_cast<std::size_t>(p.ldd) * static_cast<std::size_t>(p.n - 1) + static_cast<std::size_t>(p.m)) * elem;
  MZ_CUDA_CHECK(cudaStreamSynchronize(stream));
  void* raw = nullptr;
  if (cudaMalloc(&raw, d_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  const std::unique_ptr<void, void (*)(void*)> scratch(raw, [](void* q) { (void)cudaFree(q); });
  const auto event = [] {
    cudaEvent_t e = nullptr;
    MZ_CUDA_CHECK(cudaEventCreate(&e));
    return std::unique_ptr<CUevent_st, void (*)(cudaEvent_t)>(e, [](cudaEvent_t q) { (void)cudaEventDestroy(q); });
  };
  const auto begin = event(), end = event();
  const void* c = p.beta != 0.0f ? static_cast<const void*>(p.d) : raw;
  std::vector<double> ms;
  for (const auto& r : candidates) {
    const auto run = [&] {
      return cublasLtMatmul(h, plan.ds.matmul, &p.alpha, p.a, plan.ds.a, p.b, plan.ds.b, &p.beta, c, plan.ds.d, raw,
                            plan.ds.d, &r.algo, ws.data, ws.bytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) {
      ms.push_back(-1);
      continue;
    }
    MZ_CUDA_CHECK(cudaEventRecord(begin.get(), stream));
    for (int k = 0; k < kAutotuneReps; ++k) (void)run();
    MZ_CUDA_CHECK(cudaEventRecord(end.get(), stream));
    MZ_CUDA_CHECK(cudaEventSynchronize(end.get()));
    float t = 0;
    MZ_CUDA_CHECK(cudaEventElapsedTime(&t, begin.get(), end.get()));
    ms.push_back(static_cast<double>(t) / kAutotuneReps);
  }
  MZ_CUDA_CHECK(cudaStreamSynchronize(stream));  // the scratch is freed after the runs that write it
  return ms;
}

}  // namespace

namespace {
std::atomic<bool> autotune_on{false};
}  // namespace
void set_lt_autotune(bool on) { autotune_on.store(on); }
bool lt_autotune() { return autotune_on.load(); }

int fastest_candidate(const std::vector<double>& ms) {
  int best = -1;
  for (std::size_t i = 0; i < ms.size(); ++i)
    if (ms[i] >= 0 && (best < 0 || ms[i] < ms[static_cast<std::size_t>(best)])) best = static_cast<int>(i);
  return best < 0 ? 0 : best;
}

const char* lt_epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::None:
      return "none";
    case LtEpilogue::Bias:
      return "bias";
    case LtEpilogue::GeluAuxBias:
      return "bias + GeLU (aux)";
    case LtEpilogue::DGeluBGrad:
      return "GeLU backward + bias gradient";
    case LtEpilogue::BGradB:
      return "weight gradient + bias gradient";
  }
  return "?";
}

LtMatmul describe_linear_forward(LtEpilogue e, std::int64_t rows, std::int64_t in, std::int64_t out, RowMajor x,
                                 RowMajor w, const void* bias, RowMajor y, RowMajor pre, DType in_type,
                                 DType out_type) {
  MZ_CHECK(e == LtEpilogue::Bias || e == LtEpilogue::GeluAuxBias, "describe_linear_forward: a forward epilogue");
  // Y^T [out x N] = W [out x in] X^T [in x N]: W's memory is W^T (in x out),
  // hence transposed; X's memory is X^T (in x N) as it is.
  LtMatmul p;
  p.epilogue = e;
  p.m = out, p.n = rows, p.k = in;
  p.trans_a = true, p.a = w.data, p.lda = w.row_stride;
  p.trans_b = false, p.b = x.data, p.ldb = x.row_stride;
  p.in = in_type, p.out = out_type;
  p.bias = const_cast<void*>(bias);  // read-only in the forward epilogues
  if (e == LtEpilogue::GeluAuxBias) {
    p.aux = const_cast<void*>(pre.data), p.aux_ld = pre.row_stride;
  }
  p.d = const_cast<void*>(y.data), p.ldd = y.row_stride;
  return p;
}

LtMatmul describe_linear_dgelu(std::int64_t rows, std::int64_t in, std::int64_t out, RowMajor dy, RowMajor w,
                               RowMajor pre, RowMajor dpre, void* bias_grad, DType type) {
  // dPre^T [in x N] = W^T [in x out] dY^T [out x N]: both memories as they are.
  LtMatmul p;
  p.epilogue = LtEpilogue::DGeluBGrad;
  p.m = in, p.n = rows, p.k = out;
  p.a = w.data, p.lda = w.row_stride;
  p.b = dy.data, p.ldb = dy.row_stride;
  p.in = p.out = type;
  p.aux = const_cast<void*>(pre.data), p.aux_ld = pre.row_stride;
  p.d = const_cast<void*>(dpre.data), p.ldd = dpre.row_stride;
  p.bias = bias_grad;  // length m = in: sums over D's columns (the rows of dpre)
  return p;
}

LtMatmul describe_linear_wgrad(std::int64_t rows, std::int64_t in, std::int64_t out, RowMajor dy, RowMajor x,
                               RowMajor dw, void* bias_grad, DType type) {
  // dW^T [in x out] += X^T [in x N] dY [N x out]: X's memory is X^T; dY's is
  // dY^T (out x N), hence transposed. BGRADB sums op(B) = dY over k = N.
  LtMatmul p;
  p.epilogue = LtEpilogue::BGradB;
  p.m = in, p.n = out, p.k = rows;
  p.a = x.data, p.lda = x.row_stride;
  p.trans_b = true, p.b = dy.data, p.ldb = dy.row_stride;
  p.in = p.out = type;
  p.beta = 1.0f;
  p.d = const_cast<void*>(dw.data), p.ldd = dw.row_stride;
  p.bias = bias_grad;  // length n = out
  return p;
}

bool lt_eligible(const LtMatmul& p) {
  const auto supported = [](DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; };
  if (!supported(p.in) || !supported(p.out)) return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return false;
  if (has_aux(p.epilogue) && (p.aux_ld % 8 != 0 || p.aux_ld < p.m)) return false;  // cuBLASLt's rule for aux
  return p.lda >= (p.trans_a ? p.k : p.m) && p.ldb >= (p.trans_b ? p.n : p.k) && p.ldd >= p.m;
}

std::string lt_descriptors_error(const LtMatmul& p, std::size_t workspace_bytes) {
  Descriptors ds;
  return build(p, workspace_bytes, ds);
}

bool lt_matmul(const LtMatmul& p, kernels::GpuScratch ws, cudaStream_t stream, int device) {
  MZ_CHECK(lt_eligible(p), "lt_matmul: cuBLASLt cannot take ", describe(p));
  MZ_CHECK(ws.data != nullptr && ws.bytes >= kernels::gpu_scratch::kCublasWorkspaceBytes, "lt_matmul: given ", ws.bytes,
           " bytes of workspace, needs ", kernels::gpu_scratch::kCublasWorkspaceBytes);
  const std::size_t ws_bytes = kernels::gpu_scratch::kCublasWorkspaceBytes;
  thread_local ThreadState state;
  CudaDeviceGuard guard(device);
  cublasLtHandle_t h = state.handle(device);
  std::unique_ptr<Plan>& plan = state.plans_[plan_key(p, ws_bytes, device)];
  if (!plan) {
    auto built = std::make_unique<Plan>();
    const std::string error = build(p, ws_bytes, built->ds);
    // Cached only once built: a failed build throws again on the next call instead of falling back unreported.
    if (!error.empty()) throw InternalError(detail::concat("cuBLASLt descriptors for ", describe(p), ": ", error));
    plan = std::move(built);
    const bool tune = lt_autotune();
    std::vector<cublasLtMatmulHeuristicResult_t> results(tune ? kAutotuneCandidates : 1);
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h, plan->ds.matmul, plan->ds.a, plan->ds.b, plan->ds.d, plan->ds.d,
                                       plan->ds.pref, static_cast<int>(results.size()), results.data(), &found);
    // The usable ones, in the heuristics' order.
    std::vector<cublasLtMatmulHeuristicResult_t> usable;
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i)
      if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS &&
          results[static_cast<std::size_t>(i)].workspaceSize <= ws_bytes)
        usable.push_back(results[static_cast<std::size_t>(i)]);
    plan->supported = !usable.empty();
    if (plan->supported) plan->algo = usable.front().algo;
    if (plan->supported && tune && usable.size() > 1) {
      const std::vector<double> ms = time_candidates(h, *plan, p, usable, {ws.data, ws_bytes}, stream);
      if (!ms.empty()) {
        const int kept = fastest_candidate(ms);
        plan->algo = usable[static_cast<std::size_t>(kept)].algo;
        std::lock_guard<std::mutex> lock(report_mutex);
        tuned.push_back(
            {describe(p), kept, static_cast<int>(usable.size()), ms.front(), ms[static_cast<std::size_t>(kept)]});
      }
    }
    std::lock_guard<std::mutex> lock(report_mutex);
    // The epilogue report's: a plain GEMM (autotuned) cuBLASLt refuses is cuBLAS's (gemm_cuda.cpp), not unfused.
    if (p.epilogue != LtEpilogue::None)
      (plan->supported ? fused_seen : refused_seen)
          .insert(describe(p) + (plan->supported ? ""
                                                 : detail::concat(" (heuristics: ", cublasLtGetStatusName(st), ", ",
                                                                  found, " algorithms)")));
  }
  if (!plan->supported) return false;
  // This call's pointers (the key holds their alignment, not their values).
  const auto set = [&](auto attribute, void* value, const char* name) {
    check_lt(cublasLtMatmulDescSetAttribute(plan->ds.matmul, attribute, &value, sizeof(value)), name, p);
  };
  if (has_bias(p.epilogue)) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias, "set BIAS_POINTER");
  if (has_aux(p.epilogue)) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux, "set EPILOGUE_AUX_POINTER");
  check_lt(cublasLtMatmul(h, plan->ds.matmul, &p.alpha, p.a, plan->ds.a, p.b, plan->ds.b, &p.beta, p.d, plan->ds.d, p.d,
                          plan->ds.d, &plan->algo, ws.data, ws_bytes, stream),
           "cublasLtMatmul", p);
  return true;
}

LtReport lt_report() {
  std::lock_guard<std::mutex> lock(report_mutex);
  LtReport r;
  r.fused_problems = fused_seen.size();
  for (const std::string& s : refused_seen) r.refused += (r.refused.empty() ? "" : "; ") + s;
  for (const Tuned& t : tuned) {
    ++r.autotuned;
    if (t.kept != 0) ++r.autotune_changed;
    if (t.first_ms >= 0) {  // the first ran: the sums compare like with like
      r.autotune_first_ms += t.first_ms;
      r.autotune_best_ms += t.kept_ms;
    }
    char times[160];
    std::snprintf(times, sizeof times, ": heuristics' first %.4f ms, kept #%d of %d %.4f ms (%.3fx)", t.first_ms,
                  t.kept, t.candidates, t.kept_ms, t.kept_ms > 0 ? t.first_ms / t.kept_ms : 0.0);
    r.autotune_lines.push_back(t.problem + times);
  }
  return r;
}

}  // namespace megazero::cuda
