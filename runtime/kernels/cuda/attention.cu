// Causal multi-head self-attention on the GPU, with the CPU's layout and saved buffers: qkv
// (B,T,3C), out (B,T,C), lse (B,NH,T) holding the log-sum-exp of each scaled score row.
//
// Deliberately the simplest exact formulation, not a tuned flash-attention kernel:
// - Forward: one warp per query row t of one (b, h). Lane l holds q[d] for d = l, l + 32, ...
//   (up to kMaxHeadSize / 32 registers). For each key j <= t: s = scale * q.k_j (warp sum), then
//   the online softmax update (running max m, running sum l, output accumulator rescaled by
//   exp(m_old - m_new)). out = acc / l, lse = m + log(l).
// - Backward, with P[t,j] = exp(s[t,j] - lse[t]) recomputed and D_t = dO_t . O_t folded into one
//   dot product (dP - D = dO_t . (v_j - O_t)), dS = scale * P * (dP - D):
//     dq kernel: one warp per query row t, dq_t = sum over j <= t of dS[t,j] k_j;
//     dkv kernel: one warp per key row j, dk_j = sum over t >= j of dS[t,j] q_t and
//                 dv_j = sum over t >= j of P[t,j] dO_t.
//   Every output row is written by exactly one warp: no atomics, no scratch, deterministic.
// Cost: O(T^2 hs) work like any exact attention, but K/V rows are re-read from L2 by every warp;
// expect far below the tensor-core peak. cuDNN's fused attention is the upgrade path.
// Storage: the kernels are templated over the storage type S of qkv, out, dout and dqkv (fp32 or
// bf16, read through ld and written through st: fp32 arithmetic, each output rounded once); lse
// is fp32 either way.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps = 4 rows per block
constexpr int kRegs = kMaxHeadSize / 32;

struct Shape {
  int B, T, C, NH, hs;
  float scale;
};

template <typename S>
__global__ void attention_forward_kernel(S* out, float* lse, const S* qkv, Shape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int t = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH);
  const int C3 = 3 * sh.C;
  const S* base = qkv + int64_t{b} * sh.T * C3 + int64_t{h} * sh.hs;
  const S* q = base + int64_t{t} * C3;
  float qr[kRegs], acc[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    qr[i] = d < sh.hs ? ld(q + d) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= t; j++) {
    const S* k = base + int64_t{j} * C3 + sh.C;
    const S* v = k + sh.C;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hs) s += qr[i] * ld(k + d);
    }
    s = warp_sum(s) * sh.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hs) acc[i] = acc[i] * corr + p * ld(v + d);
    }
    m = m_new;
  }
  S* o = out + (int64_t{b} * sh.T + t) * sh.C + int64_t{h} * sh.hs;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hs) st(o + d, acc[i] * inv);
  }
  if (lane == 0) lse[bh * sh.T + t] = m + logf(l);
}

template <typename S>
__global__ void attention_backward_dq_kernel(S* dqkv, const S* dout, const S* qkv, const S* out,
                                             const float* lse, Shape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int t = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH);
  const int C3 = 3 * sh.C;
  const int64_t qoff = int64_t{b} * sh.T * C3 + int64_t{h} * sh.hs;
  const int64_t ooff = (int64_t{b} * sh.T + t) * sh.C + int64_t{h} * sh.hs;
  const S* base = qkv + qoff;
  const S* q = base + int64_t{t} * C3;
  float qr[kRegs], dor[kRegs], orr[kRegs], acc[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    const bool in = d < sh.hs;
    qr[i] = in ? ld(q + d) : 0.0f;
    dor[i] = in ? ld(dout + ooff + d) : 0.0f;
    orr[i] = in ? ld(out + ooff + d) : 0.0f;
    acc[i] = 0.0f;
  }
  const float l = lse[bh * sh.T + t];
  for (int j = 0; j <= t; j++) {
    const S* k = base + int64_t{j} * C3 + sh.C;
    const S* v = k + sh.C;
    float s = 0.0f, dpd = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hs) {
        s += qr[i] * ld(k + d);
        dpd += dor[i] * (ld(v + d) - orr[i]);
      }
    }
    s = warp_sum(s) * sh.scale;
    dpd = warp_sum(dpd);
    const float ds = sh.scale * expf(s - l) * dpd;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hs) acc[i] += ds * ld(k + d);
    }
  }
  S* dq = dqkv + qoff + int64_t{t} * C3;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hs) st(dq + d, acc[i]);
  }
}

