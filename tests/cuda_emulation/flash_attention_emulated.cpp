// megazero/cuda/flash_attention.cu's kernels, run on the CPU through the
// emulation in shim/ (every thread of a block a host thread, WMMA tiles as
// plain 16x16 products), against a double-precision reference of the same
// contract (kernels/fused_attention.h): output, log-sum-exp and dq/dk/dv, with
// the CPU's dropout mask (rng.h's uniform_at of the global index). Ragged tiles,
// padded head sizes (8 -> 16, 24 -> 32, 40 -> 64), one key, dropout on and off.
// Exit code 1 on any error beyond the 16-bit rounding the kernels do.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "emu_runtime.h"
#include "flash_attention_kernels.inc"  // generated from megazero/cuda/flash_attention.cu (CMake)

using namespace megazero;
using namespace megazero::cuda;
using megazero::cuda::detail_k::i64;

namespace {

// ||a - b|| / max(||b||, floor)
double rel_diff(const std::vector<double>& a, const std::vector<double>& b, double floor = 0) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max({std::sqrt(den), floor, 1e-300});
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Plain loops in double over the 16-bit inputs.
// starts (per-document masks), when not empty: the first key of each row of
// each sample's l.groups matrices, [samples * s].
Reference reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                    const std::vector<double>& g, i64 bh, int s, int d, double p, const RngKey& key,
                    const kernels::DropoutLayout& l, const std::vector<std::int64_t>& starts) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d)), keep = p > 0 ? 1.0 / (1.0 - p) : 1.0;
  const auto n = static_cast<std::size_t>(bh * s * d);
  Reference r{std::vector<double>(n), std::vector<double>(static_cast<std::size_t>(bh * s)), std::vector<double>(n),
              std::vector<double>(n), std::vector<double>(n)};
  for (i64 b = 0; b < bh; ++b) {
    const i64 global = (l.sample_offset + b / l.groups) * l.global_groups + l.group_offset + b % l.groups;
    const auto at = [&](i64 i, int c) { return static_cast<std::size_t>((b * s + i) * d + c); };
    std::vector<double> P(static_cast<std::size_t>(s * s)), M(P.size()), dS(P.size());
    const auto first = [&](int i) {
      return starts.empty() ? 0 : static_cast<int>(starts[static_cast<std::size_t>(b / l.groups * s + i)]);
    };
    for (int i = 0; i < s; ++i) {
      std::vector<double> sc(static_cast<std::size_t>(i + 1), -INFINITY);
      double mx = -INFINITY, sum = 0;
      for (int j = first(i); j <= i; ++j) {
        double a = 0;
        for (int c = 0; c < d; ++c) a += q[at(i, c)] * k[at(j, c)];
        sc[static_cast<std::size_t>(j)] = a * scale;
        mx = std::max(mx, a * scale);
      }
      for (double x : sc) sum += std::exp(x - mx);
      r.lse[static_cast<std::size_t>(b * s + i)] = mx + std::log(sum);
      for (int j = first(i); j <= i; ++j) {
        const auto e = static_cast<std::size_t>(i * s + j);
        P[e] = std::exp(sc[static_cast<std::size_t>(j)] - mx) / sum;
        const auto idx = static_cast<std::uint64_t>(global) * static_cast<std::uint64_t>(s * s) + e;
        M[e] = p == 0 || uniform_at(key, idx) >= p ? keep : 0.0;
      }
      for (int c = 0; c < d; ++c)
        for (int j = 0; j <= i; ++j)
          r.out[at(i, c)] +=
              P[static_cast<std::size_t>(i * s + j)] * M[static_cast<std::size_t>(i * s + j)] * v[at(j, c)];
    }
    for (int i = 0; i < s; ++i) {
      double D = 0;
      for (int c = 0; c < d; ++c) D += g[at(i, c)] * r.out[at(i, c)];
      for (int j = 0; j <= i; ++j) {
        double dp = 0;
        for (int c = 0; c < d; ++c) dp += g[at(i, c)] * v[at(j, c)];
        const auto e = static_cast<std::size_t>(i * s + j);
        dS[e] = P[e] * (dp * M[e] - D);
      }
    }
    for (int i = 0; i < s; ++i)
      for (int c = 0; c < d; ++c)
        for (int j = 0; j <= i; ++j) {
          const auto e = static_cast<std::size_t>(i * s + j);
          r.dq[at(i, c)] += scale * dS[e] * k[at(j, c)];
          r.dk[at(j, c)] += scale * dS[e] * q[at(i, c)];
          r.dv[at(j, c)] += P[e] * M[e] * g[at(i, c)];
        }
  }
  return r;
}

