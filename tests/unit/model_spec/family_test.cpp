// The family descriptions (model_spec/family.h) and the one FLOP count (model_spec/flops.h): each
// registered family's recipe and roles name tensors of its own parameter table; the FLOPs derived
// from the tensor lists equal the hand formulas (GPT-2: llm.c's 24·C² per token per layer; Llama:
// the q/k/v/o and gate/up/down matrices).
#include <gtest/gtest.h>

#include <optional>

#include "model_spec/family.h"
#include "model_spec/flops.h"

namespace ms = ds::model_spec;

namespace {

ms::ModelShape llama_1b() {
  ms::ModelShape s{22, 32, 2048, 32000, 32000, 2048};
  s.family = ms::ModelFamily::kLlama;
  s.n_kv_head = 4;
  s.intermediate_size = 5632;
  return s;
}

// Every role the description names is a per-layer tensor of the family's table (or, for the final
// norm, a global one).
void expect_roles_in_table(const ms::ModelShape& s) {
  const auto& f = ms::family_of(s);
  const auto table = f.params(s);
  auto has = [&](ms::ParamId id, bool per_layer) {
    for (const auto& t : table) {
      if (t.id == id) return t.per_layer == per_layer;
    }
    return false;
  };
  const ms::LayerRoles& r = f.roles;
  for (ms::ParamId id : {r.norm1_w, r.qkv_w, r.proj_w, r.norm2_w, r.up_w, r.down_w}) EXPECT_TRUE(has(id, true)) << f.name;
  for (const auto& id : {r.norm1_b, r.qkv_b, r.proj_b, r.norm2_b, r.up_b, r.down_b}) {
    if (id) {
      EXPECT_TRUE(has(*id, true)) << f.name;
    }
  }
  EXPECT_TRUE(has(r.final_norm_w, false)) << f.name;
  if (r.final_norm_b) {
    EXPECT_TRUE(has(*r.final_norm_b, false)) << f.name;
  }
}

}  // namespace

TEST(ModelFamily, EachDescriptionNamesItsOwnTensors) {
  const auto gpt2 = ms::ModelShape::gpt2_124m();
  expect_roles_in_table(gpt2);
  expect_roles_in_table(llama_1b());
  EXPECT_STREQ(ms::family_of(gpt2).name, "gpt2");
  EXPECT_STREQ(ms::family_of(llama_1b()).name, "llama");
  EXPECT_EQ(ms::kv_heads(gpt2), 12);
  EXPECT_EQ(ms::kv_heads(llama_1b()), 4);
  EXPECT_EQ(ms::mlp_width(gpt2), 4 * 768);
  EXPECT_EQ(ms::mlp_width(llama_1b()), 5632);
}

TEST(ModelFlops, GPT2MatchesLlmcsFormula) {
  const auto s = ms::ModelShape::gpt2_124m();
  const double C = 768, L = 12, T = 1024;
  EXPECT_DOUBLE_EQ(ms::layer_matmul_params(s), 12 * C * C);
  EXPECT_DOUBLE_EQ(ms::layer_forward_flops(s, 1024), T * (24 * C * C + 4 * T * C));
  EXPECT_DOUBLE_EQ(ms::model_flops_per_token(s, 1024), 6.0 * static_cast<double>(ms::param_count(s)) + 6 * L * C * T);
}

TEST(ModelFlops, LlamaCountsItsGroupedQueryAndSwiGluMatrices) {
  const auto s = llama_1b();
  const double C = 2048, hd = 64, NH = 32, KV = 4, I = 5632, T = 2048;
  EXPECT_DOUBLE_EQ(ms::layer_matmul_params(s), C * (NH + 2 * KV) * hd + NH * hd * C + 3 * C * I);
  EXPECT_DOUBLE_EQ(ms::model_flops_per_token(s, 2048), 6.0 * 1100048384 + 6 * 22 * NH * hd * T);
}
