// Lowering of megazero/cuda/sdpa_graph.h to cuDNN's backend API, one
// descriptor per graph tensor and operation, then operation graph ->
// heuristics (mode A) -> the first engine configuration whose workspace fits
// our budget -> execution plan, cached per problem and GPU. Execution binds
// the caller's pointers, the by-value scalars (host memory) and the workspace
// in a variant pack.
#include "megazero/cuda/cudnn_sdpa.h"

#include <cudnn.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <initializer_list>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/cuda/cuda_kernels.h"
#include "megazero/cuda/softmax.h"

namespace megazero::cuda {
namespace {

using sdpa::ElementType;
using sdpa::Graph;
using sdpa::GraphOp;
using sdpa::GraphTensor;
using sdpa::i64;
using sdpa::OpKind;
using sdpa::Pointwise;

[[noreturn]] void fail(cudnnStatus_t st, const std::string& what) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw InternalError(detail::concat("cuDNN attention: ", what, " failed: ", cudnnGetErrorString(st),
                                     last[0] ? std::string(" (") + last + ")" : std::string()));
}

void check(cudnnStatus_t st, const std::string& what) {
  if (st != CUDNN_STATUS_SUCCESS) fail(st, what);
}

// A backend descriptor that destroys itself. Attributes are set with the
// element type spelled out, as the backend API wants.
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
    check(cudnnBackendCreateDescriptor(type, &d_), "creating " + name_);
  }
  ~Descriptor() {
    if (d_) (void)cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  template <typename T>
  Descriptor& set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, const T* values, i64 count,
                  const char* attr_name) {
    check(cudnnBackendSetAttribute(d_, attr, type, count, values), name_ + "." + attr_name);
    return *this;
  }
  Descriptor& set_desc(cudnnBackendAttributeName_t attr, const Descriptor& other, const char* attr_name) {
    cudnnBackendDescriptor_t raw = other.raw();
    return set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw, 1, attr_name);
  }
  void finalize() { check(cudnnBackendFinalize(d_), "finalizing " + name_); }
  cudnnBackendDescriptor_t raw() const { return d_; }
  const std::string& name() const { return name_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string name_;
};

#define MZ_SET(desc, attr, type, ptr, n) (desc).set(attr, type, ptr, n, #attr)
#define MZ_SET_DESC(desc, attr, other) (desc).set_desc(attr, other, #attr)

cudnnDataType_t data_type(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return CUDNN_DATA_FLOAT;
    case ElementType::bf16:
      return CUDNN_DATA_BFLOAT16;
    case ElementType::f16:
      return CUDNN_DATA_HALF;
    case ElementType::i32:
      return CUDNN_DATA_INT32;
    case ElementType::int64:
      return CUDNN_DATA_INT64;
    case ElementType::boolean:
      return CUDNN_DATA_BOOLEAN;
  }
  return CUDNN_DATA_FLOAT;
}

cudnnPointwiseMode_t pointwise_mode(Pointwise m) {
  switch (m) {
    case Pointwise::mul:
      return CUDNN_POINTWISE_MUL;
    case Pointwise::add:
      return CUDNN_POINTWISE_ADD;
    case Pointwise::sub:
      return CUDNN_POINTWISE_SUB;
    case Pointwise::div:
      return CUDNN_POINTWISE_DIV;
    case Pointwise::exp:
      return CUDNN_POINTWISE_EXP;
    case Pointwise::log:
      return CUDNN_POINTWISE_LOG;
    case Pointwise::gen_index:
      return CUDNN_POINTWISE_GEN_INDEX;
    case Pointwise::cmp_ge:
      return CUDNN_POINTWISE_CMP_GE;
    case Pointwise::binary_select:
      return CUDNN_POINTWISE_BINARY_SELECT;
    case Pointwise::identity:
      return CUDNN_POINTWISE_IDENTITY;
  }
  return CUDNN_POINTWISE_IDENTITY;
}

