// Stage partition tables: uniform by layers and balanced by parameters (embedding counted on the
// first stage, lnf and the tied wte on the last), and the clear error for more stages than layers.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "layout/partition.h"

namespace ds::layout {
namespace {

namespace ms = ds::model_spec;

std::string table(const std::vector<ms::ModelPart>& parts) {
  std::string s;
  for (const auto& p : parts) {
    if (!s.empty()) s += ' ';
    s += std::to_string(p.layer_begin) + "-" + std::to_string(p.layer_end);
    if (p.has_embedding) s += "E";
    if (p.has_head) s += "H";
  }
  return s;
}

TEST(StagePartition, Uniform) {
  ms::ModelShape s{8, 2, 16, 40, 48, 8};
  EXPECT_EQ(table(partition_stages(s, 1, StageSplit::kUniform)), "0-8EH");
  EXPECT_EQ(table(partition_stages(s, 2, StageSplit::kUniform)), "0-4E 4-8H");
  EXPECT_EQ(table(partition_stages(s, 3, StageSplit::kUniform)), "0-3E 3-6 6-8H");
  EXPECT_EQ(table(partition_stages(s, 8, StageSplit::kUniform)),
            "0-1E 1-2 2-3 3-4 4-5 5-6 6-7 7-8H");
  const auto tp = partition_stages(s, 2, StageSplit::kUniform, 2, 1);
  EXPECT_EQ(tp[1].tp, 2);
  EXPECT_EQ(tp[1].tp_rank, 1);
}

TEST(StagePartition, ByParameters) {
  // C = 16: one layer holds 12*C*C + 13*C = 3280 parameters. Vp = 48 -> wte 768; maxT 8 -> wpe 128.
  // First stage extra 896, last stage extra 768 + 32 = 800: small, so layers split like uniform.
  ms::ModelShape s{8, 2, 16, 40, 48, 8};
  EXPECT_EQ(table(partition_stages(s, 2, StageSplit::kParameters)), "0-4E 4-8H");
  // A big vocabulary (Vp = 960 -> wte 15360, about 4.7 layers) pushes layers off the first and
  // last stage: 8 layers over 3 stages -> the middle stage takes most of them.
  ms::ModelShape big{8, 2, 16, 900, 960, 8};
  const auto p = partition_stages(big, 3, StageSplit::kParameters);
  EXPECT_EQ(table(p), "0-1E 1-7 7-8H");
  // The chosen split minimises the largest stage: check against every alternative.
  int64_t worst = 0;
  for (const auto& part : p) worst = std::max(worst, ms::part_param_count(big, part));
  for (int a = 1; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      const int64_t w = std::max({ms::part_param_count(big, {0, a, true, false, 1, 0}),
                                  ms::part_param_count(big, {a, b, false, false, 1, 0}),
                                  ms::part_param_count(big, {b, 8, false, true, 1, 0})});
      EXPECT_LE(worst, w) << a << " " << b;
    }
  }
  // With tp = 2 every count halves (wte by vocabulary, layers by columns/rows): same split.
  EXPECT_EQ(table(partition_stages(big, 3, StageSplit::kParameters, 2, 0)), "0-1E 1-7 7-8H");
}

TEST(StagePartition, MoreStagesThanLayersIsAClearError) {
  ms::ModelShape s{3, 2, 16, 40, 48, 8};
  for (auto m : {StageSplit::kUniform, StageSplit::kParameters}) {
    try {
      partition_stages(s, 4, m);
      FAIL() << "no error";
    } catch (const ds::Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("4 stages"), std::string::npos) << w;
      EXPECT_NE(w.find("3 layers"), std::string::npos) << w;
    }
  }
  EXPECT_THROW(partition_stages(s, 0, StageSplit::kUniform), ds::Error);
  EXPECT_EQ(parse_stage_split_or_throw("Parameters", "pipeline.partition"),
            StageSplit::kParameters);
  EXPECT_THROW(parse_stage_split_or_throw("type:transformer", "pipeline.partition"), ds::Error);
}

}  // namespace
}  // namespace ds::layout
