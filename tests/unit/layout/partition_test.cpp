// model_spec's partition arithmetic, the one copy the runtime (rt::layout::Partition,
// partition_stages) and the planner (zero_partition, stage_bounds) both call: ZeRO's flat split
// by hand, stage bounds uniform and by parameters (checked against every alternative split),
// and the errors naming the numbers.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "layout/partition.h"

namespace ds::layout {

using namespace ds::model_spec;
namespace {

TEST(FlatPartition, StrideAlignedLastRanksOwnLess) {
  auto p = Partition(1920, 7);  // ceil(1920 / 7) = 275 -> 288
  EXPECT_EQ(p.stride(), 288);
  EXPECT_EQ(p.begin(6), 1728);
  EXPECT_EQ(p.count(6), 192);
  int64_t sum = 0;
  for (int r = 0; r < 7; ++r) sum += p.count(r);
  EXPECT_EQ(sum, 1920);
  auto q = Partition(10, 4);  // stride 16: rank 0 owns all 10
  EXPECT_EQ(q.count(0), 10);
  EXPECT_EQ(q.begin(3), 10);
  EXPECT_EQ(q.count(3), 0);
  EXPECT_EQ(Partition(0, 3).count(2), 0);
  EXPECT_THROW(Partition(-1, 2), Error);
  EXPECT_THROW(Partition(10, 0), Error);
  EXPECT_THROW(p.begin(7), Error);
  EXPECT_THROW(p.count(-1), Error);
}

TEST(StageLayerBounds, UniformAndByParameters) {
  ModelShape s{8, 2, 16, 40, 48, 8};
  EXPECT_EQ(stage_layer_bounds(s, 1, StageSplit::kParameters), (std::vector<int>{0, 8}));
  EXPECT_EQ(stage_layer_bounds(s, 3, StageSplit::kUniform), (std::vector<int>{0, 3, 6, 8}));
  EXPECT_EQ(stage_layer_bounds(s, 2, StageSplit::kParameters), (std::vector<int>{0, 4, 8}));
  // A big vocabulary (wte about 4.7 layers) pushes layers off the first and last stage.
  ModelShape big{8, 2, 16, 900, 960, 8};
  const auto b = stage_layer_bounds(big, 3, StageSplit::kParameters);
  EXPECT_EQ(b, (std::vector<int>{0, 1, 7, 8}));
  auto worst = [&](int a, int c) {
    return std::max({part_param_count(big, {0, a, true, false, 1, 0}),
                     part_param_count(big, {a, c, false, false, 1, 0}),
                     part_param_count(big, {c, 8, false, true, 1, 0})});
  };
  for (int a = 1; a < 8; ++a) {
    for (int c = a + 1; c < 8; ++c) EXPECT_LE(worst(b[1], b[2]), worst(a, c)) << a << " " << c;
  }
  EXPECT_EQ(stage_layer_bounds(big, 3, StageSplit::kParameters, 2), b);  // tp halves every count
}

TEST(StageLayerBounds, EarliestBoundaryWinsTies) {
  // maxT = 2 makes wpe (2C) as large as lnf (2C): both ends carry wte + 32 extra, so 1+2 and 2+1
  // layers cost the same; the earliest boundary wins.
  ModelShape s{3, 2, 16, 40, 48, 2};
  EXPECT_EQ(part_param_count(s, {0, 1, true, false, 1, 0}), part_param_count(s, {2, 3, false, true, 1, 0}));
  EXPECT_EQ(stage_layer_bounds(s, 2, StageSplit::kParameters), (std::vector<int>{0, 1, 3}));
}

TEST(StageLayerBounds, MoreStagesThanLayersNamesBothNumbers) {
  ModelShape s{3, 2, 16, 40, 48, 8};
  for (auto m : {StageSplit::kUniform, StageSplit::kParameters}) {
    try {
      stage_layer_bounds(s, 4, m);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("4 stages"), std::string::npos) << w;
      EXPECT_NE(w.find("3 layers"), std::string::npos) << w;
    }
  }
  EXPECT_THROW(stage_layer_bounds(s, 0, StageSplit::kUniform), Error);
}

}  // namespace
}  // namespace ds::layout
