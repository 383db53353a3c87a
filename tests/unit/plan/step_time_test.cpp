// The step-time model's pieces against hand-computed cases (lib/plan/step_time.h): the bubble of
// a pipeline, exposed communication with and without overlap, the micro-batch efficiency curve,
// the shared-cores bound, 16-bit communication.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "plan/step_time.h"

namespace ds::plan {
namespace {

model_spec::ModelShape shape() {
  model_spec::ModelShape s;
  s.n_layer = 4;
  s.n_head = 2;
  s.n_embd = 64;
  s.vocab_size = 256;
  s.padded_vocab_size = 256;
  s.seq_len = 32;
  return s;
}

ComputeSample sample(int b, double fwd, double bwd, int conc = 1, int tp = 1) {
  ComputeSample c;
  c.tp = tp;
  c.concurrency = conc;
  c.micro_batch = b;
  c.layer_fwd = fwd;
  c.layer_bwd = bwd;
  return c;
}

CollectiveFit fit(CollectiveOp op, int n, double latency, double bw) {
  CollectiveFit f;
  f.op = op;
  f.group_size = n;
  f.latency = latency;
  f.bus_bw = bw;
  return f;
}

// A measured GPU-like machine: 1 ms forward, 2 ms backward per layer at micro-batch 2, free
// embedding and head, instant point-to-point.
Calibration machine() {
  Calibration c;
  c.measured = true;
  c.shape = shape();
  c.compute = {sample(2, 1e-3, 2e-3)};
  c.collectives = {fit(CollectiveOp::kSendRecv, 2, 0, 1e30)};
  c.optimizer_rate = 1e30;
  return c;
}

Layout layout(int pp, int dp, int m) {
  Layout l;
  l.pp = pp;
  l.dp = dp;
  l.grad_accum = m;
  l.micro_batch = 2;
  l.partition = StageSplit::kUniform;
  return l;
}

TEST(StepTime, PipelineScheduleAndBubbleFraction) {
  EXPECT_DOUBLE_EQ(pipeline_schedule({1, 2, 3}, 4), 6 + 3 * 3);
  EXPECT_DOUBLE_EQ(pipeline_schedule({5}, 3), 15);
  // 2 stages of 2 layers: a slot is 2 x (1 + 2) ms; m = 4: (m + pp - 1) slots, bubble 1 slot,
  // (pp - 1) / (m + pp - 1) = 1/5 of the schedule.
  const StepTime t = step_time(shape(), layout(2, 1, 4), machine(), {});
  EXPECT_NEAR(t.compute, 4 * 6e-3, 1e-12);
  EXPECT_NEAR(t.bubble, 6e-3, 1e-12);
  EXPECT_NEAR(t.bubble / (t.compute + t.bubble), 1.0 / 5, 1e-12);
  EXPECT_NEAR(t.total(), 30e-3, 1e-12);
  // GPipe keeps more micro-batches in memory, not more time.
  Layout g = layout(2, 1, 4);
  g.schedule = PipelineSchedule::kGPipe;
  EXPECT_NEAR(step_time(shape(), g, machine(), {}).total(), t.total(), 1e-15);
  // Recomputation costs one more forward per layer in the backward.
  Layout ck = layout(1, 1, 1);
  ck.checkpointing = true;
  const StepTime r = step_time(shape(), ck, machine(), {});
  EXPECT_NEAR(r.compute, 4 * (1e-3 + 2e-3 + 1e-3), 1e-12);
  EXPECT_NEAR(r.recompute, 4e-3, 1e-12);
}

TEST(StepTime, ExposedCommunicationWithAndWithoutOverlap) {
  EXPECT_DOUBLE_EQ(exposed_comm(10, 5, 7, 1), 3);   // 7 of 10 hidden behind the backward
  EXPECT_DOUBLE_EQ(exposed_comm(10, 5, 20, 1), 2);  // the last bucket always shows
  EXPECT_DOUBLE_EQ(exposed_comm(10, 5, 20, 0), 10); // no overlap: all of it
  EXPECT_DOUBLE_EQ(exposed_comm(0, 1, 1, 1), 0);
}

TEST(StepTime, ZeroTwoReduceScatterOverlapsTheBackward) {
  const auto s = shape();
  Calibration c = machine();
  const double bw = 1e9;
  c.collectives.push_back(fit(CollectiveOp::kReduceScatter, 2, 0, bw));
  c.collectives.push_back(fit(CollectiveOp::kAllGather, 2, 0, bw));
  Layout l = layout(1, 2, 2);
  l.zero_stage = 2;
  const double n = static_cast<double>(model_spec::part_param_count(s, {0, 4, true, true, 1, 0}));
  l.reduce_bucket_size = static_cast<int64_t>(std::ceil(n / 4));  // 4 buckets
  const double rs = n * 4 * 0.5 / bw;                        // per micro-batch, bus bytes (n-1)/n
  const double ag = n * 4 * 0.5 / bw;                        // the parameters after the step
  const double bwd = 4 * 2e-3;                               // the window: 4 layers' backward
  StepTime off = step_time(s, l, c, {});
  EXPECT_NEAR(off.dp_comm, 2 * rs + ag, 1e-12);
  EXPECT_NEAR(off.dp_comm_total, 2 * rs + ag, 1e-12);
  l.overlap_comm = true;
  StepTime on = step_time(s, l, c, {});
  EXPECT_NEAR(on.dp_comm, 2 * std::max(rs / 4, rs - bwd) + ag, 1e-12);
  EXPECT_NEAR(on.dp_comm_total, off.dp_comm_total, 1e-12);
  EXPECT_LT(on.total(), off.total());
  // A CPU with no spare core per rank: the collective is CPU work, nothing overlaps.
  c.cpu = true;
  c.cores = 2;
  c.ranks_per_node = 2;
  EXPECT_NEAR(step_time(s, l, c, {}).dp_comm, 2 * rs + ag, 1e-12);
}

TEST(StepTime, SixteenBitCommunicationHalvesTheBytes) {
  EXPECT_EQ(comm_types(Precision::kBf16, Precision::kFp32).param_bytes, 2);
  EXPECT_EQ(comm_types(Precision::kBf16, Precision::kFp32).grad_bytes, 4);
  Calibration c = machine();
  c.collectives.push_back(fit(CollectiveOp::kAllReduce, 2, 0, 1e9));
  Layout l = layout(1, 2, 1);
  const double fp32 = step_time(shape(), l, c, comm_types(Precision::kFp32, Precision::kFp32)).dp_comm;
  const double bf16 = step_time(shape(), l, c, comm_types(Precision::kBf16, Precision::kBf16)).dp_comm;
  EXPECT_NEAR(bf16, fp32 / 2, 1e-12);
}

TEST(StepTime, MicroBatchEfficiencyCurve) {
  Calibration c = machine();
  c.compute = {sample(1, 1e-3, 2e-3), sample(4, 2e-3, 4e-3)};  // 4 sequences cost only 2x one
  const auto s = shape();
  EXPECT_NEAR(compute_for(c, s, 1, 1, Precision::kFp32, 1).layer_fwd, 1e-3, 1e-15);
  EXPECT_NEAR(compute_for(c, s, 1, 2, Precision::kFp32, 1).layer_fwd, 1e-3 + 1e-3 / 3, 1e-15);
  EXPECT_NEAR(compute_for(c, s, 1, 8, Precision::kFp32, 1).layer_fwd, 4e-3, 1e-15);  // per sequence
  // The same 8 sequences a step: 8 micro-batches of 1 cost 8 ms forward per layer, 2 of 4 cost 4.
  Layout small = layout(1, 1, 8), big = layout(1, 1, 2);
  small.micro_batch = 1;
  big.micro_batch = 4;
  EXPECT_NEAR(step_time(s, small, c, {}).compute, 4 * 8 * 3e-3, 1e-12);
  EXPECT_NEAR(step_time(s, big, c, {}).compute, 4 * 2 * 6e-3, 1e-12);
  // tp 2 without a tp-2 sample: the tp-1 time halved; a different model: rescaled by FLOPs.
  EXPECT_NEAR(compute_for(c, s, 2, 1, Precision::kFp32, 1).layer_fwd, 0.5e-3, 1e-15);
  auto wide = s;
  wide.n_embd = 128;
  const PieceTimes w = compute_for(c, wide, 1, 1, Precision::kFp32, 1);
  EXPECT_TRUE(w.scaled);
  EXPECT_NEAR(w.layer_fwd, 1e-3 * (24.0 * 128 * 128 + 4 * 32 * 128) / (24.0 * 64 * 64 + 4 * 32 * 64), 1e-15);
}

TEST(StepTime, RanksSharingCores) {
  // 4 ranks on 2 cores: a rank alone takes 3 ms a layer, two at once 4.5 ms each, so the node
  // delivers K = 2 x 3 / 4.5 = 4/3 ranks' worth, and the step is at least the node's compute / K.
  Calibration c = machine();
  c.cpu = true;
  c.cores = 2;
  c.ranks_per_node = 4;
  c.compute = {sample(2, 1e-3, 2e-3, 1), sample(2, 1.5e-3, 3e-3, 2)};
  const auto s = shape();
  const double K = 2 * 3.0 / 4.5;
  const StepTime dp = step_time(s, layout(1, 4, 1), c, {});
  EXPECT_NEAR(dp.compute, 4 * 3e-3, 1e-12);                       // one rank's, alone
  EXPECT_NEAR(dp.compute + dp.shared_cores, 4 * 4 * 3e-3 / K, 1e-9);  // 4 ranks' / K
  // A 4-stage pipeline: its schedule at the speed of a rank alone, then the stages sharing the
  // cores while they compute at once (shared_core_pipeline, checked by hand below): at least
  // both the schedule and the node's compute through K.
  const StepTime pp = step_time(s, layout(4, 1, 8), c, {});
  const double slot = 3e-3;  // one layer per stage
  EXPECT_NEAR(pp.compute + pp.bubble, (8 + 3) * slot, 1e-12);
  const double shared = shared_core_pipeline(std::vector<StageWork>(4, StageWork{1e-3, 2e-3}), 8,
                                             PipelineSchedule::k1F1B, 0, 1,
                                             [&](int k) { return k == 1 ? 1.0 : K; });
  EXPECT_NEAR(pp.total(), shared, 1e-9);
  EXPECT_GE(pp.total(), std::max((8 + 3) * slot, 4 * 8 * slot / K) - 1e-12);
  // One micro-batch through 2 stages on 2 ranks: never two ranks at once, so no penalty.
  c.ranks_per_node = 2;
  const StepTime one = step_time(s, layout(2, 1, 1), c, {});
  EXPECT_EQ(one.shared_cores, 0);
  EXPECT_NEAR(one.total(), 4 * 3e-3, 1e-9);
  // Data parallelism on the same 2 ranks pays for computing together.
  const StepTime two = step_time(s, layout(1, 2, 1), c, {});
  EXPECT_NEAR(two.total() - two.dp_comm, 2 * 4 * 3e-3 / K, 1e-9);
}

TEST(StepTime, SharedCorePipelineByHand) {
  const std::vector<StageWork> two(2, StageWork{1, 2});
  auto every = [](int k) { return 1.0 * k; };  // a core per rank
  auto one_core = [](int) { return 1.0; };
  // Cores enough: (m + pp - 1) slots, both schedules (1F1B: s0 F1 F2 B1 F3 B2 F4 B3 B4).
  EXPECT_NEAR(shared_core_pipeline(two, 4, PipelineSchedule::k1F1B, 0, 1, every), 5 * 3, 1e-12);
  EXPECT_NEAR(shared_core_pipeline(two, 4, PipelineSchedule::kGPipe, 0, 1, every), 5 * 3, 1e-12);
  EXPECT_NEAR(pipeline_schedule({3, 3}, 4), 15, 1e-12);
  // Handoffs on the edges: F [0,1], +0.5, F [1.5,2.5], B [2.5,4.5], +0.5, B [5,7].
  EXPECT_NEAR(shared_core_pipeline(two, 1, PipelineSchedule::k1F1B, 0.5, 1, every), 7, 1e-12);
  // One core, one micro-batch: the stages never compute at once, nothing to share.
  EXPECT_NEAR(shared_core_pipeline(two, 1, PipelineSchedule::k1F1B, 0, 1, one_core), 6, 1e-12);
  // One core, GPipe over 2: s0 F1 [0,1]; s0 F2 and s1 F1 at half speed [1,3]; s1 F2 [3,4];
  // s1 B1 [4,6]; s1 B2 and s0 B1 at half speed [6,10]; s0 B2 [10,12]: the total work, the core
  // never idle.
  EXPECT_NEAR(shared_core_pipeline(two, 2, PipelineSchedule::kGPipe, 0, 1, one_core), 12, 1e-12);
  // Two ranks per stage (dp 2): on two cores a stage alone runs at full speed, on one at half.
  auto two_cores = [](int k) { return std::min(2.0, 1.0 * k); };
  EXPECT_NEAR(shared_core_pipeline(two, 1, PipelineSchedule::k1F1B, 0, 2, two_cores), 6, 1e-12);
  EXPECT_NEAR(shared_core_pipeline(two, 1, PipelineSchedule::k1F1B, 0, 2, one_core), 12, 1e-12);
}

TEST(StepTime, CollectiveLookupAndBusBytes) {
  EXPECT_DOUBLE_EQ(bus_bytes(CollectiveOp::kAllReduce, 4, 100), 150);
  EXPECT_DOUBLE_EQ(bus_bytes(CollectiveOp::kAllGather, 4, 100), 75);
  EXPECT_DOUBLE_EQ(bus_bytes(CollectiveOp::kSendRecv, 2, 100), 100);
  Calibration c;
  c.collectives = {fit(CollectiveOp::kAllReduce, 2, 1e-5, 1e9), fit(CollectiveOp::kAllReduce, 4, 2e-5, 5e8)};
  EXPECT_NEAR(collective_time(c, CollectiveOp::kAllReduce, 4, false, 1, 1e6), 2e-5 + 1.5e6 / 5e8, 1e-15);
  EXPECT_NEAR(collective_time(c, CollectiveOp::kAllReduce, 2, false, 1, 1e6), 1e-5 + 1e6 / 1e9, 1e-15);
  EXPECT_EQ(collective_time(c, CollectiveOp::kAllReduce, 1, false, 1, 1e6), 0);
  // Not measured: the built-in bandwidths.
  EXPECT_NEAR(collective_time(c, CollectiveOp::kAllGather, 2, true, 1, 1e6), 0.5e6 / c.inter_node_bw, 1e-15);
}

// all_to_all and ring_exchange have fits of their own; a calibration that has send/recv but not
// them prices them by its send/recv (every rank of the world in a pair): all_to_all as the
// (n-1)/n of the buffer that leaves the rank, ring_exchange as the message.
TEST(StepTime, AllToAllAndRingExchangeFallBackToSendRecv) {
  EXPECT_DOUBLE_EQ(bus_bytes(CollectiveOp::kAllToAll, 4, 100), 75);
  EXPECT_DOUBLE_EQ(bus_bytes(CollectiveOp::kRingExchange, 4, 100), 100);
  EXPECT_STREQ(collective_name(CollectiveOp::kAllToAll), "all_to_all");
  EXPECT_STREQ(collective_name(CollectiveOp::kRingExchange), "ring_exchange");
  Calibration c;
  CollectiveFit pairs = fit(CollectiveOp::kSendRecv, 2, 1e-5, 1e9);
  pairs.concurrent_groups = 4;  // 8 ranks in pairs
  CollectiveFit alone = fit(CollectiveOp::kSendRecv, 2, 3e-5, 2e8);  // one pair at a time
  c.collectives = {alone, pairs};
  // A group of 4, two groups at once: 8 ranks, 4 pairs: the 4-pair fit.
  EXPECT_NEAR(collective_time(c, CollectiveOp::kAllToAll, 4, false, 2, 1e6), 1e-5 + 0.75e6 / 1e9, 1e-15);
  EXPECT_NEAR(collective_time(c, CollectiveOp::kRingExchange, 4, false, 2, 1e6), 1e-5 + 1e6 / 1e9, 1e-15);
  // Their own fits win once measured.
  c.collectives.push_back(fit(CollectiveOp::kAllToAll, 4, 5e-5, 4e8));
  c.collectives.push_back(fit(CollectiveOp::kRingExchange, 4, 7e-5, 6e8));
  EXPECT_NEAR(collective_time(c, CollectiveOp::kAllToAll, 4, false, 2, 1e6), 5e-5 + 0.75e6 / 4e8, 1e-15);
  EXPECT_NEAR(collective_time(c, CollectiveOp::kRingExchange, 4, false, 2, 1e6), 7e-5 + 1e6 / 6e8, 1e-15);
  // No collectives at all: the built-in bandwidths, on the bus bytes.
  const Calibration builtin;
  EXPECT_NEAR(collective_time(builtin, CollectiveOp::kAllToAll, 4, false, 1, 1e6), 0.75e6 / builtin.intra_node_bw,
              1e-15);
}

}  // namespace
}  // namespace ds::plan