template <typename S>
__global__ void attention_backward_dkv_kernel(S* dqkv, const S* dout, const S* qkv, const S* out,
                                              const float* lse, Shape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int j = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH);
  const int C3 = 3 * sh.C;
  const int64_t qoff = int64_t{b} * sh.T * C3 + int64_t{h} * sh.hs;
  const int64_t obase = int64_t{b} * sh.T * sh.C + int64_t{h} * sh.hs;
  const S* base = qkv + qoff;
  const S* k = base + int64_t{j} * C3 + sh.C;
  const S* v = k + sh.C;
  float kr[kRegs], vr[kRegs], dk[kRegs], dv[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    const bool in = d < sh.hs;
    kr[i] = in ? ld(k + d) : 0.0f;
    vr[i] = in ? ld(v + d) : 0.0f;
    dk[i] = 0.0f;
    dv[i] = 0.0f;
  }
  const float* lrow = lse + bh * sh.T;
  for (int t = j; t < sh.T; t++) {
    const S* q = base + int64_t{t} * C3;
    const S* dO = dout + obase + int64_t{t} * sh.C;
    const S* o = out + obase + int64_t{t} * sh.C;
    float s = 0.0f, dpd = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hs) {
        s += ld(q + d) * kr[i];
        dpd += ld(dO + d) * (vr[i] - ld(o + d));
      }
    }
    s = warp_sum(s) * sh.scale;
    dpd = warp_sum(dpd);
    const float p = expf(s - lrow[t]);
    const float ds = sh.scale * p * dpd;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hs) {
        dk[i] += ds * ld(q + d);
        dv[i] += p * ld(dO + d);
      }
    }
  }
  S* dkp = dqkv + qoff + int64_t{j} * C3 + sh.C;
  S* dvp = dkp + sh.C;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hs) {
      st(dkp + d, dk[i]);
      st(dvp + d, dv[i]);
    }
  }
}

Shape make_shape(int B, int T, int C, int NH) {
  if (NH <= 0 || C % NH != 0 || C / NH > kMaxHeadSize) {
    throw_cuda_error("attention", "shape check", __FILE__, __LINE__, 0,
                     ("C must be a multiple of NH with head size C/NH <= 256; got C=" +
                      std::to_string(C) + " NH=" + std::to_string(NH))
                         .c_str());
  }
  return Shape{B, T, C, NH, C / NH, 1.0f / std::sqrt(static_cast<float>(C / NH))};
}

}  // namespace

size_t attention_scratch_floats(int /*T*/) { return 0; }

namespace typed {

template <typename S>
void attention_forward(S* out, float* lse, const S* qkv, float* /*scratch*/, int B, int T, int C,
                       int NH, cudaStream_t stream) {
  const Shape sh = make_shape(B, T, C, NH);
  const int64_t rows = int64_t{B} * NH * T;
  if (rows <= 0) return;
  if constexpr (std::is_same_v<S, Bf16>) {
    if (use_flash_attention(sh.hs, out, qkv, out, qkv)) {
      flash_attention_forward_bf16(reinterpret_cast<uint16_t*>(out), lse,
                                   reinterpret_cast<const uint16_t*>(qkv), B, T, NH, NH, sh.hs, stream);
      return;
    }
  }
  attention_forward_kernel<S><<<blocks_for(rows * 32, kThreads), kThreads, 0, stream>>>(out, lse,
                                                                                        qkv, sh);
  DS_CUDA_CHECK_LAUNCH("attention_forward_kernel");
}

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                        float* /*scratch*/, int B, int T, int C, int NH, cudaStream_t stream) {
  const Shape sh = make_shape(B, T, C, NH);
  const int64_t rows = int64_t{B} * NH * T;
  if (rows <= 0) return;
  if constexpr (std::is_same_v<S, Bf16>) {
    if (use_flash_attention(sh.hs, dqkv, dout, qkv, out)) {
      flash_attention_backward_bf16(reinterpret_cast<uint16_t*>(dqkv), reinterpret_cast<const uint16_t*>(dout),
                                    reinterpret_cast<const uint16_t*>(qkv), reinterpret_cast<const uint16_t*>(out),
                                    lse, B, T, NH, NH, sh.hs, stream);
      return;
    }
  }
  attention_backward_dq_kernel<S><<<blocks_for(rows * 32, kThreads), kThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("attention_backward_dq_kernel");
  attention_backward_dkv_kernel<S><<<blocks_for(rows * 32, kThreads), kThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("attention_backward_dkv_kernel");
}

#define DS_CUDA_INST_S(S)                                                                        \
  template void attention_forward<S>(S*, float*, const S*, float*, int, int, int, int,           \
                                     cudaStream_t);                                              \
  template void attention_backward<S>(S*, const S*, const S*, const S*, const float*, float*,    \
                                      int, int, int, int, cudaStream_t);
DS_CUDA_INST_S(float)
DS_CUDA_INST_S(Bf16)
#undef DS_CUDA_INST_S

}  // namespace typed

void attention_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                       int C, int NH, cudaStream_t stream) {
  typed::attention_forward(out, lse, qkv, scratch, B, T, C, NH, stream);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH,
                        cudaStream_t stream) {
  typed::attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, stream);
}

}  // namespace ds::rt::cuda
