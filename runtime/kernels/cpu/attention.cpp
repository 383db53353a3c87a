// Causal multi-head self-attention, forward and backward, one (b, h) pair per task.
//
// Forward, per head, in row blocks of kRows queries [r0, r1) (causality: keys [0, r1) only):
//   S = scale * Q[r0:r1] K[0:r1]^T                (gemm into the thread's (T,T) tile)
// With documents (packing: row t sees keys [ds[t], t]) the block's gemms start at the block's
// lowest document start k0, so a block past a document boundary skips the earlier keys; the row
// steps run over [ds[t], t] and zero the rest of the block's row; backward sums dK and dV block by
// block over [k0, r1) instead of one (T,T) product. A window whose starts are all 0 runs the path
// without documents, bit for bit.
//   P = softmax over j <= t (row t), lse[t] = max + log(sum exp)   (P written over S, 0 for j > t)
//   O[r0:r1] = P V[0:r1]                         (gemm)
// Backward recomputes P = exp(S - lse) the same way (no (T,T) activation is kept), then
//   dP = dO V^T, D_t = dO[t] . O[t], dS = scale * P * (dP - D_t),
//   dQ = dS K, dK = dS^T Q, dV = P^T dO          (gemms; the upper triangle of P and dS is 0).
// With 16-bit storage each (b, h) head's q, k, v (and o, dO) are converted to fp32 in the
// thread's scratch, the fp32 code runs on them, and the results are rounded once into place;
// except at bf16 on a processor with AVX512-BF16 (T and hs even), where the head runs on bf16
// operands with fp32 sums (attention_bf16.cpp), as PyTorch's autocast runs it.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

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

namespace {
constexpr int kRows = 64;

// The lowest document start of rows [r0, r1) (0 without documents): a block's keys before it are
// masked for every row, so the block's gemms start there.
int first_key(const int32_t* ds, int r0, int r1) {
  if (ds == nullptr) return 0;
  int k0 = ds[r0];
  for (int t = r0 + 1; t < r1; t++) k0 = std::min(k0, ds[t]);
  return k0;
}
}  // namespace

void head_forward(float* o, int ldo, float* l, const float* q, const float* k, const float* v,
                  int ldq, float* S, int T, int hs, float scale, const int32_t* ds) {
  for (int r0 = 0; r0 < T; r0 += kRows) {
    const int r1 = std::min(T, r0 + kRows);
    const int k0 = first_key(ds, r0, r1);
    // Scores of rows [r0, r1) against keys [k0, r1), into tile columns k0.. (row stride T).
    gemm(false, true, r1 - r0, r1 - k0, hs, scale, q + static_cast<int64_t>(r0) * ldq, ldq,
         k + static_cast<int64_t>(k0) * ldq, ldq, 0.0f, S + static_cast<int64_t>(r0) * T + k0, T);
    for (int t = r0; t < r1; t++) {
      float* srow = S + static_cast<int64_t>(t) * T;
      const int lo = ds == nullptr ? 0 : ds[t];
      for (int j = k0; j < lo; j++) srow[j] = 0.0f;
      l[t] = softmax_row(srow + lo, t - lo, r1 - lo);
    }
    gemm(false, false, r1 - r0, hs, r1 - k0, 1.0f, S + static_cast<int64_t>(r0) * T + k0, T,
         v + static_cast<int64_t>(k0) * ldq, ldq, 0.0f, o + static_cast<int64_t>(r0) * ldo, ldo);
  }
}

