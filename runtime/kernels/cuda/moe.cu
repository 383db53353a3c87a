// The mixture of experts' kernels on the GPU (kernels/cuda/kernels.h), twins of cpu/moe.cpp with
// the same math: each a template over the storage type computing in fp32 and rounding each output
// once. The expert matmuls are matmul_forward/backward (cuBLAS) over each expert's rows.
// - Router: one thread per row (E and k are small: Mixtral 8 and 2, DeepSeek 256 and 8), the
//   column sums of the probabilities by one block per expert over the rows in a fixed order.
// - Sort: a count per expert (one block each), an exclusive scan over E on one thread, then one
//   block per expert writes its slots in slot order with a block-wide prefix sum: stable and
//   deterministic, no atomics.
// - Row moves: one block per row, threads over the channels.
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kThreads = 256;

template <typename S>
__global__ void router_rows_kernel(float* probs, int32_t* idx, float* w, const S* logits, int N, int E, int k) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const S* l = logits + static_cast<int64_t>(n) * E;
  float* p = probs + static_cast<int64_t>(n) * E;
  float mx = -INFINITY;
  for (int e = 0; e < E; e++) mx = fmaxf(mx, ld(l + e));
  float sum = 0.0f;
  for (int e = 0; e < E; e++) sum += (p[e] = expf(ld(l + e) - mx));
  const float inv = 1.0f / sum;
  for (int e = 0; e < E; e++) p[e] *= inv;
  int32_t* id = idx + static_cast<int64_t>(n) * k;
  float picked = 0.0f;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken |= id[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    id[j] = best;
    picked += p[best];
  }
  for (int j = 0; j < k; j++) {
    S r;
    st(&r, p[id[j]] / picked);
    w[static_cast<int64_t>(n) * k + j] = ld(&r);
  }
}

// prob_sums[e] over the rows: each thread a strided share in row order, then the block's shares
// in thread order (the same bits on every run).
__global__ void column_sums_kernel(float* sums, const float* probs, int N, int E) {
  __shared__ double part[kThreads];
  const int e = blockIdx.x;
  double s = 0.0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) s += probs[static_cast<int64_t>(n) * E + e];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int i = 0; i < blockDim.x; i++) t += part[i];
    sums[e] = static_cast<float>(t);
  }
}

template <typename S>
__global__ void router_backward_kernel(S* dlogits, const float* probs, const int32_t* idx, const float* w,
                                       const float* dw, const float* daux, int N, int E, int k) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + static_cast<int64_t>(n) * E;
  const int32_t* id = idx + static_cast<int64_t>(n) * k;
  const float* wn = w + static_cast<int64_t>(n) * k;
  const float* g = dw + static_cast<int64_t>(n) * k;
  float z = 0.0f, gw = 0.0f;
  for (int j = 0; j < k; j++) {
    z += p[id[j]];
    gw += g[j] * wn[j];
  }
  // dp_e = daux_e + (g_j - gw) / z where e = id_j; the dot sum p dp, then each dlogit.
  auto dp = [&](int e) {
    float v = daux != nullptr ? daux[e] : 0.0f;
    for (int j = 0; j < k; j++) v += id[j] == e ? (g[j] - gw) / z : 0.0f;
    return v;
  };
  float dot = 0.0f;
  for (int e = 0; e < E; e++) dot += p[e] * dp(e);
  S* d = dlogits + static_cast<int64_t>(n) * E;
  for (int e = 0; e < E; e++) st(d + e, p[e] * (dp(e) - dot));
}

template <typename S>
__global__ void gather_rows_kernel(S* out, const S* inp, const int32_t* slots, const float* w, int k, int C) {
  const int64_t i = blockIdx.x;
  const int64_t slot = slots != nullptr ? slots[i] : i;
  const S* src = inp + slot / k * C;
  const float s = w != nullptr ? w[slot] : 1.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) st(out + i * C + c, s * ld(src + c));
}

template <typename S>
__global__ void combine_kernel(S* out, const S* rows, const int32_t* pos, const float* w, int k, int C) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      const int64_t slot = t * k + j;
      acc += (w != nullptr ? w[slot] : 1.0f) * ld(rows + static_cast<int64_t>(pos[slot]) * C + c);
    }
    st(out + t * C + c, acc);
  }
}

template <typename S>
__global__ void slot_dots_kernel(float* out, const S* a, const S* b, const int32_t* pos, int H) {
  __shared__ float part[kThreads];
  const int64_t s = blockIdx.x;
  const int64_t row = pos != nullptr ? pos[s] : s;
  const S* x = a + row * H;
  const S* y = b + row * H;
  float d = 0.0f;
  for (int h = threadIdx.x; h < H; h += blockDim.x) d += ld(x + h) * ld(y + h);
  part[threadIdx.x] = d;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[s] = part[0];
}

template <typename S>
__global__ void scale_rows_kernel(S* x, const int32_t* slots, const float* w, int H) {
  const int64_t i = blockIdx.x;
  const float s = w[slots != nullptr ? slots[i] : i];
  for (int h = threadIdx.x; h < H; h += blockDim.x) st(x + i * H + h, s * ld(x + i * H + h));
}

// counts[e + 1] = the slots routed to expert e (offsets[0] = 0).
__global__ void count_kernel(int32_t* offsets, const int32_t* idx, int64_t NK) {
  __shared__ int part[kThreads];
  const int e = blockIdx.x;
  int c = 0;
  for (int64_t s = threadIdx.x; s < NK; s += blockDim.x) c += idx[s] == e;
  part[threadIdx.x] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int t = 0;
    for (int i = 0; i < blockDim.x; i++) t += part[i];
    offsets[e + 1] = t;
    if (e == 0) offsets[0] = 0;
  }
}

