// The Llama kernels on the GPU (kernels/cuda/llama_kernels.h): RMSNorm, RoPE, SwiGLU and causal
// grouped-query attention, forward and backward, each a template over the storage type (float or
// bf16 bits) computing in fp32 and rounding each output once, as the CPU templates do.
//
// - RMSNorm: one warp per row for the row outputs (sum of squares, then the normalised row; in
//   backward b = mean(dy w x) r^2, dx += r (dy w - x b)); dweight as LayerNorm's: a (32, 8) block
//   per 32 channels strides the rows and sums its 8 partials in a fixed order.
// - RoPE: one thread per rotated pair (row, head, i < hd/2), reading the fp32 tables.
// - SwiGLU: grid-stride over the N x I outputs.
// - Attention: GPT-2's exact, deliberately simple formulation (attention.cu) with the kv head
//   chosen per query head, g = h / (NH/KV), and k/v read in place from the qkv rows:
//     forward: one warp per (b, h, t), online softmax over j <= t; out = acc / l, lse = m + log l;
//     dq: one warp per (b, h, t), dq_t = sum_j dS[t,j] k_j, with P recomputed from lse and
//         dP - D = dO_t . (v_j - O_t) (one dot product);
//     dk, dv: one warp per (b, g, j), summing over the group's query heads h (in head order) and
//         t >= j: dk_j = sum dS[t,j] q_t, dv_j = sum P[t,j] dO_t, in fp32 registers, written once.
//   No scratch, no atomics: every output row is one warp's, so the result is deterministic.
//   Expect far below the tensor-core peak (K/V re-read from L2 by every warp); a tiled flash
//   kernel or cuDNN's fused attention (which takes GQA natively) is the upgrade path.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/llama_kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps = 8 rows per block (RMSNorm)
constexpr int kThreads = 256;     // element-wise kernels
constexpr int kAttThreads = 128;  // 4 warps = 4 rows per block (attention)
constexpr int kRegs = kMaxHeadSize / 32;

// ---- RMSNorm ----

template <typename S>
__global__ void rmsnorm_forward_kernel(S* out, float* rstd, const S* inp, const S* weight,
                                       int64_t rows, int C, float eps) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const S* x = inp + r * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = ld(x + c);
    ss += v * v;
  }
  const float s = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  S* o = out + r * C;
  for (int c = lane; c < C; c += 32) st(o + c, ld(x + c) * s * ld(weight + c));
  if (lane == 0) rstd[r] = s;
}

template <typename S>
__global__ void rmsnorm_backward_dinp_kernel(S* dinp, const S* dout, const S* inp, const S* weight,
                                             const float* rstd, int64_t rows, int C) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const S* dy = dout + r * C;
  const S* x = inp + r * C;
  const float s = rstd[r];
  float acc = 0.0f;
  for (int c = lane; c < C; c += 32) acc += ld(dy + c) * ld(weight + c) * ld(x + c);
  const float b = warp_sum(acc) * s * s / static_cast<float>(C);  // mean(dy w xhat) / r
  S* dx = dinp + r * C;
  for (int c = lane; c < C; c += 32) {
    st(dx + c, ld(dx + c) + s * (ld(dy + c) * ld(weight + c) - ld(x + c) * b));
  }
}

// dweight[c] += sum_r dout[r,c] inp[r,c] rstd[r]: fp32 sums over row chunks in a fixed order
// (column_sums.cuh), one rounding into G.
template <typename S>
struct RmsNormWeightTerm {
  const S* dout;
  const S* inp;
  const float* rstd;
  int C;
  __device__ void operator()(int64_t r, int c, float (&acc)[1]) const {
    acc[0] += ld(dout + r * C + c) * ld(inp + r * C + c) * rstd[r];
  }
};
template <typename G>
struct AddWeight {
  G* dweight;
  __device__ void operator()(int c, const float (&sum)[1]) const { st(dweight + c, ld(dweight + c) + sum[0]); }
};

