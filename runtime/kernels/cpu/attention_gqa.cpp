// Causal grouped-query attention, forward and backward, with k and v read in place from the
// qkv rows (never expanded to NH heads). The math per query head is attention.cpp's, and so is
// the code (attention_rows.h: flash-style, one (T,T) tile per thread, backward recomputing the
// probabilities from the lse):
//   S = scale Q K^T,  P = softmax over j <= t,  O = P V;
//   dP = dO V^T,  dS = scale P (dP - rowsum(dO o O)),  dQ = dS K,  dK += dS^T Q,  dV += P^T dO.
// The only change is which k/v columns a query head reads, and that the backward walks a kv
// head's group of query heads in one task, summing their dK and dV in head order (beta 1 after
// the first), so the result does not depend on the thread count.
// At bf16 on AVX512-BF16 the heads run on bf16 operands (attention_bf16.cpp, as in attention.cpp),
// the group's dK and dV summed in fp32 and rounded once. Otherwise, with 16-bit storage the heads
// are copied to fp32 in the thread's scratch (attention.cpp's way):
// the forward copies its query head and the kv head it reads; the backward copies the kv head
// once, sums the group's dK and dV in fp32 and rounds them once at the end, and rounds each query
// head's dQ as it is done.
// Documents (attention_gqa_doc_*, packing): each head's rows see only their document's keys
// (attention_rows.h's ds); the bf16 dot-product path has no document mask, so bf16 with documents
// takes the fp32 copies.
#include <omp.h>

#include <cmath>
#include <type_traits>

#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

namespace {
using namespace attention_rows;

struct Geometry {
  int T, NH, KV, hd;
  int64_t stride() const { return static_cast<int64_t>(NH + 2 * KV) * hd; }  // qkv row
  int64_t ostride() const { return static_cast<int64_t>(NH) * hd; }          // out row
  int group() const { return NH / KV; }
  int64_t q_col(int h) const { return static_cast<int64_t>(h) * hd; }
  int64_t k_col(int g) const { return static_cast<int64_t>(NH + g) * hd; }
  int64_t v_col(int g) const { return static_cast<int64_t>(NH + KV + g) * hd; }
};

template <typename S>
void gqa_forward(S* out, float* lse, const S* qkv, const int32_t* doc_start, float* scratch, int B, int T, int NH,
                 int KV, int hd) {
  const Geometry G{T, NH, KV, hd};
  const int st = static_cast<int>(G.stride()), os = static_cast<int>(G.ostride());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t per_thread = per_thread_floats(T, hd, sizeof(S));
  const bool bf16_dot = std::is_same_v<S, bf16> && doc_start == nullptr && bf16_dot_head_supported(T, hd);
  if constexpr (std::is_same_v<S, bf16>) note_bf16_path(bf16_dot);
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * NH > 1 && int64_t{T} * T * NH * hd >= kParallelWork)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH, g = h / G.group();
    float* tile = scratch + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    const S* row0 = qkv + static_cast<int64_t>(b) * T * st;
    S* o = out + static_cast<int64_t>(b) * T * os + G.q_col(h);
    float* l = lse + static_cast<int64_t>(bh) * T;
    const int32_t* ds = doc_start == nullptr ? nullptr : doc_start + static_cast<int64_t>(b) * T;
    if constexpr (std::is_same_v<S, float>) {
      head_forward(o, os, l, row0 + G.q_col(h), row0 + G.k_col(g), row0 + G.v_col(g), st, tile, T, hd, scale, ds);
    } else if (bf16_dot) {
      if constexpr (std::is_same_v<S, bf16>) {
        head_forward_bf16(o, os, l, row0 + G.q_col(h), row0 + G.k_col(g), row0 + G.v_col(g), st, tile, T, hd, scale);
      }
    } else {
      const int64_t th = static_cast<int64_t>(T) * hd;
      float* f = tile + 2 * static_cast<size_t>(T) * T;  // q, k, v, o of this head in fp32
      gather_rows(f, row0 + G.q_col(h), st, T, hd);
      gather_rows(f + th, row0 + G.k_col(g), st, T, hd);
      gather_rows(f + 2 * th, row0 + G.v_col(g), st, T, hd);
      head_forward(f + 3 * th, hd, l, f, f + th, f + 2 * th, hd, tile, T, hd, scale, ds);
      scatter_rows(o, os, f + 3 * th, T, hd);
    }
  }
}

