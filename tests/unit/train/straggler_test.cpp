// The straggler rule (train/straggler.h): a rank more than slower_by above the median for `steps`
// steps in a row is named once per streak; coming back within the bound ends the streak.
#include "train/straggler.h"

#include <gtest/gtest.h>

namespace ds::rt::train {
namespace {

TEST(Straggler, NamedAfterItsStreakOncePerStreak) {
  StragglerWatch w(0.2, 3);
  const std::vector<double> slow = {10.0, 10.5, 9.5, 15.0};  // median 10.25: rank 3 is 46% slower
  EXPECT_TRUE(w.observe(slow).empty());
  EXPECT_TRUE(w.observe(slow).empty());
  const auto named = w.observe(slow);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0], "rank 3 computed 46% slower than the median (15.0 ms against 10.2 ms) for 3 steps in a row");
  EXPECT_TRUE(w.observe(slow).empty());  // the same streak: not again
  EXPECT_TRUE(w.observe({10.0, 10.5, 9.5, 12.0}).empty());  // 17% slower: within the bound, streak over
  EXPECT_TRUE(w.observe(slow).empty());
  EXPECT_TRUE(w.observe(slow).empty());
  EXPECT_EQ(w.observe(slow).size(), 1u);  // a new streak
}

TEST(Straggler, NothingWithOneRankOrNoTime) {
  StragglerWatch w(0.2, 1);
  EXPECT_TRUE(w.observe({5.0}).empty());
  EXPECT_TRUE(w.observe({0.0, 0.0}).empty());
  EXPECT_EQ(w.observe({1.0, 3.0}).size(), 1u);  // median 2: rank 1 is 50% slower
}

}  // namespace
}  // namespace ds::rt::train
