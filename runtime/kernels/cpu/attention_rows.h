// The row steps of the causal flash-style attention, shared by GPT-2's attention (attention.cpp,
// where they are defined) and the grouped-query attention (attention_gqa.cpp). Each works on
// row t of a score tile whose rows are `width` wide: entries after t are zeroed.
#pragma once

namespace ds::rt::cpu::attention_rows {

// Given the scores s[0..t]: the probabilities over [0, t]; returns the log-sum-exp.
float softmax_row(float* s, int t, int width);
// The probabilities exp(s[j] - lse) over [0, t], from the scores and the row's log-sum-exp.
void probs_row(float* s, float lse, int t, int width);
// dP row -> dS row in place: ds = scale * p * (dp - D) for j <= t.
void dscores_row(float* dp, const float* p, float D, float scale, int t, int width);

}  // namespace ds::rt::cpu::attention_rows
