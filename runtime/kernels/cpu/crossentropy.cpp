// Fused softmax + cross-entropy over the real vocabulary [0, V) of (N, Vp) logits of any storage
// type (kernels.h: S); losses and every sum are fp32. With fp32 logits the softmax is written in
// place and scaled (one exp per element); with 16-bit logits the exponentials go to an fp32 row
// of the thread's and each dlogit is computed from it and rounded once (one exp, one rounding).
// A target of kIgnoreTarget (a masked-out token) has loss 0 and zero dlogits, here and in the
// vocabulary-parallel variant.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
// log(sum exp(x[0..V))), x unchanged.
template <typename S>
DS_SIMD_CLONES float row_lse(const S* x, int V) {
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

// The same for 16-bit x: x[v] <- exp(x[v] - mx) * dloss / sum, rounded once; x[V..Vp) <- 0.
// `tgt` (in [0, V)) also gets -dloss before its one rounding. The exponentials are kept in fp32
// in e (V floats, the thread's) between the sum and the scaling, so each is computed once.
template <typename S>
DS_SIMD_CLONES float row_softmax_scaled_16(S* x, float* e, float dloss, int tgt, int V, int Vp) {
  const float mx = vmax(x, V);
  const float sum = vexp_into_sum(e, x, mx, V);
  const float scale = dloss / sum;
  const float et = e[tgt];
  for (int v = 0; v < V; v++) x[v] = from_f32<S>(e[v] * scale);
  for (int v = V; v < Vp; v++) x[v] = from_f32<S>(0.0f);
  x[tgt] = from_f32<S>(et * scale - dloss);
  return mx + std::log(sum);
}

template <bool kBackward, typename S>
int64_t crossentropy(float* losses, S* logits, const int32_t* targets, float dloss, int N, int V,
                     int Vp) {
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (int64_t{N} * Vp >= kParallelWork)
  for (int n = 0; n < N; n++) {
    S* x = logits + static_cast<int64_t>(n) * Vp;
    const int32_t tgt = targets[n];
    if (tgt == kIgnoreTarget) {  // masked out: loss 0, and backward no gradient
      losses[n] = 0.0f;
      if constexpr (kBackward) {
        for (int v = 0; v < Vp; v++) x[v] = from_f32<S>(0.0f);
      }
      continue;
    }
    if (tgt < 0 || tgt >= V) {
      bad++;
      losses[n] = NAN;
      continue;
    }
    const float xt = to_f32(x[tgt]);
    if constexpr (!kBackward) {
      losses[n] = row_lse(x, V) - xt;
    } else if constexpr (std::is_same_v<S, float>) {
      losses[n] = row_softmax_scaled(x, dloss, V, Vp) - xt;
      x[tgt] -= dloss;
    } else {
      // The exponentials' row: the thread's, grown once to the vocabulary (not a tracked buffer:
      // V floats per thread, 200 KB at a 50k vocabulary).
      thread_local std::vector<float> e;
      if (e.size() < static_cast<size_t>(V)) e.resize(V);
      losses[n] = row_softmax_scaled_16(x, e.data(), dloss, tgt, V, Vp) - xt;
    }
  }
  return bad;
}

int valid_columns(int Vl, int v0, int V) { return std::max(0, std::min(Vl, V - v0)); }
}  // namespace

template <typename S>
int64_t crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                             int Vp) {
  return crossentropy<false>(losses, const_cast<S*>(logits), targets, 0.0f, N, V, Vp);
}

template <typename S>
int64_t crossentropy_softmax_backward(float* losses, S* logits_to_dlogits, const int32_t* targets,
                                      float dloss, int N, int V, int Vp) {
  return crossentropy<true>(losses, logits_to_dlogits, targets, dloss, N, V, Vp);
}

// ---- vocabulary-parallel ----

template <typename S>
void vocab_ce_max(float* mx, const S* logits, int N, int Vl, int v0, int V) {
  const int nv = valid_columns(Vl, v0, V);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vl >= kParallelWork)
  for (int n = 0; n < N; n++) mx[n] = nv > 0 ? vmax(logits + static_cast<int64_t>(n) * Vl, nv) : -INFINITY;
}

template <typename S>
void vocab_ce_sums(float* sumexp, float* tlogit, const S* logits, const float* mx,
                   const int32_t* targets, int N, int Vl, int v0, int V) {
  const int nv = valid_columns(Vl, v0, V);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vl >= kParallelWork)
  for (int n = 0; n < N; n++) {
    const S* x = logits + static_cast<int64_t>(n) * Vl;
    sumexp[n] = nv > 0 ? vexp_sum(x, mx[n], nv) : 0.0f;
    const int t = targets[n] - v0;
    tlogit[n] = (t >= 0 && t < nv) ? to_f32(x[t]) : 0.0f;
  }
}

template <typename S>
void vocab_ce_finish(float* losses, S* logits, const float* mx, const float* sumexp,
                     const float* tlogit, const int32_t* targets, float dloss, int N, int Vl,
                     int v0, int V) {
  const int nv = valid_columns(Vl, v0, V);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vl >= kParallelWork)
  for (int n = 0; n < N; n++) {
    const bool ignored = targets[n] == kIgnoreTarget;  // masked out: loss 0, no gradient
    losses[n] = ignored ? 0.0f : mx[n] + std::log(sumexp[n]) - tlogit[n];
    if (logits == nullptr) continue;
    S* x = logits + static_cast<int64_t>(n) * Vl;
    const float scale = ignored ? 0.0f : dloss / sumexp[n];
    const int t = targets[n] - v0;
    for (int v = 0; v < nv; v++) {
      const float d = vexp(to_f32(x[v]) - mx[n]) * scale;
      x[v] = from_f32<S>(v == t ? d - dloss : d);
    }
    for (int v = nv; v < Vl; v++) x[v] = from_f32<S>(0.0f);
  }
}

#define DS_INST_S(S)                                                                                   \
  template int64_t crossentropy_forward<S>(float*, const S*, const int32_t*, int, int, int);           \
  template int64_t crossentropy_softmax_backward<S>(float*, S*, const int32_t*, float, int, int, int); \
  template void vocab_ce_max<S>(float*, const S*, int, int, int, int);                                 \
  template void vocab_ce_sums<S>(float*, float*, const S*, const float*, const int32_t*, int, int, int, \
                                 int);                                                                  \
  template void vocab_ce_finish<S>(float*, S*, const float*, const float*, const float*, const int32_t*, \
                                   float, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
