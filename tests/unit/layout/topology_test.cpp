// The rank grid, exhaustively for small grids: rank = (pp * dp + dp_rank) * tp + tp_rank, groups
// along each axis partition the world, and bad shapes are named.
#include "layout/topology.h"

#include <algorithm>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::layout {
namespace {

TEST(Topology, RankFormulaAndGroupsForEveryGridUpTo4x4x4) {
  for (int tp = 1; tp <= 4; ++tp) {
    for (int dp = 1; dp <= 4; ++dp) {
      for (int pp = 1; pp <= 4; ++pp) {
        Topology t(tp * dp * pp, tp, dp, pp);
        for (int r = 0; r < t.world_size(); ++r) {
          Coord c = t.coord_of(r);
          EXPECT_EQ(r, (c.pp * dp + c.dp) * tp + c.tp);
          EXPECT_EQ(t.rank_of(c), r);
        }
        for (Axis a : {Axis::kTp, Axis::kDp, Axis::kPp}) {
          auto gs = t.groups(a);
          ASSERT_EQ(static_cast<int>(gs.size()), t.world_size() / t.size(a));
          std::set<int> seen;
          for (size_t gi = 0; gi < gs.size(); ++gi) {
            const auto& g = gs[gi];
            ASSERT_EQ(static_cast<int>(g.size()), t.size(a));
            for (size_t i = 0; i < g.size(); ++i) {
              EXPECT_TRUE(seen.insert(g[i]).second) << "rank in two groups";
              Coord c = t.coord_of(g[i]);
              int along = a == Axis::kTp ? c.tp : a == Axis::kDp ? c.dp : c.pp;
              EXPECT_EQ(along, static_cast<int>(i));  // group-local rank = the axis coordinate
              EXPECT_EQ(t.group_of(g[i], a), g);
              EXPECT_EQ(t.group_index(g[i], a), static_cast<int>(gi));
            }
            if (gi > 0) {
              EXPECT_LT(gs[gi - 1].front(), g.front());
            }
          }
          EXPECT_EQ(static_cast<int>(seen.size()), t.world_size());
        }
      }
    }
  }
}

TEST(Topology, TpRanksAreAdjacentAndDpStridesByTp) {
  Topology t(16, 2, 4, 2);
  EXPECT_EQ(t.group_of(5, Axis::kTp), (std::vector<int>{4, 5}));
  EXPECT_EQ(t.group_of(5, Axis::kDp), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(t.group_of(5, Axis::kPp), (std::vector<int>{5, 13}));
  EXPECT_EQ(t.coord_of(13), (Coord{1, 2, 1}));
}

// The context-parallel axis sits between tp and dp: rank = ((pp * dp + dp_rank) * cp + cp_rank) *
// tp + tp_rank; every axis's groups partition the world, and the gradient group is dp x cp.
TEST(Topology, ContextParallelAxisBetweenTpAndDp) {
  for (int tp = 1; tp <= 2; ++tp) {
    for (int cp = 1; cp <= 4; ++cp) {
      for (int dp = 1; dp <= 3; ++dp) {
        for (int pp = 1; pp <= 2; ++pp) {
          Topology t(tp * cp * dp * pp, tp, dp, pp, cp);
          for (int r = 0; r < t.world_size(); ++r) {
            const Coord c = t.coord_of(r);
            EXPECT_EQ(r, ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp);
            EXPECT_EQ(t.rank_of(c), r);
            const auto grad = t.gradient_group(r);
            ASSERT_EQ(static_cast<int>(grad.size()), dp * cp);
            for (int q : grad) {
              EXPECT_EQ(t.coord_of(q).pp, c.pp);
              EXPECT_EQ(t.coord_of(q).tp, c.tp);
            }
            EXPECT_NE(std::find(grad.begin(), grad.end(), r), grad.end());
          }
          for (Axis a : {Axis::kTp, Axis::kCp, Axis::kDp, Axis::kPp}) {
            std::set<int> seen;
            for (const auto& g : t.groups(a)) {
              ASSERT_EQ(static_cast<int>(g.size()), t.size(a));
              for (int q : g) EXPECT_TRUE(seen.insert(q).second) << axis_name(a);
            }
            EXPECT_EQ(static_cast<int>(seen.size()), t.world_size()) << axis_name(a);
          }
        }
      }
    }
  }
  // tp 2 x cp 2 x dp 2: cp peers stride by tp, dp peers by tp x cp.
  Topology t(8, 2, 2, 1, 2);
  EXPECT_EQ(t.group_of(5, Axis::kCp), (std::vector<int>{5, 7}));
  EXPECT_EQ(t.group_of(5, Axis::kDp), (std::vector<int>{1, 5}));
  EXPECT_EQ(t.gradient_group(5), (std::vector<int>{1, 3, 5, 7}));
  try {
    Topology bad(8, 2, 2, 1, 3);
    FAIL() << "a grid of 12 ranks was accepted for a world of 8";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp 2 x cp 3 x dp 2 x pp 1 = 12 ranks, but the world has 8"), std::string::npos)
        << e.what();
  }
}

TEST(Topology, BadShapesAndRanksAreNamed) {
  try {
    Topology t(6, 2, 2, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp 2 x dp 2 x pp 2 = 8 ranks, but the world has 6"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Topology(4, 0, 4, 1), Error);
  Topology t(4, 1, 4, 1);
  EXPECT_THROW(t.coord_of(4), Error);
  EXPECT_THROW(t.coord_of(-1), Error);
  EXPECT_THROW(t.rank_of(Coord{0, 4, 0}), Error);
  EXPECT_STREQ(axis_name(Axis::kDp), "dp");
}

}  // namespace
}  // namespace ds::layout
