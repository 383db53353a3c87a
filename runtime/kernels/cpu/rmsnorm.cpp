// RMSNorm forward and backward (Llama's: no mean, no bias). With r = rstd and xhat = x r:
//   y = xhat w,   dx = r (dy w - xhat mean(dy w xhat)),   dw = sum over rows of dy xhat.
// Row math in fp32 whatever the storage type T (a template for the 16-bit types to come).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {

template <typename T>
float sum_squares_row(const T* x, int C) {
  float acc[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const float v = static_cast<float>(x[c0 + j]);
      acc[j] += v * v;
    }
  }
  for (; c0 < C; c0++) acc[0] += static_cast<float>(x[c0]) * static_cast<float>(x[c0]);
  return vsum(acc, kLanes);
}

template <typename T>
void rms_row(T* o, float* rstd_out, const T* x, const T* w, int C, float eps) {
  const float s = 1.0f / std::sqrt(sum_squares_row(x, C) / static_cast<float>(C) + eps);
  for (int c = 0; c < C; c++) o[c] = static_cast<T>(static_cast<float>(x[c]) * s * static_cast<float>(w[c]));
  *rstd_out = s;
}

template <typename T>
void rms_row_backward(T* dx, const T* dy, const T* x, const T* w, float s, int C) {
  float acc[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const int c = c0 + j;
      acc[j] += static_cast<float>(dy[c]) * static_cast<float>(w[c]) * static_cast<float>(x[c]);
    }
  }
  for (; c0 < C; c0++) acc[0] += static_cast<float>(dy[c0]) * static_cast<float>(w[c0]) * static_cast<float>(x[c0]);
  const float b = vsum(acc, kLanes) * s * s / static_cast<float>(C);  // mean(dy w xhat) / r
  for (int c = 0; c < C; c++) {
    const float xv = static_cast<float>(x[c]);
    dx[c] = static_cast<T>(static_cast<float>(dx[c]) + s * (static_cast<float>(dy[c]) * static_cast<float>(w[c]) - xv * b));
  }
}

template <typename T>
void rmsnorm_forward_t(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelWork)
  for (int64_t r = 0; r < N; r++) rms_row(out + r * C, rstd + r, inp + r * C, weight, C, eps);
}

template <typename T, typename G>
void rmsnorm_backward_t(T* dinp, G* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                        int64_t N, int C) {
#pragma omp parallel if (N * C >= kParallelWork)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; r++) rms_row_backward(dinp + r * C, dout + r * C, inp + r * C, weight, rstd[r], C);
    // dweight: each thread owns a block of channels and walks every row (no races, fixed order).
    constexpr int kBlock = 32;
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
    for (int cb = 0; cb < nblocks; cb++) {
      const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
      float dw[kBlock] = {};
      for (int64_t r = 0; r < N; r++) {
        const T* dy = dout + r * C;
        const T* x = inp + r * C;
        for (int c = c0; c < c1; c++) dw[c - c0] += static_cast<float>(dy[c]) * static_cast<float>(x[c]) * rstd[r];
      }
      for (int c = c0; c < c1; c++) dweight[c] = static_cast<G>(static_cast<float>(dweight[c]) + dw[c - c0]);
    }
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C, float eps) {
  rmsnorm_forward_t(out, rstd, inp, weight, N, C, eps);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int C) {
  rmsnorm_backward_t(dinp, dweight, dout, inp, weight, rstd, N, C);
}

}  // namespace ds::rt::cpu
