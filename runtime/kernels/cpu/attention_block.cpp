// Ring attention's pieces (context parallelism, cpu/kernels.h): one rank's queries against one
// block of keys and values at other sequence positions, the merge of the partial results by
// their log-sum-exp, and the backward of one block given the merged output and lse.
//
// Per query head h (kv head g = h / (NH/KV)), query i at position qi = q_pos + i sees the block's
// keys j with k_pos + j <= qi, n_i of them (0..Tk):
//   s_ij = scale q_i . k_j,  lse_i = log sum_j exp(s_ij),  o_i = sum_j exp(s_ij - lse_i) v_j.
// Merging partial (o, lse) pairs: lse = log(exp(lse_a) + exp(lse_b)), o = e^(lse_a - lse) o_a +
// e^(lse_b - lse) o_b; a row that saw no key has lse -inf and contributes nothing. Backward, with
// the MERGED o and lse (so the block's probabilities are the full softmax's):
//   p_ij = exp(s_ij - lse_i),  D_i = dO_i . o_i,  ds_ij = scale p_ij (dO_i . v_j - D_i),
//   dq_i += sum_j ds_ij k_j,  dk_j += sum_i ds_ij q_i,  dv_j += sum_i p_ij dO_i.
// Everything is computed in fp32 over rows converted once from the storage type, in tiles of 64
// queries whose scores, probabilities and products are gemms (as cpu/attention.cpp's heads), the
// row steps between them the fused attention's (attention_rows.h: the widest ISA the CPU has);
// partial outputs and gradients are fp32 accumulators (a ring adds several blocks before one
// rounding).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys of the block visible to query i.
inline int visible(int i, int Tk, int q_pos, int k_pos) {
  const int64_t n = static_cast<int64_t>(q_pos) + i - k_pos + 1;
  return static_cast<int>(std::clamp<int64_t>(n, 0, Tk));
}

template <typename S>
void load(float* dst, const S* src, int n) {
  for (int d = 0; d < n; d++) dst[d] = to_f32(src[d]);
}

struct BlockGeometry {
  int Tq, Tk, NH, KV, hd;
  int64_t qkv_stride() const { return static_cast<int64_t>(NH + 2 * KV) * hd; }
  int64_t kv_stride() const { return static_cast<int64_t>(2 * KV) * hd; }
  int64_t out_stride() const { return static_cast<int64_t>(NH) * hd; }
  int group() const { return NH / KV; }
};

constexpr int kRows = 64;  // queries per tile of scores (kRows, Tk)

// Query head h's rows (Tq, hd) of sequence b into q, and kv head g's keys and values (Tk, hd) of
// the block into k and v, in fp32.
template <typename S>
void load_head(float* k, float* v, float* q, const S* kv, const S* qkv, const BlockGeometry& G, int b, int g, int h) {
  const int hd = G.hd;
  const S* kvb = kv + static_cast<int64_t>(b) * G.Tk * G.kv_stride();
  for (int j = 0; j < G.Tk; j++) {
    load(k + static_cast<int64_t>(j) * hd, kvb + j * G.kv_stride() + static_cast<int64_t>(g) * hd, hd);
    load(v + static_cast<int64_t>(j) * hd, kvb + j * G.kv_stride() + static_cast<int64_t>(G.KV + g) * hd, hd);
  }
  for (int i = 0; i < G.Tq; i++) {
    load(q + static_cast<int64_t>(i) * hd, qkv + (static_cast<int64_t>(b) * G.Tq + i) * G.qkv_stride() + static_cast<int64_t>(h) * hd, hd);
  }
}

}  // namespace

size_t attention_block_scratch_floats(int Tq, int Tk, int hd) {
  const size_t q = static_cast<size_t>(Tq), k = static_cast<size_t>(Tk), h = static_cast<size_t>(hd);
  return 3 * q * h + q + 2 * k * h + 2 * static_cast<size_t>(kRows) * k;
}

