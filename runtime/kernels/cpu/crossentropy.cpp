// Fused softmax + cross-entropy over the real vocabulary [0, V) of (N, Vp) logits.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
// log(sum exp(x[0..V))), x unchanged.
DS_SIMD_CLONES
float row_lse(const float* x, int V) {
  const float mx = vmax(x, V);
  return mx + std::log(vexp_sum(x, mx, V));
}

// x[0..V) <- softmax(x) * dloss, x[V..Vp) <- 0; returns log(sum exp(x)) of the old values.
DS_SIMD_CLONES
float row_softmax_scaled(float* x, float dloss, int V, int Vp) {
  const float mx = vmax(x, V);
  const float sum = vexp_inplace_sum(x, mx, V);
  const float scale = dloss / sum;
  for (int v = 0; v < V; v++) x[v] *= scale;
  for (int v = V; v < Vp; v++) x[v] = 0.0f;
  return mx + std::log(sum);
}

template <bool kBackward>
int64_t crossentropy(float* losses, float* logits, const int32_t* targets, float dloss, int N,
                     int V, int Vp) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (int64_t{N} * Vp >= kParallelWork)
  for (int n = 0; n < N; n++) {
    float* x = logits + static_cast<int64_t>(n) * Vp;
    const int32_t tgt = targets[n];
    if (tgt < 0 || tgt >= V) {
      bad++;
      losses[n] = NAN;
      continue;
    }
    const float xt = x[tgt];
    if constexpr (kBackward) {
      losses[n] = row_softmax_scaled(x, dloss, V, Vp) - xt;
      x[tgt] -= dloss;
    } else {
      losses[n] = row_lse(x, V) - xt;
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

// ---- vocabulary-parallel ----

namespace {
int valid_columns(int Vl, int v0, int V) { return std::max(0, std::min(Vl, V - v0)); }
}  // namespace

void vocab_ce_max(float* mx, const float* logits, int N, int Vl, int v0, int V) {
  const int nv = valid_columns(Vl, v0, V);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vl >= kParallelWork)
  for (int n = 0; n < N; n++) mx[n] = nv > 0 ? vmax(logits + static_cast<int64_t>(n) * Vl, nv) : -INFINITY;
}

void vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const float* mx,
                   const int32_t* targets, int N, int Vl, int v0, int V) {
  const int nv = valid_columns(Vl, v0, V);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vl >= kParallelWork)
  for (int n = 0; n < N; n++) {
    const float* x = logits + static_cast<int64_t>(n) * Vl;
    sumexp[n] = nv > 0 ? vexp_sum(x, mx[n], nv) : 0.0f;
    const int t = targets[n] - v0;
    tlogit[n] = (t >= 0 && t < nv) ? x[t] : 0.0f;
  }
}

void vocab_ce_finish(float* losses, float* logits, const float* mx, const float* sumexp,
                     const float* tlogit, const int32_t* targets, float dloss, int N, int Vl,
                     int v0, int V) {
  const int nv = valid_columns(Vl, v0, V);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vl >= kParallelWork)
  for (int n = 0; n < N; n++) {
    losses[n] = mx[n] + std::log(sumexp[n]) - tlogit[n];
    if (logits == nullptr) continue;
    float* x = logits + static_cast<int64_t>(n) * Vl;
    vexp_inplace_sum(x, mx[n], nv);
    const float scale = dloss / sumexp[n];
    for (int v = 0; v < nv; v++) x[v] *= scale;
    for (int v = nv; v < Vl; v++) x[v] = 0.0f;
    const int t = targets[n] - v0;
    if (t >= 0 && t < nv) x[t] -= dloss;
  }
}

}  // namespace ds::rt::cpu
