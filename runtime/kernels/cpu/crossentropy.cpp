// Fused softmax + cross-entropy over the real vocabulary [0, V) of (N, Vp) logits.
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
// Returns log(sum exp(x - max)) + max over x[0..V).
DS_SIMD_CLONES
float row_lse(const float* x, int V) {
  float mx = -INFINITY;
  for (int v = 0; v < V; v++) mx = x[v] > mx ? x[v] : mx;
  float sum = 0.0f;
  for (int v = 0; v < V; v++) sum += vexp(x[v] - mx);
  return mx + std::log(sum);
}

DS_SIMD_CLONES
void row_dlogits(float* x, float lse, float dloss, int V, int Vp) {
  for (int v = 0; v < V; v++) x[v] = vexp(x[v] - lse) * dloss;
  for (int v = V; v < Vp; v++) x[v] = 0.0f;
}

template <bool kBackward>
int64_t crossentropy(float* losses, float* logits, const int32_t* targets, float dloss, int N,
                     int V, int Vp) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (int64_t{N} * Vp >= kParallelWork)
  for (int n = 0; n < N; n++) {
    float* x = logits + static_cast<int64_t>(n) * Vp;
    const int32_t tgt = targets[n];
    const float lse = row_lse(x, V);
    if (tgt < 0 || tgt >= V) {
      bad++;
      losses[n] = NAN;
      continue;
    }
    losses[n] = lse - x[tgt];
    if constexpr (kBackward) {
      row_dlogits(x, lse, dloss, V, Vp);
      x[tgt] -= dloss;
    }
  }
  return bad;
}
}  // namespace

int64_t crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V, int Vp) {
  return crossentropy<false>(losses, const_cast<float*>(logits), targets, 0.0f, N, V, Vp);
}

int64_t crossentropy_softmax_backward(float* losses, float* logits_to_dlogits,
                                      const int32_t* targets, float dloss, int N, int V, int Vp) {
  return crossentropy<true>(losses, logits_to_dlogits, targets, dloss, N, V, Vp);
}

}  // namespace ds::rt::cpu
