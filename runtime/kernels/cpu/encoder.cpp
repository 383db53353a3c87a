// Token + position embedding, forward and backward.
#include <algorithm>

#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    const int t = static_cast<int>(bt % T);
    float* o = out + bt * C;
    const float* w = wte + static_cast<int64_t>(inp[bt]) * C;
    const float* p = wpe + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; c++) o[c] = w[c] + p[c];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                      int T, int C) {
  // Parallel over channel blocks: every thread walks all tokens for its channels, so repeated
  // tokens never race and the sums keep one order.
  const int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int cb = 0; cb < nblocks; cb++) {
    const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
      const int t = static_cast<int>(bt % T);
      const float* d = dout + bt * C;
      if (dwte != nullptr) {
        float* w = dwte + static_cast<int64_t>(inp[bt]) * C;
        for (int c = c0; c < c1; c++) w[c] += d[c];
      }
      if (dwpe != nullptr) {
        float* p = dwpe + static_cast<int64_t>(t) * C;
        for (int c = c0; c < c1; c++) p[c] += d[c];
      }
    }
  }
}

void encoder_forward_vocab(float* out, const int32_t* inp, const float* wte, int B, int T, int C,
                           int v0, int Vl) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    float* o = out + bt * C;
    const int v = inp[bt] - v0;
    if (v < 0 || v >= Vl) {
      for (int c = 0; c < C; c++) o[c] = 0.0f;
      continue;
    }
    const float* w = wte + static_cast<int64_t>(v) * C;
    for (int c = 0; c < C; c++) o[c] = w[c];
  }
}

void encoder_backward_vocab(float* dwte, const float* dout, const int32_t* inp, int B, int T,
                            int C, int v0, int Vl) {
  const int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int cb = 0; cb < nblocks; cb++) {
    const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
      const int v = inp[bt] - v0;
      if (v < 0 || v >= Vl) continue;
      const float* d = dout + bt * C;
      float* w = dwte + static_cast<int64_t>(v) * C;
      for (int c = c0; c < c1; c++) w[c] += d[c];
    }
  }
}

void add_position(float* out, const float* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    float* o = out + bt * C;
    const float* p = wpe + (bt % T) * C;
    for (int c = 0; c < C; c++) o[c] += p[c];
  }
}

}  // namespace ds::rt::cpu
