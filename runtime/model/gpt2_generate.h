// Text generation with GPT-2 on the CPU: a forward pass with a KV cache (each new token attends
// to the keys and values of the tokens before it, kept per layer, instead of llm.c's full
// recompute of the whole sequence per token), and the sampler that picks the next token.
//
// Weights: the whole model (model_spec::ModelPart::whole, tp 1) as fp32 in the flat layer-major
// layout (model_spec::param_layout), host memory the caller keeps alive. The matmuls, LayerNorms,
// GELU and residual adds are the training kernels (kernels/dispatch.h, fp32, on the CPU); the
// single-query attention over the cache is here (softmax over the t+1 scores of each head).
// full_forward_logits runs the training kernels over a whole sequence (attention_forward's causal
// attention): the reference the cache is tested against.
//
// Not here: tokenizers (the caller encodes and decodes), other architectures, batches, GPUs.
// Thread safety: one thread per Gpt2Generator; the kernels use OpenMP inside.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "model_spec/shape.h"

namespace ds::rt {

class Gpt2Generator {
 public:
  // `params`: param_count(shape) fp32 values, whole model. invalid_argument for a bad shape.
  Gpt2Generator(const model_spec::ModelShape& shape, const float* params);

  // Feeds the token at the next position (position() of them were fed before) and returns the
  // logits for the token after it: padded_vocab_size floats (only the first vocab_size are real
  // tokens), valid until the next call. invalid_argument for a token outside [0, vocab_size) or
  // when the cache is full (seq_len tokens).
  const float* feed(int32_t token);
  int position() const { return pos_; }
  void reset() { pos_ = 0; }

 private:
  void layer(int l, float* x);
  const float* p(model_spec::ParamId id, int layer = -1) const;

  model_spec::ModelShape s_;
  const float* params_;
  model_spec::ParamLayout layout_;
  int pos_ = 0;
  std::vector<float> kv_;  // (L, 2, T, C): keys then values of every fed position
  std::vector<float> x_, ln_, qkv_, att_, proj_, fc_, gelu_, logits_;
};

// The logits at every position of `tokens` (T' <= seq_len tokens) from one forward over the whole
// sequence, no cache: (T', padded_vocab_size).
std::vector<float> full_forward_logits(const model_spec::ModelShape& shape, const float* params,
                                       const std::vector<int32_t>& tokens);

struct SampleOptions {
  double temperature = 1.0;  // <= 0: greedy (the most likely token)
  int top_k = 0;             // 0: the whole vocabulary; 1: greedy
};

// Picks a token from the first `vocab` logits: the softmax of logits / temperature over the top_k
// largest (ties to the lower id), drawn with `rng`. Deterministic for a given rng state.
int32_t sample_token(const float* logits, int vocab, const SampleOptions& o, std::mt19937_64& rng);

}  // namespace ds::rt