// group > 1: grouped-query attention, k and v hold bh / group heads (query
// head h reads head h / group); the reference gets them repeated per head.
template <typename S, int DP>
// documents: each sample packs documents (per-document masks), of lengths
// that put boundaries inside and at the edges of 64-row tiles and leave whole
// key tiles before a query tile's first start.
bool check(const char* dtype, int samples, int heads, int s, int d, double p, int group = 1, bool documents = false) {
  const i64 bh = static_cast<i64>(samples) * heads, n = bh * s * d, head = static_cast<i64>(s) * d;
  std::mt19937 rng(1234 + static_cast<unsigned>(s + d));
  std::normal_distribution<float> normal;
  std::vector<S> q(static_cast<std::size_t>(n)), k(q.size() / static_cast<std::size_t>(group)), v(k.size()),
      g(q.size());
  std::vector<double> qd(q.size()), kd(q.size()), vd(q.size()), gd(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    q[i] = detail_k::st<S>(normal(rng));
    g[i] = detail_k::st<S>(normal(rng));
    qd[i] = ld(q[i]), gd[i] = ld(g[i]);
  }
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = detail_k::st<S>(normal(rng));
    v[i] = detail_k::st<S>(normal(rng));
  }
  for (i64 h = 0; h < bh; ++h)
    for (i64 e = 0; e < head; ++e) {
      const auto at = static_cast<std::size_t>(h * head + e), from = static_cast<std::size_t>(h / group * head + e);
      kd[at] = ld(k[from]), vd[at] = ld(v[from]);
    }
  kernels::DropoutLayout l;
  l.samples = samples, l.groups = heads, l.matrix_rows = l.matrix_cols = s, l.sample_offset = 3, l.group_offset = 1,
  l.global_groups = heads + 2;
  const RngKey key{11, 5, 2, kRngAttentionDropout};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d)), log2e = 1.4426950408889634f;
  const Dropout drop{philox_key(key), keep_threshold(p), p > 0, static_cast<float>(p > 0 ? 1.0 / (1.0 - p) : 1.0), l};
  std::vector<std::int64_t> starts;
  if (documents)
    for (int b = 0; b < samples; ++b)
      for (int i = 0, start = 0; i < s; ++i) {
        // Even samples: documents start at a tile's edge (64), after a one-token
        // document (65) and at 130, so query tile 2 (rows 128..) skips key tile
        // 0; odd samples: inside tiles (10, 100, 140).
        const bool even = b % 2 == 0;
        if (even ? (i == 64 || i == 65 || i == 130) : (i == 10 || i == 100 || i == 140)) start = i;
        starts.push_back(start);
      }
  const Documents docs{documents ? starts.data() : nullptr, heads};
  const S nan = detail_k::st<S>(NAN);  // outputs start as NaN: an element a kernel forgets shows up
  std::vector<S> out(q.size(), nan), dq(q.size(), nan), dk(q.size(), nan), dv(q.size(), nan);  // dk, dv per query head
  std::vector<float> lse(static_cast<std::size_t>(bh * s), NAN), dot(lse.size(), NAN);
  const dim3 grid{static_cast<unsigned>(bh), static_cast<unsigned>((s + 63) / 64), 1};
  emu_launch(grid, 128, ForwardSmem<S, DP>::bytes, [&] {
    flash_forward_kernel<S, DP>(q.data(), k.data(), v.data(), out.data(), lse.data(), s, d, group, scale * log2e, drop,
                                docs);
  });
  emu_launch(dim3{1, 1, 1}, 256, 0, [&] { row_dot_kernel<S>(out.data(), g.data(), dot.data(), bh * s, d); });
  emu_launch(grid, 128, KeySmem<S, DP>::bytes, [&] {
    flash_backward_dkdv_kernel<S, DP>(q.data(), k.data(), v.data(), g.data(), lse.data(), dot.data(), dk.data(),
                                      dv.data(), s, d, group, scale, scale * log2e, drop, docs);
  });
  emu_launch(grid, 128, QuerySmem<S, DP>::bytes, [&] {
    flash_backward_dq_kernel<S, DP>(q.data(), k.data(), v.data(), g.data(), lse.data(), dot.data(), dq.data(), s, d,
                                    group, scale, scale * log2e, drop, docs);
  });
  const Reference ref = reference(qd, kd, vd, gd, bh, s, d, p, key, l, starts);
  auto doubles = [](const auto& x) {
    std::vector<double> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = static_cast<double>(ld(x[i]));
    return r;
  };
  // With one key the softmax has no gradient: dq and dk are rounding noise, measured against dv's size.
  const double floor = s == 1 ? norm(ref.dv) : 0.0;
  const double e_out = rel_diff(doubles(out), ref.out), e_lse = rel_diff(doubles(lse), ref.lse),
               e_dq = rel_diff(doubles(dq), ref.dq, floor), e_dk = rel_diff(doubles(dk), ref.dk, floor),
               e_dv = rel_diff(doubles(dv), ref.dv);
  // bf16 keeps 8 bits, fp16 11: a few roundings of P, dS and the outputs.
  const double tol = std::is_same_v<S, __nv_bfloat16> ? 1e-2 : 2e-3;
  const bool ok = e_out <= tol && e_lse <= 1e-6 && e_dq <= 2 * tol && e_dk <= 2 * tol && e_dv <= 2 * tol;
  std::printf(
      "%s %s samples %d heads %d (kv group %d) s %4d d %3d (DP %3d) p %.1f%s: out %.1e lse %.1e dq %.1e dk %.1e "
      "dv %.1e\n",
      ok ? "ok  " : "FAIL", dtype, samples, heads, group, s, d, DP, p, documents ? " documents" : "", e_out, e_lse,
      e_dq, e_dk, e_dv);
  return ok;
}

}  // namespace

