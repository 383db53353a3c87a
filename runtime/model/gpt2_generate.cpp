// GPT-2 generation with a KV cache (gpt2_generate.h).
//
// One token at position t through layer l: ln1, qkv = ln1 @ qkvw^T + qkvb (3C: q, k, v); k and v
// go to the cache at t; each head's scores are q·k_j / sqrt(hs) for j <= t (the causal mask is
// implicit: later positions are not in the cache yet), softmaxed with the max subtracted, and
// y = sum_j p_j v_j; then attproj, the residual, ln2, the MLP (fc, GELU, fcproj) and the residual,
// exactly the training forward's order of operations for that row.
#include "model/gpt2_generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <omp.h>

#include "common/error.h"
#include "kernels/dispatch.h"

namespace ds::rt {

namespace ms = ds::model_spec;
using ms::ParamId;

Gpt2Generator::Gpt2Generator(const ms::ModelShape& shape, const float* params)
    : s_(shape), params_(params), layout_(ms::param_layout(shape, ms::ModelPart::whole(shape))) {
  ms::ModelPart::whole(shape).validate(shape);
  const size_t C = static_cast<size_t>(s_.n_embd), T = static_cast<size_t>(s_.seq_len);
  kv_.assign(static_cast<size_t>(s_.n_layer) * 2 * T * C, 0.0f);
  x_.resize(C);
  ln_.resize(C);
  qkv_.resize(3 * C);
  att_.resize(C + T);  // the head's output (C) and its scores (T)
  proj_.resize(C);
  fc_.resize(4 * C);
  gelu_.resize(4 * C);
  logits_.resize(static_cast<size_t>(s_.padded_vocab_size));
}

const float* Gpt2Generator::p(ParamId id, int layer) const {
  const auto* t = layout_.find_tensor(id, layer);
  return params_ + t->offset;
}

void Gpt2Generator::layer(int l, float* x) {
  const int C = s_.n_embd, T = s_.seq_len, NH = s_.n_head, hs = C / NH;
  float mean, rstd;
  kern::layernorm_forward(ln_.data(), &mean, &rstd, x, p(ParamId::kLn1w, l), p(ParamId::kLn1b, l), 1, 1, C);
  kern::matmul_forward(qkv_.data(), ln_.data(), p(ParamId::kQkvw, l), p(ParamId::kQkvb, l), 1, 1, C, 3 * C);
  float* keys = kv_.data() + static_cast<size_t>(l) * 2 * T * C;
  float* values = keys + static_cast<size_t>(T) * C;
  std::copy_n(qkv_.data() + C, C, keys + static_cast<size_t>(pos_) * C);
  std::copy_n(qkv_.data() + 2 * C, C, values + static_cast<size_t>(pos_) * C);
  float* y = att_.data();
  float* score = att_.data() + C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int h = 0; h < NH; ++h) {
    const float* q = qkv_.data() + h * hs;
    float mx = -INFINITY;
    for (int j = 0; j <= pos_; ++j) {
      const float* k = keys + static_cast<size_t>(j) * C + h * hs;
      float d = 0;
      for (int i = 0; i < hs; ++i) d += q[i] * k[i];
      score[j] = d * scale;
      mx = std::max(mx, score[j]);
    }
    float sum = 0;
    for (int j = 0; j <= pos_; ++j) sum += (score[j] = std::exp(score[j] - mx));
    float* yh = y + h * hs;
    std::fill_n(yh, hs, 0.0f);
    for (int j = 0; j <= pos_; ++j) {
      const float w = score[j] / sum;
      const float* v = values + static_cast<size_t>(j) * C + h * hs;
      for (int i = 0; i < hs; ++i) yh[i] += w * v[i];
    }
  }
  kern::matmul_forward(proj_.data(), y, p(ParamId::kAttprojw, l), p(ParamId::kAttprojb, l), 1, 1, C, C);
  kern::residual_forward(x, x, proj_.data(), C);
  kern::layernorm_forward(ln_.data(), &mean, &rstd, x, p(ParamId::kLn2w, l), p(ParamId::kLn2b, l), 1, 1, C);
  kern::matmul_forward(fc_.data(), ln_.data(), p(ParamId::kFcw, l), p(ParamId::kFcb, l), 1, 1, C, 4 * C);
  kern::gelu_forward(gelu_.data(), fc_.data(), 4 * C);
  kern::matmul_forward(proj_.data(), gelu_.data(), p(ParamId::kFcprojw, l), p(ParamId::kFcprojb, l), 1, 1, 4 * C, C);
  kern::residual_forward(x, x, proj_.data(), C);
}

