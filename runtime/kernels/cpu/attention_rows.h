// The pieces of the causal flash-style attention shared by multi-head attention (attention.cpp, where
// they are defined) and the grouped-query attention (attention_gqa.cpp): the row steps of a score
// tile, one head's forward and backward over fp32 q, k, v, and the row copies between a strided
// 16-bit buffer and a dense fp32 one that the 16-bit kernels run the fp32 code on.
// Internal to runtime/kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ds::rt::cpu::attention_rows {

// Each row step works on row t of a score tile whose rows are `width` wide: entries after t are
// zeroed.
// Given the scores s[0..t]: the probabilities over [0, t]; returns the log-sum-exp.
float softmax_row(float* s, int t, int width);
// The probabilities exp(s[j] - lse) over [0, t], from the scores and the row's log-sum-exp.
void probs_row(float* s, float lse, int t, int width);
// dP row -> dS row in place: ds = scale * p * (dp - D) for j <= t.
void dscores_row(float* dp, const float* p, float D, float scale, int t, int width);

// One head's forward over fp32 q, k, v (T rows of hs, row stride ldq) into o (row stride ldo) and
// its log-sum-exp l (T); S is the thread's (T, T) tile. ds: the rows' document starts (T, each in
// [0, t]; ops.def's attention_gqa_doc_forward), row t seeing keys [ds[t], t]; null: [0, t].
void head_forward(float* o, int ldo, float* l, const float* q, const float* k, const float* v, int ldq, float* S,
                  int T, int hs, float scale, const int32_t* ds = nullptr);
// One head's backward: dq (row stride ldq) overwritten; dk, dv (row stride ldq) = beta * themselves
// + this head's part (beta 0: overwritten; 1: a grouped-query kv head summing its query heads);
// from q, k, v (stride ldq), o and dO (stride ldo) and l. P and dS are the thread's two (T, T)
// tiles. ds as head_forward's.
void head_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v, int ldq,
                   const float* o, const float* dO, int ldo, const float* l, float* P, float* dS, int T, int hs,
                   float scale, float beta = 0.0f, const int32_t* ds = nullptr);

// The same two on bf16 operands and the bf16 dot-product instruction (attention_bf16.cpp), where
// bf16_dot_head_supported(T, hs): q, k, v, o, dO as stored; o and dq rounded once into place; dK
// and dV (dense (T, hs) fp32) = beta * themselves + this head's part, for the caller to round
// (round_head_rows) once its kv head is done. `work` is the thread's per_thread_floats(T, hs, 2):
// the forward uses T*T + 2*T*hs of it, the backward bf16_dot_head_backward_floats(T, hs) (dK and
// dV go after that).
bool bf16_dot_head_supported(int T, int hs);
size_t bf16_dot_head_backward_floats(int T, int hs);
void head_forward_bf16(bf16* o, int ldo, float* l, const bf16* q, const bf16* k, const bf16* v, int ldq,
                       float* work, int T, int hs, float scale);
void head_backward_bf16(bf16* dq, float* dK, float* dV, const bf16* q, const bf16* k, const bf16* v, int ldq,
                        const bf16* o, const bf16* dO, int ldo, const float* l, float* work, int T, int hs,
                        float scale, float beta);
// Records which path a bf16 attention forward took, for kernel_report().
void note_bf16_path(bool dot);
// T rows of hs dense fp32 values rounded into a strided bf16 buffer (row stride ld).
void round_head_rows(bf16* dst, int64_t ld, const float* src, int T, int hs);

// Scratch floats per thread: the two (T, T) tiles, and at 16 bits (storage_bytes 2) also 8 x T x hs
// for the fp32 copies of the head's operands and results.
size_t per_thread_floats(int T, int hs, int storage_bytes);

// T rows of hs values between a strided buffer of type S (row stride ld) and a dense fp32 one.
template <typename S>
void gather_rows(float* dst, const S* src, int64_t ld, int T, int hs) {
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < hs; i++) dst[static_cast<int64_t>(t) * hs + i] = to_f32(src[t * ld + i]);
  }
}
template <typename S>
void scatter_rows(S* dst, int64_t ld, const float* src, int T, int hs) {
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < hs; i++) dst[t * ld + i] = from_f32<S>(src[static_cast<int64_t>(t) * hs + i]);
  }
}

}  // namespace ds::rt::cpu::attention_rows
