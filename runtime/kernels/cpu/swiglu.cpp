// SwiGLU's elementwise part, silu(gate) * up, over the stacked (gate | up) rows of one matmul.
//   silu(g) = g sig(g),  silu'(g) = sig(g) (1 + g (1 - sig(g))).
// Any storage type (kernels.h: S): read in fp32, each output rounded once.
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {

inline float sigmoid(float g) { return 1.0f / (1.0f + vexp(-g)); }

// The row loops are multi-versioned (vmath.h) so the exp and the 16-bit conversions vectorise.
template <typename S>
DS_SIMD_CLONES void swiglu_row(S* o, const S* g, const S* u, int I) {
  for (int i = 0; i < I; i++) {
    const float gv = to_f32(g[i]);
    o[i] = from_f32<S>(gv * sigmoid(gv) * to_f32(u[i]));
  }
}

template <typename S>
DS_SIMD_CLONES void swiglu_row_backward(S* dg, S* du, const S* dy, const S* g, const S* u, int I) {
  for (int i = 0; i < I; i++) {
    const float gv = to_f32(g[i]), uv = to_f32(u[i]), d = to_f32(dy[i]);
    const float sg = sigmoid(gv);
    dg[i] = from_f32<S>(d * uv * sg * (1.0f + gv * (1.0f - sg)));
    du[i] = from_f32<S>(d * gv * sg);
  }
}

}  // namespace

template <typename S>
void swiglu_forward(S* out, const S* gu, int64_t N, int I) {
#pragma omp parallel for schedule(static) if (N * I >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const S* g = gu + n * 2 * I;
    swiglu_row(out + n * I, g, g + I, I);
  }
}

template <typename S>
void swiglu_backward(S* dgu, const S* dout, const S* gu, int64_t N, int I) {
#pragma omp parallel for schedule(static) if (N * I >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const S* g = gu + n * 2 * I;
    S* dg = dgu + n * 2 * I;
    swiglu_row_backward(dg, dg + I, dout + n * I, g, g + I, I);
  }
}

#define DS_INST_S(S)                                                  \
  template void swiglu_forward<S>(S*, const S*, int64_t, int);        \
  template void swiglu_backward<S>(S*, const S*, const S*, int64_t, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
