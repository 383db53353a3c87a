// GELU (tanh approximation) and residual add, forward and backward, over any storage type
// (kernels.h: S); the in-place add the parallel engines use; the parallel memset of large buffers;
// fp32 rounding helpers for tests.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "core/dtype.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr int64_t kChunk = 16384;

template <typename S>
DS_SIMD_CLONES void gelu_chunk(S* out, const S* inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float x = to_f32(inp[i]);
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = from_f32<S>(0.5f * x * (1.0f + vtanh(u)));
  }
}

template <typename S>
DS_SIMD_CLONES void gelu_backward_chunk(S* dx, const S* x, const S* dy, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float xi = to_f32(x[i]);
    const float u = kGeluScale * (xi + 0.044715f * xi * xi * xi);
    // With e = exp(2u): 1 + tanh(u) = 2e / (1 + e) and sech^2(u) = 4e / (1 + e)^2, free of the
    // cancellation 1 + tanh and 1 - tanh^2 suffer in the tail (x < -3), where they left only a
    // few correct bits (docs/gpu.md, "GELU backward"). The CUDA kernel computes the same.
    const float e = vexp(std::min(2.0f * u, 80.0f));  // tanh(40) is 1 in float; 1 / (1 + e) stays normal
    const float r = 1.0f / (1.0f + e);
    const float one_plus_th = 2.0f * e * r;
    const float sech2 = 2.0f * one_plus_th * r;
    const float grad =
        0.5f * one_plus_th + 0.5f * xi * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * xi * xi);
    dx[i] = from_f32<S>(grad * to_f32(dy[i]));
  }
}

template <typename S>
DS_SIMD_CLONES void add_chunk(S* out, const S* a, const S* b, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = from_f32<S>(to_f32(a[i]) + to_f32(b[i]));
}

// f(lo, n) over [0, N) in chunks of kChunk, in parallel when N is large enough.
template <typename F>
void for_chunks(int64_t N, F f) {
  const int64_t nchunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t c = 0; c < nchunks; c++) {
    const int64_t lo = c * kChunk;
    f(lo, std::min(kChunk, N - lo));
  }
}
}  // namespace

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t N) {
  for_chunks(N, [&](int64_t lo, int64_t n) { gelu_chunk(out + lo, inp + lo, n); });
}

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t N) {
  for_chunks(N, [&](int64_t lo, int64_t n) { gelu_backward_chunk(dinp + lo, inp + lo, dout + lo, n); });
}

template <typename S>
void residual_forward(S* out, const S* inp1, const S* inp2, int64_t N) {
  for_chunks(N, [&](int64_t lo, int64_t n) { add_chunk(out + lo, inp1 + lo, inp2 + lo, n); });
}

template <typename S>
void residual_backward(S* dinp1, S* dinp2, const S* dout, int64_t N) {
  for_chunks(N, [&](int64_t lo, int64_t n) {
    add_chunk(dinp1 + lo, dinp1 + lo, dout + lo, n);
    add_chunk(dinp2 + lo, dinp2 + lo, dout + lo, n);
  });
}

template <typename S>
void add_in_place(S* dst, const S* src, int64_t N) {
  for_chunks(N, [&](int64_t lo, int64_t n) { add_chunk(dst + lo, dst + lo, src + lo, n); });
}

void fill_zero(void* p, size_t bytes) {
  constexpr size_t kChunk = size_t{1} << 20;
  auto* c = static_cast<char*>(p);
  if (bytes < 2 * kChunk || omp_in_parallel()) {
    if (bytes > 0) std::memset(c, 0, bytes);
    return;
  }
  const int64_t n = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const size_t off = static_cast<size_t>(i) * kChunk;
    std::memset(c + off, 0, std::min(kChunk, bytes - off));
  }
}

void round_to_bf16_in_place(float* x, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

void round_to_f16_in_place(float* x, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

#define DS_INST_S(S)                                                     \
  template void gelu_forward<S>(S*, const S*, int64_t);                  \
  template void gelu_backward<S>(S*, const S*, const S*, int64_t);       \
  template void residual_forward<S>(S*, const S*, const S*, int64_t);    \
  template void residual_backward<S>(S*, S*, const S*, int64_t);         \
  template void add_in_place<S>(S*, const S*, int64_t);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
