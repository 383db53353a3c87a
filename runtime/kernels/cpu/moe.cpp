// The mixture of experts' kernels around the expert matmuls (ops.def, "mixture of experts"): the
// fused router (softmax, top-k, renormalisation, the load-balancing statistic), the sort of the
// routed slots by expert, and the row moves between token order and expert order. The expert
// matmuls themselves are matmul_forward/backward over each expert's contiguous rows.
// Any storage type (kernels.h: S): read in fp32, each output rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

template <typename S>
void moe_router_forward(float* probs, int32_t* idx, float* w, float* prob_sums, const S* logits, int N, int E,
                        int k) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * E >= kParallelWork)
  for (int n = 0; n < N; n++) {
    const S* l = logits + static_cast<int64_t>(n) * E;
    float* p = probs + static_cast<int64_t>(n) * E;
    float mx = -std::numeric_limits<float>::infinity();
    for (int e = 0; e < E; e++) mx = std::max(mx, to_f32(l[e]));
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += (p[e] = std::exp(to_f32(l[e]) - mx));
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; e++) p[e] *= inv;
    // k passes of an argmax over the experts not yet picked: ties to the lower index.
    int32_t* id = idx + static_cast<int64_t>(n) * k;
    float picked = 0.0f;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        bool taken = false;
        for (int i = 0; i < j; i++) taken |= id[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      id[j] = best;
      picked += p[best];
    }
    for (int j = 0; j < k; j++) w[static_cast<int64_t>(n) * k + j] = to_f32(from_f32<S>(p[id[j]] / picked));
  }
  // The column sums in row order (one thread: the same bits whatever the thread count).
  std::vector<double> sums(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; n++) {
    for (int e = 0; e < E; e++) sums[static_cast<size_t>(e)] += probs[n * E + e];
  }
  for (int e = 0; e < E; e++) prob_sums[e] = static_cast<float>(sums[static_cast<size_t>(e)]);
}

template <typename S>
void moe_router_backward(S* dlogits, const float* probs, const int32_t* idx, const float* w, const float* dw,
                         const float* daux, int N, int E, int k) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(N) * E >= kParallelWork)
  for (int n = 0; n < N; n++) {
    const float* p = probs + static_cast<int64_t>(n) * E;
    const int32_t* id = idx + static_cast<int64_t>(n) * k;
    const float* wn = w + static_cast<int64_t>(n) * k;
    const float* g = dw + static_cast<int64_t>(n) * k;
    // w_j = p[id_j] / Z, Z = sum of the picked p: dp[id_j] = (g_j - sum_i g_i w_i) / Z.
    float z = 0.0f, gw = 0.0f;
    for (int j = 0; j < k; j++) {
      z += p[id[j]];
      gw += g[j] * wn[j];
    }
    thread_local std::vector<float> dp_buf;  // grows once per thread
    if (dp_buf.size() < static_cast<size_t>(E)) dp_buf.resize(static_cast<size_t>(E));
    float* dp = dp_buf.data();
    for (int e = 0; e < E; e++) dp[e] = daux != nullptr ? daux[e] : 0.0f;
    for (int j = 0; j < k; j++) dp[id[j]] += (g[j] - gw) / z;
    // Softmax: dlogit_e = p_e (dp_e - sum p dp).
    float dot = 0.0f;
    for (int e = 0; e < E; e++) dot += p[e] * dp[e];
    S* d = dlogits + static_cast<int64_t>(n) * E;
    for (int e = 0; e < E; e++) d[e] = from_f32<S>(p[e] * (dp[e] - dot));
  }
}