template <typename S>
void rmsnorm_forward_impl(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C,
                          float eps, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_forward_kernel<S><<<blocks_for(N * 32, kRowThreads), kRowThreads, 0, stream>>>(
      out, rstd, inp, weight, N, C, eps);
  DS_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

template <typename S, typename G>
void rmsnorm_backward_impl(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                           const float* rstd, int64_t N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  rmsnorm_backward_dinp_kernel<S><<<blocks_for(N * 32, kRowThreads), kRowThreads, 0, stream>>>(
      dinp, dout, inp, weight, rstd, N, C);
  DS_CUDA_CHECK_LAUNCH("rmsnorm_backward_dinp_kernel");
  column_sums::run<1>(N, C, RmsNormWeightTerm<S>{dout, inp, rstd, C}, AddWeight<G>{dweight}, stream);
}

// ---- RoPE ----

struct RopeShape {
  int T, heads, hd, stride, offset;
  int64_t pairs;  // rows x heads x hd/2
};

// sign +1: the forward rotation; -1: its transpose.
template <typename S>
__global__ void rope_kernel(S* x, const float* cos, const float* sin, RopeShape sh, float sign) {
  const int h2 = sh.hd / 2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < sh.pairs;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int p = static_cast<int>(i % h2);
    const int64_t rh = i / h2;
    const int h = static_cast<int>(rh % sh.heads);
    const int64_t r = rh / sh.heads;
    const int t = static_cast<int>(r % sh.T);
    S* v = x + r * sh.stride + sh.offset + int64_t{h} * sh.hd;
    const float c = cos[int64_t{t} * h2 + p], sn = sign * sin[int64_t{t} * h2 + p];
    const float a = ld(v + p), b = ld(v + p + h2);
    st(v + p, a * c - b * sn);
    st(v + p + h2, b * c + a * sn);
  }
}

void check_rope(int hd, const char* what) {
  if (hd <= 0 || hd % 2 != 0) {
    throw_cuda_error(what, "shape check", __FILE__, __LINE__, 0,
                     ("the head size must be even and positive (RoPE rotates pairs); got hd=" +
                      std::to_string(hd))
                         .c_str());
  }
}

template <typename S>
void rope_impl(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
               int stride, int offset, float sign, cudaStream_t stream) {
  check_rope(hd, sign > 0 ? "rope_forward" : "rope_backward");
  const RopeShape sh{T, heads, hd, stride, offset, int64_t{B} * T * heads * (hd / 2)};
  if (sh.pairs <= 0) return;
  rope_kernel<S>
      <<<elementwise_blocks(sh.pairs, kThreads), kThreads, 0, stream>>>(x, cos, sin, sh, sign);
  DS_CUDA_CHECK_LAUNCH("rope_kernel");
}

// ---- SwiGLU ----

__device__ inline float sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

template <typename S>
__global__ void swiglu_forward_kernel(S* out, const S* gu, int64_t n, int I) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = k / I;
    const int i = static_cast<int>(k % I);
    const S* g = gu + row * 2 * I;
    const float gv = ld(g + i);
    st(out + k, gv * sigmoid(gv) * ld(g + I + i));
  }
}

template <typename S>
__global__ void swiglu_backward_kernel(S* dgu, const S* dout, const S* gu, int64_t n, int I) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = k / I;
    const int i = static_cast<int>(k % I);
    const S* g = gu + row * 2 * I;
    S* dg = dgu + row * 2 * I;
    const float gv = ld(g + i), uv = ld(g + I + i), d = ld(dout + k);
    const float sg = sigmoid(gv);
    st(dg + i, d * uv * sg * (1.0f + gv * (1.0f - sg)));
    st(dg + I + i, d * gv * sg);
  }
}

template <typename S>
void swiglu_forward_impl(S* out, const S* gu, int64_t N, int I, cudaStream_t stream) {
  const int64_t n = N * I;
  if (n <= 0) return;
  swiglu_forward_kernel<S><<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(out, gu, n, I);
  DS_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
}

template <typename S>
void swiglu_backward_impl(S* dgu, const S* dout, const S* gu, int64_t N, int I,
                          cudaStream_t stream) {
  const int64_t n = N * I;
  if (n <= 0) return;
  swiglu_backward_kernel<S>
      <<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(dgu, dout, gu, n, I);
  DS_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
}

