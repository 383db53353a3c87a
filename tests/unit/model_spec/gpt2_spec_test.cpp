// Unit tests for the GPT-2 model spec: parameter counts against published figures, the flat
// layout, tensor-parallel shards, and the activation list.
#include <gtest/gtest.h>

#include <set>

#include "common/error.h"
#include "model_spec/gpt2_spec.h"

namespace ms = ds::model_spec;

namespace {
ms::ModelShape small() { return ms::ModelShape{4, 4, 256, 4096, 4096, 128}; }   // issue 4's S
ms::ModelShape medium() { return ms::ModelShape{6, 6, 384, 50304, 50304, 256}; }  // issue 4's M
}  // namespace

TEST(Gpt2Spec, ParamCountsMatchKnownModels) {
  EXPECT_EQ(ms::param_count(ms::ModelShape::gpt2_124m()), 124475904);
  EXPECT_EQ(ms::param_count(small()), 4240896);   // "4.24M"
  EXPECT_EQ(ms::param_count(medium()), 30062592);  // "30.1M"
}

TEST(Gpt2Spec, TensorsInLlmcOrderWithShapes) {
  const auto all = ms::gpt2_params(ms::ModelShape::gpt2_124m());
  ASSERT_EQ(all.size(), 16u);
  const char* names[] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
  for (size_t i = 0; i < all.size(); i++) EXPECT_EQ(all[i].name, names[i]);
  EXPECT_EQ(all[0].shape, (std::vector<int64_t>{50304, 768}));
  EXPECT_EQ(all[4].shape, (std::vector<int64_t>{2304, 768}));
  EXPECT_EQ(all[12].shape, (std::vector<int64_t>{768, 3072}));
  EXPECT_EQ(all[4].split, ms::TpSplit::kColumn);
  EXPECT_EQ(all[6].split, ms::TpSplit::kRow);
  EXPECT_EQ(all[0].split, ms::TpSplit::kVocab);
  EXPECT_EQ(all[7].split, ms::TpSplit::kReplicated);
}

TEST(Gpt2Spec, LayoutIsLayerMajorAndContiguous) {
  const auto s = small();
  const auto lay = ms::param_layout(s, ms::ModelPart::whole(s));
  EXPECT_EQ(lay.total, ms::param_count(s));
  ASSERT_EQ(lay.units.size(), 2u + 4u + 1u);
  int64_t off = 0;
  for (const auto& u : lay.units) {
    EXPECT_EQ(u.offset, off);
    off += u.numel;
  }
  const auto* qkv2 = lay.find_tensor(ms::ParamId::kQkvw, 2);
  ASSERT_NE(qkv2, nullptr);
  EXPECT_EQ(qkv2->offset, lay.find_unit(ms::UnitKind::kLayer, 2)->offset + 2 * 256);
  EXPECT_EQ(lay.layer_numel, ms::layer_param_count(s));
}

TEST(Gpt2Spec, PipelineStagesAndTpShardsAddUp) {
  const auto s = medium();
  // Two stages: embedding + layers 0-2 | layers 3-5 + head (with its own copy of the tied wte).
  ms::ModelPart first{0, 3, true, false, 1, 0}, last{3, 6, false, true, 1, 0};
  const int64_t wte = 50304LL * 384;
  EXPECT_EQ(ms::part_param_count(s, first) + ms::part_param_count(s, last),
            ms::param_count(s) + wte);
  // tp = 2: split tensors halve, replicated ones stay.
  const int64_t full_layer = ms::layer_param_count(s, 1), half_layer = ms::layer_param_count(s, 2);
  const int64_t replicated = 6 * 384;  // ln1w ln1b attprojb ln2w ln2b fcprojb
  EXPECT_EQ(half_layer, (full_layer - replicated) / 2 + replicated);
  EXPECT_EQ(ms::layers_param_count(s, 1, 4, 2), 3 * half_layer);
}

TEST(Gpt2Spec, FullIndexCoversEveryElementOnce) {
  const ms::ModelShape s{2, 4, 8, 30, 32, 8};
  const int tp = 2;
  for (const auto& t : ms::gpt2_params(s)) {
    std::set<int64_t> seen;
    for (int r = 0; r < tp; r++) {
      for (int64_t i = 0; i < ms::local_numel(t, tp); i++) {
        seen.insert(ms::full_index(t, tp, r, i));
      }
    }
    if (t.split == ms::TpSplit::kReplicated) {
      EXPECT_EQ(static_cast<int64_t>(seen.size()), t.numel()) << t.name;
    } else {
      EXPECT_EQ(static_cast<int64_t>(seen.size()), t.numel()) << t.name;
      EXPECT_EQ(*seen.rbegin(), t.numel() - 1) << t.name;
    }
  }
  // qkv rank 1 starts with q's second half of heads: row C/2 of the full tensor.
  const auto qkvw = ms::gpt2_params(s)[4];
  EXPECT_EQ(ms::full_index(qkvw, 2, 1, 0), 4 * 8);
  // ... and its k part starts at row C + C/2.
  EXPECT_EQ(ms::full_index(qkvw, 2, 1, 4 * 8), (8 + 4) * 8);
}

TEST(Gpt2Spec, ActivationsShrinkWithRecompute) {
  const auto s = small();
  const auto part = ms::ModelPart::whole(s);
  ms::ActConfig cfg{8, 128, false, 2, 0};
  const auto full = ms::activation_totals(s, part, cfg);
  const int64_t BT = 8 * 128, C = 256;
  // ln1 + ln2 + res2 + out (C), qkv (3C), atty (C), fch + fch_gelu (8C), 4 stats, lse (NH).
  EXPECT_EQ(full.per_layer, BT * (4 * C + 3 * C + C + 8 * C + 4 + 4));
  cfg.recompute = true;
  const auto ck = ms::activation_totals(s, part, cfg);
  EXPECT_EQ(ck.per_layer, BT * C);
  EXPECT_EQ(ck.shared_activations, full.per_layer - BT * C);
  EXPECT_LT(ck.per_micro_batch, full.per_micro_batch);
}

TEST(Gpt2Spec, BadShapesAreClearErrors) {
  ms::ModelShape s = small();
  s.n_head = 3;
  EXPECT_THROW(s.validate(), ds::Error);
  s = small();
  try {
    s.validate_tp(3);
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_head (4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW((ms::ModelPart{2, 5, true, true, 1, 0}.validate(s)), ds::Error);
}

TEST(Gpt2Spec, LlmcOffsetsAreTensorMajor) {
  const auto s = ms::ModelShape::gpt2_124m();
  const int64_t C = 768, L = 12;
  EXPECT_EQ(ms::llmc_offset(s, ms::ParamId::kWte, -1), 0);
  EXPECT_EQ(ms::llmc_offset(s, ms::ParamId::kWpe, -1), 50304 * C);
  EXPECT_EQ(ms::llmc_offset(s, ms::ParamId::kLn1w, 3), 50304 * C + 1024 * C + 3 * C);
  EXPECT_EQ(ms::llmc_offset(s, ms::ParamId::kQkvw, 1), 50304 * C + 1024 * C + 2 * L * C + 3 * C * C);
  EXPECT_EQ(ms::llmc_offset(s, ms::ParamId::kLnfb, -1), ms::param_count(s) - C);
}