// Every descriptor of one graph, finalized, kept alive together (the
// operation graph and plans refer to them).
class LoweredGraph {
 public:
  explicit LoweredGraph(const Graph& g) : graph_(g) {
    for (const GraphTensor& t : g.tensors) lower_tensor(t);
    for (const GraphOp& op : g.ops) lower_op(op);
  }
  int operation_count() const { return static_cast<int>(ops_.size()); }
  const Graph& graph() const { return graph_; }

  // Needs a handle (a GPU): the operation graph over every operation.
  std::unique_ptr<Descriptor> operation_graph(cudnnHandle_t handle) const {
    auto og = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    std::vector<cudnnBackendDescriptor_t> raw;
    for (const auto& op : ops_) raw.push_back(op->raw());
    MZ_SET(*og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, raw.data(), static_cast<i64>(raw.size()));
    MZ_SET(*og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1);
    og->finalize();
    return og;
  }

 private:
  const Descriptor& tensor(i64 uid) const {
    auto it = tensors_.find(uid);
    MZ_CHECK(it != tensors_.end(), "SDPA graph uses tensor ", uid, " before describing it");
    return *it->second;
  }

  void lower_tensor(const GraphTensor& t) {
    if (tensors_.count(t.uid)) return;  // K^T / V^T: described once, under the caller's uid
    auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + t.name);
    const cudnnDataType_t dt = data_type(t.type);
    const i64 alignment = 16;
    const bool is_virtual = t.is_virtual, by_value = t.by_value;
    MZ_SET(*d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt, 1);
    MZ_SET(*d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, t.dims.data(), static_cast<i64>(t.dims.size()));
    MZ_SET(*d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, t.strides.data(), static_cast<i64>(t.strides.size()));
    MZ_SET(*d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &t.uid, 1);
    MZ_SET(*d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment, 1);
    MZ_SET(*d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual, 1);
    if (by_value) MZ_SET(*d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value, 1);
    d->finalize();
    tensors_.emplace(t.uid, std::move(d));
  }

  void lower_op(const GraphOp& op) {
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;  // every intermediate and accumulation in fp32
    switch (op.kind) {
      case OpKind::matmul: {
        auto mm = std::make_unique<Descriptor>(CUDNN_BACKEND_MATMUL_DESCRIPTOR, op.name + " (matmul)");
        MZ_SET(*mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute, 1);
        mm->finalize();
        auto o = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, op.name);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_MATMUL_ADESC, tensor(op.inputs.at(0)));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_MATMUL_BDESC, tensor(op.inputs.at(1)));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_MATMUL_CDESC, tensor(op.output));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_MATMUL_DESC, *mm);
        o->finalize();
        keep_.push_back(std::move(mm));
        ops_.push_back(std::move(o));
        return;
      }
      case OpKind::pointwise: {
        auto pw = std::make_unique<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, op.name + " (pointwise)");
        const cudnnPointwiseMode_t mode = pointwise_mode(op.pointwise);
        MZ_SET(*pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode, 1);
        const cudnnDataType_t precision = data_type(op.compute);
        MZ_SET(*pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision, 1);
        if (op.pointwise == Pointwise::gen_index) MZ_SET(*pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &op.axis, 1);
        pw->finalize();
        auto o = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op.name);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, tensor(op.inputs.at(0)));
        if (op.inputs.size() > 1) MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, tensor(op.inputs.at(1)));
        if (op.inputs.size() > 2) MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, tensor(op.inputs.at(2)));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, tensor(op.output));
        o->finalize();
        keep_.push_back(std::move(pw));
        ops_.push_back(std::move(o));
        return;
      }
      case OpKind::reduction: {
        auto r = std::make_unique<Descriptor>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, op.name + " (reduction)");
        const cudnnReduceTensorOp_t how =
            op.reduction == sdpa::Reduction::max ? CUDNN_REDUCE_TENSOR_MAX : CUDNN_REDUCE_TENSOR_ADD;
        MZ_SET(*r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how, 1);
        MZ_SET(*r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute, 1);
        r->finalize();
        auto o = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, op.name);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, tensor(op.inputs.at(0)));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, tensor(op.output));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_REDUCTION_DESC, *r);
        o->finalize();
        keep_.push_back(std::move(r));
        ops_.push_back(std::move(o));
        return;
      }
      case OpKind::rng: {
        auto r = std::make_unique<Descriptor>(CUDNN_BACKEND_RNG_DESCRIPTOR, op.name + " (rng)");
        const cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
        MZ_SET(*r, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, &dist, 1);
        MZ_SET(*r, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, &op.keep_probability, 1);
        r->finalize();
        auto o = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR, op.name);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_RNG_YDESC, tensor(op.output));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_RNG_DESC, *r);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_RNG_SEED, tensor(op.inputs.at(0)));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, tensor(op.inputs.at(1)));
        o->finalize();
        keep_.push_back(std::move(r));
        ops_.push_back(std::move(o));
        return;
      }
      case OpKind::reshape: {
        auto o = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, op.name);
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, tensor(op.inputs.at(0)));
        MZ_SET_DESC(*o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, tensor(op.output));
        o->finalize();
        ops_.push_back(std::move(o));
        return;
      }
    }
  }

  Graph graph_;
  std::unordered_map<i64, std::unique_ptr<Descriptor>> tensors_;
  std::vector<std::unique_ptr<Descriptor>> keep_;  // matmul/pointwise/reduction/rng descriptors the ops refer to
  std::vector<std::unique_ptr<Descriptor>> ops_;
};