int main() {
  bool ok = true;
  for (double p : {0.0, 0.2}) {
    ok &= check<__nv_bfloat16, 64>("bf16", 1, 1, 1, 64, p);
    ok &= check<__nv_bfloat16, 64>("bf16", 2, 2, 100, 64, p);
    ok &= check<__half, 128>("fp16", 1, 3, 200, 128, p);
    ok &= check<__half, 64>("fp16", 2, 1, 130, 40, p);
    ok &= check<__nv_bfloat16, 16>("bf16", 1, 2, 67, 8, p);
    ok &= check<__half, 32>("fp16", 1, 1, 129, 24, p);
    // Grouped-query attention: 4 heads reading 2 (and 1) k/v heads in place.
    ok &= check<__nv_bfloat16, 64>("bf16", 2, 4, 100, 64, p, 2);
    ok &= check<__half, 32>("fp16", 1, 4, 70, 32, p, 4);
    // Documents packed into samples: key tiles skipped, boundaries inside tiles, GQA.
    ok &= check<__nv_bfloat16, 64>("bf16", 2, 2, 200, 64, p, 1, true);
    ok &= check<__half, 32>("fp16", 2, 4, 150, 32, p, 2, true);
  }
  std::printf("%s\n", ok ? "all cases within tolerance" : "some cases FAILED");
  return ok ? 0 : 1;
}
