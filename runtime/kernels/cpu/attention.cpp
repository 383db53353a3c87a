// Causal multi-head self-attention, forward and backward, one (b, h) pair per task.
//
// Forward, per head, in row blocks of kRows queries [r0, r1) (causality: keys [0, r1) only):
//   S = scale * Q[r0:r1] K[0:r1]^T                (gemm into the thread's (T,T) tile)
//   P = softmax over j <= t (row t), lse[t] = max + log(sum exp)   (P written over S, 0 for j > t)
//   O[r0:r1] = P V[0:r1]                         (gemm)
// Backward recomputes P = exp(S - lse) the same way (no (T,T) activation is kept), then
//   dP = dO V^T, D_t = dO[t] . O[t], dS = scale * P * (dP - D_t),
//   dQ = dS K, dK = dS^T Q, dV = P^T dO          (gemms; the upper triangle of P and dS is 0).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace attention_rows {

DS_SIMD_CLONES
float softmax_row(float* s, int t, int width) {
  const float mx = vmax(s, t + 1);
  const float sum = vexp_inplace_sum(s, mx, t + 1);
  const float inv = 1.0f / sum;
  for (int j = 0; j <= t; j++) s[j] *= inv;
  for (int j = t + 1; j < width; j++) s[j] = 0.0f;
  return mx + std::log(sum);
}

DS_SIMD_CLONES
void probs_row(float* s, float lse, int t, int width) {
  for (int j = 0; j <= t; j++) s[j] = vexp(s[j] - lse);
  for (int j = t + 1; j < width; j++) s[j] = 0.0f;
}

DS_SIMD_CLONES
void dscores_row(float* dp, const float* p, float D, float scale, int t, int width) {
  for (int j = 0; j <= t; j++) dp[j] = scale * p[j] * (dp[j] - D);
  for (int j = t + 1; j < width; j++) dp[j] = 0.0f;
}

}  // namespace attention_rows

namespace {
using namespace attention_rows;
constexpr int kRows = 64;

// Scores of rows [r0, r1) against keys [0, r1), into tile rows r0.. (row stride T).
void scores(float* S, const float* q, const float* k, int r0, int r1, int C3, int T, int hs,
            float scale) {
  gemm(false, true, r1 - r0, r1, hs, scale, q + static_cast<int64_t>(r0) * C3, C3, k, C3, 0.0f,
       S + static_cast<int64_t>(r0) * T, T);
}
}  // namespace

size_t attention_scratch_floats(int T) {
  return static_cast<size_t>(omp_get_max_threads()) * 2 * static_cast<size_t>(T) * T;
}

void attention_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                       int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * NH > 1 && int64_t{T} * T * C >= kParallelWork)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    float* S = scratch + static_cast<size_t>(omp_get_thread_num()) * 2 * T * T;
    const float* q = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* o = out + static_cast<int64_t>(b) * T * C + h * hs;
    float* l = lse + static_cast<int64_t>(bh) * T;
    for (int r0 = 0; r0 < T; r0 += kRows) {
      const int r1 = std::min(T, r0 + kRows);
      scores(S, q, k, r0, r1, C3, T, hs, scale);
      for (int t = r0; t < r1; t++) l[t] = softmax_row(S + static_cast<int64_t>(t) * T, t, r1);
      gemm(false, false, r1 - r0, hs, r1, 1.0f, S + static_cast<int64_t>(r0) * T, T, v, C3, 0.0f,
           o + static_cast<int64_t>(r0) * C, C);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * NH > 1 && int64_t{T} * T * C >= kParallelWork)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    float* P = scratch + static_cast<size_t>(omp_get_thread_num()) * 2 * T * T;
    float* dS = P + static_cast<size_t>(T) * T;
    const int64_t qoff = static_cast<int64_t>(b) * T * C3 + h * hs;
    const float* q = qkv + qoff;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const int64_t ooff = static_cast<int64_t>(b) * T * C + h * hs;
    const float* o = out + ooff;
    const float* dO = dout + ooff;
    const float* l = lse + static_cast<int64_t>(bh) * T;
    float* dq = dqkv + qoff;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    for (int r0 = 0; r0 < T; r0 += kRows) {
      const int r1 = std::min(T, r0 + kRows);
      scores(P, q, k, r0, r1, C3, T, hs, scale);
      // dP rows [r0, r1) = dO V^T over keys [0, r1).
      gemm(false, true, r1 - r0, r1, hs, 1.0f, dO + static_cast<int64_t>(r0) * C, C, v, C3, 0.0f,
           dS + static_cast<int64_t>(r0) * T, T);
      for (int t = r0; t < r1; t++) {
        float* prow = P + static_cast<int64_t>(t) * T;
        probs_row(prow, l[t], t, T);
        const float D = vdot(dO + static_cast<int64_t>(t) * C, o + static_cast<int64_t>(t) * C, hs);
        dscores_row(dS + static_cast<int64_t>(t) * T, prow, D, scale, t, T);
      }
      // dQ rows [r0, r1) = dS K over keys [0, r1).
      gemm(false, false, r1 - r0, hs, r1, 1.0f, dS + static_cast<int64_t>(r0) * T, T, k, C3, 0.0f,
           dq + static_cast<int64_t>(r0) * C3, C3);
    }
    // dK = dS^T Q and dV = P^T dO over all rows (zeros above the diagonal).
    gemm(true, false, T, hs, T, 1.0f, dS, T, q, C3, 0.0f, dk, C3);
    gemm(true, false, T, hs, T, 1.0f, P, T, dO, C, 0.0f, dv, C3);
  }
}

}  // namespace ds::rt::cpu
