// Text generation on the CPU, for every family: a forward pass with a KV cache (each new token
// attends to the keys and values of the tokens before it, kept per layer, instead of llm.c's full
// recompute of the whole sequence per token), and the sampler that picks the next token.
//
// The block is the one decoder's (decoder.h), read from the family description
// (model_spec/family.h): its norm (LayerNorm, or RMSNorm with model.norm_eps), positions (a
// learned row added to the token's embedding, or RoPE on q and k at the token's position),
// grouped-query attention (KV = NH for multi-head families), its MLP (GELU, SwiGLU over gate|up,
// or a mixture of experts: the router's top k SwiGLU experts, weighted), biases where the family
// has them, and the head (the token embedding when tied, else lm_head).
//
// Weights: the whole model (model_spec::ModelPart::whole, tp 1) as fp32 in the flat layer-major
// layout (model_spec::param_layout), host memory the caller keeps alive. The matmuls, norms,
// activations, RoPE and residual adds are the training kernels (kernels/dispatch.h, fp32, on the
// CPU); the single-query attention over the cache is here (softmax over the t+1 scores of each
// head). tests/unit/model/generate_test.cpp holds every position's logits to the training
// forward's per-token losses.
//
// Not here: tokenizers (the caller encodes and decodes), batches, GPUs.
// Thread safety: one thread per Generator; the kernels use OpenMP inside.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "model_spec/family.h"
#include "model_spec/shape.h"

namespace ds::rt {

class Generator {
 public:
  // `params`: param_count(shape) fp32 values, whole model. invalid_argument for a bad shape.
  Generator(const model_spec::ModelShape& shape, const float* params);

  // Feeds the token at the next position (position() of them were fed before) and returns the
  // logits for the token after it: padded_vocab_size floats (only the first vocab_size are real
  // tokens), valid until the next call. invalid_argument for a token outside [0, vocab_size) or
  // when the cache is full (seq_len tokens).
  const float* feed(int32_t token);
  int position() const { return pos_; }
  void reset() { pos_ = 0; }

 private:
  void layer(int l, float* x);
  void norm(float* out, const float* x, model_spec::ParamId w, const std::optional<model_spec::ParamId>& b,
            int layer);
  const float* p(model_spec::ParamId id, int layer = -1) const;
  const float* p(const std::optional<model_spec::ParamId>& id, int layer = -1) const;  // null when absent

  model_spec::ModelShape s_;
  const model_spec::FamilyDescription& family_;
  const float* params_;
  model_spec::ParamLayout layout_;
  int pos_ = 0;
  int hd_ = 0, kv_ = 0, h_ = 0;  // head size, kv heads, MLP width
  std::vector<float> cache_;     // (L, 2, T, KV*hd): keys then values of every fed position
  std::vector<float> rope_cos_, rope_sin_;  // (T, hd/2) with RoPE
  std::vector<float> x_, ln_, qkv_, att_, proj_, up_, act_, logits_;
  // A mixture of experts: the router's logits, probabilities and sums (E), picks and weights (k),
  // one expert's output (C).
  std::vector<float> router_logits_, probs_, prob_sums_, pick_w_, expert_out_;
  std::vector<int32_t> pick_;
};

struct SampleOptions {
  double temperature = 1.0;  // <= 0: greedy (the most likely token)
  int top_k = 0;             // 0: the whole vocabulary; 1: greedy
};

// Picks a token from the first `vocab` logits: the softmax of logits / temperature over the top_k
// largest (ties to the lower id), drawn with `rng`. Deterministic for a given rng state.
int32_t sample_token(const float* logits, int vocab, const SampleOptions& o, std::mt19937_64& rng);

}  // namespace ds::rt
