// Element-wise CUDA kernels: embeddings, GELU, residual, bias, type conversions, the fused AdamW
// step and the gradient norm's sum of squares. Grid-stride loops over flat buffers, fp32
// arithmetic, every kernel templated over the storage type S (and the gradient type G) and
// reading/writing it through ld/st (device_util.cuh), instantiated for fp32 and bf16 (kernels.h,
// namespace typed: the op list's twins).
// The hot ones (GELU, residual, bias, in-place add) read and write 16-byte packs where every
// pointer is aligned (device_util.cuh, for_each_pack); the others stay one element per thread per
// iteration.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// ---- encoder ----

template <typename T>
__global__ void encoder_forward_kernel(T* out, const int32_t* inp, const T* wte, const T* wpe,
                                       int T_, int C, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T_);
    st(out + i, ld(wte + int64_t{inp[bt]} * C + c) + ld(wpe + int64_t{t} * C + c));
  }
}

// dwte[inp[bt], c] += dout[bt, c] (atomic: the same token may repeat in the batch).
template <typename T, typename G>
__global__ void encoder_backward_wte_kernel(G* dwte, const T* dout, const int32_t* inp, int C,
                                            int64_t n, int v0, int Vl) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int v = inp[bt] - v0;
    if (v < 0 || v >= Vl) continue;
    atomic_add(dwte + int64_t{v} * C + c, ld(dout + i));
  }
}

// dwpe[t, c] += sum over b of dout[b, t, c]: one thread per (t, c), no race, fixed order.
template <typename T, typename G>
__global__ void encoder_backward_wpe_kernel(G* dwpe, const T* dout, int B, int T_, int C) {
  const int64_t n = int64_t{T_} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += ld(dout + int64_t{b} * n + i);
    st(dwpe + i, ld(dwpe + i) + s);
  }
}

template <typename T>
__global__ void encoder_forward_vocab_kernel(T* out, const int32_t* inp, const T* wte, int C,
                                             int64_t n, int v0, int Vl) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int v = inp[bt] - v0;
    st(out + i, (v < 0 || v >= Vl) ? 0.0f : ld(wte + int64_t{v} * C + c));
  }
}

template <typename T>
__global__ void add_position_kernel(T* out, const T* wpe, int T_, int C, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tc = i % (int64_t{T_} * C);
    st(out + i, ld(out + i) + ld(wpe + tc));
  }
}

// ---- GELU, residual, bias ----

__device__ inline float gelu(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ inline float gelu_grad(float x) {
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  // 1 + tanh(u) and sech^2(u) from e = exp(2u), without cancellation (as the CPU kernel).
  const float e = expf(fminf(2.0f * u, 80.0f));
  const float r = 1.0f / (1.0f + e);
  const float one_plus_th = 2.0f * e * r;
  const float sech2 = 2.0f * one_plus_th * r;
  return 0.5f * one_plus_th + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// The kernels below take kN elements at a time (device_util.cuh, for_each_pack): 16-byte packs
// where the launcher found every pointer aligned, one element otherwise.
template <typename T, int kN>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for_each_pack<kN>(n, [&](auto w, int64_t i) {
    constexpr int k = decltype(w)::value;
    float x[k];
    ldv<k>(inp + i, x);
#pragma unroll
    for (int j = 0; j < k; j++) x[j] = gelu(x[j]);
    stv<k>(out + i, x);
  });
}

template <typename T, int kN>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for_each_pack<kN>(n, [&](auto w, int64_t i) {
    constexpr int k = decltype(w)::value;
    float x[k], d[k];
    ldv<k>(inp + i, x);
    ldv<k>(dout + i, d);
#pragma unroll
    for (int j = 0; j < k; j++) x[j] = gelu_grad(x[j]) * d[j];
    stv<k>(dinp + i, x);
  });
}

