// Row-wise CUDA kernels: LayerNorm forward/backward and the fused softmax + cross-entropy (full
// and vocabulary-parallel). LayerNorm rows get one warp each; cross-entropy rows (a vocabulary
// of ~50k) one block each; both read and write 16-byte packs where the row allows it. Parameter
// gradients of LayerNorm are column sums over row chunks in a fixed order (column_sums.cuh:
// deterministic, no atomics). Every kernel is
// templated over the storage type (and LayerNorm's backward over the gradient type): the fp32
// entry points and the bf16 twins (kernels.h, namespace typed) are the same kernels; statistics
// are fp32 whatever the storage.
#include <cuda_runtime.h>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kRowThreads = 256;   // 8 warps = 8 rows per block (layernorm)
constexpr int kLossThreads = 512;  // threads per row (cross-entropy)

// ---- layernorm ----

// Row kernels take kN elements at a time: 16-byte packs (device_util.cuh) where C % kN == 0 and
// every pointer is aligned (so is every row), one element otherwise. A lane's pack of a row
// starts at c = kN * (lane + 32 j).
template <typename T, int kN>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, int64_t rows, int C) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* x = inp + r * C;
  float s = 0.0f;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN];
    ldv<kN>(x + c, v);
#pragma unroll
    for (int j = 0; j < kN; j++) s += v[j];
  }
  const float m = warp_sum(s) / static_cast<float>(C);
  float var = 0.0f;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN];
    ldv<kN>(x + c, v);
#pragma unroll
    for (int j = 0; j < kN; j++) var += (v[j] - m) * (v[j] - m);
  }
  const float rs = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(C) + 1e-5f);
  T* o = out + r * C;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float v[kN], w[kN], b[kN];
    ldv<kN>(x + c, v);
    ldv<kN>(weight + c, w);
    ldv<kN>(bias + c, b);
#pragma unroll
    for (int j = 0; j < kN; j++) v[j] = (v[j] - m) * rs * w[j] + b[j];
    stv<kN>(o + c, v);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * weight.
template <typename T, int kN>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp,
                                               const T* weight, const float* mean,
                                               const float* rstd, int64_t rows, int C) {
  const int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* dy = dout + r * C;
  const T* x = inp + r * C;
  const float m = mean[r], s = rstd[r];
  float a = 0.0f, b = 0.0f;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float g[kN], w[kN], v[kN];
    ldv<kN>(dy + c, g);
    ldv<kN>(weight + c, w);
    ldv<kN>(x + c, v);
#pragma unroll
    for (int j = 0; j < kN; j++) {
      const float dn = g[j] * w[j];
      a += dn;
      b += dn * (v[j] - m) * s;
    }
  }
  a = warp_sum(a) / static_cast<float>(C);
  b = warp_sum(b) / static_cast<float>(C);
  T* dx = dinp + r * C;
  for (int c = lane * kN; c < C; c += 32 * kN) {
    float g[kN], w[kN], v[kN], d[kN];
    ldv<kN>(dy + c, g);
    ldv<kN>(weight + c, w);
    ldv<kN>(x + c, v);
    ldv<kN>(dx + c, d);
#pragma unroll
    for (int j = 0; j < kN; j++) d[j] += s * (g[j] * w[j] - a - (v[j] - m) * s * b);
    stv<kN>(dx + c, d);
  }
}

// dweight[c] += sum_r dout[r,c] (inp[r,c] - mean[r]) rstd[r], dbias[c] += sum_r dout[r,c]: fp32 sums
// over row chunks in a fixed order (column_sums.cuh), one rounding into G.
template <typename T>
struct LayerNormParamTerms {
  const T* dout;
  const T* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(int64_t r, int c, float (&acc)[2]) const {
    const float dy = ld(dout + r * C + c);
    acc[0] += dy * (ld(inp + r * C + c) - mean[r]) * rstd[r];
    acc[1] += dy;
  }
};
template <typename G>
struct AddWeightAndBias {
  G* dweight;
  G* dbias;
  __device__ void operator()(int c, const float (&sum)[2]) const {
    st(dweight + c, ld(dweight + c) + sum[0]);
    st(dbias + c, ld(dbias + c) + sum[1]);
  }
};

