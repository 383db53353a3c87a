// One head of the causal attention with bf16 operands on the bf16 dot-product instruction
// (cpu/bf16_dot.h), for bf16 storage where the processor has it (attention.cpp decides).
//
// The same blocked schedule as head_forward / head_backward (attention.cpp), with the products'
// operands in bf16 and every sum in fp32, as PyTorch's autocast runs attention's matmuls:
//   q, k, v, o and dO are read as they are stored (already bf16);
//   P and dS are rounded to bf16 where they enter a product (P V, dS K, dS^T Q, P^T dO); the
//   softmax, the log-sum-exp, D_t and dS itself are computed in fp32;
//   outputs are accumulated in fp32 and rounded once into the bf16 buffers (dK and dV are left in
//   fp32 for the caller, who sums a grouped-query kv head's over its query heads first).
// The operands are repacked into pair words once per head (k and v transposed, q, k, dO with
// consecutive rows paired); P and dS are paired in place in their own tiles, so this path needs no
// scratch beyond the 16-bit path's (per_thread_floats).
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu::attention_rows {

namespace {
constexpr int kRows = 64;

const uint16_t* bits(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }
const uint32_t* words(const bf16* p) { return reinterpret_cast<const uint32_t*>(p); }
const uint32_t* words(const float* p) { return reinterpret_cast<const uint32_t*>(p); }

}  // namespace

void round_head_rows(bf16* dst, int64_t ld, const float* src, int T, int hs) {
  for (int t = 0; t < T; t++) {
    bf16_dot::round_row(reinterpret_cast<uint16_t*>(dst + t * ld), src + static_cast<int64_t>(t) * hs, hs);
  }
}

bool bf16_dot_head_supported(int T, int hs) { return bf16_dot::available() && T % 2 == 0 && hs % 2 == 0; }

size_t bf16_dot_head_backward_floats(int T, int hs) {
  return 2 * static_cast<size_t>(T) * T + static_cast<size_t>(T) * hs * 7 / 2;
}

DS_SIMD_CLONES
void head_forward_bf16(bf16* o, int ldo, float* l, const bf16* q, const bf16* k, const bf16* v, int ldq,
                       float* work, int T, int hs, float scale) {
  const int64_t TT = static_cast<int64_t>(T) * T, Th = static_cast<int64_t>(T) * hs;
  float* S = work;                                           // (T, T) scores, then bf16 P rows
  uint32_t* Kt = reinterpret_cast<uint32_t*>(work + TT);     // k^T: (hs/2, T) words
  uint32_t* Vp = Kt + Th / 2;                                // v: (T/2, hs) words
  float* O = reinterpret_cast<float*>(Vp + Th / 2);          // (T, hs) fp32
  bf16_dot::pairs_transposed(Kt, T, bits(k), ldq, T, hs);
  bf16_dot::pairs_from_rows(Vp, hs, bits(v), ldq, T, hs);
  for (int r0 = 0; r0 < T; r0 += kRows) {
    const int r1 = std::min(T, r0 + kRows);
    float* Sr = S + static_cast<int64_t>(r0) * T;
    // S rows [r0, r1) over keys [0, r1) = scale * q k^T.
    bf16_dot::gemm(r1 - r0, r1, hs / 2, words(q + static_cast<int64_t>(r0) * ldq), ldq / 2, 1, Kt, T, scale, 0.0f,
                   Sr, T);
    for (int t = r0; t < r1; t++) {
      float* s = S + static_cast<int64_t>(t) * T;
      l[t] = softmax_row(s, t, r1);
      bf16_dot::round_row(reinterpret_cast<uint16_t*>(s), s, r1);  // row t as bf16, in place
    }
    // O rows [r0, r1) = P v over keys [0, r1): P's rows are T words apart.
    bf16_dot::gemm(r1 - r0, hs, r1 / 2, words(Sr), T, 1, Vp, hs, 1.0f, 0.0f, O + static_cast<int64_t>(r0) * hs, hs);
  }
  round_head_rows(o, ldo, O, T, hs);
}

DS_SIMD_CLONES
void head_backward_bf16(bf16* dq, float* dK, float* dV, const bf16* q, const bf16* k, const bf16* v, int ldq,
                        const bf16* o, const bf16* dO, int ldo, const float* l, float* work, int T, int hs,
                        float scale, float beta) {
  const int64_t TT = static_cast<int64_t>(T) * T, Th = static_cast<int64_t>(T) * hs;
  float* P = work;        // (T, T): scores, then P, then P's rows paired into words
  float* dS = P + TT;     // (T, T): dP, then dS, then dS's rows paired into words
  uint32_t* Kt = reinterpret_cast<uint32_t*>(dS + TT);  // k^T, v^T: (hs/2, T) words
  uint32_t* Vt = Kt + Th / 2;
  uint32_t* Kp = Vt + Th / 2;  // k, q, dO with rows paired: (T/2, hs) words
  uint32_t* Qp = Kp + Th / 2;
  uint32_t* dOp = Qp + Th / 2;
  float* dQ = reinterpret_cast<float*>(dOp + Th / 2);  // (T, hs) fp32
  bf16_dot::pairs_transposed(Kt, T, bits(k), ldq, T, hs);
  bf16_dot::pairs_transposed(Vt, T, bits(v), ldq, T, hs);
  bf16_dot::pairs_from_rows(Kp, hs, bits(k), ldq, T, hs);
  bf16_dot::pairs_from_rows(Qp, hs, bits(q), ldq, T, hs);
  bf16_dot::pairs_from_rows(dOp, hs, bits(dO), ldo, T, hs);
  for (int r0 = 0; r0 < T; r0 += kRows) {
    const int r1 = std::min(T, r0 + kRows), rows = r1 - r0;
    float* Pr = P + static_cast<int64_t>(r0) * T;
    float* dSr = dS + static_cast<int64_t>(r0) * T;
    bf16_dot::gemm(rows, r1, hs / 2, words(q + static_cast<int64_t>(r0) * ldq), ldq / 2, 1, Kt, T, scale, 0.0f, Pr,
                   T);
    bf16_dot::gemm(rows, r1, hs / 2, words(dO + static_cast<int64_t>(r0) * ldo), ldo / 2, 1, Vt, T, 1.0f, 0.0f,
                   dSr, T);
    for (int t = r0; t < r1; t++) {
      float* prow = P + static_cast<int64_t>(t) * T;
      probs_row(prow, l[t], t, T);
      const float D = vdot(dO + static_cast<int64_t>(t) * ldo, o + static_cast<int64_t>(t) * ldo, hs);
      dscores_row(dS + static_cast<int64_t>(t) * T, prow, D, scale, t, T);
    }
    // P's rows [r0, r1) paired into word rows [r0/2, r1/2); float rows [r1/2, r1) are then free
    // and take this block's dS rows as bf16 (r1 values each) for dQ = dS k.
    bf16_dot::pairs_from_rows_f32_inplace(P, T, r0, r1, T);
    uint16_t* dSb = reinterpret_cast<uint16_t*>(P + static_cast<int64_t>(r1 / 2) * T);
    for (int t = r0; t < r1; t++) {
      bf16_dot::round_row(dSb + static_cast<int64_t>(t - r0) * r1, dS + static_cast<int64_t>(t) * T, r1);
    }
    bf16_dot::gemm(rows, hs, r1 / 2, reinterpret_cast<const uint32_t*>(dSb), r1 / 2, 1, Kp, hs, 1.0f, 0.0f,
                   dQ + static_cast<int64_t>(r0) * hs, hs);
  }
  // dK = dS^T q and dV = P^T dO over all rows (zeros above the diagonal): the paired rows of dS
  // and P read as A with pairs down the columns (word (m, kp) at kp * T + m).
  bf16_dot::pairs_from_rows_f32_inplace(dS, T, 0, T, T);
  bf16_dot::gemm(T, hs, T / 2, words(dS), 1, T, Qp, hs, 1.0f, beta, dK, hs);
  bf16_dot::gemm(T, hs, T / 2, words(P), 1, T, dOp, hs, 1.0f, beta, dV, hs);
  round_head_rows(dq, ldq, dQ, T, hs);
}


}  // namespace ds::rt::cpu::attention_rows
