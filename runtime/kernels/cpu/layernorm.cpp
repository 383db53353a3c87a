// LayerNorm forward and backward (eps 1e-5, biased variance, as PyTorch and llm.c), over any
// storage type (kernels.h: S, G); mean and rstd are fp32, every sum is in fp32.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
template <typename S>
DS_SIMD_CLONES void ln_row(S* o, float* mean_out, float* rstd_out, const S* x, const S* w,
                           const S* b, int C) {
  const float m = vsum(x, C) / static_cast<float>(C);
  float acc[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const float d = to_f32(x[c0 + j]) - m;
      acc[j] += d * d;
    }
  }
  for (; c0 < C; c0++) acc[0] += (to_f32(x[c0]) - m) * (to_f32(x[c0]) - m);
  const float var = vsum(acc, kLanes);
  const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + 1e-5f);
  for (int c = 0; c < C; c++) o[c] = from_f32<S>((to_f32(x[c]) - m) * s * to_f32(w[c]) + to_f32(b[c]));
  *mean_out = m;
  *rstd_out = s;
}

template <typename S>
DS_SIMD_CLONES void ln_row_backward(S* dx, const S* dy, const S* x, const S* w, float m, float s,
                                    int C) {
  // dx += s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * w.
  float aa[kLanes] = {}, bb[kLanes] = {};
  int c0 = 0;
  for (; c0 + kLanes <= C; c0 += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const float dn = to_f32(dy[c0 + j]) * to_f32(w[c0 + j]);
      aa[j] += dn;
      bb[j] += dn * (to_f32(x[c0 + j]) - m) * s;
    }
  }
  for (; c0 < C; c0++) {
    const float dn = to_f32(dy[c0]) * to_f32(w[c0]);
    aa[0] += dn;
    bb[0] += dn * (to_f32(x[c0]) - m) * s;
  }
  const float a = vsum(aa, kLanes) / static_cast<float>(C);
  const float b = vsum(bb, kLanes) / static_cast<float>(C);
  for (int c = 0; c < C; c++) {
    const float n = (to_f32(x[c]) - m) * s;
    dx[c] = from_f32<S>(to_f32(dx[c]) + s * (to_f32(dy[c]) * to_f32(w[c]) - a - n * b));
  }
}
}  // namespace

template <typename S>
void layernorm_forward(S* out, float* mean, float* rstd, const S* inp, const S* weight,
                       const S* bias, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t r = 0; r < static_cast<int64_t>(B) * T; r++) {
    ln_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C);
  }
}

template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, std::type_identity_t<G>* dbias, const S* dout, const S* inp,
                        const S* weight, const float* mean, const float* rstd, int B, int T,
                        int C) {
  const int64_t N = static_cast<int64_t>(B) * T;
#pragma omp parallel if (int64_t{B} * T * C >= kParallelWork)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; r++) {
      ln_row_backward(dinp + r * C, dout + r * C, inp + r * C, weight, mean[r], rstd[r], C);
    }
    // Parameter gradients: each thread owns a block of channels and walks every row.
    const int kBlock = 32;
    const int nblocks = dweight == nullptr ? 0 : (C + kBlock - 1) / kBlock;  // null: frozen weights
#pragma omp for schedule(static)
    for (int cb = 0; cb < nblocks; cb++) {
      const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
      float dw[kBlock] = {}, db[kBlock] = {};
      for (int64_t r = 0; r < N; r++) {
        const S* dy = dout + r * C;
        const S* x = inp + r * C;
        const float m = mean[r], s = rstd[r];
        for (int c = c0; c < c1; c++) {
          dw[c - c0] += to_f32(dy[c]) * (to_f32(x[c]) - m) * s;
          db[c - c0] += to_f32(dy[c]);
        }
      }
      for (int c = c0; c < c1; c++) {
        dweight[c] = from_f32<G>(to_f32(dweight[c]) + dw[c - c0]);
        dbias[c] = from_f32<G>(to_f32(dbias[c]) + db[c - c0]);
      }
    }
  }
}

#define DS_INST_S(S) \
  template void layernorm_forward<S>(S*, float*, float*, const S*, const S*, const S*, int, int, int);
#define DS_INST_SG(S, G)                                                                                \
  template void layernorm_backward<S, G>(S*, G*, std::type_identity_t<G>*, const S*, const S*, const S*, const float*, \
                                         const float*, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)
DS_FOR_EACH_STORAGE_GRAD(DS_INST_SG)

}  // namespace ds::rt::cpu
