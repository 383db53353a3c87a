// The Llama model spec: parameter counts against Hugging Face's published figures, HF's tensor
// names, grouped-query attention's smaller k/v, tied and untied heads in the flat layout, tensor-
// parallel shards (kv heads split) and the activation list.
#include <gtest/gtest.h>

#include "model_spec/llama_spec.h"
#include "model_spec/gpt2_spec.h"
#include "common/error.h"
#include "model_spec/shape.h"

namespace ms = ds::model_spec;

namespace {
ms::ModelShape llama(int L, int NH, int KV, int C, int I, int V, int T, bool tie = false) {
  ms::ModelShape s{L, NH, C, V, V, T};
  s.family = ms::ModelFamily::kLlama;
  s.n_kv_head = KV;
  s.intermediate_size = I;
  s.tie_embeddings = tie;
  return s;
}
ms::ModelShape llama3_8b() { return llama(32, 32, 8, 4096, 14336, 128256, 8192); }
ms::ModelShape llama2_7b() { return llama(32, 32, 32, 4096, 11008, 32000, 4096); }
ms::ModelShape tiny(int KV = 2, bool tie = false) { return llama(3, 4, KV, 32, 48, 64, 16, tie); }
}  // namespace

TEST(LlamaSpec, ParamCountsMatchPublishedModels) {
  EXPECT_EQ(ms::param_count(llama3_8b()), 8030261248);  // Meta-Llama-3-8B: 8.03B
  EXPECT_EQ(ms::param_count(llama2_7b()), 6738415616);  // Llama-2-7b: 6.74B
  // TinyLlama-1.1B (22 layers, 32 heads, 4 kv heads, 2048, 5632, vocab 32000): 1,100,048,384.
  EXPECT_EQ(ms::param_count(llama(22, 32, 4, 2048, 5632, 32000, 2048)), 1100048384);
}

TEST(LlamaSpec, TensorsHaveHfNamesAndGqaShapes) {
  const auto all = ms::model_params(llama3_8b());
  ASSERT_EQ(all.size(), 12u);
  EXPECT_EQ(ms::find_param(all, ms::ParamId::kWk).shape, (std::vector<int64_t>{1024, 4096}));  // 8 kv heads x 128
  EXPECT_EQ(ms::find_param(all, ms::ParamId::kWq).shape, (std::vector<int64_t>{4096, 4096}));
  EXPECT_EQ(ms::find_param(all, ms::ParamId::kWdown).shape, (std::vector<int64_t>{4096, 14336}));
  EXPECT_EQ(ms::find_param(all, ms::ParamId::kWdown).split, ms::TpSplit::kRow);
  EXPECT_EQ(ms::find_param(all, ms::ParamId::kLmHead).split, ms::TpSplit::kVocab);
  EXPECT_EQ(ms::llama_hf_name(ms::ParamId::kWk, 3), "model.layers.3.self_attn.k_proj.weight");
  EXPECT_EQ(ms::llama_hf_name(ms::ParamId::kWup, 0), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(ms::llama_hf_name(ms::ParamId::kMlpNorm, 1), "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(ms::llama_hf_name(ms::ParamId::kWte, -1), "model.embed_tokens.weight");
  EXPECT_EQ(ms::llama_hf_name(ms::ParamId::kLnfw, -1), "model.norm.weight");
  EXPECT_EQ(ms::llama_hf_name(ms::ParamId::kLmHead, -1), "lm_head.weight");
  EXPECT_THROW(ms::find_param(all, ms::ParamId::kWpe), ds::Error);
  // Tied: no lm_head tensor, the embedding serves the head.
  EXPECT_EQ(ms::model_params(tiny(2, true)).size(), 11u);
}

TEST(LlamaSpec, LayoutHoldsTheHeadWithTheLastStage) {
  const auto s = tiny();
  const auto whole = ms::param_layout(s, ms::ModelPart::whole(s));
  EXPECT_EQ(whole.units.size(), 1u + 3u + 1u);  // embedding, layers, final norm + lm_head
  EXPECT_EQ(whole.find_unit(ms::UnitKind::kPositionEmbedding), nullptr);
  // q, k, v adjacent, then o: one (NH+2KV)hd x C matrix.
  const auto* q = whole.find_tensor(ms::ParamId::kWq, 1);
  const auto* v = whole.find_tensor(ms::ParamId::kWv, 1);
  EXPECT_EQ(v->offset + v->numel - q->offset, (4 + 2 * 2) * 8 * 32);
  // Untied, two stages: the first holds the embedding only, the last the lm_head only.
  ms::ModelPart first{0, 2, true, false, 1, 0}, last{2, 3, false, true, 1, 0};
  EXPECT_EQ(ms::part_param_count(s, first) + ms::part_param_count(s, last), ms::param_count(s));
  EXPECT_EQ(ms::param_layout(s, last).find_unit(ms::UnitKind::kTokenEmbedding), nullptr);
  // Tied: the last stage keeps its copy of the embedding, as GPT-2's.
  const auto t = tiny(2, true);
  EXPECT_EQ(ms::part_param_count(t, first) + ms::part_param_count(t, last), ms::param_count(t) + 64 * 32);
}

TEST(LlamaSpec, TensorParallelSplitsKvHeads) {
  const auto s = tiny(2);
  for (int tp : {1, 2}) {
    int64_t sum = 0;
    for (int r = 0; r < tp; r++) {
      ms::ModelPart p = ms::ModelPart::whole(s);
      p.tp = tp;
      p.tp_rank = r;
      p.validate(s);
      sum += ms::part_param_count(s, p);
    }
    const int64_t replicated = (tp - 1) * (3 * 2 * 32 + 32);  // norms on every rank
    EXPECT_EQ(sum, ms::param_count(s) + replicated) << tp;
  }
  try {
    s.validate_tp(4);
    FAIL() << "4 ranks cannot split 2 kv heads";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_head (2) must be divisible by the tensor-parallel size (4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(tiny(4).validate_tp(4));
}

TEST(LlamaSpec, ActivationsCountGqaAndSwiGlu) {
  const auto s = tiny(2);
  ms::ActConfig cfg;
  cfg.B = 2;
  cfg.T = 16;
  cfg.num_threads = 1;
  ms::ModelPart p = ms::ModelPart::whole(s);
  p.tp = 2;
  const auto acts = ms::model_activations(s, p, cfg);
  auto numel = [&](const std::string& n) {
    for (const auto& b : acts) {
      if (b.name == n) return b.numel;
    }
    return int64_t{-1};
  };
  const int64_t BT = 32;
  EXPECT_EQ(numel("qkv"), BT * (2 + 2 * 1) * 8);  // per rank: 2 q heads, 1 k and 1 v head of 8
  EXPECT_EQ(numel("gu"), BT * 2 * 24);            // gate | up, I/tp = 24
  EXPECT_EQ(numel("act"), BT * 24);
  EXPECT_EQ(numel("rope_cos"), 16 * 4);
  EXPECT_EQ(numel("ln1_mean"), -1);  // RMSNorm keeps no mean
  const auto tot = ms::activation_totals(s, p, cfg);
  int64_t per_layer = 0;
  for (const auto& b : acts) {
    if (b.scope == ms::ActScope::kPerLayer) per_layer += b.numel;
  }
  EXPECT_EQ(tot.per_layer, per_layer);
  EXPECT_THROW(ms::llmc_offset(s, ms::ParamId::kWte, -1), ds::Error);
}