template <typename T>
void layernorm_forward_impl(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                            const T* bias, int B, int T_, int C, cudaStream_t stream) {
  const int64_t rows = int64_t{B} * T_;
  if (rows <= 0) return;
  if (C % PackOf<T>::kN == 0 && all_aligned16(out, inp, weight, bias)) {
    layernorm_forward_kernel<T, PackOf<T>::kN><<<blocks_for(rows * 32, kRowThreads), kRowThreads, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, rows, C);
  } else {
    layernorm_forward_kernel<T, 1><<<blocks_for(rows * 32, kRowThreads), kRowThreads, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, rows, C);
  }
  DS_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

template <typename T, typename G>
void layernorm_backward_impl(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp,
                             const T* weight, const float* mean, const float* rstd, int B, int T_,
                             int C, cudaStream_t stream) {
  const int64_t rows = int64_t{B} * T_;
  if (rows <= 0 || C <= 0) return;
  if (C % PackOf<T>::kN == 0 && all_aligned16(dinp, dout, inp, weight)) {
    layernorm_backward_dinp_kernel<T, PackOf<T>::kN>
        <<<blocks_for(rows * 32, kRowThreads), kRowThreads, 0, stream>>>(dinp, dout, inp, weight, mean, rstd,
                                                                         rows, C);
  } else {
    layernorm_backward_dinp_kernel<T, 1><<<blocks_for(rows * 32, kRowThreads), kRowThreads, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, rows, C);
  }
  DS_CUDA_CHECK_LAUNCH("layernorm_backward_dinp_kernel");
  if (dweight == nullptr) return;  // frozen weights (a LoRA base)
  column_sums::run<2>(rows, C, LayerNormParamTerms<T>{dout, inp, mean, rstd, C}, AddWeightAndBias<G>{dweight, dbias},
                      stream);
}

// ---- fused softmax + cross-entropy: one block per row ----

// The row's max and sum of exponentials in one pass (online softmax: the sum is rescaled when
// the max grows), over kN-element packs as the row kernels above (kN > 1: Vp % kN == 0, aligned).
template <typename T, int kN>
__device__ inline void row_max_and_sumexp(const T* x, int V, float* red, float& mx, float& s) {
  float m = -INFINITY, sum = 0.0f;
  for (int v = threadIdx.x * kN; v < V; v += blockDim.x * kN) {
    float e[kN];
    ldv<kN>(x + v, e);
#pragma unroll
    for (int j = 0; j < kN; j++) {
      if (v + j >= V) break;
      if (e[j] > m) {
        sum = sum * expf(m - e[j]) + 1.0f;
        m = e[j];
      } else if (m != -INFINITY) {  // a row of -inf so far adds nothing (and no NaN)
        sum += expf(e[j] - m);
      }
    }
  }
  mx = block_max(m, red);
  s = block_sum(m == -INFINITY ? 0.0f : sum * expf(m - mx), red);
}

template <typename T, int kN, bool kBackward>
__global__ void crossentropy_kernel(float* losses, T* logits, const int32_t* targets, float dloss,
                                    int V, int Vp, int* bad) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  T* x = logits + n * Vp;
  const int32_t tgt = targets[n];
  if (tgt == -1) {  // kIgnoreTarget, a masked-out token: loss 0, no gradient (uniform per block)
    if (threadIdx.x == 0) losses[n] = 0.0f;
    if constexpr (kBackward) {
      for (int v = threadIdx.x; v < Vp; v += blockDim.x) st(x + v, 0.0f);
    }
    return;
  }
  if (tgt < 0 || tgt >= V) {  // uniform across the block: nobody reaches a barrier
    if (threadIdx.x == 0) {
      losses[n] = __int_as_float(0x7fc00000);  // NaN
      if (bad != nullptr) atomicAdd(bad, 1);
    }
    return;
  }
  const float xt = ld(x + tgt);
  float mx = 0.0f, s = 0.0f;
  row_max_and_sumexp<T, kN>(x, V, red, mx, s);  // its barriers order every read before the writes
  if (threadIdx.x == 0) losses[n] = mx + logf(s) - xt;
  if constexpr (kBackward) {
    const float scale = dloss / s;
    for (int v = threadIdx.x * kN; v < Vp; v += blockDim.x * kN) {
      float d[kN];
      ldv<kN>(x + v, d);
#pragma unroll
      for (int j = 0; j < kN; j++) {
        d[j] = v + j < V ? expf(d[j] - mx) * scale : 0.0f;
        if (v + j == tgt) d[j] -= dloss;
      }
      stv<kN>(x + v, d);
    }
  }
}

