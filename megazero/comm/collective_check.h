// The --check-collectives fingerprint (internal; see fault_tolerance.h).
// A fixed number of int64 per rank, so the exchange is the same all-gather on
// every rank whatever each one is about to issue: the check itself can never
// mismatch. Only fields that must agree across ranks are compared; the
// communicator's name is a per-rank label and is left out.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "megazero/comm/communicator.h"

namespace megazero::detail {

inline constexpr std::size_t kFingerprintWords = 8;
using Fingerprint = std::array<std::int64_t, kFingerprintWords>;

// counts_hash: hash_counts() of the per-rank counts (reduce-scatter /
// all-gather), 0 otherwise.
Fingerprint make_fingerprint(const CollectiveRecord& r, std::uint64_t counts_hash);
std::uint64_t hash_counts(const std::vector<std::int64_t>& counts);

// all: size fingerprints back to back. Empty if they all agree, otherwise the
// message every rank throws (the same text on every rank: rank 0 against the
// first rank that differs from it).
std::string compare_fingerprints(const std::vector<std::int64_t>& all, int size, const std::string& comm_name);

}  // namespace megazero::detail