namespace {

// This thread's tiles in `scratch` (attention_block_scratch_floats of them per thread): the
// forward uses q, k, v and P (its scores); the backward all of them.
struct BlockTiles {
  float *q, *o, *dO, *D, *k, *v, *P, *dS;
  BlockTiles(float* scratch, int Tq, int Tk, int hd) {
    const size_t tq = static_cast<size_t>(Tq) * hd, tk = static_cast<size_t>(Tk) * hd;
    q = scratch + static_cast<size_t>(omp_get_thread_num()) * attention_block_scratch_floats(Tq, Tk, hd);
    o = q + tq;
    dO = o + tq;
    D = dO + tq;
    k = D + Tq;
    v = k + tk;
    P = v + tk;
    dS = P + static_cast<size_t>(kRows) * Tk;
  }
};

}  // namespace

template <typename S>
void attention_block_forward(float* out, float* lse, const S* qkv, const S* kv, float* scratch, int B, int Tq,
                             int Tk, int NH, int KV, int hd, int q_pos, int k_pos) {
  const BlockGeometry G{Tq, Tk, NH, KV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  gemm_before_parallel_region();
#pragma omp parallel if (int64_t{B} * NH * Tq * Tk * hd >= kParallelWork)
  {
    // This thread's fp32 copies of one head's q (Tq, hd), k and v (Tk, hd), one tile of scores.
    const BlockTiles tiles(scratch, Tq, Tk, hd);
    float *q = tiles.q, *k = tiles.k, *v = tiles.v, *sc = tiles.P;
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH, g = h / G.group();
      load_head(k, v, q, kv, qkv, G, b, g, h);
      for (int r0 = 0; r0 < Tq; r0 += kRows) {
        const int r1 = std::min(Tq, r0 + kRows), m = r1 - r0;
        const int nmax = visible(r1 - 1, Tk, q_pos, k_pos);  // keys any row of the tile sees
        float* o = out + (static_cast<int64_t>(b) * Tq + r0) * G.out_stride() + static_cast<int64_t>(h) * hd;
        float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
        if (nmax == 0) {
          for (int t = r0; t < r1; t++) {
            std::fill(o + (t - r0) * G.out_stride(), o + (t - r0) * G.out_stride() + hd, 0.0f);
            l[t] = kNegInf;
          }
          continue;
        }
        gemm(false, true, m, nmax, hd, scale, q + static_cast<int64_t>(r0) * hd, hd, k, hd, 0.0f,
             sc, nmax);
        for (int t = r0; t < r1; t++) {
          float* row = sc + static_cast<int64_t>(t - r0) * nmax;
          const int n = visible(t, Tk, q_pos, k_pos);
          if (n == 0) {
            std::fill(row, row + nmax, 0.0f);
            l[t] = kNegInf;
            continue;
          }
          l[t] = attention_rows::softmax_row(row, n - 1, nmax);
        }
        gemm(false, false, m, hd, nmax, 1.0f, sc, nmax, v, hd, 0.0f, o, static_cast<int>(G.out_stride()));
      }
    }
  }
}

void attention_merge(float* out, float* lse, const float* part, const float* part_lse, int B, int T, int NH,
                     int hd) {
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
#pragma omp parallel for schedule(static) if (rows * hd >= kParallelWork)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t b = r / (static_cast<int64_t>(NH) * T), h = (r / T) % NH, t = r % T;
    const float la = lse[r], lb = part_lse[r];
    if (lb == kNegInf) continue;
    float* o = out + (b * T + t) * NH * hd + h * hd;
    const float* p = part + (b * T + t) * NH * hd + h * hd;
    if (la == kNegInf) {
      std::copy(p, p + hd, o);
      lse[r] = lb;
      continue;
    }
    const float m = std::max(la, lb);
    const float l = m + std::log(std::exp(la - m) + std::exp(lb - m));
    const float wa = std::exp(la - l), wb = std::exp(lb - l);
    for (int d = 0; d < hd; d++) o[d] = wa * o[d] + wb * p[d];
    lse[r] = l;
  }
}

