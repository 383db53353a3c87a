// Korthikanti et al. 2022, Table 2, against hand-computed numbers.
#include <gtest/gtest.h>

#include "common/error.h"
#include "plan/activation_paper.h"

namespace ds::plan {
namespace {

// GPT-3 175B as in the paper: s = 2048, h = 12288, a = 96, t = 8, b = 1.
constexpr double kS = 2048, kH = 12288, kA = 96, kT = 8;
constexpr double kSbh = kS * kH;  // 25,165,824; 5as/h = 80

TEST(Korthikanti, Table2RowsForGpt3) {
  KorthikantiInput in{kS, 1, kH, kA, 1, false, PaperRecompute::kNone};
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 114);  // 34 + 80
  in.t = kT;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 23);   // 10 + 3 + 10
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), 578813952.0);
  in.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 14.25);  // 34/8 + 10
  in.recompute = PaperRecompute::kSelective;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 4.25);   // 34/8
  in.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 13);     // 10 + 24/8
  in.recompute = PaperRecompute::kFull;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 2);
  in.b = 4;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 8);
}

TEST(Korthikanti, TableHasSixRowsWithTensorParallelism) {
  auto rows = korthikanti_table(kS, 1, kH, kA, kT);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows.back().formula, "2sbh");
  EXPECT_EQ(korthikanti_table(kS, 1, kH, kA, 1).size(), 4u);  // no SP rows at t = 1
}

TEST(Korthikanti, RejectsImpossibleSplits) {
  KorthikantiInput in{kS, 1, kH, kA, 7, false, PaperRecompute::kNone};
  EXPECT_THROW(korthikanti_layer_bytes(in), Error);  // 7 does not divide 96
  in.t = 1;
  in.sequence_parallel = true;
  EXPECT_THROW(korthikanti_layer_bytes(in), Error);
  in.sequence_parallel = false;
  in.s = 0;
  EXPECT_THROW(korthikanti_layer_bytes(in), Error);
}

}  // namespace
}  // namespace ds::plan