// ---- grouped-query attention ----

struct GqaShape {
  int B, T, NH, KV, hd;
  float scale;
  __host__ __device__ int group() const { return NH / KV; }
  __host__ __device__ int64_t stride() const { return int64_t{NH + 2 * KV} * hd; }  // qkv row
  __host__ __device__ int64_t ostride() const { return int64_t{NH} * hd; }          // out row
  __host__ __device__ int64_t q_col(int h) const { return int64_t{h} * hd; }
  __host__ __device__ int64_t k_col(int g) const { return int64_t{NH + g} * hd; }
  __host__ __device__ int64_t v_col(int g) const { return int64_t{NH + KV + g} * hd; }
};

GqaShape make_gqa_shape(int B, int T, int NH, int KV, int hd, const char* what) {
  if (NH <= 0 || KV <= 0 || NH % KV != 0 || hd <= 0 || hd > kMaxHeadSize) {
    throw_cuda_error(
        what, "shape check", __FILE__, __LINE__, 0,
        ("need NH a positive multiple of KV and 0 < hd <= 256; got NH=" + std::to_string(NH) +
         " KV=" + std::to_string(KV) + " hd=" + std::to_string(hd))
            .c_str());
  }
  return GqaShape{B, T, NH, KV, hd, 1.0f / sqrtf(static_cast<float>(hd))};
}

template <typename S>
__global__ void gqa_forward_kernel(S* out, float* lse, const S* qkv, GqaShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int t = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH), g = h / sh.group();
  const int64_t st_ = sh.stride();
  const S* base = qkv + int64_t{b} * sh.T * st_;
  const S* q = base + t * st_ + sh.q_col(h);
  float qr[kRegs], acc[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    qr[i] = d < sh.hd ? ld(q + d) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= t; j++) {
    const S* k = base + j * st_ + sh.k_col(g);
    const S* v = base + j * st_ + sh.v_col(g);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hd) s += qr[i] * ld(k + d);
    }
    s = warp_sum(s) * sh.scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hd) acc[i] = acc[i] * corr + p * ld(v + d);
    }
    m = m_new;
  }
  S* o = out + (int64_t{b} * sh.T + t) * sh.ostride() + sh.q_col(h);
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hd) st(o + d, acc[i] * inv);
  }
  if (lane == 0) lse[bh * sh.T + t] = m + logf(l);
}

template <typename S>
__global__ void gqa_backward_dq_kernel(S* dqkv, const S* dout, const S* qkv, const S* out,
                                       const float* lse, GqaShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int t = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH), g = h / sh.group();
  const int64_t st_ = sh.stride();
  const int64_t rbase = int64_t{b} * sh.T * st_;
  const int64_t ooff = (int64_t{b} * sh.T + t) * sh.ostride() + sh.q_col(h);
  const S* base = qkv + rbase;
  const S* q = base + t * st_ + sh.q_col(h);
  float qr[kRegs], dor[kRegs], orr[kRegs], acc[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    const bool in = d < sh.hd;
    qr[i] = in ? ld(q + d) : 0.0f;
    dor[i] = in ? ld(dout + ooff + d) : 0.0f;
    orr[i] = in ? ld(out + ooff + d) : 0.0f;
    acc[i] = 0.0f;
  }
  const float l = lse[bh * sh.T + t];
  for (int j = 0; j <= t; j++) {
    const S* k = base + j * st_ + sh.k_col(g);
    const S* v = base + j * st_ + sh.v_col(g);
    float s = 0.0f, dpd = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegs; i++) {
      const int d = lane + 32 * i;
      if (d < sh.hd) {
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
      if (d < sh.hd) acc[i] += ds * ld(k + d);
    }
  }
  S* dq = dqkv + rbase + t * st_ + sh.q_col(h);
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hd) st(dq + d, acc[i]);
  }
}