template <typename T, bool kBackward>
void crossentropy_impl(float* losses, T* logits, const int32_t* targets, float dloss, int N, int V,
                       int Vp, int* bad, cudaStream_t stream) {
  if (N <= 0) return;
  if (Vp % PackOf<T>::kN == 0 && aligned16(logits)) {
    crossentropy_kernel<T, PackOf<T>::kN, kBackward><<<static_cast<unsigned int>(N), kLossThreads, 0, stream>>>(
        losses, logits, targets, dloss, V, Vp, bad);
  } else {
    crossentropy_kernel<T, 1, kBackward><<<static_cast<unsigned int>(N), kLossThreads, 0, stream>>>(
        losses, logits, targets, dloss, V, Vp, bad);
  }
  DS_CUDA_CHECK_LAUNCH("crossentropy_kernel");
}

// ---- vocabulary-parallel cross-entropy ----

template <typename T>
__global__ void vocab_ce_max_kernel(float* mx, const T* logits, int Vl, int nv) {
  __shared__ float red[32];
  const T* x = logits + int64_t{blockIdx.x} * Vl;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < nv; v += blockDim.x) m = fmaxf(m, ld(x + v));
  m = block_max(m, red);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

template <typename T>
__global__ void vocab_ce_sums_kernel(float* sumexp, float* tlogit, const T* logits,
                                     const float* mx, const int32_t* targets, int Vl, int v0,
                                     int nv) {
  __shared__ float red[32];
  const T* x = logits + int64_t{blockIdx.x} * Vl;
  const float m = mx[blockIdx.x];
  float s = 0.0f;
  for (int v = threadIdx.x; v < nv; v += blockDim.x) s += expf(ld(x + v) - m);
  s = block_sum(s, red);
  if (threadIdx.x == 0) {
    sumexp[blockIdx.x] = s;
    const int t = targets[blockIdx.x] - v0;
    tlogit[blockIdx.x] = (t >= 0 && t < nv) ? ld(x + t) : 0.0f;
  }
}

template <typename T>
__global__ void vocab_ce_finish_kernel(float* losses, T* logits, const float* mx,
                                       const float* sumexp, const float* tlogit,
                                       const int32_t* targets, float dloss, int Vl, int v0,
                                       int nv) {
  const int64_t n = blockIdx.x;
  const float m = mx[n], s = sumexp[n];
  const bool ignored = targets[n] == -1;  // kIgnoreTarget: loss 0, no gradient
  if (threadIdx.x == 0) losses[n] = ignored ? 0.0f : m + logf(s) - tlogit[n];
  if (logits == nullptr) return;
  T* x = logits + n * Vl;
  const float scale = ignored ? 0.0f : dloss / s;
  const int t = targets[n] - v0;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) {
    float d = 0.0f;
    if (v < nv) {
      d = expf(ld(x + v) - m) * scale;
      if (v == t) d -= dloss;
    }
    st(x + v, d);
  }
}

int valid_columns(int Vl, int v0, int V) {
  const int n = V - v0 < Vl ? V - v0 : Vl;
  return n > 0 ? n : 0;
}

}  // namespace

// ---- the typed kernels (kernels.h, namespace typed) ----