template <typename S>
void moe_gather_rows(S* out, const S* inp, const int32_t* slots, const float* w, int64_t M, int k, int C) {
#pragma omp parallel for schedule(static) if (M * C >= kParallelWork)
  for (int64_t i = 0; i < M; i++) {
    const int64_t slot = slots != nullptr ? slots[i] : i;
    const S* src = inp + slot / k * C;
    S* dst = out + i * C;
    if (w == nullptr) {
      for (int c = 0; c < C; c++) dst[c] = src[c];
    } else {
      const float s = w[slot];
      for (int c = 0; c < C; c++) dst[c] = from_f32<S>(s * to_f32(src[c]));
    }
  }
}

template <typename S>
void moe_combine(S* out, const S* rows, const int32_t* pos, const float* w, int64_t N, int k, int C) {
#pragma omp parallel
  {
    thread_local std::vector<float> acc;  // grows once per thread
    if (acc.size() < static_cast<size_t>(C)) acc.resize(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; t++) {
      std::fill(acc.begin(), acc.begin() + C, 0.0f);
      for (int j = 0; j < k; j++) {
        const int64_t slot = t * k + j;
        const S* r = rows + static_cast<int64_t>(pos[slot]) * C;
        const float s = w != nullptr ? w[slot] : 1.0f;
        for (int c = 0; c < C; c++) acc[static_cast<size_t>(c)] += s * to_f32(r[c]);
      }
      S* o = out + t * C;
      for (int c = 0; c < C; c++) o[c] = from_f32<S>(acc[static_cast<size_t>(c)]);
    }
  }
}

template <typename S>
void moe_slot_dots(float* out, const S* a, const S* b, const int32_t* pos, int64_t NK, int H) {
#pragma omp parallel for schedule(static) if (NK * H >= kParallelWork)
  for (int64_t s = 0; s < NK; s++) {
    const int64_t row = pos != nullptr ? pos[s] : s;
    const S* x = a + row * H;
    const S* y = b + row * H;
    float d = 0.0f;
    for (int h = 0; h < H; h++) d += to_f32(x[h]) * to_f32(y[h]);
    out[s] = d;
  }
}

template <typename S>
void moe_scale_rows(S* x, const int32_t* slots, const float* w, int64_t M, int H) {
#pragma omp parallel for schedule(static) if (M * H >= kParallelWork)
  for (int64_t i = 0; i < M; i++) {
    const float s = w[slots != nullptr ? slots[i] : i];
    S* r = x + i * H;
    for (int h = 0; h < H; h++) r[h] = from_f32<S>(s * to_f32(r[h]));
  }
}

void moe_gather_f32(float* out, const float* in, const int32_t* idx, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = in[idx[i]];
}

void moe_sort_slots(int32_t* slots, int32_t* pos, int32_t* offsets, const int32_t* idx, int64_t NK, int E) {
  for (int e = 0; e <= E; e++) offsets[e] = 0;
  for (int64_t s = 0; s < NK; s++) {
    if (idx[s] < 0 || idx[s] >= E) throw invalid_argument("moe_sort_slots: slot {} routed to expert {} of {}", s, idx[s], E);
    offsets[idx[s] + 1]++;
  }
  for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
  std::vector<int32_t> fill(offsets, offsets + E);
  for (int64_t s = 0; s < NK; s++) {
    const int32_t at = fill[static_cast<size_t>(idx[s])]++;
    slots[at] = static_cast<int32_t>(s);
    pos[s] = at;
  }
}

#define DS_INST_S(S)                                                                                          \
  template void moe_router_forward<S>(float*, int32_t*, float*, float*, const S*, int, int, int);            \
  template void moe_router_backward<S>(S*, const float*, const int32_t*, const float*, const float*,          \
                                       const float*, int, int, int);                                          \
  template void moe_gather_rows<S>(S*, const S*, const int32_t*, const float*, int64_t, int, int);           \
  template void moe_combine<S>(S*, const S*, const int32_t*, const float*, int64_t, int, int);               \
  template void moe_slot_dots<S>(float*, const S*, const S*, const int32_t*, int64_t, int);                  \
  template void moe_scale_rows<S>(S*, const int32_t*, const float*, int64_t, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
