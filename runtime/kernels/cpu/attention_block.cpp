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
// Everything is computed in fp32 over rows converted once from the storage type; partial outputs
// and gradients are fp32 accumulators (a ring adds several blocks before one rounding).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys of the block visible to query i.
inline int visible(int i, int Tk, int q_pos, int k_pos) {
  const int64_t n = static_cast<int64_t>(q_pos) + i - k_pos + 1;
  return static_cast<int>(std::clamp<int64_t>(n, 0, Tk));
}

inline float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; d++) s += a[d] * b[d];
  return s;
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

}  // namespace

template <typename S>
void attention_block_forward(float* out, float* lse, const S* qkv, const S* kv, int B, int Tq, int Tk, int NH,
                             int KV, int hd, int q_pos, int k_pos) {
  const BlockGeometry G{Tq, Tk, NH, KV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (int64_t{B} * NH * Tq * Tk * hd >= kParallelWork)
  {
    std::vector<float> k(static_cast<size_t>(Tk) * hd), v(k.size()), q(static_cast<size_t>(hd)), s(static_cast<size_t>(Tk));
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH, g = h / G.group();
      const S* kvb = kv + static_cast<int64_t>(b) * Tk * G.kv_stride();
      for (int j = 0; j < Tk; j++) {
        load(k.data() + static_cast<size_t>(j) * hd, kvb + j * G.kv_stride() + static_cast<int64_t>(g) * hd, hd);
        load(v.data() + static_cast<size_t>(j) * hd, kvb + j * G.kv_stride() + static_cast<int64_t>(KV + g) * hd, hd);
      }
      for (int i = 0; i < Tq; i++) {
        float* o = out + (static_cast<int64_t>(b) * Tq + i) * G.out_stride() + static_cast<int64_t>(h) * hd;
        float& l = lse[(static_cast<int64_t>(b) * NH + h) * Tq + i];
        const int n = visible(i, Tk, q_pos, k_pos);
        std::fill(o, o + hd, 0.0f);
        if (n == 0) {
          l = kNegInf;
          continue;
        }
        load(q.data(), qkv + (static_cast<int64_t>(b) * Tq + i) * G.qkv_stride() + static_cast<int64_t>(h) * hd, hd);
        float mx = kNegInf;
        for (int j = 0; j < n; j++) {
          s[static_cast<size_t>(j)] = scale * dot(q.data(), k.data() + static_cast<size_t>(j) * hd, hd);
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
          const float p = std::exp(s[static_cast<size_t>(j)] - mx);
          sum += p;
          const float* vj = v.data() + static_cast<size_t>(j) * hd;
          for (int d = 0; d < hd; d++) o[d] += p * vj[d];
        }
        for (int d = 0; d < hd; d++) o[d] /= sum;
        l = mx + std::log(sum);
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
                              const float* lse, int B, int Tq, int Tk, int NH, int KV, int hd, int q_pos,
                              int k_pos) {
  const BlockGeometry G{Tq, Tk, NH, KV, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One task per (b, kv head): it owns that head's dk and dv rows and its group's dq rows, so no
  // two threads write the same element, and the sums run in a fixed order.
#pragma omp parallel if (int64_t{B} * NH * Tq * Tk * hd >= kParallelWork)
  {
    std::vector<float> k(static_cast<size_t>(Tk) * hd), v(k.size()), q(static_cast<size_t>(hd)),
        o(q.size()), dO(q.size()), p(static_cast<size_t>(Tk));
#pragma omp for schedule(static)
    for (int bg = 0; bg < B * KV; bg++) {
      const int b = bg / KV, g = bg % KV;
      const S* kvb = kv + static_cast<int64_t>(b) * Tk * G.kv_stride();
      for (int j = 0; j < Tk; j++) {
        load(k.data() + static_cast<size_t>(j) * hd, kvb + j * G.kv_stride() + static_cast<int64_t>(g) * hd, hd);
        load(v.data() + static_cast<size_t>(j) * hd, kvb + j * G.kv_stride() + static_cast<int64_t>(KV + g) * hd, hd);
      }
      float* dkb = dkv + static_cast<int64_t>(b) * Tk * G.kv_stride() + static_cast<int64_t>(g) * hd;
      float* dvb = dkv + static_cast<int64_t>(b) * Tk * G.kv_stride() + static_cast<int64_t>(KV + g) * hd;
      for (int hh = 0; hh < G.group(); hh++) {
        const int h = g * G.group() + hh;
        for (int i = 0; i < Tq; i++) {
          const int n = visible(i, Tk, q_pos, k_pos);
          if (n == 0) continue;
          const int64_t orow = (static_cast<int64_t>(b) * Tq + i) * G.out_stride() + static_cast<int64_t>(h) * hd;
          load(q.data(), qkv + (static_cast<int64_t>(b) * Tq + i) * G.qkv_stride() + static_cast<int64_t>(h) * hd, hd);
          load(o.data(), out + orow, hd);
          load(dO.data(), dout + orow, hd);
          const float l = lse[(static_cast<int64_t>(b) * NH + h) * Tq + i];
          const float D = dot(dO.data(), o.data(), hd);
          float* dqi = dq + orow;
          for (int j = 0; j < n; j++) {
            const float* kj = k.data() + static_cast<size_t>(j) * hd;
            const float* vj = v.data() + static_cast<size_t>(j) * hd;
            const float pj = std::exp(scale * dot(q.data(), kj, hd) - l);
            const float ds = scale * pj * (dot(dO.data(), vj, hd) - D);
            float* dkj = dkb + j * G.kv_stride();
            float* dvj = dvb + j * G.kv_stride();
            for (int d = 0; d < hd; d++) {
              dqi[d] += ds * kj[d];
              dkj[d] += ds * q[static_cast<size_t>(d)];
              dvj[d] += pj * dO[static_cast<size_t>(d)];
            }
          }
        }
      }
    }
  }
}

#define DS_INST_S(S)                                                                                                \
  template void attention_block_forward<S>(float*, float*, const S*, const S*, int, int, int, int, int, int, int,   \
                                           int);                                                                    \
  template void attention_block_backward<S>(float*, float*, const S*, const S*, const S*, const S*, const float*,   \
                                            int, int, int, int, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