const float* Gpt2Generator::feed(int32_t token) {
  if (token < 0 || token >= s_.vocab_size) {
    throw invalid_argument("token {} at position {} is outside the model's vocabulary of {}", token, pos_,
                           s_.vocab_size);
  }
  if (pos_ >= s_.seq_len) {
    throw invalid_argument("the model's context is full: {} tokens (model.seq_len)", s_.seq_len);
  }
  const int C = s_.n_embd;
  kern::encoder_forward(x_.data(), &token, p(ParamId::kWte), p(ParamId::kWpe) + static_cast<size_t>(pos_) * C, 1, 1, C);
  for (int l = 0; l < s_.n_layer; ++l) layer(l, x_.data());
  float mean, rstd;
  kern::layernorm_forward(ln_.data(), &mean, &rstd, x_.data(), p(ParamId::kLnfw), p(ParamId::kLnfb), 1, 1, C);
  kern::matmul_forward(logits_.data(), ln_.data(), p(ParamId::kWte), static_cast<const float*>(nullptr), 1, 1, C,
                       s_.padded_vocab_size);
  ++pos_;
  return logits_.data();
}

std::vector<float> full_forward_logits(const ms::ModelShape& s, const float* params, const std::vector<int32_t>& tokens) {
  const int T = static_cast<int>(tokens.size()), C = s.n_embd, Vp = s.padded_vocab_size;
  if (T < 1 || T > s.seq_len) throw invalid_argument("full_forward_logits: {} tokens (1..{})", T, s.seq_len);
  const auto layout = ms::param_layout(s, ms::ModelPart::whole(s));
  auto p = [&](ParamId id, int l = -1) { return params + layout.find_tensor(id, l)->offset; };
  const size_t TC = static_cast<size_t>(T) * C;
  std::vector<float> x(TC), ln(TC), mean(T), rstd(T), qkv(3 * TC), y(TC), proj(TC), fc(4 * TC), gelu(4 * TC),
      lse(static_cast<size_t>(s.n_head) * T), scratch(kern::attention_scratch_floats(T) * static_cast<size_t>(omp_get_max_threads()));
  kern::encoder_forward(x.data(), tokens.data(), p(ParamId::kWte), p(ParamId::kWpe), 1, T, C);
  for (int l = 0; l < s.n_layer; ++l) {
    kern::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), p(ParamId::kLn1w, l), p(ParamId::kLn1b, l), 1, T, C);
    kern::matmul_forward(qkv.data(), ln.data(), p(ParamId::kQkvw, l), p(ParamId::kQkvb, l), 1, T, C, 3 * C);
    kern::attention_forward(y.data(), lse.data(), qkv.data(), scratch.data(), 1, T, C, s.n_head);
    kern::matmul_forward(proj.data(), y.data(), p(ParamId::kAttprojw, l), p(ParamId::kAttprojb, l), 1, T, C, C);
    kern::residual_forward(x.data(), x.data(), proj.data(), static_cast<int64_t>(TC));
    kern::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), p(ParamId::kLn2w, l), p(ParamId::kLn2b, l), 1, T, C);
    kern::matmul_forward(fc.data(), ln.data(), p(ParamId::kFcw, l), p(ParamId::kFcb, l), 1, T, C, 4 * C);
    kern::gelu_forward(gelu.data(), fc.data(), static_cast<int64_t>(4 * TC));
    kern::matmul_forward(proj.data(), gelu.data(), p(ParamId::kFcprojw, l), p(ParamId::kFcprojb, l), 1, T, 4 * C, C);
    kern::residual_forward(x.data(), x.data(), proj.data(), static_cast<int64_t>(TC));
  }
  kern::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), p(ParamId::kLnfw), p(ParamId::kLnfb), 1, T, C);
  std::vector<float> logits(static_cast<size_t>(T) * Vp);
  kern::matmul_forward(logits.data(), ln.data(), p(ParamId::kWte), static_cast<const float*>(nullptr), 1, T, C, Vp);
  return logits;
}

int32_t sample_token(const float* logits, int vocab, const SampleOptions& o, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const bool greedy = o.temperature <= 0 || o.top_k == 1;
  if (greedy) return *std::min_element(ids.begin(), ids.end(), better);
  const int k = o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
  std::vector<double> w(static_cast<size_t>(k));
  const double mx = logits[ids[0]];
  for (int i = 0; i < k; ++i) w[static_cast<size_t>(i)] = std::exp((logits[ids[static_cast<size_t>(i)]] - mx) / o.temperature);
  // An inverse-CDF draw from one 53-bit uniform: the same on every platform (std::discrete_distribution is not).
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * std::accumulate(w.begin(), w.end(), 0.0);
  double c = 0;
  for (int i = 0; i < k; ++i) {
    c += w[static_cast<size_t>(i)];
    if (u < c) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(k - 1)];
}

}  // namespace ds::rt
