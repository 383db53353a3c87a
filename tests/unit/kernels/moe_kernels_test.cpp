// The mixture of experts' CPU kernels (kernels/ops.def, "mixture of experts"; cpu/moe.cpp):
// - the router: softmax, top-k most probable first, renormalised weights, column sums; exact ties
//   go to the lower expert, near-ties (1 ulp apart) to the larger, the same on every call and
//   thread count; at bf16 the weights are the fp32 ones rounded once;
// - the router's backward against central finite differences of an objective of the weights and
//   the probabilities (through the renormalisation and the softmax);
// - the sort of routed slots by expert: stable, with its inverse and the experts' offsets; an
//   expert id out of range is refused;
// - gather, combine, slot dots, row scaling: each against a plain loop.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/kernels.h"

namespace ds::rt {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Routed {
  std::vector<float> probs, w, sums;
  std::vector<int32_t> idx;
};

Routed route(const std::vector<float>& logits, int N, int E, int k) {
  Routed r{std::vector<float>(size_t(N) * E), std::vector<float>(size_t(N) * k), std::vector<float>(E),
           std::vector<int32_t>(size_t(N) * k)};
  cpu::moe_router_forward(r.probs.data(), r.idx.data(), r.w.data(), r.sums.data(), logits.data(), N, E, k);
  return r;
}

TEST(MoeKernels, RouterPicksTheTopKAndRenormalises) {
  const int N = 37, E = 8, k = 3;
  const auto logits = randn(size_t(N) * E, 1, 2.0f);
  const Routed r = route(logits, N, E, k);
  std::vector<double> sums(E, 0.0);
  for (int n = 0; n < N; n++) {
    double mx = -1e30, z = 0;
    for (int e = 0; e < E; e++) mx = std::max(mx, double(logits[n * E + e]));
    for (int e = 0; e < E; e++) z += std::exp(logits[n * E + e] - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[n * E + a] > logits[n * E + b]; });
    double picked = 0;
    for (int j = 0; j < k; j++) picked += std::exp(logits[n * E + order[j]] - mx) / z;
    for (int e = 0; e < E; e++) {
      const double p = std::exp(logits[n * E + e] - mx) / z;
      EXPECT_NEAR(r.probs[n * E + e], p, 1e-6);
      sums[e] += p;
    }
    for (int j = 0; j < k; j++) {
      EXPECT_EQ(r.idx[n * k + j], order[j]) << "row " << n << " pick " << j;
      EXPECT_NEAR(r.w[n * k + j], std::exp(logits[n * E + order[j]] - mx) / z / picked, 1e-6);
    }
  }
  for (int e = 0; e < E; e++) EXPECT_NEAR(r.sums[e], sums[e], 1e-5);
}

// Exact ties go to the lower index; logits 1 ulp apart pick the larger; the picks do not depend on
// the thread count or the call.
TEST(MoeKernels, NearTiedRoutingIsDeterministic) {
  const int E = 6, k = 2;
  std::vector<float> logits = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,  // all tied: experts 0 and 1
                               1.0f, 0.0f, std::nextafter(1.0f, 2.0f), 0.0f, 1.0f, 0.0f};  // 2 (1 ulp up), then 0
  const Routed r = route(logits, 2, E, k);
  EXPECT_EQ(r.idx[0], 0);
  EXPECT_EQ(r.idx[1], 1);
  EXPECT_EQ(r.idx[2], 2);
  EXPECT_EQ(r.idx[3], 0);
  const int N = 4096;
  std::vector<float> many(size_t(N) * E);
  std::mt19937 rng(3);
  for (auto& x : many) x = 0.25f * static_cast<float>(rng() % 4);  // many exact and near ties
  for (int n = 0; n < N; n += 7) many[size_t(n) * E + n % E] = std::nextafter(many[size_t(n) * E + n % E], 2.0f);
  std::vector<std::vector<int32_t>> runs;
  for (int threads : {1, 2, 1}) {
    omp_set_num_threads(threads);
    runs.push_back(route(many, N, E, k).idx);
  }
  omp_set_num_threads(2);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(MoeKernels, Bf16RouterWeightsAreTheFp32OnesRounded) {
  const int N = 9, E = 4, k = 2;
  const auto logits = randn(size_t(N) * E, 4);
  std::vector<bf16> lb(logits.size());
  for (size_t i = 0; i < logits.size(); i++) lb[i] = from_f32<bf16>(logits[i]);
  std::vector<float> as_f32(logits.size());
  for (size_t i = 0; i < logits.size(); i++) as_f32[i] = to_f32(lb[i]);
  const Routed r32 = route(as_f32, N, E, k);
  Routed r16{std::vector<float>(size_t(N) * E), std::vector<float>(size_t(N) * k), std::vector<float>(E),
             std::vector<int32_t>(size_t(N) * k)};
  cpu::moe_router_forward(r16.probs.data(), r16.idx.data(), r16.w.data(), r16.sums.data(), lb.data(), N, E, k);
  EXPECT_EQ(r16.idx, r32.idx);
  EXPECT_EQ(r16.probs, r32.probs);
  for (size_t i = 0; i < r32.w.size(); i++) EXPECT_EQ(r16.w[i], to_f32(from_f32<bf16>(r32.w[i])));
}

