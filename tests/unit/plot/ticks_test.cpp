// Axis ticks at round values and their labels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "plot/ticks.h"

namespace ds::plot {
namespace {

TEST(PlotTicks, StepAxisFromOneToSixty) {
  auto a = nice_axis(1, 60, 5, /*integer=*/true);
  EXPECT_EQ(a.lo, 0);
  EXPECT_EQ(a.hi, 60);
  EXPECT_EQ(a.step, 20);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"0", "20", "40", "60"}));
}

TEST(PlotTicks, IntegerAxisNeverStepsByFractions) {
  auto a = nice_axis(1, 3, 9, /*integer=*/true);
  EXPECT_EQ(a.step, 1);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"1", "2", "3"}));
}

TEST(PlotTicks, LossAxisCoversTheDataAtRoundValues) {
  auto a = nice_axis(2.49, 5.57, 8);
  EXPECT_LE(a.lo, 2.49);
  EXPECT_GE(a.hi, 5.57);
  EXPECT_EQ(a.step, 1);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"2", "3", "4", "5", "6"}));
  a = nice_axis(2.2, 2.9, 5);
  EXPECT_DOUBLE_EQ(a.step, 0.2);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"2.2", "2.4", "2.6", "2.8", "3.0"}));
}

TEST(PlotTicks, LearningRatesInScientificNotation) {
  auto a = nice_axis(0, 1e-3, 5);
  EXPECT_EQ(tick_labels(a),
            (std::vector<std::string>{"0", "2e-4", "4e-4", "6e-4", "8e-4", "1e-3"}));
  a = nice_axis(0, 6e-4, 5);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"0", "2e-4", "4e-4", "6e-4"}));
  a = nice_axis(1e-3, 1.5e-3, 5);
  EXPECT_EQ(tick_labels(a).back(), "1.5e-3");
}

TEST(PlotTicks, LargeValuesInThousands) {
  auto a = nice_axis(0, 180000, 5);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"0", "50k", "100k", "150k", "200k"}));
  a = nice_axis(0, 3e8, 4);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"0", "200M", "400M"}));
  a = nice_axis(0, 30000, 4);
  EXPECT_EQ(tick_labels(a), (std::vector<std::string>{"0", "20000", "40000"}));
}

TEST(PlotTicks, OneValueIsWidenedAndNonFiniteIsUnitRange) {
  auto a = nice_axis(52.25, 52.25, 5);
  EXPECT_LT(a.lo, 52.25);
  EXPECT_GT(a.hi, 52.25);
  a = nice_axis(0, 0, 5);
  EXPECT_LT(a.lo, 0);
  EXPECT_GT(a.hi, 0);
  a = nice_axis(0, std::numeric_limits<double>::infinity(), 5);
  EXPECT_EQ(a.lo, 0);
  EXPECT_EQ(a.hi, 1);
}

TEST(PlotTicks, TicksAreMultiplesOfTheStepWithoutNegativeZero) {
  auto a = nice_axis(-0.3, 0.7, 6);
  for (double t : a.ticks) EXPECT_FALSE(t == 0 && std::signbit(t));
  EXPECT_EQ(tick_labels(a)[0], "-0.4");
  EXPECT_EQ(tick_labels(a)[2], "0");
}

}  // namespace
}  // namespace ds::plot
