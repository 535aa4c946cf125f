#include "megazero/comm/activity.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace megazero {
namespace {

// Constant-initialised, so usable from static initialisers and at exit.
std::mutex g_mu;
char g_label[kMaxActivityLength + 1] = {};
std::size_t g_length = 0;
std::atomic<std::int64_t> g_iteration{-1};

void store(const char* text, std::size_t n) {
  n = std::min(n, kMaxActivityLength);
  std::lock_guard<std::mutex> lock(g_mu);
  std::memcpy(g_label, text, n);
  g_length = n;
}

}  // namespace

void set_activity(std::string_view label) { store(label.data(), label.size()); }

void set_activity_iteration(std::int64_t iteration) { g_iteration.store(iteration, std::memory_order_relaxed); }

std::string describe_activity() {
  std::string label;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    label.assign(g_label, g_length);
  }
  const auto it = g_iteration.load(std::memory_order_relaxed);
  if (it < 0) return label.empty() ? "no activity label set" : label;
  const std::string iteration = "iteration " + std::to_string(it);
  return label.empty() ? iteration : iteration + ": " + label;
}

Activity::Activity(std::string_view label) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    std::memcpy(previous_, g_label, g_length);
    previous_length_ = g_length;
  }
  set_activity(label);
}

Activity::~Activity() { store(previous_, previous_length_); }

}  // namespace megazero