void head_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                   int ldq, const float* o, const float* dO, int ldo, const float* l, float* P,
                   float* dS, int T, int hs, float scale, float beta, const int32_t* ds) {
  // With documents that start after row 0, dK and dV are summed block by block over each block's
  // keys [k0, r1) only; starts that are all 0 (no document boundary in the window) take the path
  // without documents, bit for bit.
  bool blocked = false;
  for (int t = 0; ds != nullptr && t < T && !blocked; t++) blocked = ds[t] != 0;
  if (!blocked) ds = nullptr;
  if (blocked) {
    for (int j = 0; j < T; j++) {
      for (int i = 0; i < hs; i++) {
        float* kk = dk + static_cast<int64_t>(j) * ldq + i;
        float* vv = dv + static_cast<int64_t>(j) * ldq + i;
        *kk = beta == 0.0f ? 0.0f : beta * *kk;
        *vv = beta == 0.0f ? 0.0f : beta * *vv;
      }
    }
  }
  for (int r0 = 0; r0 < T; r0 += kRows) {
    const int r1 = std::min(T, r0 + kRows);
    const int k0 = first_key(ds, r0, r1);
    gemm(false, true, r1 - r0, r1 - k0, hs, scale, q + static_cast<int64_t>(r0) * ldq, ldq,
         k + static_cast<int64_t>(k0) * ldq, ldq, 0.0f, P + static_cast<int64_t>(r0) * T + k0, T);
    // dP rows [r0, r1) = dO V^T over keys [k0, r1).
    gemm(false, true, r1 - r0, r1 - k0, hs, 1.0f, dO + static_cast<int64_t>(r0) * ldo, ldo,
         v + static_cast<int64_t>(k0) * ldq, ldq, 0.0f, dS + static_cast<int64_t>(r0) * T + k0, T);
    for (int t = r0; t < r1; t++) {
      float* prow = P + static_cast<int64_t>(t) * T;
      float* dsrow = dS + static_cast<int64_t>(t) * T;
      // Keys of the block before the row's document: 0 in both tiles. Without documents the rows
      // are zeroed to T (dK and dV below read whole rows); with them to r1 (the block's keys).
      const int lo = ds == nullptr ? 0 : ds[t];
      const int width = ds == nullptr ? T : r1;
      for (int j = k0; j < lo; j++) prow[j] = dsrow[j] = 0.0f;
      probs_row(prow + lo, l[t], t - lo, width - lo);
      const float D = vdot(dO + static_cast<int64_t>(t) * ldo, o + static_cast<int64_t>(t) * ldo, hs);
      dscores_row(dsrow + lo, prow + lo, D, scale, t - lo, width - lo);
    }
    // dQ rows [r0, r1) = dS K over keys [k0, r1).
    gemm(false, false, r1 - r0, hs, r1 - k0, 1.0f, dS + static_cast<int64_t>(r0) * T + k0, T,
         k + static_cast<int64_t>(k0) * ldq, ldq, 0.0f, dq + static_cast<int64_t>(r0) * ldq, ldq);
    if (blocked) {  // dK, dV rows [k0, r1) += this block's dS^T Q, P^T dO
      gemm(true, false, r1 - k0, hs, r1 - r0, 1.0f, dS + static_cast<int64_t>(r0) * T + k0, T,
           q + static_cast<int64_t>(r0) * ldq, ldq, 1.0f, dk + static_cast<int64_t>(k0) * ldq, ldq);
      gemm(true, false, r1 - k0, hs, r1 - r0, 1.0f, P + static_cast<int64_t>(r0) * T + k0, T,
           dO + static_cast<int64_t>(r0) * ldo, ldo, 1.0f, dv + static_cast<int64_t>(k0) * ldq, ldq);
    }
  }
  if (blocked) return;
  // dK = dS^T Q and dV = P^T dO over all rows (zeros above the diagonal), onto beta * themselves.
  gemm(true, false, T, hs, T, 1.0f, dS, T, q, ldq, beta, dk, ldq);
  gemm(true, false, T, hs, T, 1.0f, P, T, dO, ldo, beta, dv, ldq);
}

size_t per_thread_floats(int T, int hs, int storage_bytes) {
  return 2 * static_cast<size_t>(T) * T + (storage_bytes == 4 ? 0 : 8 * static_cast<size_t>(T) * hs);
}

}  // namespace attention_rows

using namespace attention_rows;

namespace {
// The path the last bf16 attention took (for attention_report): 0 none yet, 1 dot products, 2 fp32.
std::atomic<int> g_bf16_path{0};
}  // namespace

void attention_rows::note_bf16_path(bool dot) { g_bf16_path.store(dot ? 1 : 2, std::memory_order_relaxed); }

std::string attention_report() {
  switch (g_bf16_path.load(std::memory_order_relaxed)) {
    case 1: return "bf16 attention: avx512_bf16 dot products";
    case 2: return "bf16 attention: fp32 compute";
    default: return "";
  }
}