template <typename S>
__global__ void gqa_backward_dkv_kernel(S* dqkv, const S* dout, const S* qkv, const S* out,
                                        const float* lse, GqaShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.KV * sh.T) return;
  const int j = static_cast<int>(row % sh.T);
  const int64_t bg = row / sh.T;
  const int b = static_cast<int>(bg / sh.KV), g = static_cast<int>(bg % sh.KV);
  const int64_t st_ = sh.stride(), os = sh.ostride();
  const int64_t rbase = int64_t{b} * sh.T * st_, obase = int64_t{b} * sh.T * os;
  const S* base = qkv + rbase;
  const S* k = base + j * st_ + sh.k_col(g);
  const S* v = base + j * st_ + sh.v_col(g);
  float kr[kRegs], vr[kRegs], dk[kRegs], dv[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    const bool in = d < sh.hd;
    kr[i] = in ? ld(k + d) : 0.0f;
    vr[i] = in ? ld(v + d) : 0.0f;
    dk[i] = 0.0f;
    dv[i] = 0.0f;
  }
  for (int jh = 0; jh < sh.group(); jh++) {
    const int h = g * sh.group() + jh;
    const float* lrow = lse + (int64_t{b} * sh.NH + h) * sh.T;
    for (int t = j; t < sh.T; t++) {
      const S* q = base + t * st_ + sh.q_col(h);
      const S* dO = dout + obase + t * os + sh.q_col(h);
      const S* o = out + obase + t * os + sh.q_col(h);
      float s = 0.0f, dpd = 0.0f;
#pragma unroll
      for (int i = 0; i < kRegs; i++) {
        const int d = lane + 32 * i;
        if (d < sh.hd) {
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
        if (d < sh.hd) {
          dk[i] += ds * ld(q + d);
          dv[i] += p * ld(dO + d);
        }
      }
    }
  }
  S* dkp = dqkv + rbase + j * st_ + sh.k_col(g);
  S* dvp = dqkv + rbase + j * st_ + sh.v_col(g);
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hd) {
      st(dkp + d, dk[i]);
      st(dvp + d, dv[i]);
    }
  }
}

template <typename S>
void gqa_forward_impl(S* out, float* lse, const S* qkv, int B, int T, int NH, int KV, int hd,
                      cudaStream_t stream) {
  const GqaShape sh = make_gqa_shape(B, T, NH, KV, hd, "attention_gqa_forward");
  const int64_t rows = int64_t{B} * NH * T;
  if (rows <= 0) return;
  gqa_forward_kernel<S>
      <<<blocks_for(rows * 32, kAttThreads), kAttThreads, 0, stream>>>(out, lse, qkv, sh);
  DS_CUDA_CHECK_LAUNCH("gqa_forward_kernel");
}

template <typename S>
void gqa_backward_impl(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, int B,
                       int T, int NH, int KV, int hd, cudaStream_t stream) {
  const GqaShape sh = make_gqa_shape(B, T, NH, KV, hd, "attention_gqa_backward");
  const int64_t qrows = int64_t{B} * NH * T, kvrows = int64_t{B} * KV * T;
  if (qrows <= 0) return;
  gqa_backward_dq_kernel<S><<<blocks_for(qrows * 32, kAttThreads), kAttThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("gqa_backward_dq_kernel");
  gqa_backward_dkv_kernel<S><<<blocks_for(kvrows * 32, kAttThreads), kAttThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("gqa_backward_dkv_kernel");
}

}  // namespace

// ---- the entry points (llama_kernels.h) ----

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int C, float eps, cudaStream_t stream) {
  rmsnorm_forward_impl(out, rstd, inp, weight, N, C, eps, stream);
}
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int C,
                      cudaStream_t stream) {
  rmsnorm_backward_impl(dinp, dweight, dout, inp, weight, rstd, N, C, stream);
}
void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const uint16_t* inp, const uint16_t* weight,
                          int64_t N, int C, float eps, cudaStream_t stream) {
  rmsnorm_forward_impl(as_bf16(out), rstd, as_bf16(inp), as_bf16(weight), N, C, eps, stream);
}
void rmsnorm_backward_bf16(uint16_t* dinp, float* dweight, const uint16_t* dout,
                           const uint16_t* inp, const uint16_t* weight, const float* rstd,
                           int64_t N, int C, cudaStream_t stream) {
  rmsnorm_backward_impl(as_bf16(dinp), dweight, as_bf16(dout), as_bf16(inp), as_bf16(weight), rstd,
                        N, C, stream);
}
void rmsnorm_backward_bf16_gbf16(uint16_t* dinp, uint16_t* dweight, const uint16_t* dout,
                                 const uint16_t* inp, const uint16_t* weight, const float* rstd,
                                 int64_t N, int C, cudaStream_t stream) {
  rmsnorm_backward_impl(as_bf16(dinp), as_bf16(dweight), as_bf16(dout), as_bf16(inp),
                        as_bf16(weight), rstd, N, C, stream);
}

