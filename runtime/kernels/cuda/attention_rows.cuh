// The warp-per-row steps of the exact attention kernels, shared by the whole-sequence kernels
// (attention.cu) and ring attention's block kernels (attention_block.cu): a head's hd values are
// spread over the 32 lanes of a warp (lane l holds d = l, l + 32, ..., up to kMaxHeadSize / 32
// registers), dot products are warp sums, and every key or query is reached through a callable,
// so each kernel only says where its rows are and which of them a row sees.
//   attend:      one query row's online softmax over its keys: acc = sum_j p_j v_j (unnormalised),
//                m the running max, l the running sum; out = acc / l, lse = m + log l.
//   dq_row:      one query row's dq = sum_j ds_j k_j, with p_j = exp(s_j - lse) and
//                ds_j = scale p_j (dO . (v_j - o)) (D = dO . o folded into the one dot product).
//   dkv_query:   one query's share of one key row's dk (+= ds q) and dv (+= p dO).
// Internal to runtime/kernels/cuda.
#pragma once

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda::attention_rows {

constexpr int kRegs = kMaxHeadSize / 32;

template <typename S>
__device__ inline void load(float (&r)[kRegs], const S* p, int hd, int lane) {
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    r[i] = d < hd ? ld(p + d) : 0.0f;
  }
}

__device__ inline void zero(float (&r)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; i++) r[i] = 0.0f;
}

// The keys and values of key row j: kv_at(j) returns {k, v} pointers.
template <typename S>
struct KvRow {
  const S* k;
  const S* v;
};

template <typename S, typename KvAt>
__device__ inline void attend(const float (&qr)[kRegs], int n, int hd, int lane, float scale, KvAt kv_at,
                              float (&acc)[kRegs], float& m, float& l) {
  zero(acc);
  m = -INFINITY;
  l = 0.0f;
  for (int j = 0; j < n; j++) {
    const KvRow<S> kv = kv_at(j);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < hd) s += qr[i] * ld(kv.k + d);
    }
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] = acc[i] * corr + p * ld(kv.v + d);
    }
    m = m_new;
  }
}

template <typename S, typename KvAt>
__device__ inline void dq_row(const float (&qr)[kRegs], const float (&dor)[kRegs], const float (&orr)[kRegs], float lse,
                              int n, int hd, int lane, float scale, KvAt kv_at, float (&acc)[kRegs]) {
  zero(acc);
  for (int j = 0; j < n; j++) {
    const KvRow<S> kv = kv_at(j);
    float s = 0.0f, dpd = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < hd) {
        s += qr[i] * ld(kv.k + d);
        dpd += dor[i] * (ld(kv.v + d) - orr[i]);
      }
    }
    s = warp_sum(s) * scale;
    dpd = warp_sum(dpd);
    const float ds = scale * expf(s - lse) * dpd;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] += ds * ld(kv.k + d);
    }
  }
}

template <typename S>
__device__ inline void dkv_query(const float (&kr)[kRegs], const float (&vr)[kRegs], const S* q, const S* dO, const S* o,
                                 float lse, int hd, int lane, float scale, float (&dk)[kRegs], float (&dv)[kRegs]) {
  float s = 0.0f, dpd = 0.0f;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < hd) {
      s += ld(q + d) * kr[i];
      dpd += ld(dO + d) * (vr[i] - ld(o + d));
    }
  }
  s = warp_sum(s) * scale;
  dpd = warp_sum(dpd);
  const float p = expf(s - lse);
  const float ds = scale * p * dpd;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < hd) {
      dk[i] += ds * ld(q + d);
      dv[i] += p * ld(dO + d);
    }
  }
}

}  // namespace ds::rt::cuda::attention_rows
