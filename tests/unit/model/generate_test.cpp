// Generation's KV cache against the training forward (the one decoder over the whole sequence,
// causal attention): at every position the cache's logits give the decoder's per-token loss, for
// GPT-2, a grouped-query Llama with an untied head, a multi-head Llama with a tied one and a Mixtral
// (the router's top 2 of 4 experts per token). And the
// sampler's greedy, top-k and seed behaviour.
#include "model/generate.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "core/allocator.h"
#include "model/decoder.h"

namespace ds::rt {
namespace {

namespace ms = ds::model_spec;

ms::ModelShape gpt2_shape() {
  ms::ModelShape s;
  s.n_layer = 3;
  s.n_head = 4;
  s.n_embd = 32;
  s.vocab_size = 100;
  s.padded_vocab_size = 128;
  s.seq_len = 24;
  return s;
}

ms::ModelShape llama_shape(int kv, bool tied) {
  ms::ModelShape s = gpt2_shape();
  s.family = ms::ModelFamily::kLlama;
  s.padded_vocab_size = s.vocab_size;
  s.n_kv_head = kv;
  s.intermediate_size = 72;
  s.rope_theta = 500.0;
  s.norm_eps = 1e-6;
  s.tie_embeddings = tied;
  return s;
}

ms::ModelShape mixtral_shape() {
  ms::ModelShape s = llama_shape(2, false);
  s.family = ms::ModelFamily::kMixtral;
  s.intermediate_size = 40;
  s.num_local_experts = 4;
  s.num_experts_per_tok = 2;
  return s;
}

class Generate : public ::testing::TestWithParam<const char*> {};

ms::ModelShape shape_named(const std::string& name) {
  if (name == "gpt2") return gpt2_shape();
  if (name == "llama_gqa_untied") return llama_shape(2, false);
  if (name == "mixtral") return mixtral_shape();
  return llama_shape(4, true);
}

TEST_P(Generate, KvCacheLogitsGiveTheTrainingForwardsLossAtEveryPosition) {
  const auto s = shape_named(GetParam());
  const int T = s.seq_len;
  std::vector<int32_t> tokens, targets;
  for (int t = 0; t < T; ++t) tokens.push_back((t * 37 + 11) % s.vocab_size);
  for (int t = 0; t < T; ++t) targets.push_back((t * 53 + 7) % s.vocab_size);
  Allocator alloc;
  Decoder m(s, ms::ModelPart::whole(s), ModelOptions{1, T}, alloc);
  m.init_weights(42);
  DecoderActivations a = m.make_activations();
  m.forward(a, tokens.data(), targets.data());
  const float* w = m.params().f32();
  Generator gen(s, w);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    const float* l = gen.feed(tokens[static_cast<size_t>(t)]);
    double mx = -INFINITY, sum = 0;
    for (int v = 0; v < s.vocab_size; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    for (int v = 0; v < s.vocab_size; ++v) sum += std::exp(l[v] - mx);
    const double loss = mx + std::log(sum) - l[targets[static_cast<size_t>(t)]];
    const double ref = a.losses[t];
    worst = std::max(worst, std::abs(loss - ref) / std::abs(ref));
  }
  EXPECT_LT(worst, 1e-5) << "largest relative difference of a position's loss";
  EXPECT_THROW(gen.feed(1), Error);  // the context is full
  gen.reset();
  EXPECT_THROW(gen.feed(s.vocab_size), Error);  // a token outside the vocabulary
}

INSTANTIATE_TEST_SUITE_P(Families, Generate, ::testing::Values("gpt2", "llama_gqa_untied", "llama_mha_tied", "mixtral"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Sampler, GreedyTopKAndSeed) {
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