template <typename S>
void gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, const int32_t* doc_start,
                  float* scratch, int B, int T, int NH, int KV, int hd) {
  const Geometry G{T, NH, KV, hd};
  const int st = static_cast<int>(G.stride()), os = static_cast<int>(G.ostride());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t per_thread = per_thread_floats(T, hd, sizeof(S));
  const bool bf16_dot = std::is_same_v<S, bf16> && doc_start == nullptr && bf16_dot_head_supported(T, hd);
  gemm_before_parallel_region();
#pragma omp parallel for schedule(static) if (B * KV > 1 && int64_t{T} * T * NH * hd >= kParallelWork)
  for (int bg = 0; bg < B * KV; bg++) {
    const int b = bg / KV, g = bg % KV;
    float* P = scratch + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    float* dS = P + static_cast<size_t>(T) * T;
    const int64_t rbase = static_cast<int64_t>(b) * T * st, obase = static_cast<int64_t>(b) * T * os;
    const S* row0 = qkv + rbase;
    S* drow0 = dqkv + rbase;
    const int32_t* ds = doc_start == nullptr ? nullptr : doc_start + static_cast<int64_t>(b) * T;
    if constexpr (std::is_same_v<S, float>) {
      for (int j = 0; j < G.group(); j++) {
        const int h = g * G.group() + j;
        head_backward(drow0 + G.q_col(h), drow0 + G.k_col(g), drow0 + G.v_col(g), row0 + G.q_col(h),
                      row0 + G.k_col(g), row0 + G.v_col(g), st, out + obase + G.q_col(h), dout + obase + G.q_col(h),
                      os, lse + (static_cast<int64_t>(b) * NH + h) * T, P, dS, T, hd, scale, j == 0 ? 0.0f : 1.0f, ds);
      }
    } else if (bf16_dot) {
      if constexpr (std::is_same_v<S, bf16>) {
        // The group's dK and dV summed in fp32 after the head's work area, rounded once.
        float* dK = P + bf16_dot_head_backward_floats(T, hd);
        float* dV = dK + static_cast<int64_t>(T) * hd;
        for (int j = 0; j < G.group(); j++) {
          const int h = g * G.group() + j;
          head_backward_bf16(drow0 + G.q_col(h), dK, dV, row0 + G.q_col(h), row0 + G.k_col(g), row0 + G.v_col(g), st,
                             out + obase + G.q_col(h), dout + obase + G.q_col(h), os,
                             lse + (static_cast<int64_t>(b) * NH + h) * T, P, T, hd, scale, j == 0 ? 0.0f : 1.0f);
        }
        round_head_rows(drow0 + G.k_col(g), st, dK, T, hd);
        round_head_rows(drow0 + G.v_col(g), st, dV, T, hd);
      }
    } else {
      // k, v, dk, dv of the kv head, then q, o, dO, dq of the query head at hand, in fp32.
      const int64_t th = static_cast<int64_t>(T) * hd;
      float* k = dS + static_cast<size_t>(T) * T;
      float *v = k + th, *dk = k + 2 * th, *dv = k + 3 * th, *q = k + 4 * th, *o = k + 5 * th, *dO = k + 6 * th,
            *dq = k + 7 * th;
      gather_rows(k, row0 + G.k_col(g), st, T, hd);
      gather_rows(v, row0 + G.v_col(g), st, T, hd);
      for (int j = 0; j < G.group(); j++) {
        const int h = g * G.group() + j;
        gather_rows(q, row0 + G.q_col(h), st, T, hd);
        gather_rows(o, out + obase + G.q_col(h), os, T, hd);
        gather_rows(dO, dout + obase + G.q_col(h), os, T, hd);
        head_backward(dq, dk, dv, q, k, v, hd, o, dO, hd, lse + (static_cast<int64_t>(b) * NH + h) * T, P, dS, T, hd,
                      scale, j == 0 ? 0.0f : 1.0f, ds);
        scatter_rows(drow0 + G.q_col(h), st, dq, T, hd);
      }
      scatter_rows(drow0 + G.k_col(g), st, dk, T, hd);
      scatter_rows(drow0 + G.v_col(g), st, dv, T, hd);
    }
  }
}

}  // namespace

template <typename S>
void attention_gqa_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int NH, int KV, int hd) {
  gqa_forward(out, lse, qkv, nullptr, scratch, B, T, NH, KV, hd);
}
template <typename S>
void attention_gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, float* scratch,
                            int B, int T, int NH, int KV, int hd) {
  gqa_backward(dqkv, dout, qkv, out, lse, nullptr, scratch, B, T, NH, KV, hd);
}
template <typename S>
void attention_gqa_doc_forward(S* out, float* lse, const S* qkv, const int32_t* doc_start, float* scratch, int B,
                               int T, int NH, int KV, int hd) {
  gqa_forward(out, lse, qkv, doc_start, scratch, B, T, NH, KV, hd);
}
template <typename S>
void attention_gqa_doc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                                const int32_t* doc_start, float* scratch, int B, int T, int NH, int KV, int hd) {
  gqa_backward(dqkv, dout, qkv, out, lse, doc_start, scratch, B, T, NH, KV, hd);
}

#define DS_INST_S(S)                                                                                            \
  template void attention_gqa_forward<S>(S*, float*, const S*, float*, int, int, int, int, int);               \
  template void attention_gqa_backward<S>(S*, const S*, const S*, const S*, const float*, float*, int, int, int, \
                                          int, int);                                                            \
  template void attention_gqa_doc_forward<S>(S*, float*, const S*, const int32_t*, float*, int, int, int, int,  \
                                             int);                                                              \
  template void attention_gqa_doc_backward<S>(S*, const S*, const S*, const S*, const float*, const int32_t*,   \
                                              float*, int, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
