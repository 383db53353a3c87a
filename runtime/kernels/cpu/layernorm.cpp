// LayerNorm forward and backward (eps 1e-5, biased variance, as PyTorch and llm.c).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
DS_SIMD_CLONES
void ln_row(float* o, float* mean_out, float* rstd_out, const float* x, const float* w,
            const float* b, int C) {
  const float m = vsum(x, C) / static_cast<float>(C);
  float acc[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) acc[j] += (x[c0 + j] - m) * (x[c0 + j] - m);
  }
  for (; c0 < C; c0++) acc[0] += (x[c0] - m) * (x[c0] - m);
  const float var = vsum(acc, kLanes);
  const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + 1e-5f);
  for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
  *mean_out = m;
  *rstd_out = s;
}

DS_SIMD_CLONES
void ln_row_backward(float* dx, const float* dy, const float* x, const float* w, float m, float s,
                     int C) {
  // dx += s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * w.
  float aa[kLanes] = {}, bb[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const float dn = dy[c0 + j] * w[c0 + j];
      aa[j] += dn;
      bb[j] += dn * (x[c0 + j] - m) * s;
    }
  }
  for (; c0 < C; c0++) {
    const float dn = dy[c0] * w[c0];
    aa[0] += dn;
    bb[0] += dn * (x[c0] - m) * s;
  }
  const float a = vsum(aa, kLanes) / static_cast<float>(C);
  const float b = vsum(bb, kLanes) / static_cast<float>(C);
  for (int c = 0; c < C; c++) {
    const float n = (x[c] - m) * s;
    dx[c] += s * (dy[c] * w[c] - a - n * b);
  }
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t r = 0; r < static_cast<int64_t>(B) * T; r++) {
    ln_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel if (int64_t{B} * T * C >= kParallelWork)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; r++) {
      ln_row_backward(dinp + r * C, dout + r * C, inp + r * C, weight, mean[r], rstd[r], C);
    }
    // Parameter gradients: each thread owns a block of channels and walks every row.
    const int kBlock = 32;
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
    for (int cb = 0; cb < nblocks; cb++) {
      const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
      float dw[kBlock] = {}, db[kBlock] = {};
      for (int64_t r = 0; r < N; r++) {
        const float* dy = dout + r * C;
        const float* x = inp + r * C;
        const float m = mean[r], s = rstd[r];
        for (int c = c0; c < c1; c++) {
          dw[c - c0] += dy[c] * (x[c] - m) * s;
          db[c - c0] += dy[c];
        }
      }
      for (int c = c0; c < c1; c++) {
        dweight[c] += dw[c - c0];
        dbias[c] += db[c - c0];
      }
    }
  }
}

}  // namespace ds::rt::cpu