template <typename T, int kN>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, int64_t n) {
  for_each_pack<kN>(n, [&](auto w, int64_t i) {
    constexpr int k = decltype(w)::value;
    float x[k], y[k];
    ldv<k>(a + i, x);
    ldv<k>(b + i, y);
#pragma unroll
    for (int j = 0; j < k; j++) x[j] += y[j];
    stv<k>(out + i, x);
  });
}

template <typename T, int kN>
__global__ void residual_backward_kernel(T* d1, T* d2, const T* dout, int64_t n) {
  for_each_pack<kN>(n, [&](auto w, int64_t i) {
    constexpr int k = decltype(w)::value;
    float g[k], x[k], y[k];
    ldv<k>(dout + i, g);
    ldv<k>(d1 + i, x);
    ldv<k>(d2 + i, y);
#pragma unroll
    for (int j = 0; j < k; j++) x[j] += g[j], y[j] += g[j];
    stv<k>(d1 + i, x);
    stv<k>(d2 + i, y);
  });
}

template <typename T, int kN>
__global__ void add_in_place_kernel(T* dst, const T* src, int64_t n) {
  for_each_pack<kN>(n, [&](auto w, int64_t i) {
    constexpr int k = decltype(w)::value;
    float x[k], y[k];
    ldv<k>(dst + i, x);
    ldv<k>(src + i, y);
#pragma unroll
    for (int j = 0; j < k; j++) x[j] += y[j];
    stv<k>(dst + i, x);
  });
}

__global__ void round_to_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = bf16_bits_to_f32(f32_to_bf16_bits(x[i]));
  }
}

__global__ void round_to_f16_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = __half2float(__float2half_rn(x[i]));
  }
}

__global__ void fill_f32_kernel(float* x, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

// Packs here also need OC % kN == 0, so that a pack never straddles two rows' bias.
template <typename T, int kN>
__global__ void add_bias_kernel(T* out, const T* bias, int OC, int64_t n) {
  for_each_pack<kN>(n, [&](auto w, int64_t i) {
    constexpr int k = decltype(w)::value;
    float x[k], b[k];
    ldv<k>(out + i, x);
    ldv<k>(bias + i % OC, b);
#pragma unroll
    for (int j = 0; j < k; j++) x[j] += b[j];
    stv<k>(out + i, x);
  });
}

// ---- conversions ----

__global__ void f32_to_bf16_kernel(Bf16* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    st(out + i, inp[i]);
  }
}
__global__ void bf16_to_f32_kernel(float* out, const Bf16* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = ld(inp + i);
  }
}
__global__ void f32_to_f16_kernel(uint16_t* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __half_as_ushort(__float2half_rn(inp[i]));
  }
}
__global__ void f16_to_f32_kernel(float* out, const uint16_t* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __half2float(__ushort_as_half(inp[i]));
  }
}

// ---- AdamW: the formula of optim/adamw.cpp, element for element ----

template <typename G>
__global__ void adamw_kernel(kern::AdamWStep s, float* params, const G* grads, float* m_, float* v_,
                             int64_t n, bool decoupled, bool l2, Bf16* params_bf16) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float p = params[i];
    float g = ld(grads + i) * s.grad_scale;
    if (l2) g += s.weight_decay * p;
    if (decoupled) p *= s.decay_factor;
    const float m = s.beta1 * m_[i] + s.one_minus_beta1 * g;
    const float v = s.beta2 * v_[i] + s.one_minus_beta2 * (g * g);
    m_[i] = m;
    v_[i] = v;
    const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
    p = p - s.step_size * (m / denom);
    params[i] = p;
    if (params_bf16 != nullptr) st(params_bf16 + i, p);
  }
}

template <typename G>
void adamw_launch(const kern::AdamWStep& s, float* params, const G* grads, float* m, float* v,
                  int64_t n, bool decay, Bf16* params_bf16, cudaStream_t stream) {
  if (n <= 0) return;
  const bool decoupled = decay && s.adam_w_mode && s.weight_decay != 0.0f;
  const bool l2 = decay && !s.adam_w_mode && s.weight_decay != 0.0f;
  adamw_kernel<<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(
      s, params, grads, m, v, n, decoupled, l2, params_bf16);
  DS_CUDA_CHECK_LAUNCH("adamw_kernel");
}