namespace typed {

template <typename S>
void layernorm_forward(S* out, float* mean, float* rstd, const S* inp, const S* weight,
                       const S* bias, int B, int T, int C, cudaStream_t stream) {
  layernorm_forward_impl(out, mean, rstd, inp, weight, bias, B, T, C, stream);
}
template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp,
                        const S* weight, const float* mean, const float* rstd, int B, int T, int C,
                        cudaStream_t stream) {
  layernorm_backward_impl(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, stream);
}
template <typename S>
void crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                          int Vp, int* bad_targets, cudaStream_t stream) {
  crossentropy_impl<S, false>(losses, const_cast<S*>(logits), targets, 0.0f, N, V, Vp,
                              bad_targets, stream);
}
template <typename S>
void crossentropy_softmax_backward(float* losses, S* logits_to_dlogits, const int32_t* targets,
                                   float dloss, int N, int V, int Vp, int* bad_targets,
                                   cudaStream_t stream) {
  crossentropy_impl<S, true>(losses, logits_to_dlogits, targets, dloss, N, V, Vp, bad_targets,
                             stream);
}
template <typename S>
void vocab_ce_max(float* mx, const S* logits, int N, int Vl, int v0, int V, cudaStream_t stream) {
  if (N <= 0) return;
  vocab_ce_max_kernel<S><<<static_cast<unsigned int>(N), kLossThreads, 0, stream>>>(
      mx, logits, Vl, valid_columns(Vl, v0, V));
  DS_CUDA_CHECK_LAUNCH("vocab_ce_max_kernel");
}
template <typename S>
void vocab_ce_sums(float* sumexp, float* tlogit, const S* logits, const float* mx,
                   const int32_t* targets, int N, int Vl, int v0, int V, cudaStream_t stream) {
  if (N <= 0) return;
  vocab_ce_sums_kernel<S><<<static_cast<unsigned int>(N), kLossThreads, 0, stream>>>(
      sumexp, tlogit, logits, mx, targets, Vl, v0, valid_columns(Vl, v0, V));
  DS_CUDA_CHECK_LAUNCH("vocab_ce_sums_kernel");
}
template <typename S>
void vocab_ce_finish(float* losses, S* logits_to_dlogits, const float* mx, const float* sumexp,
                     const float* tlogit, const int32_t* targets, float dloss, int N, int Vl,
                     int v0, int V, cudaStream_t stream) {
  if (N <= 0) return;
  vocab_ce_finish_kernel<S><<<static_cast<unsigned int>(N), kLossThreads, 0, stream>>>(
      losses, logits_to_dlogits, mx, sumexp, tlogit, targets, dloss, Vl, v0,
      valid_columns(Vl, v0, V));
  DS_CUDA_CHECK_LAUNCH("vocab_ce_finish_kernel");
}

#define DS_CUDA_INST_S(S)                                                                          \
  template void layernorm_forward<S>(S*, float*, float*, const S*, const S*, const S*, int, int,   \
                                     int, cudaStream_t);                                           \
  template void crossentropy_forward<S>(float*, const S*, const int32_t*, int, int, int, int*,     \
                                        cudaStream_t);                                             \
  template void crossentropy_softmax_backward<S>(float*, S*, const int32_t*, float, int, int, int, \
                                                 int*, cudaStream_t);                              \
  template void vocab_ce_max<S>(float*, const S*, int, int, int, int, cudaStream_t);               \
  template void vocab_ce_sums<S>(float*, float*, const S*, const float*, const int32_t*, int, int,  \
                                 int, int, cudaStream_t);                                          \
  template void vocab_ce_finish<S>(float*, S*, const float*, const float*, const float*,           \
                                   const int32_t*, float, int, int, int, int, cudaStream_t);
#define DS_CUDA_INST_SG(S, G)                                                                      \
  template void layernorm_backward<S, G>(S*, G*, G*, const S*, const S*, const S*, const float*,  \
                                         const float*, int, int, int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
DS_CUDA_FOR_EACH_STORAGE_GRAD(DS_CUDA_INST_SG)
#undef DS_CUDA_INST_S
#undef DS_CUDA_INST_SG

}  // namespace typed

}  // namespace ds::rt::cuda
