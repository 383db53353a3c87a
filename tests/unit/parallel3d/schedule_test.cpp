// Pipeline schedules as event lists: the exact order of 1F1B and GPipe for small cases, and for
// many (stages, micro-batches): every micro-batch passes every stage once each way, the lists of
// all stages run to completion under blocking receives (no deadlock), and the peak number of
// micro-batches in flight per stage (1F1B: pp - stage, capped by m; GPipe: m).
#include "layout/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>

#include "common/error.h"

namespace ds::layout {
namespace {

TEST(PipelineSchedule, OneF1BTwoStagesFourMicroBatches) {
  const auto s = schedule_events(PipelineSchedule::k1F1B, 2, 4);
  EXPECT_EQ(events_to_string(s[0]), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(events_to_string(s[1]), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(events_to_string(s[0], true),
            "F0 >a0 F1 >a1 <g0 B0 F2 >a2 <g1 B1 F3 >a3 <g2 B2 <g3 B3");
  EXPECT_EQ(events_to_string(s[1], true),
            "<a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 <a3 F3 B3 >g3");
}

TEST(PipelineSchedule, OneF1BFourStages) {
  const auto s = schedule_events(PipelineSchedule::k1F1B, 4, 6);
  EXPECT_EQ(events_to_string(s[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(events_to_string(s[1]), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(events_to_string(s[2]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(events_to_string(s[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(events_to_string(s[1], true),
            "<a0 F0 >a0 <a1 F1 >a1 <a2 F2 >a2 <g0 B0 >g0 <a3 F3 >a3 <g1 B1 >g1 <a4 F4 >a4 <g2 B2 "
            ">g2 <a5 F5 >a5 <g3 B3 >g3 <g4 B4 >g4 <g5 B5 >g5");
  // Fewer micro-batches than stages: the warm-up is capped by m.
  const auto few = schedule_events(PipelineSchedule::k1F1B, 4, 2);
  EXPECT_EQ(events_to_string(few[0]), "F0 F1 B0 B1");
  EXPECT_EQ(events_to_string(few[3]), "F0 B0 F1 B1");
}

TEST(PipelineSchedule, GPipe) {
  const auto s = schedule_events(PipelineSchedule::kGPipe, 2, 3);
  EXPECT_EQ(events_to_string(s[0], true), "F0 >a0 F1 >a1 F2 >a2 <g0 B0 <g1 B1 <g2 B2");
  EXPECT_EQ(events_to_string(s[1], true), "<a0 F0 <a1 F1 <a2 F2 B0 >g0 B1 >g1 B2 >g2");
  EXPECT_EQ(events_to_string(schedule_events(PipelineSchedule::kGPipe, 1, 2)[0], true), "F0 F1 B0 B1");
}

// Runs every stage's list with blocking receives and buffered sends; returns false on deadlock.
bool simulate(const std::vector<std::vector<Event>>& all) {
  const int pp = static_cast<int>(all.size());
  std::vector<size_t> pc(pp, 0);
  // Messages in flight per (from, to, kind), in order.
  std::map<std::tuple<int, int, int>, std::deque<int>> chan;
  for (;;) {
    bool progress = false, done = true;
    for (int s = 0; s < pp; ++s) {
      while (pc[s] < all[s].size()) {
        done = false;
        const Event e = all[s][pc[s]];
        if (e.kind == EventKind::kRecvActivation || e.kind == EventKind::kRecvGrad) {
          const int from = e.kind == EventKind::kRecvActivation ? s - 1 : s + 1;
          auto& q = chan[{from, s, static_cast<int>(e.kind)}];
          if (q.empty()) break;
          EXPECT_EQ(q.front(), e.mb) << "stage " << s << " receives out of order";
          q.pop_front();
        } else if (e.kind == EventKind::kSendActivation) {
          chan[{s, s + 1, static_cast<int>(EventKind::kRecvActivation)}].push_back(e.mb);
        } else if (e.kind == EventKind::kSendGrad) {
          chan[{s, s - 1, static_cast<int>(EventKind::kRecvGrad)}].push_back(e.mb);
        }
        ++pc[s];
        progress = true;
      }
    }
    bool all_done = true;
    for (int s = 0; s < pp; ++s) all_done = all_done && pc[s] == all[s].size();
    if (all_done) return true;
    if (!progress || done) return false;
  }
}

TEST(PipelineSchedule, EveryShapeIsCompleteOrderedAndDeadlockFree) {
  for (auto kind : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe}) {
    for (int pp = 1; pp <= 6; ++pp) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE(::testing::Message() << schedule_name(kind) << " pp " << pp << " m " << m);
        const auto all = schedule_events(kind, pp, m);
        ASSERT_EQ(static_cast<int>(all.size()), pp);
        for (int s = 0; s < pp; ++s) {
          std::vector<int> fwd, bwd;
          std::vector<bool> fwd_done(m, false);
          for (const auto& e : all[s]) {
            if (e.kind == EventKind::kForward) {
              fwd.push_back(e.mb);
              fwd_done[e.mb] = true;
            }
            if (e.kind == EventKind::kBackward) {
              EXPECT_TRUE(fwd_done[e.mb]) << "backward before forward, stage " << s;
              bwd.push_back(e.mb);
            }
          }
          std::vector<int> want(m);
          for (int i = 0; i < m; ++i) want[i] = i;
          EXPECT_EQ(fwd, want) << "stage " << s;
          EXPECT_EQ(bwd, want) << "stage " << s;
          const int expect_peak = kind == PipelineSchedule::kGPipe ? m : std::min(pp - s, m);
          EXPECT_EQ(peak_in_flight(all[s]), expect_peak) << "stage " << s;
        }
        EXPECT_TRUE(simulate(all)) << "deadlock";
      }
    }
  }
}

TEST(PipelineSchedule, BadArgumentsAreErrors) {
  EXPECT_THROW(stage_events(PipelineSchedule::k1F1B, 0, 0, 1), ds::Error);
  EXPECT_THROW(stage_events(PipelineSchedule::k1F1B, 2, 2, 1), ds::Error);
  EXPECT_THROW(stage_events(PipelineSchedule::kGPipe, 2, 0, 0), ds::Error);
  EXPECT_EQ(layout::parse_schedule_or_throw("1F1B", "pipeline.schedule"), PipelineSchedule::k1F1B);
  EXPECT_EQ(layout::parse_schedule_or_throw("gpipe", "pipeline.schedule"), PipelineSchedule::kGPipe);
  try {
    layout::parse_schedule_or_throw("zigzag", "pipeline.schedule");
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.schedule"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zigzag"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ds::layout
