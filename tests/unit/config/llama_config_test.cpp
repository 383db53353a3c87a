// The model section with type "llama": its keys, defaults, errors for Llama keys under GPT-2,
// and the rules against tensor parallelism (kv heads split, never replicated).
#include <gtest/gtest.h>

#include "config/job_config.h"

namespace ds::config {
namespace {

std::vector<std::string> errors_of(const std::string& text, int world = 1) {
  try {
    parse_job_config(text, "t.json", world);
  } catch (const ConfigError& e) {
    return e.errors();
  }
  return {};
}

// A Llama config: `extra` keys appended to the model section (vocab_size and n_embd unless given
// there), `top` keys before it.
std::string llama(const std::string& extra, const std::string& top = "") {
  std::string base = R"("type": "llama", "n_layer": 2, "n_head": 4, "seq_len": 32)";
  if (extra.find("\"vocab_size\"") == std::string::npos) base += R"(, "vocab_size": 300)";
  if (extra.find("\"n_embd\"") == std::string::npos) base += R"(, "n_embd": 64)";
  return R"({"train_micro_batch_size_per_gpu": 2, )" + top + R"("model": {)" + base + extra + "}}";
}

TEST(LlamaConfig, KeysAndDefaults) {
  const JobConfig c = parse_job_config(llama(R"(, "intermediate_size": 176)"), "t.json", 1);
  EXPECT_EQ(c.model.type, "llama");
  EXPECT_EQ(c.model.shape.n_kv_head, 4);  // n_head: plain multi-head attention
  EXPECT_EQ(c.model.shape.intermediate_size, 176);
  EXPECT_EQ(c.model.shape.rope_theta, 10000.0);
  EXPECT_EQ(c.model.shape.norm_eps, 1e-5);
  EXPECT_FALSE(c.model.shape.tie_embeddings);
  EXPECT_EQ(c.model.shape.padded_vocab_size, 300);  // Hugging Face does not pad
  const JobConfig d = parse_job_config(
      llama(R"(, "n_kv_head": 2, "intermediate_size": 176, "rope_theta": 500000, "norm_eps": 1e-6, )"
            R"("tie_embeddings": true, "padded_vocab_size": 384)"),
      "t.json", 1);
  EXPECT_EQ(d.model.shape.n_kv_head, 2);
  EXPECT_EQ(d.model.shape.rope_theta, 500000.0);
  EXPECT_EQ(d.model.shape.norm_eps, 1e-6);
  EXPECT_TRUE(d.model.shape.tie_embeddings);
  EXPECT_EQ(d.model.shape.padded_vocab_size, 384);
  // The JSON round trip keeps the Llama keys.
  const auto j = d.to_json();
  EXPECT_EQ(j["model"]["n_kv_head"], 2);
  EXPECT_EQ(j["model"]["tie_embeddings"], true);
  // Llama 3's vocabulary is accepted (for dstrain plan).
  EXPECT_TRUE(errors_of(llama(R"(, "intermediate_size": 176, "vocab_size": 128256)")).empty());
}

TEST(LlamaConfig, ErrorsNameTheKey) {
  struct Case {
    std::string json;
    std::string error;
  };
  const std::vector<Case> cases = {
      {llama(""), "t.json:1: $.model: missing required key \"intermediate_size\" (model.type llama: the SwiGLU width)"},
      {llama(R"(, "intermediate_size": 176, "n_kv_head": 3)"),
       "t.json:1: $.model.n_kv_head: n_kv_head (3) must divide n_head (4)"},
      {llama(R"(, "intermediate_size": 176, "n_kv_head": 8)"),
       "t.json:1: $.model.n_kv_head: n_kv_head (8) must divide n_head (4)"},
      {llama(R"(, "intermediate_size": 176, "rope_theta": 0)"),
       "t.json:1: $.model.rope_theta: expected a number > 0, got 0"},
      {llama(R"(, "intermediate_size": 176, "n_embd": 20)"),
       "t.json:1: $.model.n_embd: the head size n_embd / n_head (5) must be even for rotary embeddings"},
      {R"({"train_micro_batch_size_per_gpu": 2, "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, )"
       R"("vocab_size": 300, "seq_len": 32, "n_kv_head": 2}})",
       "t.json:1: $.model.n_kv_head: \"n_kv_head\" is a Llama or Mixtral key: it needs model.type \"llama\" or \"mixtral\""},
      {llama(R"(, "intermediate_size": 176, "n_kv_head": 2)", R"("tensor_parallel": {"size": 4}, )"),
       "t.json:1: $.model.n_kv_head: n_kv_head (2) must be divisible by tensor_parallel.size (4): each rank "
       "holds whole kv heads (dstrain does not replicate them)"},
      {llama(R"(, "intermediate_size": 175)", R"("tensor_parallel": {"size": 2}, )"),
       "t.json:1: $.model.intermediate_size: intermediate_size (175) must be divisible by tensor_parallel.size (2)"},
  };
  for (const auto& c : cases) {
    const auto errs = errors_of(c.json, 4);
    ASSERT_FALSE(errs.empty()) << c.json;
    EXPECT_EQ(errs[0], c.error) << c.json;
  }
  // tp 2 with n_kv_head 2 is fine.
  EXPECT_TRUE(errors_of(llama(R"(, "intermediate_size": 176, "n_kv_head": 2)", R"("tensor_parallel": {"size": 2}, )"),
                        2).empty());
}

}  // namespace
}  // namespace ds::config
