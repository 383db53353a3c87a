// SwiGLU's elementwise part, silu(gate) * up, over the stacked (gate | up) rows of one matmul.
//   silu(g) = g sig(g),  silu'(g) = sig(g) (1 + g (1 - sig(g))).
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {

inline float sigmoid(float g) { return 1.0f / (1.0f + vexp(-g)); }

template <typename T>
void swiglu_forward_t(T* out, const T* gu, int64_t N, int I) {
#pragma omp parallel for schedule(static) if (N * I >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const T* g = gu + n * 2 * I;
    const T* u = g + I;
    T* o = out + n * I;
    for (int i = 0; i < I; i++) {
      const float gv = static_cast<float>(g[i]);
      o[i] = static_cast<T>(gv * sigmoid(gv) * static_cast<float>(u[i]));
    }
  }
}

template <typename T>
void swiglu_backward_t(T* dgu, const T* dout, const T* gu, int64_t N, int I) {
#pragma omp parallel for schedule(static) if (N * I >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const T* g = gu + n * 2 * I;
    const T* u = g + I;
    const T* dy = dout + n * I;
    T* dg = dgu + n * 2 * I;
    T* du = dg + I;
    for (int i = 0; i < I; i++) {
      const float gv = static_cast<float>(g[i]), uv = static_cast<float>(u[i]), d = static_cast<float>(dy[i]);
      const float sg = sigmoid(gv);
      dg[i] = static_cast<T>(d * uv * sg * (1.0f + gv * (1.0f - sg)));
      du[i] = static_cast<T>(d * gv * sg);
    }
  }
}

}  // namespace

void swiglu_forward(float* out, const float* gu, int64_t N, int I) { swiglu_forward_t(out, gu, N, I); }

void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I) {
  swiglu_backward_t(dgu, dout, gu, N, I);
}

}  // namespace ds::rt::cpu
