// The model section with type "mixtral" and the expert_parallel section: Hugging Face's
// MixtralConfig keys and defaults, and the errors that name the key: top-k above the experts, an
// expert-parallel size that does not divide the experts or the data-parallel ranks, expert
// parallelism of a dense model.
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

// A Mixtral config: `extra` keys appended to the model section, `top` keys before it.
std::string mixtral(const std::string& extra, const std::string& top = "") {
  return R"({"train_micro_batch_size_per_gpu": 2, )" + top +
         R"("model": {"type": "mixtral", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 300, "seq_len": 32, )"
         R"("intermediate_size": 96)" + extra + "}}";
}

TEST(MixtralConfig, KeysDefaultsAndExpertParallelism) {
  const JobConfig c = parse_job_config(mixtral(R"(, "num_local_experts": 8)"), "t.json", 1);
  EXPECT_EQ(c.model.shape.num_local_experts, 8);
  EXPECT_EQ(c.model.shape.num_experts_per_tok, 2);           // HF's default
  EXPECT_DOUBLE_EQ(c.model.shape.router_aux_loss_coef, 0.02);  // HF's default
  EXPECT_EQ(c.expert_parallel.size, 1);
  const JobConfig d = parse_job_config(
      mixtral(R"(, "num_local_experts": 8, "num_experts_per_tok": 1, "router_aux_loss_coef": 0)",
              R"("expert_parallel": {"size": 4}, )"),
      "t.json", 8);
  EXPECT_EQ(d.expert_parallel.size, 4);
  EXPECT_EQ(d.model.shape.num_experts_per_tok, 1);
  EXPECT_EQ(d.model.shape.router_aux_loss_coef, 0.0);
  const auto j = d.to_json();
  EXPECT_EQ(j["expert_parallel"]["size"], 4);
  EXPECT_EQ(j["model"]["num_local_experts"], 8);
}

TEST(MixtralConfig, ErrorsNameTheKey) {
  struct Case {
    std::string json;
    int world;
    std::string error;
  };
  const std::vector<Case> cases = {
      {mixtral(""), 1,
       "t.json:1: $.model: missing required key \"num_local_experts\" (model.type mixtral: the experts of each layer)"},
      {mixtral(R"(, "num_local_experts": 4, "num_experts_per_tok": 5)"), 1,
       "t.json:1: $.model.num_experts_per_tok: num_experts_per_tok (5) must lie in [1, num_local_experts (4)]: each "
       "token picks that many of the experts"},
      {mixtral(R"(, "num_local_experts": 4, "router_aux_loss_coef": -1)"), 1,
       "t.json:1: $.model.router_aux_loss_coef: expected a number >= 0, got -1"},
      {mixtral(R"(, "num_local_experts": 6)", R"("expert_parallel": {"size": 4}, )"), 4,
       "t.json:1: $.expert_parallel.size: expert_parallel.size 4 must divide model.num_local_experts (6): each rank "
       "holds the same number of experts"},
      {mixtral(R"(, "num_local_experts": 8)", R"("expert_parallel": {"size": 4}, "tensor_parallel": {"size": 2}, )"), 4,
       "t.json:1: $.expert_parallel.size: expert_parallel.size 4 must divide the data-parallel x context-parallel "
       "ranks (2 x 1 = 2): the expert-parallel groups are carved out of them"},
      {R"({"train_micro_batch_size_per_gpu": 2, "expert_parallel": {"size": 2}, "model": {"type": "llama", )"
       R"("n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 300, "seq_len": 32, "intermediate_size": 96}})",
       2,
       "t.json:1: $.expert_parallel.size: expert parallelism splits a mixture of experts' experts, but model.type "
       "\"llama\" has none (a mixture of experts: model.type \"mixtral\")"},
      {mixtral(R"(, "num_local_experts": 4)", R"("expert_parallel": {"size": 0}, )"), 1,
       "t.json:1: $.expert_parallel.size: expected an integer >= 1, got 0"},
  };
  for (const auto& c : cases) {
    const auto errs = errors_of(c.json, c.world);
    ASSERT_FALSE(errs.empty()) << c.json;
    EXPECT_EQ(errs[0], c.error) << c.json;
  }
}

}  // namespace
}  // namespace ds::config