// ---- sum of squares: per-block partials, then one block, both in a fixed order ----

__device__ inline double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block of kThreads threads; returns the block's sum to every thread.
__device__ inline double block_sum_d(double v) {
  __shared__ double part[kThreads / 32];
  v = warp_sum_d(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < kThreads / 32; w++) t += part[w];
  return t;
}

// kSquare: the sum of squares (the gradient norm); else the plain sum (the per-token losses).
template <typename T, bool kSquare = true>
__global__ void sum_squares_partial_kernel(double* partial, const T* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double v = ld(x + i);
    s += kSquare ? v * v : v;
  }
  s = block_sum_d(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(double* out, const double* partial, int nparts) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
  s = block_sum_d(s);
  if (threadIdx.x == 0) *out = s;
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float coef) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    st(x + i, ld(x + i) * coef);
  }
}

template <typename T>
__global__ void columns_axpy_kernel(T* dst, int ld_dst, const T* src, int ld_src, float scale, int64_t N, int cols,
                                    bool accumulate) {
  const int64_t n_all = N * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_all; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    T* d = dst + r * ld_dst + c;
    st(d, (accumulate ? ld(d) : 0.0f) + scale * ld(src + r * ld_src + c));
  }
}

__device__ inline uint64_t dropout_mix(uint64_t x) {  // splitmix64's finaliser, as the CPU kernel's
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void lora_dropout_kernel(T* out, const T* x, int64_t N, int cols, int64_t col0, int64_t full_cols, float p,
                                    uint64_t key) {
  const uint64_t k = dropout_mix(key);
  const float keep_scale = 1.0f / (1.0f - p);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < N * cols; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / cols, j = i % cols;
    const uint64_t h = dropout_mix(k ^ static_cast<uint64_t>(n * full_cols + col0 + j));
    const float u = static_cast<float>(h >> 40) * 0x1.0p-24f;
    st(out + i, u < p ? 0.0f : ld(x + i) * keep_scale);
  }
}

template <typename T, bool kSquare = true>
void sum_of_squares_impl(double* out, double* scratch, const T* x, int64_t n, cudaStream_t stream) {
  sum_squares_partial_kernel<T, kSquare><<<kSumSquaresBlocks, kThreads, 0, stream>>>(scratch, x,
                                                                                     n > 0 ? n : 0);
  DS_CUDA_CHECK_LAUNCH("sum_squares_partial_kernel");
  sum_squares_final_kernel<<<1, kThreads, 0, stream>>>(out, scratch, kSumSquaresBlocks);
  DS_CUDA_CHECK_LAUNCH("sum_squares_final_kernel");
}

// A device array of doubles per (thread, device), kept for the thread's life and grown when a
// call needs more (outside the tagged accounting, like the cuBLAS workspace). Growing frees the old
// array: only for arrays whose contents a call does not keep across calls.
struct DeviceDoubles {
  int device = -1;
  int64_t count = 0;
  double* mem = nullptr;
  ~DeviceDoubles() {
    if (mem != nullptr) cudaFree(mem);
  }
  double* at_least(int64_t n) {
    int dev = 0;
    DS_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev != device || n > count) {
      if (mem != nullptr) DS_CUDA_CHECK(cudaFree(mem));
      mem = nullptr;
      DS_CUDA_CHECK(cudaMalloc(&mem, static_cast<size_t>(n) * sizeof(double)));
      device = dev;
      count = n;
    }
    return mem;
  }
};

// One scratch of 1 + kSumSquaresBlocks doubles per (thread, device), kept for the thread's life
// (a few KiB, outside the tagged accounting like the cuBLAS workspace).
double* norm_scratch() {
  thread_local DeviceDoubles scratch;
  return scratch.at_least(1 + kSumSquaresBlocks);
}