void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
                  int stride, int offset, cudaStream_t stream) {
  rope_impl(x, cos, sin, B, T, heads, hd, stride, offset, 1.0f, stream);
}
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                   int stride, int offset, cudaStream_t stream) {
  rope_impl(dx, cos, sin, B, T, heads, hd, stride, offset, -1.0f, stream);
}
void rope_forward_bf16(uint16_t* x, const float* cos, const float* sin, int B, int T, int heads,
                       int hd, int stride, int offset, cudaStream_t stream) {
  rope_impl(as_bf16(x), cos, sin, B, T, heads, hd, stride, offset, 1.0f, stream);
}
void rope_backward_bf16(uint16_t* dx, const float* cos, const float* sin, int B, int T, int heads,
                        int hd, int stride, int offset, cudaStream_t stream) {
  rope_impl(as_bf16(dx), cos, sin, B, T, heads, hd, stride, offset, -1.0f, stream);
}

void swiglu_forward(float* out, const float* gu, int64_t N, int I, cudaStream_t stream) {
  swiglu_forward_impl(out, gu, N, I, stream);
}
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I,
                     cudaStream_t stream) {
  swiglu_backward_impl(dgu, dout, gu, N, I, stream);
}
void swiglu_forward_bf16(uint16_t* out, const uint16_t* gu, int64_t N, int I, cudaStream_t stream) {
  swiglu_forward_impl(as_bf16(out), as_bf16(gu), N, I, stream);
}
void swiglu_backward_bf16(uint16_t* dgu, const uint16_t* dout, const uint16_t* gu, int64_t N, int I,
                          cudaStream_t stream) {
  swiglu_backward_impl(as_bf16(dgu), as_bf16(dout), as_bf16(gu), N, I, stream);
}

void attention_gqa_forward(float* out, float* lse, const float* qkv, float* /*scratch*/, int B,
                           int T, int NH, int KV, int hd, cudaStream_t stream) {
  gqa_forward_impl(out, lse, qkv, B, T, NH, KV, hd, stream);
}
void attention_gqa_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, float* /*scratch*/, int B, int T, int NH, int KV,
                            int hd, cudaStream_t stream) {
  gqa_backward_impl(dqkv, dout, qkv, out, lse, B, T, NH, KV, hd, stream);
}
void attention_gqa_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, float* /*scratch*/,
                                int B, int T, int NH, int KV, int hd, cudaStream_t stream) {
  if (NH > 0 && KV > 0 && NH % KV == 0 && use_flash_attention(hd, out, qkv, out, qkv)) {
    flash_attention_forward_bf16(out, lse, qkv, B, T, NH, KV, hd, stream);
    return;
  }
  gqa_forward_impl(as_bf16(out), lse, as_bf16(qkv), B, T, NH, KV, hd, stream);
}
void attention_gqa_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                                 const uint16_t* out, const float* lse, float* /*scratch*/, int B,
                                 int T, int NH, int KV, int hd, cudaStream_t stream) {
  if (NH > 0 && KV > 0 && NH % KV == 0 && use_flash_attention(hd, dqkv, dout, qkv, out)) {
    flash_attention_backward_bf16(dqkv, dout, qkv, out, lse, B, T, NH, KV, hd, stream);
    return;
  }
  gqa_backward_impl(as_bf16(dqkv), as_bf16(dout), as_bf16(qkv), as_bf16(out), lse, B, T, NH, KV, hd,
                    stream);
}

}  // namespace ds::rt::cuda