// f(logits) = sum g_slot * w_slot + sum_e a_e * (column sum of probs)_e: the router's backward
// with dw = g and daux = a against central differences (the picks fixed: logits far from ties).
TEST(MoeKernels, RouterBackwardMatchesFiniteDifferences) {
  const int N = 5, E = 6, k = 2;
  auto logits = randn(size_t(N) * E, 7, 1.5f);
  const auto g = randn(size_t(N) * k, 8), a = randn(E, 9);
  auto f = [&](const std::vector<float>& l) {
    const Routed r = route(l, N, E, k);
    double v = 0;
    for (size_t i = 0; i < g.size(); i++) v += double(g[i]) * r.w[i];
    for (int n = 0; n < N; n++) {
      for (int e = 0; e < E; e++) v += double(a[e]) * r.probs[n * E + e];
    }
    return v;
  };
  const Routed r = route(logits, N, E, k);
  std::vector<float> d(logits.size());
  cpu::moe_router_backward(d.data(), r.probs.data(), r.idx.data(), r.w.data(), g.data(), a.data(), N, E, k);
  for (size_t i = 0; i < logits.size(); i++) {
    const float h = 1e-2f;
    auto lp = logits, lm = logits;
    lp[i] += h;
    lm[i] -= h;
    if (route(lp, N, E, k).idx != r.idx || route(lm, N, E, k).idx != r.idx) continue;  // a pick would flip
    const double fd = (f(lp) - f(lm)) / (2.0 * h);
    EXPECT_NEAR(d[i], fd, 2e-3 + 2e-3 * std::fabs(fd)) << "logit " << i;
  }
}

TEST(MoeKernels, SortIsStableWithItsInverseAndOffsets) {
  const int E = 5;
  const std::vector<int32_t> idx = {3, 0, 3, 1, 4, 0, 3, 1};
  std::vector<int32_t> slots(idx.size()), pos(idx.size()), off(E + 1);
  cpu::moe_sort_slots(slots.data(), pos.data(), off.data(), idx.data(), int64_t(idx.size()), E);
  EXPECT_EQ(slots, (std::vector<int32_t>{1, 5, 3, 7, 0, 2, 6, 4}));
  EXPECT_EQ(off, (std::vector<int32_t>{0, 2, 4, 4, 7, 8}));
  for (size_t s = 0; s < idx.size(); s++) EXPECT_EQ(slots[size_t(pos[s])], int32_t(s));
  const std::vector<int32_t> bad = {0, 5};
  EXPECT_THROW(cpu::moe_sort_slots(slots.data(), pos.data(), off.data(), bad.data(), 2, E), Error);
}

TEST(MoeKernels, GatherCombineDotsAndScaleAreTheirLoops) {
  const int N = 6, k = 2, C = 5;
  const auto x = randn(size_t(N) * C, 11), w = randn(size_t(N) * k, 12);
  std::vector<int32_t> idx = {1, 0, 2, 1, 0, 2, 1, 2, 0, 1, 2, 0};
  std::vector<int32_t> slots(idx.size()), pos(idx.size()), off(4);
  cpu::moe_sort_slots(slots.data(), pos.data(), off.data(), idx.data(), int64_t(idx.size()), 3);
  const int64_t NK = int64_t(N) * k;
  std::vector<float> rows(size_t(NK) * C), wrows(rows.size()), back(size_t(N) * C);
  cpu::moe_gather_rows(rows.data(), x.data(), slots.data(), static_cast<const float*>(nullptr), NK, k, C);
  cpu::moe_gather_rows(wrows.data(), x.data(), slots.data(), w.data(), NK, k, C);
  for (int64_t i = 0; i < NK; i++) {
    for (int c = 0; c < C; c++) {
      EXPECT_EQ(rows[i * C + c], x[slots[i] / k * C + c]);
      EXPECT_FLOAT_EQ(wrows[i * C + c], w[slots[i]] * x[slots[i] / k * C + c]);
    }
  }
  // Combining the gathered rows with the weights is the weighted sum of each token's k copies.
  cpu::moe_combine(back.data(), rows.data(), pos.data(), w.data(), N, k, C);
  for (int t = 0; t < N; t++) {
    for (int c = 0; c < C; c++) EXPECT_NEAR(back[t * C + c], (w[t * k] + w[t * k + 1]) * x[t * C + c], 1e-6);
  }
  std::vector<float> dots(NK);
  cpu::moe_slot_dots(dots.data(), rows.data(), wrows.data(), pos.data(), NK, C);
  for (int64_t s = 0; s < NK; s++) {
    double d = 0;
    for (int c = 0; c < C; c++) d += double(rows[pos[s] * C + c]) * wrows[pos[s] * C + c];
    EXPECT_NEAR(dots[s], d, 1e-5);
  }
  auto scaled = rows;
  cpu::moe_scale_rows(scaled.data(), slots.data(), w.data(), NK, C);
  for (size_t i = 0; i < scaled.size(); i++) EXPECT_FLOAT_EQ(scaled[i], wrows[i]);
  std::vector<float> g(NK);
  cpu::moe_gather_f32(g.data(), w.data(), slots.data(), NK);
  for (int64_t i = 0; i < NK; i++) EXPECT_EQ(g[i], w[slots[i]]);
}

}  // namespace
}  // namespace ds::rt
