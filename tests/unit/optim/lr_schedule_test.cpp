// LR schedules against DeepSpeed's formulas: the values below come from
// deepspeed/runtime/lr_schedules.py's WarmupLR/WarmupDecayLR._get_gamma and
// WarmupCosineLR.get_lr_ratio, restated in Python and run once
// (/usr/bin/python3 tests/unit/optim/make_reference_values.py) at last_batch_iteration = -1, 0, 1, 5, 9, 10, 11, 30, 49, 50, 59, 100.
#include <gtest/gtest.h>

#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "optim/lr_schedule.h"

namespace ds::rt::optim {
namespace {

const std::vector<int64_t> kIters = {-1, 0, 1, 5, 9, 10, 11, 30, 49, 50, 59, 100};

void expect_values(const LrScheduleConfig& c, const std::vector<double>& want) {
  ASSERT_EQ(want.size(), kIters.size());
  for (size_t i = 0; i < kIters.size(); ++i) {
    EXPECT_NEAR(lr_at(c, kIters[i]), want[i], 1e-15) << "last_batch_iteration " << kIters[i];
  }
}

LrScheduleConfig warmup(LrScheduleType type, WarmupType wt) {
  LrScheduleConfig c;
  c.type = type;
  c.warmup_min_lr = 1e-5;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 10;
  c.warmup_type = wt;
  c.total_num_steps = 50;
  return c;
}

TEST(LrSchedule, WarmupLR) {
  expect_values(warmup(LrScheduleType::kWarmupLR, WarmupType::kLog),
                {1e-05, 1e-05, 0.0003080196957073414, 0.0007803697378798071,
                 0.0009999999999999998, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001});
  expect_values(warmup(LrScheduleType::kWarmupLR, WarmupType::kLinear),
                {1e-05, 1e-05, 0.000109, 0.000505, 0.000901, 0.001, 0.001, 0.001, 0.001, 0.001,
                 0.001, 0.001});
  // warmup_num_steps = 1 is treated as 2 (DeepSpeed's max(2, n)).
  LrScheduleConfig c = warmup(LrScheduleType::kWarmupLR, WarmupType::kLog);
  c.warmup_min_lr = 0;
  c.warmup_num_steps = 1;
  EXPECT_EQ(lr_at(c, 0), 0.0);
  EXPECT_EQ(lr_at(c, 1), 1e-3);
}

TEST(LrSchedule, WarmupDecayLR) {
  expect_values(warmup(LrScheduleType::kWarmupDecayLR, WarmupType::kLog),
                {1e-05, 1e-05, 0.0003080196957073414, 0.0007803697378798071,
                 0.0009999999999999998, 0.001, 0.00097525, 0.000505, 3.4750000000000004e-05,
                 1e-05, 1e-05, 1e-05});
  expect_values(warmup(LrScheduleType::kWarmupDecayLR, WarmupType::kLinear),
                {1e-05, 1e-05, 0.000109, 0.000505, 0.000901, 0.001, 0.00097525, 0.000505,
                 3.4750000000000004e-05, 1e-05, 1e-05, 1e-05});
}

TEST(LrSchedule, WarmupCosineLR) {
  LrScheduleConfig c;
  c.type = LrScheduleType::kWarmupCosineLR;
  c.base_lr = 6e-4;
  c.total_num_steps = 50;
  c.warmup_num_steps = 10;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  c.warmup_type = WarmupType::kLog;
  expect_values(c, {0.0, 5.9999999999999995e-05, 0.00022255619765854982, 0.0004802016752071675,
                    0.0005999999999999998, 0.000599084448118739, 0.0005963434371567559,
                    0.0002796976485688301, 5.999999999999999e-06, 5.999999999999999e-06,
                    5.999999999999999e-06, 5.999999999999999e-06});
  c.warmup_type = WarmupType::kLinear;
  expect_values(c, {0.0, 5.9999999999999995e-05, 0.00011399999999999999, 0.00033,
                    0.0005459999999999999, 0.000599084448118739, 0.0005963434371567559,
                    0.0002796976485688301, 5.999999999999999e-06, 5.999999999999999e-06,
                    5.999999999999999e-06, 5.999999999999999e-06});
}

TEST(LrSchedule, ConstantAndNames) {
  LrScheduleConfig c;
  c.base_lr = 3e-4;
  EXPECT_EQ(lr_at(c, -1), 3e-4);
  EXPECT_EQ(lr_at(c, 12345), 3e-4);
  EXPECT_EQ(lr_schedule_type_from_name(""), LrScheduleType::kConstant);
  EXPECT_EQ(lr_schedule_type_from_name("WarmupCosineLR"), LrScheduleType::kWarmupCosineLR);
  EXPECT_EQ(warmup_type_from_name("linear"), WarmupType::kLinear);
  try {
    lr_schedule_type_from_name("OneCycle");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown lr schedule \"OneCycle\" (supported: WarmupLR, WarmupDecayLR, "
              "WarmupCosineLR, or none for a constant lr)");
  }
  EXPECT_THROW(warmup_type_from_name("cosine"), Error);
}

// The scheduler object follows DeepSpeed's engine: the first optimizer step runs at
// last_batch_iteration -1, and step() advances after each applied step.
TEST(LrSchedule, SchedulerStepsAndResumes) {
  LrScheduler s(warmup(LrScheduleType::kWarmupDecayLR, WarmupType::kLinear));
  EXPECT_EQ(s.last_batch_iteration(), -1);
  EXPECT_EQ(s.lr(), 1e-05);
  for (int i = 0; i < 6; ++i) s.step();
  EXPECT_EQ(s.last_batch_iteration(), 5);
  EXPECT_NEAR(s.lr(), 0.000505, 1e-15);

  LrScheduler r(s.config());
  r.restore(nlohmann::json::parse(s.state().dump()), "ckpt.scheduler");
  EXPECT_EQ(r.lr(), s.lr());
  try {
    r.restore(nlohmann::json{{"last_batch_iteration", "5"}}, "ckpt.scheduler");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "ckpt.scheduler.last_batch_iteration: expected an integer >= -1");
  }
}

}  // namespace
}  // namespace ds::rt::optim
