// The loss-spike guard's rule (train/spike_guard.h): nothing is judged until the window is full;
// then a loss or norm more than K population standard deviations above the window's mean is
// skipped and stays out of the window; non-finite values are left to the loss scaler; the state
// round-trips and a state of another window is refused by name.
#include "train/spike_guard.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::rt::train {
namespace {

TEST(SpikeGuardRule, JudgesOnlyAFullWindowAndKeepsSpikesOut) {
  SpikeGuard g(3.0, 4);
  EXPECT_EQ(g.judge(10.0, 1.0), "");  // the window fills: nothing is judged
  EXPECT_EQ(g.judge(2.0, 1.1), "");
  EXPECT_EQ(g.judge(2.2, 0.9), "");
  EXPECT_EQ(g.judge(1.8, 1.0), "");
  // window {10, 2, 2.2, 1.8}: mean 4, population sd 3.47 -> 15 is 3.17 sd above
  const std::string why = g.judge(15.0, 1.0);
  EXPECT_EQ(why, "loss 15.0000 is 3.2 standard deviations above the mean 4.0000 of the last 4 steps");
  EXPECT_EQ(g.skipped(), 1);
  EXPECT_EQ(g.judge(2.0, 1.05), "");  // window {2, 2.2, 1.8, 2}: the spike stayed out
  EXPECT_NE(g.judge(3.0, 1.0), "");  // sd 0.14: 3.0 is far above
  EXPECT_EQ(g.skipped(), 2);
  EXPECT_NE(g.judge(2.0, 50.0).find("gradient norm 50.0000 is"), std::string::npos);  // norms {1.1, 0.9, 1, 1.05}
  EXPECT_EQ(g.skipped(), 3);
}

TEST(SpikeGuardRule, ZeroSpreadAndNonFiniteValuesAreNotSpikes) {
  SpikeGuard g(3.0, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g.judge(2.0, 1.0), "");
  EXPECT_EQ(g.judge(9.0, 1.0), "");  // no spread: no z-score (llm.c's detector neither)
  EXPECT_EQ(g.judge(std::numeric_limits<double>::infinity(), 1.0), "");  // the fp16 scaler's case
  EXPECT_EQ(g.skipped(), 0);
}

TEST(SpikeGuardRule, StateRoundTripsAndAnotherWindowIsRefused) {
  SpikeGuard a(3.0, 3);
  for (double l : {2.0, 2.5, 2.2, 9.0, 2.1}) a.judge(l, 1.0 + l);
  SpikeGuard b(3.0, 3);
  b.restore(a.state(), "m.json");
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.judge(30.0, 1.0), a.judge(30.0, 1.0));
  SpikeGuard c(3.0, 5);
  try {
    c.restore(a.state(), "m.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: spike_guard: the checkpoint's window is 3 steps"), std::string::npos)
        << e.what();
  }
  c.restore(nullptr, "m.json");  // a checkpoint without the guard: the windows fill again
  EXPECT_EQ(c.skipped(), 0);
}

}  // namespace
}  // namespace ds::rt::train
