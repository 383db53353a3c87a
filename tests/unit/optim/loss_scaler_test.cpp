// Dynamic loss scaling: the sequence of scales for a scripted overflow pattern, against
// DeepSpeed's DynamicLossScaler.update_scale (restated in Python and run once on the same pattern:
// /usr/bin/python3 tests/unit/optim/make_reference_values.py; the (scale, remaining hysteresis)
// pairs are below).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "optim/loss_scaler.h"

namespace ds::rt::optim {
namespace {

const std::string kPattern = "FFFFTFTTFFFFFFTFTFTTTTT";  // T = this step overflowed

LossScalerConfig dynamic(bool consecutive) {
  LossScalerConfig c;
  c.enabled = true;
  c.initial_scale_power = 4;  // 16
  c.loss_scale_window = 3;
  c.hysteresis = 2;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = 1;
  return c;
}

using Seq = std::vector<std::pair<double, int64_t>>;

Seq run(LossScaler& s, const std::string& pattern, size_t* ran) {
  Seq out;
  for (*ran = 0; *ran < pattern.size(); ++*ran) {
    const bool overflow = pattern[*ran] == 'T';
    EXPECT_EQ(s.update(overflow), overflow);  // skip exactly the overflowed steps
    out.emplace_back(s.scale(), s.remaining_hysteresis());
  }
  return out;
}

TEST(LossScaler, HysteresisSequenceMatchesDeepSpeed) {
  LossScaler s(dynamic(false));
  EXPECT_EQ(s.scale(), 16.0);
  Seq got;
  size_t i = 0;
  try {
    for (; i < kPattern.size(); ++i) {
      s.update(kPattern[i] == 'T');
      got.emplace_back(s.scale(), s.remaining_hysteresis());
    }
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "fp16 loss scale is already at min_loss_scale 1 and the gradients still overflow at "
              "iteration 21");
  }
  EXPECT_EQ(i, 21u);  // DeepSpeed raises on the 22nd update, at the minimum scale
  const Seq want = {{16, 2}, {16, 2}, {16, 2}, {32, 2}, {32, 1}, {32, 1}, {16, 1},
                    {8, 1},  {8, 1},  {8, 1},  {8, 1},  {16, 2}, {16, 2}, {16, 2},
                    {16, 1}, {16, 1}, {8, 1},  {8, 1},  {4, 1},  {2, 1},  {1, 1}};
  EXPECT_EQ(got, want);
}

TEST(LossScaler, ConsecutiveHysteresisSequenceMatchesDeepSpeed) {
  LossScaler s(dynamic(true));
  size_t ran = 0;
  const Seq got = run(s, kPattern, &ran);
  const Seq want = {{16, 2}, {16, 2}, {16, 2}, {32, 2}, {32, 1}, {32, 2}, {32, 1}, {16, 1},
                    {16, 2}, {16, 2}, {16, 2}, {32, 2}, {32, 2}, {32, 2}, {32, 1}, {32, 2},
                    {32, 1}, {32, 2}, {32, 1}, {16, 1}, {8, 1},  {4, 1},  {2, 1}};
  EXPECT_EQ(got, want);
}

TEST(LossScaler, NoHysteresisHalvesAtOnceAndStopsAtTheMinimum) {
  LossScalerConfig c = dynamic(false);
  c.initial_scale_power = 2;
  c.hysteresis = 1;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_THROW(s.update(true), Error);

  c.raise_error_at_min_scale = false;
  LossScaler quiet(c);
  for (int i = 0; i < 5; ++i) quiet.update(true);
  EXPECT_EQ(quiet.scale(), 1.0);
}

TEST(LossScaler, DeepSpeedDefaults) {
  LossScalerConfig c;
  c.enabled = true;
  LossScaler s(c);
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.remaining_hysteresis(), 2);
  for (int i = 0; i < 1000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);  // iteration 1000: 1000 good steps since "overflow" at -1
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScaler, StaticAndDisabled) {
  LossScalerConfig c;
  c.enabled = true;
  c.loss_scale = 128;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_TRUE(s.update(true));  // an overflow still skips the step
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);

  LossScaler off{LossScalerConfig{}};
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_FALSE(off.update(true));  // no scaling: an overflow is the caller's to handle
  EXPECT_EQ(off.scale(), 1.0);
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a(dynamic(false)), b(dynamic(false));
  size_t ran = 0;
  run(a, "FFFFTFT", &ran);
  b.restore(nlohmann::json::parse(a.state().dump()), "ckpt.loss_scaler");
  const Seq rest_a = run(a, "FFFFFFTT", &ran);
  const Seq rest_b = run(b, "FFFFFFTT", &ran);
  EXPECT_EQ(rest_a, rest_b);
  try {
    b.restore(nlohmann::json{{"cur_scale", 2.0}}, "ckpt.loss_scaler");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "ckpt.loss_scaler.cur_iter: expected an integer");
  }
}

TEST(LossScaler, RejectsBadConfig) {
  LossScalerConfig c = dynamic(false);
  c.hysteresis = 0;
  try {
    LossScaler s(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "hysteresis must be at least 1, got 0");
  }
  c = dynamic(false);
  c.loss_scale = -1;
  EXPECT_THROW(LossScaler{c}, Error);
}

}  // namespace
}  // namespace ds::rt::optim
