// RMSNorm, RoPE and SwiGLU on the GPU (kernels/cuda/kernels.h), forward and backward, each
// a template over the storage type (float or bf16 bits) computing in fp32 and rounding each output
// once, as the CPU templates do. (Grouped-query attention is attention.cu's, and flash's.)
//
// - RMSNorm: one warp per row for the row outputs (sum of squares, then the normalised row; in
//   backward b = mean(dy w x) r^2, dx += r (dy w - x b)); dweight: column sums over row chunks
//   (column_sums.cuh), in a fixed order.
// - RoPE: one thread per rotated pair (row, head, i < hd/2), reading the fp32 tables.
// - SwiGLU: grid-stride over the N x I outputs.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps = 8 rows per block (RMSNorm)
constexpr int kThreads = 256;     // element-wise kernels

// ---- RMSNorm ----

// kN elements at a time: 16-byte packs where C % kN == 0 and every pointer is aligned
// (device_util.cuh), one element otherwise; a lane's packs start at c = kN * (lane + 32 j).
template <typename S, int kN>
__global__ void rmsnorm_forward_kernel(S* out, float* rstd, const S* inp, const S* weight,
                                       int64_t rows, int C, float eps) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const S* x = inp + r * C;
  float ss = 0.0f;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN];
    ldv<kN>(x + c, v);
#pragma unroll
    for (int j = 0; j < kN; j++) ss += v[j] * v[j];
  }
  const float s = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  S* o = out + r * C;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN], w[kN];
    ldv<kN>(x + c, v);
    ldv<kN>(weight + c, w);
#pragma unroll
    for (int j = 0; j < kN; j++) v[j] = v[j] * s * w[j];
    stv<kN>(o + c, v);
  }
  if (lane == 0) rstd[r] = s;
}

template <typename S, int kN>
__global__ void rmsnorm_backward_dinp_kernel(S* dinp, const S* dout, const S* inp, const S* weight,
                                             const float* rstd, int64_t rows, int C) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const S* dy = dout + r * C;
  const S* x = inp + r * C;
  const float s = rstd[r];
  float acc = 0.0f;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float g[kN], w[kN], v[kN];
    ldv<kN>(dy + c, g);
    ldv<kN>(weight + c, w);
    ldv<kN>(x + c, v);
#pragma unroll
    for (int j = 0; j < kN; j++) acc += g[j] * w[j] * v[j];
  }
  const float b = warp_sum(acc) * s * s / static_cast<float>(C);  // mean(dy w xhat) / r
  S* dx = dinp + r * C;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float g[kN], w[kN], v[kN], d[kN];
    ldv<kN>(dy + c, g);
    ldv<kN>(weight + c, w);
    ldv<kN>(x + c, v);
    ldv<kN>(dx + c, d);
#pragma unroll
    for (int j = 0; j < kN; j++) d[j] += s * (g[j] * w[j] - v[j] * b);
    stv<kN>(dx + c, d);
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
  if (C % PackOf<S>::kN == 0 && all_aligned16(out, inp, weight)) {
    rmsnorm_forward_kernel<S, PackOf<S>::kN><<<blocks_for(N * 32, kRowThreads), kRowThreads, 0, stream>>>(
        out, rstd, inp, weight, N, C, eps);
  } else {
    rmsnorm_forward_kernel<S, 1><<<blocks_for(N * 32, kRowThreads), kRowThreads, 0, stream>>>(out, rstd, inp,
                                                                                            weight, N, C, eps);
  }
  DS_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

template <typename S, typename G>
void rmsnorm_backward_impl(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                           const float* rstd, int64_t N, int C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (C % PackOf<S>::kN == 0 && all_aligned16(dinp, dout, inp, weight)) {
    rmsnorm_backward_dinp_kernel<S, PackOf<S>::kN><<<blocks_for(N * 32, kRowThreads), kRowThreads, 0, stream>>>(
        dinp, dout, inp, weight, rstd, N, C);
  } else {
    rmsnorm_backward_dinp_kernel<S, 1><<<blocks_for(N * 32, kRowThreads), kRowThreads, 0, stream>>>(
        dinp, dout, inp, weight, rstd, N, C);
  }
  DS_CUDA_CHECK_LAUNCH("rmsnorm_backward_dinp_kernel");
  if (dweight == nullptr) return;  // a frozen weight (a LoRA base)
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

}  // namespace

// ---- the typed ops (kernels/ops.def) ----

namespace typed {

template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C,
                     float eps, cudaStream_t stream) {
  rmsnorm_forward_impl(out, rstd, inp, weight, N, C, eps, stream);
}
template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                      const float* rstd, int64_t N, int C, cudaStream_t stream) {
  rmsnorm_backward_impl(dinp, dweight, dout, inp, weight, rstd, N, C, stream);
}
template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
                  int stride, int offset, cudaStream_t stream) {
  rope_impl(x, cos, sin, B, T, heads, hd, stride, offset, 1.0f, stream);
}
template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                   int stride, int offset, cudaStream_t stream) {
  rope_impl(dx, cos, sin, B, T, heads, hd, stride, offset, -1.0f, stream);
}
template <typename S>
void swiglu_forward(S* out, const S* gu, int64_t N, int I, cudaStream_t stream) {
  swiglu_forward_impl(out, gu, N, I, stream);
}
template <typename S>
void swiglu_backward(S* dgu, const S* dout, const S* gu, int64_t N, int I, cudaStream_t stream) {
  swiglu_backward_impl(dgu, dout, gu, N, I, stream);
}

#define DS_CUDA_INST_S(S)                                                                        \
  template void rmsnorm_forward<S>(S*, float*, const S*, const S*, int64_t, int, float, cudaStream_t); \
  template void rope_forward<S>(S*, const float*, const float*, int, int, int, int, int, int,     \
                                cudaStream_t);                                                   \
  template void rope_backward<S>(S*, const float*, const float*, int, int, int, int, int, int,    \
                                 cudaStream_t);                                                  \
  template void swiglu_forward<S>(S*, const S*, int64_t, int, cudaStream_t);                       \
  template void swiglu_backward<S>(S*, const S*, const S*, int64_t, int, cudaStream_t);
#define DS_CUDA_INST_SG(S, G)                                                                    \
  template void rmsnorm_backward<S, G>(S*, G*, const S*, const S*, const S*, const float*, int64_t, \
                                       int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
DS_CUDA_FOR_EACH_STORAGE_GRAD(DS_CUDA_INST_SG)
#undef DS_CUDA_INST_S
#undef DS_CUDA_INST_SG

}  // namespace typed

}  // namespace ds::rt::cuda
