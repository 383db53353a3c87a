// The layout search: everything it recommends fits, what does not fit or breaks a rule is absent,
// and the step-time model moves the right way.
#include <gtest/gtest.h>

#include "common/error.h"
#include "plan/recommend.h"

namespace ds::plan {
namespace {

model_spec::ModelShape small() {
  model_spec::ModelShape s;
  s.n_layer = 4;
  s.n_head = 2;
  s.n_embd = 64;
  s.vocab_size = 256;
  s.padded_vocab_size = 256;
  s.seq_len = 32;
  return s;
}

Layout base() {
  Layout l;
  l.dp = 4;
  l.micro_batch = 2;
  l.grad_accum = 2;  // global batch 16
  l.precision = Precision::kBf16;
  return l;
}

TEST(Recommend, EveryRecommendationFitsAndImpossibleOnesAreAbsent) {
  const auto s = small();
  // The baseline (ZeRO-0, no checkpointing, micro-batch 4 on dp 4) must not fit.
  Layout big = base();
  big.micro_batch = 4;
  big.grad_accum = 1;
  const int64_t big_peak = plan_memory(s, big).peak_total();
  Layout z3 = base();
  z3.zero_stage = 3;
  z3.micro_batch = 1;
  z3.grad_accum = 4;
  z3.checkpointing = true;
  const int64_t device = plan_memory(s, z3).peak_total() + 1024;
  ASSERT_LT(device, big_peak);

  const Calibration cal = builtin_calibration(Hardware{});
  auto res = recommend(s, base(), 4, device, cal, comm_types(Precision::kBf16, Precision::kBf16));
  ASSERT_FALSE(res.fits.empty());
  EXPECT_GT(res.rejected_memory, 0);
  EXPECT_GT(res.rejected_rule, 0);  // tp 4 does not divide 2 heads
  for (const auto& c : res.fits) {
    EXPECT_LE(plan_memory(s, c.layout).peak_total(), device) << describe_layout(c.layout);
    EXPECT_EQ(c.peak_bytes, plan_memory(s, c.layout).peak_total());
    EXPECT_EQ(c.layout.world_size(), 4);
    EXPECT_EQ(c.layout.micro_batch * c.layout.grad_accum * c.layout.dp, 16);
    EXPECT_NE(c.layout.tp, 4);
    EXPECT_FALSE(c.layout.zero_stage == 3 && c.layout.pp > 1);  // the config refuses it
    EXPECT_FALSE(c.reason.empty());
    bool same_as_big = c.layout.tp == 1 && c.layout.pp == 1 && c.layout.zero_stage == 0 &&
                       c.layout.micro_batch == 4 && !c.layout.checkpointing;
    EXPECT_FALSE(same_as_big);
  }
  for (size_t i = 1; i < res.fits.size(); ++i) {
    EXPECT_LE(res.fits[i - 1].time.total(), res.fits[i].time.total() * (1 + 1e-9));
  }
}

TEST(Recommend, StepTimeModelMovesTheRightWay) {
  const auto s = small();
  Hardware hw;
  Layout l = base();
  auto t0 = estimate_step_time(s, l, hw);
  EXPECT_GT(t0.compute, 0);
  EXPECT_EQ(t0.bubble, 0);
  EXPECT_GT(t0.dp_comm, 0);
  Layout ck = l;
  ck.checkpointing = true;
  EXPECT_GT(estimate_step_time(s, ck, hw).compute, t0.compute);  // recomputation costs a forward
  Layout pp = l;
  pp.pp = 2;
  pp.dp = 2;
  pp.grad_accum = 4;
  pp.partition = StageSplit::kUniform;
  auto tp = estimate_step_time(s, pp, hw);
  // (pp - 1) / m of a stage's work: the head makes the last stage the slowest, so a little less.
  EXPECT_GT(tp.bubble, 0);
  EXPECT_LE(tp.bubble, (tp.compute + tp.tp_comm + tp.pp_comm) / 4 * (1 + 1e-12));
  Layout z3 = l;
  z3.zero_stage = 3;
  EXPECT_GT(estimate_step_time(s, z3, hw).dp_comm, t0.dp_comm);
}

TEST(Recommend, RejectsBadArguments) {
  const Calibration hw = builtin_calibration(Hardware{});
  const CommTypes types;
  EXPECT_THROW(recommend(small(), base(), 0, 1 << 30, hw, types), Error);
  EXPECT_THROW(recommend(small(), base(), 4, 0, hw, types), Error);
  auto res = recommend(small(), base(), 4, 1024, hw, types);  // nothing fits in 1 KiB
  EXPECT_TRUE(res.fits.empty());
}

}  // namespace
}  // namespace ds::plan
