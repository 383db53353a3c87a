// Causal grouped-query attention, forward and backward, with k and v read in place from the
// qkv rows (never expanded to NH heads). The math per query head is attention.cpp's (flash-
// style, one (T,T) tile per thread, backward recomputing the probabilities from the lse):
//   S = scale Q K^T,  P = softmax over j <= t,  O = P V;
//   dP = dO V^T,  dS = scale P (dP - rowsum(dO o O)),  dQ = dS K,  dK += dS^T Q,  dV += P^T dO.
// The only change is which k/v columns a query head reads, and that the backward walks a kv
// head's group of query heads in one task, summing their dK and dV in head order (beta 1 after
// the first), so the result does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
constexpr int kRows = 64;

struct Geometry {
  int T, NH, KV, hd;
  int64_t stride() const { return static_cast<int64_t>(NH + 2 * KV) * hd; }  // qkv row
  int64_t ostride() const { return static_cast<int64_t>(NH) * hd; }          // out row
  int group() const { return NH / KV; }
  int64_t q_col(int h) const { return static_cast<int64_t>(h) * hd; }
  int64_t k_col(int g) const { return static_cast<int64_t>(NH + g) * hd; }
  int64_t v_col(int g) const { return static_cast<int64_t>(NH + KV + g) * hd; }
};

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

// One query head's forward: q, k, v point at the head's first row; out at its output columns.
void head_forward(float* o, float* l, const float* q, const float* k, const float* v, float* S, const Geometry& G,
                  float scale) {
  const int T = G.T, hd = G.hd;
  const int64_t st = G.stride(), os = G.ostride();
  for (int r0 = 0; r0 < T; r0 += kRows) {
    const int r1 = std::min(T, r0 + kRows);
    gemm(false, true, r1 - r0, r1, hd, scale, q + r0 * st, static_cast<int>(st), k, static_cast<int>(st), 0.0f,
         S + static_cast<int64_t>(r0) * T, T);
    for (int t = r0; t < r1; t++) l[t] = softmax_row(S + static_cast<int64_t>(t) * T, t, r1);
    gemm(false, false, r1 - r0, hd, r1, 1.0f, S + static_cast<int64_t>(r0) * T, T, v, static_cast<int>(st), 0.0f,
         o + r0 * os, static_cast<int>(os));
  }
}

struct HeadGrads {
  float *dq, *dk, *dv;
  float beta;  // 0 for the group's first head (dk, dv overwritten), then 1 (summed)
};

void head_backward(const HeadGrads& d, const float* dO, const float* o, const float* l, const float* q,
                   const float* k, const float* v, float* P, const Geometry& G, float scale) {
  const int T = G.T, hd = G.hd;
  const int st = static_cast<int>(G.stride()), os = static_cast<int>(G.ostride());
  float* dS = P + static_cast<size_t>(T) * T;
  for (int r0 = 0; r0 < T; r0 += kRows) {
    const int r1 = std::min(T, r0 + kRows);
    gemm(false, true, r1 - r0, r1, hd, scale, q + static_cast<int64_t>(r0) * st, st, k, st, 0.0f,
         P + static_cast<int64_t>(r0) * T, T);
    gemm(false, true, r1 - r0, r1, hd, 1.0f, dO + static_cast<int64_t>(r0) * os, os, v, st, 0.0f,
         dS + static_cast<int64_t>(r0) * T, T);
    for (int t = r0; t < r1; t++) {
      float* prow = P + static_cast<int64_t>(t) * T;
      probs_row(prow, l[t], t, T);
      const float D = vdot(dO + static_cast<int64_t>(t) * os, o + static_cast<int64_t>(t) * os, hd);
      dscores_row(dS + static_cast<int64_t>(t) * T, prow, D, scale, t, T);
    }
    gemm(false, false, r1 - r0, hd, r1, 1.0f, dS + static_cast<int64_t>(r0) * T, T, k, st, 0.0f,
         d.dq + static_cast<int64_t>(r0) * st, st);
  }
  gemm(true, false, T, hd, T, 1.0f, dS, T, q, st, d.beta, d.dk, st);
  gemm(true, false, T, hd, T, 1.0f, P, T, dO, os, d.beta, d.dv, st);
}

}  // namespace

void attention_gqa_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T, int NH, int KV,
                           int hd) {
  const Geometry G{T, NH, KV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * NH > 1 && int64_t{T} * T * NH * hd >= kParallelWork)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH, g = h / G.group();
    float* S = scratch + static_cast<size_t>(omp_get_thread_num()) * 2 * T * T;
    const float* row0 = qkv + static_cast<int64_t>(b) * T * G.stride();
    head_forward(out + static_cast<int64_t>(b) * T * G.ostride() + G.q_col(h), lse + static_cast<int64_t>(bh) * T,
                 row0 + G.q_col(h), row0 + G.k_col(g), row0 + G.v_col(g), S, G, scale);
  }
}

void attention_gqa_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                            float* scratch, int B, int T, int NH, int KV, int hd) {
  const Geometry G{T, NH, KV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * KV > 1 && int64_t{T} * T * NH * hd >= kParallelWork)
  for (int bg = 0; bg < B * KV; bg++) {
    const int b = bg / KV, g = bg % KV;
    float* P = scratch + static_cast<size_t>(omp_get_thread_num()) * 2 * T * T;
    const int64_t rbase = static_cast<int64_t>(b) * T * G.stride(), obase = static_cast<int64_t>(b) * T * G.ostride();
    const float* row0 = qkv + rbase;
    float* drow0 = dqkv + rbase;
    for (int j = 0; j < G.group(); j++) {
      const int h = g * G.group() + j;
      const HeadGrads d{drow0 + G.q_col(h), drow0 + G.k_col(g), drow0 + G.v_col(g), j == 0 ? 0.0f : 1.0f};
      head_backward(d, dout + obase + G.q_col(h), out + obase + G.q_col(h),
                    lse + (static_cast<int64_t>(b) * NH + h) * T, row0 + G.q_col(h), row0 + G.k_col(g),
                    row0 + G.v_col(g), P, G, scale);
    }
  }
}

}  // namespace ds::rt::cpu
