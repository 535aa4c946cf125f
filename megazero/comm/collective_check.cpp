#include "megazero/comm/collective_check.h"

#include <atomic>
#include <sstream>

#include "megazero/comm/fault_tolerance.h"

namespace megazero {
namespace {

std::atomic<bool> g_check_default{false};

// Word layout of a fingerprint.
enum Word : std::size_t { kMagic, kType, kOp, kDType, kCount, kSeq, kPeer, kCountsHash };
constexpr std::int64_t kMagicValue = 0x6d7a6670;  // "mzfp": a garbled exchange shows up as such

bool has_reduce_op(CollectiveType t) {
  return t == CollectiveType::AllReduce || t == CollectiveType::ReduceScatter || t == CollectiveType::Reduce;
}

// "all_reduce(sum, f32, 4096)", "broadcast(f32, 10, root 1)", "barrier()".
std::string describe(const detail::Fingerprint& f) {
  if (f[kMagic] != kMagicValue) return "something unreadable (a corrupted fingerprint)";
  const auto t = static_cast<CollectiveType>(f[kType]);
  if (f[kType] < 0 || f[kType] >= static_cast<std::int64_t>(kNumCollectiveTypes)) return "an unknown collective";
  std::ostringstream os;
  os << collective_name(t) << "(";
  if (t != CollectiveType::Barrier) {
    if (has_reduce_op(t)) os << reduce_op_name(static_cast<ReduceOp>(f[kOp])) << ", ";
    os << dtype_name(static_cast<DType>(f[kDType])) << ", " << f[kCount];
    if (f[kPeer] >= 0) os << ", root " << f[kPeer];
  }
  os << ")";
  return os.str();
}

}  // namespace

void set_check_collectives_default(bool on) { g_check_default.store(on); }
bool check_collectives_default() { return g_check_default.load(); }

namespace detail {

Fingerprint make_fingerprint(const CollectiveRecord& r, std::uint64_t counts_hash) {
  Fingerprint f{};
  f[kMagic] = kMagicValue;
  f[kType] = static_cast<std::int64_t>(r.type);
  f[kOp] = static_cast<std::int64_t>(r.op);
  f[kDType] = static_cast<std::int64_t>(r.dtype);
  f[kCount] = r.count;
  f[kSeq] = static_cast<std::int64_t>(r.seq);
  f[kPeer] = r.peer;
  f[kCountsHash] = static_cast<std::int64_t>(counts_hash);
  return f;
}

std::uint64_t hash_counts(const std::vector<std::int64_t>& counts) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
  for (auto c : counts) {
    h ^= static_cast<std::uint64_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

std::string compare_fingerprints(const std::vector<std::int64_t>& all, int size, const std::string& comm_name) {
  auto at = [&](int r) {
    Fingerprint f{};
    for (std::size_t i = 0; i < kFingerprintWords; ++i) f[i] = all[static_cast<std::size_t>(r) * kFingerprintWords + i];
    return f;
  };
  const Fingerprint first = at(0);
  for (int r = 1; r < size; ++r) {
    const Fingerprint other = at(r);
    if (other == first) continue;
    std::ostringstream os;
    os << "--check-collectives: collective #" << first[kSeq] << " on communicator '" << comm_name
       << "' diverged: rank 0 issued " << describe(first) << " but rank " << r << " issued " << describe(other);
    if (other[kSeq] != first[kSeq])
      os << " as its collective #" << other[kSeq] << " (one of them skipped or added a collective)";
    else if (describe(other) == describe(first) && other[kCountsHash] != first[kCountsHash])
      os << " with different per-rank counts";
    os << "; every rank of a communicator must issue the same collectives in the same order";
    return os.str();
  }
  return {};
}

}  // namespace detail
}  // namespace megazero