// The deferred loss sums (loss_sum_to_slot): kLossSlots doubles per (thread, device).
double* loss_slots() {
  thread_local DeviceDoubles slots;
  return slots.at_least(kLossSlots);
}

}  // namespace

void loss_sum_to_slot(const float* losses, int64_t n, int slot, cudaStream_t stream) {
  if (slot < 0 || slot >= kLossSlots) {
    throw_cuda_error("loss_sum_to_slot", "slot check", __FILE__, __LINE__, slot, "slot outside [0, kLossSlots)");
  }
  sum_of_squares_impl<float, false>(loss_slots() + slot, norm_scratch() + 1, losses, n, stream);
}

void loss_slots_to_host(double* out, int count, cudaStream_t stream) {
  if (count < 0 || count > kLossSlots) {
    throw_cuda_error("loss_slots_to_host", "count check", __FILE__, __LINE__, count, "count outside [0, kLossSlots]");
  }
  if (count == 0) return;
  DS_CUDA_CHECK(cudaMemcpyAsync(out, loss_slots(), static_cast<size_t>(count) * sizeof(double),
                                cudaMemcpyDeviceToHost, stream));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void sum_of_squares(double* out, double* scratch, const float* x, int64_t n,
                    cudaStream_t stream) {
  sum_of_squares_impl(out, scratch, x, n, stream);
}

// Every launcher returns early on empty work: a grid of 0 blocks is a launch error.
#define DS_ELEMENTWISE(kernel, n, ...)                                              \
  do {                                                                              \
    if ((n) <= 0) return;                                                           \
    kernel<<<elementwise_blocks((n), kThreads), kThreads, 0, stream>>>(__VA_ARGS__); \
    DS_CUDA_CHECK_LAUNCH(#kernel);                                                  \
  } while (0)

// The same for the packed kernels: kernel<S, pack> where `aligned` holds, kernel<S, 1> otherwise.
#define DS_ELEMENTWISE_PACKED(kernel, S, n, aligned, ...)                                         \
  do {                                                                                           \
    if ((n) <= 0) return;                                                                        \
    if (aligned) {                                                                               \
      kernel<S, PackOf<S>::kN><<<elementwise_blocks((n) / PackOf<S>::kN + 1, kThreads), kThreads, \
                                 0, stream>>>(__VA_ARGS__);                                      \
    } else {                                                                                     \
      kernel<S, 1><<<elementwise_blocks((n), kThreads), kThreads, 0, stream>>>(__VA_ARGS__);     \
    }                                                                                            \
    DS_CUDA_CHECK_LAUNCH(#kernel);                                                               \
  } while (0)

// ---- the typed kernels (kernels.h, namespace typed) ----

namespace typed {

template <typename S>
void encoder_forward(S* out, const int32_t* inp, const S* wte, const S* wpe, int B, int T, int C,
                     cudaStream_t stream) {
  const int64_t n = int64_t{B} * T * C;
  DS_ELEMENTWISE(encoder_forward_kernel<S>, n, out, inp, wte, wpe, T, C, n);
}

template <typename S, typename G>
void encoder_backward(G* dwte, G* dwpe, const S* dout, const int32_t* inp, int B, int T, int C,
                      cudaStream_t stream) {
  const int64_t n = int64_t{B} * T * C;
  if (n <= 0) return;
  if (dwte != nullptr) {
    encoder_backward_wte_kernel<S, G><<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(
        dwte, dout, inp, C, n, 0, 0x7fffffff);
    DS_CUDA_CHECK_LAUNCH("encoder_backward_wte_kernel");
  }
  if (dwpe != nullptr) {
    const int64_t tc = int64_t{T} * C;
    encoder_backward_wpe_kernel<S, G><<<elementwise_blocks(tc, kThreads), kThreads, 0, stream>>>(
        dwpe, dout, B, T, C);
    DS_CUDA_CHECK_LAUNCH("encoder_backward_wpe_kernel");
  }
}

template <typename S>
void encoder_forward_vocab(S* out, const int32_t* inp, const S* wte, int B, int T, int C, int v0,
                           int Vl, cudaStream_t stream) {
  const int64_t n = int64_t{B} * T * C;
  DS_ELEMENTWISE(encoder_forward_vocab_kernel<S>, n, out, inp, wte, C, n, v0, Vl);
}

template <typename S, typename G>
void encoder_backward_vocab(G* dwte, const S* dout, const int32_t* inp, int B, int T, int C, int v0,
                            int Vl, cudaStream_t stream) {
  const int64_t n = int64_t{B} * T * C;
  if (n <= 0) return;
  encoder_backward_wte_kernel<S, G><<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(
      dwte, dout, inp, C, n, v0, Vl);
  DS_CUDA_CHECK_LAUNCH("encoder_backward_wte_kernel");
}

template <typename S>
void add_position(S* out, const S* wpe, int B, int T, int C, cudaStream_t stream) {
  const int64_t n = int64_t{B} * T * C;
  DS_ELEMENTWISE(add_position_kernel<S>, n, out, wpe, T, C, n);
}

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE_PACKED(gelu_forward_kernel, S, N, all_aligned16(out, inp), out, inp, N);
}
template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE_PACKED(gelu_backward_kernel, S, N, all_aligned16(dinp, inp, dout), dinp, inp, dout, N);
}
template <typename S>
void residual_forward(S* out, const S* inp1, const S* inp2, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE_PACKED(residual_forward_kernel, S, N, all_aligned16(out, inp1, inp2), out, inp1, inp2, N);
}
template <typename S>
void residual_backward(S* dinp1, S* dinp2, const S* dout, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE_PACKED(residual_backward_kernel, S, N, all_aligned16(dinp1, dinp2, dout), dinp1, dinp2, dout,
                        N);
}
template <typename S>
void add_in_place(S* dst, const S* src, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE_PACKED(add_in_place_kernel, S, N, all_aligned16(dst, src), dst, src, N);
}
template <typename S>
void add_bias(S* out, const S* bias, int N, int OC, cudaStream_t stream) {
  const int64_t n = int64_t{N} * OC;
  DS_ELEMENTWISE_PACKED(add_bias_kernel, S, n, all_aligned16(out, bias) && OC % PackOf<S>::kN == 0, out, bias, OC,
                        n);
}

template <typename S>
double sum_of_squares_to_host(const S* x, int64_t n, cudaStream_t stream) {
  double* scratch = norm_scratch();
  sum_of_squares_impl(scratch, scratch + 1, x, n, stream);
  double out = 0.0;
  DS_CUDA_CHECK(cudaMemcpyAsync(&out, scratch, sizeof(double), cudaMemcpyDeviceToHost, stream));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

// Each span's sum into its own device double (the partials' scratch reused in stream order),
// then one copy back and one synchronisation for all of them.
template <typename S>
void sums_of_squares_to_host(double* out, const S* const* xs, const int64_t* ns, int count, cudaStream_t stream) {
  if (count <= 0) return;
  thread_local DeviceDoubles sums;
  double* d = sums.at_least(count);
  double* partials = norm_scratch() + 1;
  for (int i = 0; i < count; ++i) sum_of_squares_impl(d + i, partials, xs[i], ns[i], stream);
  DS_CUDA_CHECK(cudaMemcpyAsync(out, d, static_cast<size_t>(count) * sizeof(double), cudaMemcpyDeviceToHost, stream));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream));
}

template <typename S>
void scale_in_place(S* x, int64_t n, float coef, cudaStream_t stream) {
  if (coef == 1.0f) return;
  DS_ELEMENTWISE(scale_kernel<S>, n, x, n, coef);
}

template <typename S>
void columns_axpy(S* dst, int ld_dst, const S* src, int ld_src, float scale, int64_t N, int cols, bool accumulate,
                  cudaStream_t stream) {
  DS_ELEMENTWISE(columns_axpy_kernel<S>, N * cols, dst, ld_dst, src, ld_src, scale, N, cols, accumulate);
}

template <typename S>
void lora_dropout(S* out, const S* x, int64_t N, int cols, int64_t col0, int64_t full_cols, float p, uint64_t key,
                  cudaStream_t stream) {
  DS_ELEMENTWISE(lora_dropout_kernel<S>, N * cols, out, x, N, cols, col0, full_cols, p, key);
}

#define DS_CUDA_INST_S(S)                                                                       \
  template void encoder_forward<S>(S*, const int32_t*, const S*, const S*, int, int, int,       \
                                   cudaStream_t);                                               \
  template void encoder_forward_vocab<S>(S*, const int32_t*, const S*, int, int, int, int, int, \
                                         cudaStream_t);                                         \
  template void add_position<S>(S*, const S*, int, int, int, cudaStream_t);                     \
  template void gelu_forward<S>(S*, const S*, int64_t, cudaStream_t);                           \
  template void gelu_backward<S>(S*, const S*, const S*, int64_t, cudaStream_t);                \
  template void residual_forward<S>(S*, const S*, const S*, int64_t, cudaStream_t);             \
  template void residual_backward<S>(S*, S*, const S*, int64_t, cudaStream_t);                  \
  template void add_in_place<S>(S*, const S*, int64_t, cudaStream_t);                           \
  template void add_bias<S>(S*, const S*, int, int, cudaStream_t);                              \
  template double sum_of_squares_to_host<S>(const S*, int64_t, cudaStream_t);                   \
  template void sums_of_squares_to_host<S>(double*, const S* const*, const int64_t*, int, cudaStream_t); \
  template void scale_in_place<S>(S*, int64_t, float, cudaStream_t);                            \
  template void columns_axpy<S>(S*, int, const S*, int, float, int64_t, int, bool, cudaStream_t);    \
  template void lora_dropout<S>(S*, const S*, int64_t, int, int64_t, int64_t, float, uint64_t, cudaStream_t);
#define DS_CUDA_INST_SG(S, G)                                                                    \
  template void encoder_backward<S, G>(G*, G*, const S*, const int32_t*, int, int, int,          \
                                       cudaStream_t);                                            \
  template void encoder_backward_vocab<S, G>(G*, const S*, const int32_t*, int, int, int, int,   \
                                             int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
DS_CUDA_FOR_EACH_STORAGE_GRAD(DS_CUDA_INST_SG)
#undef DS_CUDA_INST_S
#undef DS_CUDA_INST_SG

}  // namespace typed

// ---- the kernels outside the op list ----

void round_to_bf16_in_place(float* x, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(round_to_bf16_kernel, N, x, N);
}
void round_to_f16_in_place(float* x, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(round_to_f16_kernel, N, x, N);
}
void fill_f32(float* x, float value, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(fill_f32_kernel, N, x, value, N);
}

void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(f32_to_bf16_kernel, N, as_bf16(out), inp, N);
}
void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(bf16_to_f32_kernel, N, out, as_bf16(inp), N);
}
void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(f32_to_f16_kernel, N, out, inp, N);
}
void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N, cudaStream_t stream) {
  DS_ELEMENTWISE(f16_to_f32_kernel, N, out, inp, N);
}

void adamw_update(const kern::AdamWStep& s, float* params, const float* grads, float* exp_avg,
                  float* exp_avg_sq, int64_t n, bool decay, uint16_t* params_bf16,
                  cudaStream_t stream) {
  adamw_launch(s, params, grads, exp_avg, exp_avg_sq, n, decay, as_bf16(params_bf16), stream);
}
void adamw_update_bf16_grads(const kern::AdamWStep& s, float* params, const uint16_t* grads,
                             float* exp_avg, float* exp_avg_sq, int64_t n, bool decay,
                             uint16_t* params_bf16, cudaStream_t stream) {
  adamw_launch(s, params, as_bf16(grads), exp_avg, exp_avg_sq, n, decay, as_bf16(params_bf16),
               stream);
}

}  // namespace ds::rt::cuda
