// Generation's KV cache against a full forward over the whole sequence (the training kernels'
// causal attention), at every position; the sampler's greedy, top-k and seed behaviour.
#include "model/gpt2_generate.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "model/gpt2.h"

namespace ds::rt {
namespace {

namespace ms = ds::model_spec;

ms::ModelShape shape() {
  ms::ModelShape s;
  s.n_layer = 3;
  s.n_head = 4;
  s.n_embd = 32;
  s.vocab_size = 100;
  s.padded_vocab_size = 128;
  s.seq_len = 24;
  return s;
}

std::vector<float> random_weights(const ms::ModelShape& s) {
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{1, s.seq_len}, alloc);
  m.init_weights(42);
  const float* p = m.params().f32();
  return std::vector<float>(p, p + m.num_params());
}

TEST(Gpt2Generate, KvCacheLogitsEqualAFullForwardAtEveryPosition) {
  const auto s = shape();
  const auto w = random_weights(s);
  std::vector<int32_t> tokens;
  for (int t = 0; t < s.seq_len; ++t) tokens.push_back((t * 37 + 11) % s.vocab_size);
  const auto full = full_forward_logits(s, w.data(), tokens);
  Gpt2Generator gen(s, w.data());
  double worst = 0;
  for (int t = 0; t < s.seq_len; ++t) {
    const float* l = gen.feed(tokens[static_cast<size_t>(t)]);
    for (int v = 0; v < s.padded_vocab_size; ++v) {
      const double ref = full[static_cast<size_t>(t) * s.padded_vocab_size + v];
      worst = std::max(worst, std::abs(l[v] - ref) / (1e-3 + std::abs(ref)));
    }
  }
  EXPECT_LT(worst, 1e-4) << "largest relative difference over every position and logit";
  EXPECT_THROW(gen.feed(1), Error);  // the context is full
  gen.reset();
  EXPECT_THROW(gen.feed(s.vocab_size), Error);  // a token outside the vocabulary
}

TEST(Gpt2Generate, SamplerGreedyTopKAndSeed) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 1.9f, 0.0f};
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample_token(logits.data(), 6, {1.0, 1}, rng), 1);  // top-k 1: argmax
  EXPECT_EQ(sample_token(logits.data(), 6, {0.0, 0}, rng), 1);  // temperature 0: argmax
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) seen.insert(sample_token(logits.data(), 6, {1.0, 3}, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3, 4})) << "top-k 3 draws only the three largest, all of them";
  auto draws = [&](uint64_t seed) {
    std::mt19937_64 r(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(sample_token(logits.data(), 6, {1.0, 0}, r));
    return out;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));
}

}  // namespace
}  // namespace ds::rt