// ---- plans (GPU only) ----

struct Plan {
  std::unique_ptr<LoweredGraph> lowered;
  std::unique_ptr<Descriptor> op_graph, engine_config, plan;
  std::int64_t workspace = 0;
  i64 engine_index = 0, engine_count = 0;
  // By-value scalars, host memory the variant pack points at (seed/offset
  // slots are written per call).
  std::vector<i64> scalar_uids;
  std::vector<float> scalar_f32;
  bool dropout = false;  // binds the seed and offset tensors
};

// The cuDNN this process loaded (not the headers it was built with) must run
// these graphs as written: before 9.6 the dQ accumulator had to be zeroed by
// the caller, and the frontend refuses 16-bit SDPA on 9.10.0 and 9.10.1.
void require_supported_cudnn() {
  const std::size_t v = cudnnGetVersion();
  MZ_REQUIRE(v >= 90600 && v != 91000 && v != 91001,
             "--attention-backend cudnn needs cuDNN 9.6 or newer (not 9.10.0 "
             "or 9.10.1, whose fused attention has known bugs); this process loaded cuDNN ",
             v, " (built against ", CUDNN_VERSION,
             "): put a newer libcudnn first on LD_LIBRARY_PATH, or use "
             "--attention-backend fused or unfused");
}

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const Graph& g, std::size_t workspace_budget) {
  require_supported_cudnn();
  auto plan = std::make_unique<Plan>();
  plan->lowered = std::make_unique<LoweredGraph>(g);
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  try {  // where cuDNN refuses the graph as a whole: the user's way out is another backend
    plan->op_graph = plan->lowered->operation_graph(handle);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    MZ_SET_DESC(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *plan->op_graph);
    MZ_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode, 1);
    heur.finalize();
  } catch (const InternalError& e) {
    throw ConfigError(detail::concat("cuDNN ", cudnnGetVersion(), " refuses this attention graph: ", e.what(),
                                     "; use --attention-backend fused or unfused"));
  }
  i64 available = 0;
  check(cudnnBackendGetAttribute(heur.raw(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                 &available, nullptr),
        "counting engine configurations");
  MZ_REQUIRE(available > 0, "cuDNN has no engine for this attention graph (cuDNN ", cudnnGetVersion(),
             "); use --attention-backend fused or unfused");
  std::vector<std::unique_ptr<Descriptor>> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (i64 i = 0; i < available; ++i) {
    configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration"));
    raw.push_back(configs.back()->raw());
  }
  i64 returned = 0;
  check(cudnnBackendGetAttribute(heur.raw(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, available,
                                 &returned, raw.data()),
        "reading engine configurations");

  // The heuristics' order, or from MEGAZERO_CUDNN_ENGINE=k on (k, k+1, ...,
  // then 0 .. k-1): a benchmarking knob to time the engine configurations
  // cuDNN offers against its first choice (the log line names the one taken).
  i64 first = 0;
  if (const char* e = std::getenv("MEGAZERO_CUDNN_ENGINE"); e && *e) {
    char* end = nullptr;
    const long k = std::strtol(e, &end, 10);
    MZ_REQUIRE(end && *end == '\0' && k >= 0,
               "MEGAZERO_CUDNN_ENGINE must be an engine configuration index (0, 1, ...), got '", e, "'");
    first = returned > 0 ? static_cast<i64>(k) % returned : 0;
  }
  std::string tried;
  for (i64 step = 0; step < returned; ++step) {
    const i64 i = (first + step) % returned;
    auto candidate = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    MZ_SET(*candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle, 1);
    MZ_SET_DESC(*candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[i]);
    const cudnnStatus_t built = cudnnBackendFinalize(candidate->raw());
    if (built != CUDNN_STATUS_SUCCESS) {  // this engine cannot build it: the next (the reason kept for the error)
      char why[256] = {0};
      cudnnGetLastErrorString(why, sizeof why);
      tried +=
          detail::concat(" #", i, ": ", cudnnGetErrorString(built), why[0] ? std::string(" (") + why + ")" : "", ";");
      continue;
    }
    i64 ws = 0, n = 0;
    check(cudnnBackendGetAttribute(candidate->raw(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                   &ws),
          "reading a plan's workspace size");
    if (static_cast<std::size_t>(ws) > workspace_budget) {
      tried += detail::concat(" #", i, ": needs ", ws, " bytes;");
      continue;
    }
    plan->engine_config = std::move(configs[i]);
    plan->plan = std::move(candidate);
    plan->workspace = ws;
    plan->engine_index = i;
    plan->engine_count = returned;
    break;
  }
  MZ_REQUIRE(plan->plan != nullptr, "cuDNN ", cudnnGetVersion(), " offers ", returned,
             " engine configuration(s) for this attention graph and none builds within the ", workspace_budget,
             "-byte workspace budget (gpu_scratch::cudnn_sdpa_scratch):", tried,
             " use --attention-backend fused or unfused");

  for (const GraphTensor& t : g.tensors) {
    if (t.uid == sdpa::kSeed) plan->dropout = true;
    if (!t.by_value) continue;
    plan->scalar_uids.push_back(t.uid);
    // The causal mask's -inf: cuDNN before 9.10 wants the lowest finite float
    // there instead (the frontend makes the same switch).
    const bool old_mask = std::isinf(t.value) && cudnnGetVersion() < 91000;
    plan->scalar_f32.push_back(old_mask ? std::numeric_limits<float>::lowest() : static_cast<float>(t.value));
  }
  return plan;
}

using PlanKey = std::tuple<int, bool, i64, i64, i64, i64, i64, int, double, double, bool, bool, std::vector<i64>>;

PlanKey key_of(int device, bool backward, const sdpa::Problem& p) {
  std::vector<i64> strides;
  for (const sdpa::Strides4* st : {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv})
    strides.insert(strides.end(), st->begin(), st->end());
  return {device,    backward,        p.b,    p.h,    p.s, p.d, sdpa::kv_heads(p), static_cast<int>(p.io), p.scale,
          p.dropout, p.deterministic, p.bias, strides};
}

struct HandleAndPlans {
  cudnnHandle_t handle = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

// cuDNN handles belong to a thread and a device: one per (thread, GPU).
std::size_t g_plans_built = 0;
std::mutex g_count_mutex;

Plan& plan_for(bool backward, const sdpa::Problem& p, std::size_t budget, cudaStream_t stream, cudnnHandle_t* out) {
  // Never destroyed: at process exit the CUDA runtime may be gone before a
  // thread_local's destructor runs, and cudnnDestroy then can crash the exit
  // of a run that succeeded (PyTorch keeps its cuDNN handles for that reason).
  thread_local auto* per_device = new std::unordered_map<int, HandleAndPlans>();
  int device = 0;
  MZ_CHECK(cudaGetDevice(&device) == cudaSuccess, "cudaGetDevice failed");
  HandleAndPlans& hp = (*per_device)[device];
  if (!hp.handle) check(cudnnCreate(&hp.handle), "cudnnCreate");
  check(cudnnSetStream(hp.handle, stream), "cudnnSetStream");
  *out = hp.handle;
  const PlanKey key = key_of(device, backward, p);
  auto it = hp.plans.find(key);
  if (it == hp.plans.end()) {
    const Graph g = backward ? sdpa::backward_graph(p) : sdpa::forward_graph(p);
    it = hp.plans.emplace(key, build_plan(hp.handle, g, budget)).first;
    std::lock_guard<std::mutex> lock(g_count_mutex);
    ++g_plans_built;
  }
  return *it->second;
}

// rng: two int64 in device memory (the scratch's first piece) that receive the
// seed and offset, written by a one-thread kernel queued before the plan.
void execute(cudnnHandle_t handle, Plan& plan, std::vector<i64> uids, std::vector<void*> pointers,
             CudnnDropoutKey dropout, std::int64_t* rng, void* workspace, cudaStream_t stream) {
  for (std::size_t i = 0; i < plan.scalar_uids.size(); ++i) {
    uids.push_back(plan.scalar_uids[i]);
    pointers.push_back(&plan.scalar_f32[i]);
  }
  if (plan.dropout) {
    store_int64_pair(rng, dropout.seed, dropout.offset, stream);
    uids.push_back(sdpa::kSeed), pointers.push_back(rng);
    uids.push_back(sdpa::kOffset), pointers.push_back(rng + 1);
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  MZ_SET(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(),
         static_cast<i64>(pointers.size()));
  MZ_SET(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<i64>(uids.size()));
  MZ_SET(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace, 1);
  pack.finalize();
  check(cudnnBackendExecute(handle, plan.plan->raw(), pack.raw()), "executing the attention plan");
}

void* carve(kernels::GpuScratch ws, std::size_t offset) { return static_cast<char*>(ws.data) + offset; }

// Every tensor is described to cuDNN as 16-byte aligned (lower_tensor).
void check_aligned(std::initializer_list<const void*> pointers, const char* what) {
  for (const void* ptr : pointers)
    MZ_CHECK(reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0, what, ": an operand at ", ptr,
             " is not 16-byte aligned, as its cuDNN descriptor says");
}

}  // namespace

CudnnDropoutKey cudnn_dropout_seed(const RngKey& key, const kernels::DropoutLayout& layout) {
  // splitmix64 over every field that keys our own masks (the iteration too),
  // so two sites or steps never share a cuDNN stream. The offset stays 0: it
  // is a position in the Philox counter, of which each of cuDNN's threads
  // consumes a window, so offsets 1 apart would give overlapping masks.
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  std::uint64_t h = mix(key.seed);
  for (std::uint64_t field : {static_cast<std::uint64_t>(key.iteration), static_cast<std::uint64_t>(key.layer),
                              static_cast<std::uint64_t>(key.site), static_cast<std::uint64_t>(layout.sample_offset),
                              static_cast<std::uint64_t>(layout.group_offset)})
    h = mix(h ^ field);
  CudnnDropoutKey out;
  out.seed = static_cast<std::int64_t>(h >> 1);
  out.offset = 0;
  return out;
}

int finalize_operations(const sdpa::Graph& graph) { return LoweredGraph(graph).operation_count(); }

namespace {
kernels::gpu_scratch::CudnnSdpaScratch scratch_of(const sdpa::Problem& p, bool backward) {
  return kernels::gpu_scratch::cudnn_sdpa_scratch(backward, p.deterministic, p.b * p.h, p.s, p.d, p.bias ? p.b : 0);
}

// The per-document bias in its scratch piece, made on the stream before the
// graph reads it; its uid and pointer appended to the variant pack's.
void bind_bias(const sdpa::Problem& p, const kernels::gpu_scratch::CudnnSdpaScratch& pieces, kernels::GpuScratch ws,
               const std::int64_t* key_starts, cudaStream_t stream, std::vector<i64>& uids,
               std::vector<void*>& pointers) {
  MZ_CHECK(p.bias == (key_starts != nullptr), "cuDNN attention: a bias problem needs the key starts, and only it");
  if (!p.bias) return;
  void* bias = carve(ws, pieces.bias_offset());
  document_mask_bias(p.io == sdpa::ElementType::bf16 ? DType::BF16 : DType::F16, key_starts, p.b, p.s, bias, stream);
  uids.push_back(sdpa::kBias);
  pointers.push_back(bias);
}
}  // namespace

void cudnn_sdpa_forward(const sdpa::Problem& p, const void* q, const void* k, const void* v, void* o, float* stats,
                        CudnnDropoutKey dropout, kernels::GpuScratch ws, cudaStream_t stream,
                        const std::int64_t* key_starts) {
  const auto pieces = scratch_of(p, false);
  MZ_CHECK(ws.data != nullptr && ws.bytes >= pieces.total(), "cuDNN attention forward: given ", ws.bytes,
           " bytes of scratch, needs ", pieces.total());
  check_aligned({q, k, v, o, stats}, "cuDNN attention forward");
  cudnnHandle_t handle = nullptr;
  Plan& plan = plan_for(false, p, pieces.engine, stream, &handle);
  std::vector<i64> uids{sdpa::kQ, sdpa::kK, sdpa::kV, sdpa::kO, sdpa::kStats};
  std::vector<void*> pointers{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, stats};
  bind_bias(p, pieces, ws, key_starts, stream, uids, pointers);
  execute(handle, plan, std::move(uids), std::move(pointers), dropout, static_cast<std::int64_t*>(ws.data),
          carve(ws, pieces.engine_offset()), stream);
}

void cudnn_sdpa_backward(const sdpa::Problem& p, const void* q, const void* k, const void* v, const void* o,
                         const void* d_o, const float* stats, void* dq, void* dk, void* dv, CudnnDropoutKey dropout,
                         kernels::GpuScratch ws, cudaStream_t stream, const std::int64_t* key_starts) {
  const auto pieces = scratch_of(p, true);
  MZ_CHECK(ws.data != nullptr && ws.bytes >= pieces.total(), "cuDNN attention backward: given ", ws.bytes,
           " bytes of scratch, needs ", pieces.total());
  check_aligned({q, k, v, o, d_o, stats, dq, dk, dv}, "cuDNN attention backward");
  cudnnHandle_t handle = nullptr;
  Plan& plan = plan_for(true, p, pieces.engine, stream, &handle);
  std::vector<i64> uids{sdpa::kQ,     sdpa::kK,  sdpa::kV,  sdpa::kO,  sdpa::kDO,
                        sdpa::kStats, sdpa::kDQ, sdpa::kDK, sdpa::kDV, sdpa::kSoftmaxSum};
  std::vector<void*> pointers{const_cast<void*>(q),
                              const_cast<void*>(k),
                              const_cast<void*>(v),
                              const_cast<void*>(o),
                              const_cast<void*>(d_o),
                              const_cast<float*>(stats),
                              dq,
                              dk,
                              dv,
                              carve(ws, pieces.row_sum_offset())};
  if (!p.deterministic) uids.push_back(sdpa::kDQAccum), pointers.push_back(carve(ws, pieces.dq_accum_offset()));
  bind_bias(p, pieces, ws, key_starts, stream, uids, pointers);
  execute(handle, plan, std::move(uids), std::move(pointers), dropout, static_cast<std::int64_t*>(ws.data),
          carve(ws, pieces.engine_offset()), stream);
}

std::string cudnn_sdpa_prepare(const sdpa::Problem& p, bool backward, cudaStream_t stream) {
  cudnnHandle_t handle = nullptr;
  const Plan& plan = plan_for(backward, p, scratch_of(p, backward).engine, stream, &handle);
  return detail::concat("engine configuration #", plan.engine_index, " of ", plan.engine_count, ", workspace ",
                        plan.workspace, " B");
}

std::string cudnn_versions() {
  return detail::concat("cuDNN ", cudnnGetVersion(), " at run time, built against ", CUDNN_VERSION);
}

std::size_t cudnn_sdpa_cached_plans() {
  std::lock_guard<std::mutex> lock(g_count_mutex);
  return g_plans_built;
}

}  // namespace megazero::cuda
