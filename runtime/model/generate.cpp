// Generation with a KV cache, for every family (generate.h).
//
// One token at position t through layer l, in the training forward's order of operations for
// that row (decoder.cpp, layer_forward): norm1; qkv = norm1 @ qkv_w^T (+ qkv_b), NH query heads
// then KV key and value heads of hd each; with RoPE, q and k rotated at t; k and v go to the
// cache at t; query head h reads kv head h / (NH / KV): scores q·k_j / sqrt(hd) for j <= t (the
// causal mask is implicit: later positions are not in the cache yet), softmaxed with the max
// subtracted, y = sum_j p_j v_j; then the projection (+ bias), the residual, norm2, the MLP (up
// (+ bias), GELU or SwiGLU, down (+ bias)) and the residual.
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/dispatch.h"

namespace ds::rt {

namespace ms = ds::model_spec;
using ms::ParamId;

Generator::Generator(const ms::ModelShape& shape, const float* params)
    : s_(shape),
      family_(ms::family_of(shape)),
      params_(params),
      layout_(ms::param_layout(shape, ms::ModelPart::whole(shape))) {
  s_.validate();
  ms::ModelPart::whole(shape).validate(shape);
  hd_ = s_.head_dim();
  kv_ = ms::kv_heads(s_);
  h_ = ms::mlp_width(s_);
  const size_t C = static_cast<size_t>(s_.n_embd), T = static_cast<size_t>(s_.seq_len);
  const size_t kvw = static_cast<size_t>(kv_) * hd_;
  cache_.assign(static_cast<size_t>(s_.n_layer) * 2 * T * kvw, 0.0f);
  if (family_.positions == ms::PositionKind::kRope) {
    rope_cos_.resize(T * static_cast<size_t>(hd_ / 2));
    rope_sin_.resize(rope_cos_.size());
    cpu::rope_tables(rope_cos_.data(), rope_sin_.data(), s_.seq_len, hd_, s_.rope_theta);
  }
  x_.resize(C);
  ln_.resize(C);
  qkv_.resize(static_cast<size_t>(s_.n_head) * hd_ + 2 * kvw);
  att_.resize(static_cast<size_t>(s_.n_head) * hd_ + T);  // the heads' outputs and one head's scores
  proj_.resize(C);
  up_.resize(static_cast<size_t>(family_.mlp == ms::MlpKind::kSwiGlu ? 2 * h_ : h_));
  act_.resize(static_cast<size_t>(h_));
  logits_.resize(static_cast<size_t>(s_.padded_vocab_size));
  if (family_.mlp == ms::MlpKind::kMoe) {
    up_.resize(static_cast<size_t>(2 * h_));
    const size_t E = static_cast<size_t>(s_.num_local_experts), k = static_cast<size_t>(s_.num_experts_per_tok);
    router_logits_.resize(E);
    probs_.resize(E);
    prob_sums_.resize(E);
    pick_.resize(k);
    pick_w_.resize(k);
    expert_out_.resize(C);
  }
}

const float* Generator::p(ParamId id, int layer) const {
  const auto* t = layout_.find_tensor(id, layer);
  return params_ + t->offset;
}

const float* Generator::p(const std::optional<ParamId>& id, int layer) const {
  return id ? p(*id, layer) : nullptr;
}

void Generator::norm(float* out, const float* x, ParamId w, const std::optional<ParamId>& b, int layer) {
  float mean, rstd;
  if (family_.norm == ms::NormKind::kLayerNorm) {
    kern::layernorm_forward(out, &mean, &rstd, x, p(w, layer), p(b, layer), 1, 1, s_.n_embd);
  } else {
    kern::rmsnorm_forward(out, &rstd, x, p(w, layer), int64_t{1}, s_.n_embd, static_cast<float>(s_.norm_eps));
  }
}

void Generator::layer(int l, float* x) {
  const ms::LayerRoles& r = family_.roles;
  const int C = s_.n_embd, T = s_.seq_len, NH = s_.n_head, Q = NH * hd_, KVW = kv_ * hd_, QKV = Q + 2 * KVW;
  norm(ln_.data(), x, r.norm1_w, r.norm1_b, l);
  kern::matmul_forward(qkv_.data(), ln_.data(), p(r.qkv_w, l), p(r.qkv_b, l), 1, 1, C, QKV);
  if (family_.positions == ms::PositionKind::kRope) {
    const size_t at = static_cast<size_t>(pos_) * static_cast<size_t>(hd_ / 2);
    kern::rope_forward(qkv_.data(), rope_cos_.data() + at, rope_sin_.data() + at, 1, 1, NH + kv_, hd_, QKV, 0);
  }
  float* keys = cache_.data() + static_cast<size_t>(l) * 2 * T * KVW;
  float* values = keys + static_cast<size_t>(T) * KVW;
  std::copy_n(qkv_.data() + Q, KVW, keys + static_cast<size_t>(pos_) * KVW);
  std::copy_n(qkv_.data() + Q + KVW, KVW, values + static_cast<size_t>(pos_) * KVW);
  float* y = att_.data();
  float* score = att_.data() + Q;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
  const int group = NH / kv_;
  for (int h = 0; h < NH; ++h) {
    const float* q = qkv_.data() + static_cast<size_t>(h) * hd_;
    const size_t kvo = static_cast<size_t>(h / group) * hd_;
    float mx = -INFINITY;
    for (int j = 0; j <= pos_; ++j) {
      const float* k = keys + static_cast<size_t>(j) * KVW + kvo;
      float d = 0;
      for (int i = 0; i < hd_; ++i) d += q[i] * k[i];
      score[j] = d * scale;
      mx = std::max(mx, score[j]);
    }
    float sum = 0;
    for (int j = 0; j <= pos_; ++j) sum += (score[j] = std::exp(score[j] - mx));
    float* yh = y + static_cast<size_t>(h) * hd_;
    std::fill_n(yh, hd_, 0.0f);
    for (int j = 0; j <= pos_; ++j) {
      const float w = score[j] / sum;
      const float* v = values + static_cast<size_t>(j) * KVW + kvo;
      for (int i = 0; i < hd_; ++i) yh[i] += w * v[i];
    }
  }
  kern::matmul_forward(proj_.data(), y, p(r.proj_w, l), p(r.proj_b, l), 1, 1, Q, C);
  kern::residual_forward(x, x, proj_.data(), C);
  norm(ln_.data(), x, r.norm2_w, r.norm2_b, l);
  if (family_.mlp == ms::MlpKind::kMoe) {
    // The router's top k experts, each a SwiGLU over its rows of the stacked w13 / w2, summed by
    // the routing weights in pick order (as moe_combine sums a token's slots).
    const int E = s_.num_local_experts, k = s_.num_experts_per_tok;
    kern::matmul_forward(router_logits_.data(), ln_.data(), p(*r.router_w, l), static_cast<const float*>(nullptr), 1, 1,
                         C, E);
    kern::moe_router_forward(probs_.data(), pick_.data(), pick_w_.data(), prob_sums_.data(), router_logits_.data(), 1,
                             E, k);
    std::fill(proj_.begin(), proj_.end(), 0.0f);
    for (int j = 0; j < k; ++j) {
      const int64_t e = pick_[static_cast<size_t>(j)];
      kern::matmul_forward(up_.data(), ln_.data(), p(r.up_w, l) + e * 2 * h_ * C, static_cast<const float*>(nullptr),
                           1, 1, C, 2 * h_);
      kern::swiglu_forward(act_.data(), up_.data(), int64_t{1}, h_);
      kern::matmul_forward(expert_out_.data(), act_.data(), p(r.down_w, l) + e * C * h_,
                           static_cast<const float*>(nullptr), 1, 1, h_, C);
      for (int c = 0; c < C; ++c) proj_[static_cast<size_t>(c)] += pick_w_[static_cast<size_t>(j)] * expert_out_[static_cast<size_t>(c)];
    }
    kern::residual_forward(x, x, proj_.data(), C);
    return;
  }
  const bool swiglu = family_.mlp == ms::MlpKind::kSwiGlu;
  kern::matmul_forward(up_.data(), ln_.data(), p(r.up_w, l), p(r.up_b, l), 1, 1, C, swiglu ? 2 * h_ : h_);
  if (swiglu) {
    kern::swiglu_forward(act_.data(), up_.data(), int64_t{1}, h_);
  } else {
    kern::gelu_forward(act_.data(), up_.data(), h_);
  }
  kern::matmul_forward(proj_.data(), act_.data(), p(r.down_w, l), p(r.down_b, l), 1, 1, h_, C);
  kern::residual_forward(x, x, proj_.data(), C);
}

const float* Generator::feed(int32_t token) {
  if (token < 0 || token >= s_.vocab_size) {
    throw invalid_argument("token {} at position {} is outside the model's vocabulary of {}", token, pos_,
                           s_.vocab_size);
  }
  if (pos_ >= s_.seq_len) {
    throw invalid_argument("the model's context is full: {} tokens (model.seq_len)", s_.seq_len);
  }
  const int C = s_.n_embd;
  const float* wte = p(ParamId::kWte);
  std::copy_n(wte + static_cast<size_t>(token) * C, C, x_.begin());
  if (family_.positions == ms::PositionKind::kLearned) {
    kern::residual_forward(x_.data(), x_.data(), p(ParamId::kWpe) + static_cast<size_t>(pos_) * C, C);
  }
  for (int l = 0; l < s_.n_layer; ++l) layer(l, x_.data());
  norm(ln_.data(), x_.data(), family_.roles.final_norm_w, family_.roles.final_norm_b, -1);
  const float* head = s_.tied() ? wte : p(ParamId::kLmHead);
  kern::matmul_forward(logits_.data(), ln_.data(), head, static_cast<const float*>(nullptr), 1, 1, C,
                       s_.padded_vocab_size);
  ++pos_;
  return logits_.data();
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
