// RMSNorm forward and backward (no mean, no bias). With r = rstd and xhat = x r:
//   y = xhat w,   dx = r (dy w - xhat mean(dy w xhat)),   dw = sum over rows of dy xhat.
// Row math in fp32 whatever the storage type (kernels.h: S, G); rstd is fp32; each output is
// rounded once (dinp after its accumulation, dweight after the rows' fp32 sum is added).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {

template <typename S>
float sum_squares_row(const S* x, int C) {
  float acc[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const float v = to_f32(x[c0 + j]);
      acc[j] += v * v;
    }
  }
  for (; c0 < C; c0++) acc[0] += to_f32(x[c0]) * to_f32(x[c0]);
  return vsum(acc, kLanes);
}

// The row loops are multi-versioned (vmath.h) so the 16-bit conversions vectorise.
template <typename S>
DS_SIMD_CLONES void rms_row(S* o, float* rstd_out, const S* x, const S* w, int C, float eps) {
  const float s = 1.0f / std::sqrt(sum_squares_row(x, C) / static_cast<float>(C) + eps);
  for (int c = 0; c < C; c++) o[c] = from_f32<S>(to_f32(x[c]) * s * to_f32(w[c]));
  *rstd_out = s;
}

template <typename S>
DS_SIMD_CLONES void rms_row_backward(S* dx, const S* dy, const S* x, const S* w, float s, int C) {
  float acc[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const int c = c0 + j;
      acc[j] += to_f32(dy[c]) * to_f32(w[c]) * to_f32(x[c]);
    }
  }
  for (; c0 < C; c0++) acc[0] += to_f32(dy[c0]) * to_f32(w[c0]) * to_f32(x[c0]);
  const float b = vsum(acc, kLanes) * s * s / static_cast<float>(C);  // mean(dy w xhat) / r
  for (int c = 0; c < C; c++) {
    const float xv = to_f32(x[c]);
    dx[c] = from_f32<S>(to_f32(dx[c]) + s * (to_f32(dy[c]) * to_f32(w[c]) - xv * b));
  }
}

// dw[c - c0] = sum over rows of dy xhat, channels [c0, c1).
template <typename S>
DS_SIMD_CLONES void weight_grad_block(float* dw, const S* dout, const S* inp, const float* rstd, int64_t N, int C,
                                      int c0, int c1) {
  for (int64_t r = 0; r < N; r++) {
    const S* dy = dout + r * C;
    const S* x = inp + r * C;
    for (int c = c0; c < c1; c++) dw[c - c0] += to_f32(dy[c]) * to_f32(x[c]) * rstd[r];
  }
}

}  // namespace

template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelWork)
  for (int64_t r = 0; r < N; r++) rms_row(out + r * C, rstd + r, inp + r * C, weight, C, eps);
}

template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight, const float* rstd,
                      int64_t N, int C) {
#pragma omp parallel if (N * C >= kParallelWork)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; r++) rms_row_backward(dinp + r * C, dout + r * C, inp + r * C, weight, rstd[r], C);
    // dweight: each thread owns a block of channels and walks every row (no races, fixed order).
    constexpr int kBlock = 32;
    const int nblocks = dweight == nullptr ? 0 : (C + kBlock - 1) / kBlock;  // null: a frozen weight
#pragma omp for schedule(static)
    for (int cb = 0; cb < nblocks; cb++) {
      const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
      float dw[kBlock] = {};
      weight_grad_block(dw, dout, inp, rstd, N, C, c0, c1);
      for (int c = c0; c < c1; c++) dweight[c] = from_f32<G>(to_f32(dweight[c]) + dw[c - c0]);
    }
  }
}

#define DS_INST_S(S) template void rmsnorm_forward<S>(S*, float*, const S*, const S*, int64_t, int, float);
#define DS_INST_SG(S, G) \
  template void rmsnorm_backward<S, G>(S*, G*, const S*, const S*, const S*, const float*, int64_t, int);
DS_FOR_EACH_STORAGE(DS_INST_S)
DS_FOR_EACH_STORAGE_GRAD(DS_INST_SG)

}  // namespace ds::rt::cpu
