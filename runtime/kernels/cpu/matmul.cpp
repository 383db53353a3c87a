// Matmul with bias, forward and backward, on gemm() (OpenBLAS).
#include <algorithm>

#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

void add_bias(float* out, const float* bias, int N, int OC) {
#pragma omp parallel for schedule(static) if (int64_t{N} * OC >= kParallelWork)
  for (int n = 0; n < N; n++) {
    float* o = out + static_cast<int64_t>(n) * OC;
    for (int j = 0; j < OC; j++) o[j] += bias[j];
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int T, int C, int OC) {
  const int N = B * T;
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
  if (bias != nullptr) add_bias(out, bias, N, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int T, int C, int OC) {
  const int N = B * T;
  if (dinp != nullptr) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
  gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) {
    // Column sums: each thread owns a block of output channels.
    const int kBlock = 64;
    const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{N} * OC >= kParallelWork)
    for (int jb = 0; jb < nblocks; jb++) {
      const int j0 = jb * kBlock, j1 = std::min(OC, j0 + kBlock);
      float acc[kBlock] = {};
      for (int n = 0; n < N; n++) {
        const float* d = dout + static_cast<int64_t>(n) * OC;
        for (int j = j0; j < j1; j++) acc[j - j0] += d[j];
      }
      for (int j = j0; j < j1; j++) dbias[j] += acc[j - j0];
    }
  }
}

}  // namespace ds::rt::cpu
