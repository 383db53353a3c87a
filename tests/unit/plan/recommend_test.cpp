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

namespace ds::plan {
namespace {

// A long sequence: the plan halves a rank's activations per doubling of cp, counts the cp
// attention's scratch (workspace) and blocks in flight (comm), refuses what does not divide, and
// both the verdict's fixes and the search offer context parallelism when activations are what
// does not fit.
TEST(Recommend, ContextParallelismSplitsTheSequence) {
  model_spec::ModelShape s = small();
  s.n_head = 4;
  s.seq_len = 4096;
  Layout one = base();
  one.micro_batch = 1;
  one.grad_accum = 4;
  Layout two = one;
  two.cp = 2;
  two.dp = 2;
  two.grad_accum = 8;
  const MemoryPlan p1 = plan_memory(s, one), p2 = plan_memory(s, two);
  EXPECT_EQ(p2.ranks[0].activations * 2, p1.ranks[0].activations);
  EXPECT_GT(p2.ranks[0].comm, p1.ranks[0].comm);  // the ring's blocks in flight
  const auto scratch = layout::cp_attention_scratch(
      {1, 4096, 4, 4, 16, 2, layout::CpMethod::kRing, storage_bytes(two), two.num_threads});
  EXPECT_GT(scratch.workspace, 0);
  EXPECT_GT(scratch.comm, 0);
  Layout odd = two;
  odd.cp = 3;
  EXPECT_THROW(plan_memory(s, odd), Error);  // 4096 is not divisible by 2 x 3
  Layout uly = two;
  uly.cp_method = layout::CpMethod::kUlysses;
  uly.cp = 8;
  uly.dp = 1;
  s.seq_len = 4096;
  EXPECT_THROW(plan_memory(s, uly), Error);  // 4 heads over 8 ranks

  // Just under the single rank's peak: the fixes include cp 2, and the search ranks cp layouts.
  const int64_t device = p1.peak_total() - 1;
  const Verdict v = verdict(p1, device);
  bool cp_fix = false;
  for (const auto& f : v.fixes) cp_fix |= f.find("context parallelism 2") != std::string::npos;
  EXPECT_TRUE(cp_fix);
  const Calibration cal = builtin_calibration(Hardware{});
  const auto res = recommend(s, one, 4, device, cal, comm_types(Precision::kBf16, Precision::kBf16));
  int with_cp = 0;
  for (const auto& c : res.fits) {
    EXPECT_EQ(c.layout.world_size(), 4);
    EXPECT_EQ(c.layout.micro_batch * c.layout.grad_accum * c.layout.dp, 16);  // sequences per step
    if (c.layout.cp > 1) {
      ++with_cp;
      EXPECT_GT(c.time.cp_comm_total, 0) << describe_layout(c.layout);
      EXPECT_NE(describe_layout(c.layout).find(" x cp "), std::string::npos);
    }
  }
  EXPECT_GT(with_cp, 0);
}


// Sequence parallelism splits the residual stream's rows over tp: fewer activation bytes than tp
// alone, offered as a fix, and searched by --recommend.
TEST(Recommend, SequenceParallelismSplitsTheRestOverTensorParallelRanks) {
  model_spec::ModelShape s = small();
  s.n_head = 4;
  s.seq_len = 1024;
  Layout tp2 = base();
  tp2.tp = 2;
  tp2.dp = 2;
  tp2.micro_batch = 1;
  tp2.grad_accum = 8;
  Layout sp = tp2;
  sp.sequence_parallel = true;
  const MemoryPlan a = plan_memory(s, tp2), b = plan_memory(s, sp);
  EXPECT_LT(b.ranks[0].activations, a.ranks[0].activations);
  const Verdict v = verdict(a, a.peak_total() - 1);
  bool offered = false;
  for (const auto& f : v.fixes) offered |= f.find("sequence parallelism") != std::string::npos;
  EXPECT_TRUE(offered);
  Layout odd = sp;
  s.seq_len = 1023;
  EXPECT_THROW(plan_memory(s, odd), Error);  // 1 x 1023 tokens over 2 tp ranks
  s.seq_len = 1024;
  const auto res = recommend(s, tp2, 4, a.peak_total(), builtin_calibration(Hardware{}),
                             comm_types(Precision::kBf16, Precision::kBf16));
  int with_sp = 0;
  for (const auto& c : res.fits) {
    EXPECT_FALSE(c.layout.sequence_parallel && c.layout.tp == 1);
    if (c.layout.sequence_parallel) {
      ++with_sp;
      EXPECT_NE(describe_layout(c.layout).find("sequence-parallel"), std::string::npos);
    }
  }
  EXPECT_GT(with_sp, 0);
}

}  // namespace
}  // namespace ds::plan