__global__ void scan_kernel(int32_t* offsets, int E) {
  for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
}

// Expert e's slots in slot order: chunks of blockDim slots, a block-wide exclusive scan of the
// matches inside each chunk.
__global__ void place_kernel(int32_t* slots, int32_t* pos, const int32_t* offsets, const int32_t* idx, int64_t NK) {
  __shared__ int scan[kThreads];
  const int e = blockIdx.x;
  int base = offsets[e];
  for (int64_t c0 = 0; c0 < NK; c0 += blockDim.x) {
    const int64_t s = c0 + threadIdx.x;
    const int hit = s < NK && idx[s] == e;
    scan[threadIdx.x] = hit;
    __syncthreads();
    for (int d = 1; d < blockDim.x; d *= 2) {  // inclusive Hillis-Steele scan
      const int v = threadIdx.x >= d ? scan[threadIdx.x - d] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    if (hit) {
      const int at = base + scan[threadIdx.x] - 1;
      slots[at] = static_cast<int32_t>(s);
      pos[s] = at;
    }
    const int total = scan[blockDim.x - 1];
    __syncthreads();
    base += total;
  }
}

__global__ void gather_f32_kernel(float* out, const float* in, const int32_t* idx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = in[idx[i]];
  }
}

}  // namespace

void moe_gather_f32(float* out, const float* in, const int32_t* idx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gather_f32_kernel<<<elementwise_blocks(n, kThreads), kThreads, 0, stream>>>(out, in, idx, n);
  DS_CUDA_CHECK_LAUNCH("moe gather_f32_kernel");
}

void moe_sort_slots(int32_t* slots, int32_t* pos, int32_t* offsets, const int32_t* idx, int64_t NK, int E,
                    cudaStream_t stream) {
  count_kernel<<<E, kThreads, 0, stream>>>(offsets, idx, NK);
  DS_CUDA_CHECK_LAUNCH("moe count_kernel");
  scan_kernel<<<1, 1, 0, stream>>>(offsets, E);
  DS_CUDA_CHECK_LAUNCH("moe scan_kernel");
  if (NK > 0) {
    place_kernel<<<E, kThreads, 0, stream>>>(slots, pos, offsets, idx, NK);
    DS_CUDA_CHECK_LAUNCH("moe place_kernel");
  }
}

namespace typed {

template <typename S>
void moe_router_forward(float* probs, int32_t* idx, float* w, float* prob_sums, const S* logits, int N, int E, int k,
                        cudaStream_t stream) {
  if (N > 0) {
    router_rows_kernel<S><<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(probs, idx, w, logits, N, E, k);
    DS_CUDA_CHECK_LAUNCH("moe router_rows_kernel");
  }
  column_sums_kernel<<<E, kThreads, 0, stream>>>(prob_sums, probs, N, E);
  DS_CUDA_CHECK_LAUNCH("moe column_sums_kernel");
}

template <typename S>
void moe_router_backward(S* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* daux, int N, int E, int k, cudaStream_t stream) {
  if (N <= 0) return;
  router_backward_kernel<S>
      <<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dlogits, probs, idx, w, dw, daux, N, E, k);
  DS_CUDA_CHECK_LAUNCH("moe router_backward_kernel");
}

template <typename S>
void moe_gather_rows(S* out, const S* inp, const int32_t* slots, const float* w, int64_t M, int k, int C,
                     cudaStream_t stream) {
  if (M <= 0) return;
  gather_rows_kernel<S><<<static_cast<unsigned>(M), kThreads, 0, stream>>>(out, inp, slots, w, k, C);
  DS_CUDA_CHECK_LAUNCH("moe gather_rows_kernel");
}

template <typename S>
void moe_combine(S* out, const S* rows, const int32_t* pos, const float* w, int64_t N, int k, int C,
                 cudaStream_t stream) {
  if (N <= 0) return;
  combine_kernel<S><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(out, rows, pos, w, k, C);
  DS_CUDA_CHECK_LAUNCH("moe combine_kernel");
}

template <typename S>
void moe_slot_dots(float* out, const S* a, const S* b, const int32_t* pos, int64_t NK, int H, cudaStream_t stream) {
  if (NK <= 0) return;
  slot_dots_kernel<S><<<static_cast<unsigned>(NK), kThreads, 0, stream>>>(out, a, b, pos, H);
  DS_CUDA_CHECK_LAUNCH("moe slot_dots_kernel");
}

template <typename S>
void moe_scale_rows(S* x, const int32_t* slots, const float* w, int64_t M, int H, cudaStream_t stream) {
  if (M <= 0) return;
  scale_rows_kernel<S><<<static_cast<unsigned>(M), kThreads, 0, stream>>>(x, slots, w, H);
  DS_CUDA_CHECK_LAUNCH("moe scale_rows_kernel");
}

#define DS_CUDA_INST_S(S)                                                                                       \
  template void moe_router_forward<S>(float*, int32_t*, float*, float*, const S*, int, int, int, cudaStream_t); \
  template void moe_router_backward<S>(S*, const float*, const int32_t*, const float*, const float*,            \
                                       const float*, int, int, int, cudaStream_t);                              \
  template void moe_gather_rows<S>(S*, const S*, const int32_t*, const float*, int64_t, int, int, cudaStream_t); \
  template void moe_combine<S>(S*, const S*, const int32_t*, const float*, int64_t, int, int, cudaStream_t);     \
  template void moe_slot_dots<S>(float*, const S*, const S*, const int32_t*, int64_t, int, cudaStream_t);      \
  template void moe_scale_rows<S>(S*, const int32_t*, const float*, int64_t, int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
#undef DS_CUDA_INST_S

}  // namespace typed

}  // namespace ds::rt::cuda