size_t attention_scratch_floats(int T, int hs, int storage_bytes) {
  return static_cast<size_t>(omp_get_max_threads()) * per_thread_floats(T, hs, storage_bytes);
}

template <typename S>
void attention_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t per_thread = per_thread_floats(T, hs, sizeof(S));
  const bool bf16_dot = std::is_same_v<S, bf16> && bf16_dot_head_supported(T, hs);
  if constexpr (std::is_same_v<S, bf16>) note_bf16_path(bf16_dot);
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * NH > 1 && int64_t{T} * T * C >= kParallelWork)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    float* tile = scratch + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    const S* q = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
    S* o = out + static_cast<int64_t>(b) * T * C + h * hs;
    float* l = lse + static_cast<int64_t>(bh) * T;
    if constexpr (std::is_same_v<S, float>) {
      head_forward(o, C, l, q, q + C, q + 2 * C, C3, tile, T, hs, scale);
    } else if (bf16_dot) {
      if constexpr (std::is_same_v<S, bf16>) head_forward_bf16(o, C, l, q, q + C, q + 2 * C, C3, tile, T, hs, scale);
    } else {
      const int64_t th = static_cast<int64_t>(T) * hs;
      float* f = tile + 2 * static_cast<size_t>(T) * T;  // q, k, v, o of this head in fp32
      for (int part = 0; part < 3; part++) gather_rows(f + part * th, q + part * C, C3, T, hs);
      head_forward(f + 3 * th, hs, l, f, f + th, f + 2 * th, hs, tile, T, hs, scale);
      scatter_rows(o, C, f + 3 * th, T, hs);
    }
  }
}

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                        float* scratch, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t per_thread = per_thread_floats(T, hs, sizeof(S));
  const bool bf16_dot = std::is_same_v<S, bf16> && bf16_dot_head_supported(T, hs);
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * NH > 1 && int64_t{T} * T * C >= kParallelWork)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    float* P = scratch + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    float* dS = P + static_cast<size_t>(T) * T;
    const int64_t qoff = static_cast<int64_t>(b) * T * C3 + h * hs;
    const int64_t ooff = static_cast<int64_t>(b) * T * C + h * hs;
    const float* l = lse + static_cast<int64_t>(bh) * T;
    if constexpr (std::is_same_v<S, float>) {
      const float* q = qkv + qoff;
      float* dq = dqkv + qoff;
      head_backward(dq, dq + C, dq + 2 * C, q, q + C, q + 2 * C, C3, out + ooff, dout + ooff, C, l, P,
                    dS, T, hs, scale);
    } else if (bf16_dot) {
      if constexpr (std::is_same_v<S, bf16>) {
        const bf16* q = qkv + qoff;
        bf16* dq = dqkv + qoff;
        float* dK = P + bf16_dot_head_backward_floats(T, hs);
        float* dV = dK + static_cast<int64_t>(T) * hs;
        head_backward_bf16(dq, dK, dV, q, q + C, q + 2 * C, C3, out + ooff, dout + ooff, C, l, P, T, hs, scale,
                           0.0f);
        round_head_rows(dq + C, C3, dK, T, hs);
        round_head_rows(dq + 2 * C, C3, dV, T, hs);
      }
    } else {
      // q, k, v, o, dO, then dq, dk, dv: this head in fp32 after the two tiles.
      const int64_t th = static_cast<int64_t>(T) * hs;
      float* f = dS + static_cast<size_t>(T) * T;
      for (int part = 0; part < 3; part++) gather_rows(f + part * th, qkv + qoff + part * C, C3, T, hs);
      gather_rows(f + 3 * th, out + ooff, C, T, hs);
      gather_rows(f + 4 * th, dout + ooff, C, T, hs);
      float* d = f + 5 * th;
      head_backward(d, d + th, d + 2 * th, f, f + th, f + 2 * th, hs, f + 3 * th, f + 4 * th, hs, l, P,
                    dS, T, hs, scale);
      for (int part = 0; part < 3; part++) scatter_rows(dqkv + qoff + part * C, C3, d + part * th, T, hs);
    }
  }
}

#define DS_INST_S(S)                                                                               \
  template void attention_forward<S>(S*, float*, const S*, float*, int, int, int, int);            \
  template void attention_backward<S>(S*, const S*, const S*, const S*, const float*, float*, int, \
                                      int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
