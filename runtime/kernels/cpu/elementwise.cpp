// GELU (tanh approximation) and residual add, forward and backward; the in-place add and
// storage-precision rounding the parallel engines and the trainer use.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr int64_t kChunk = 16384;

DS_SIMD_CLONES
void gelu_chunk(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float u = kGeluScale * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    out[i] = 0.5f * x[i] * (1.0f + vtanh(u));
  }
}

DS_SIMD_CLONES
void gelu_backward_chunk(float* dx, const float* x, const float* dy, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float xi = x[i];
    const float u = kGeluScale * (xi + 0.044715f * xi * xi * xi);
    const float th = vtanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) + 0.5f * xi * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * xi * xi);
    dx[i] = grad * dy[i];
  }
}
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t N) {
  const int64_t nchunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t c = 0; c < nchunks; c++) {
    const int64_t lo = c * kChunk;
    gelu_chunk(out + lo, inp + lo, std::min(kChunk, N - lo));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N) {
  const int64_t nchunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t c = 0; c < nchunks; c++) {
    const int64_t lo = c * kChunk;
    gelu_backward_chunk(dinp + lo, inp + lo, dout + lo, std::min(kChunk, N - lo));
  }
}

void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

void add_in_place(float* dst, const float* src, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) dst[i] += src[i];
}

void round_to_bf16_in_place(float* x, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

void round_to_f16_in_place(float* x, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

}  // namespace ds::rt::cpu