template <typename S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const S* kv, const S* out,
                              const float* lse, float* scratch, int B, int Tq, int Tk, int NH, int KV, int hd,
                              int q_pos, int k_pos) {
  const BlockGeometry G{Tq, Tk, NH, KV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int ldo = static_cast<int>(G.out_stride()), ldkv = static_cast<int>(G.kv_stride());
  gemm_before_parallel_region();
  // One task per (b, kv head): it owns that head's dk and dv rows and its group's dq rows, so no
  // two threads write the same element, and the sums run in a fixed order.
#pragma omp parallel if (int64_t{B} * NH * Tq * Tk * hd >= kParallelWork)
  {
    const BlockTiles tiles(scratch, Tq, Tk, hd);
    float *q = tiles.q, *o = tiles.o, *dO = tiles.dO, *D = tiles.D, *k = tiles.k, *v = tiles.v, *P = tiles.P,
          *dS = tiles.dS;
#pragma omp for schedule(static)
    for (int bg = 0; bg < B * KV; bg++) {
      const int b = bg / KV, g = bg % KV;
      float* dk = dkv + static_cast<int64_t>(b) * Tk * G.kv_stride() + static_cast<int64_t>(g) * hd;
      float* dv = dkv + static_cast<int64_t>(b) * Tk * G.kv_stride() + static_cast<int64_t>(KV + g) * hd;
      for (int hh = 0; hh < G.group(); hh++) {
        const int h = g * G.group() + hh;
        load_head(k, v, q, kv, qkv, G, b, g, h);
        for (int i = 0; i < Tq; i++) {
          const int64_t orow = (static_cast<int64_t>(b) * Tq + i) * G.out_stride() + static_cast<int64_t>(h) * hd;
          load(o + static_cast<int64_t>(i) * hd, out + orow, hd);
          load(dO + static_cast<int64_t>(i) * hd, dout + orow, hd);
          D[i] = vdot(dO + static_cast<int64_t>(i) * hd, o + static_cast<int64_t>(i) * hd, hd);
        }
        const float* l = lse + (static_cast<int64_t>(b) * NH + h) * Tq;
        for (int r0 = 0; r0 < Tq; r0 += kRows) {
          const int r1 = std::min(Tq, r0 + kRows), m = r1 - r0;
          const int nmax = visible(r1 - 1, Tk, q_pos, k_pos);
          if (nmax == 0) continue;
          const float* qt = q + static_cast<int64_t>(r0) * hd;
          const float* dOt = dO + static_cast<int64_t>(r0) * hd;
          // P = exp(scale Q K^T - lse) and dP = dO V^T over the tile's visible keys.
          gemm(false, true, m, nmax, hd, scale, qt, hd, k, hd, 0.0f, P, nmax);
          gemm(false, true, m, nmax, hd, 1.0f, dOt, hd, v, hd, 0.0f, dS, nmax);
          for (int t = r0; t < r1; t++) {
            const int n = visible(t, Tk, q_pos, k_pos);
            float* prow = P + static_cast<int64_t>(t - r0) * nmax;
            float* drow = dS + static_cast<int64_t>(t - r0) * nmax;
            attention_rows::probs_row(prow, l[t], n - 1, nmax);
            attention_rows::dscores_row(drow, prow, D[t], scale, n - 1, nmax);
          }
          // dQ += dS K; dK += dS^T Q; dV += P^T dO (into the fp32 accumulators in place).
          float* dqt = dq + (static_cast<int64_t>(b) * Tq + r0) * G.out_stride() + static_cast<int64_t>(h) * hd;
          gemm(false, false, m, hd, nmax, 1.0f, dS, nmax, k, hd, 1.0f, dqt, ldo);
          gemm(true, false, nmax, hd, m, 1.0f, dS, nmax, qt, hd, 1.0f, dk, ldkv);
          gemm(true, false, nmax, hd, m, 1.0f, P, nmax, dOt, hd, 1.0f, dv, ldkv);
        }
      }
    }
  }
}

#define DS_INST_S(S)                                                                                                \
  template void attention_block_forward<S>(float*, float*, const S*, const S*, float*, int, int, int, int, int, int, \
                                           int, int);                                                               \
  template void attention_block_backward<S>(float*, float*, const S*, const S*, const S*, const S*, const float*,   \
                                            float*, int, int, int, int, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
