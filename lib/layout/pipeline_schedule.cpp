// Pipeline schedules (see pipeline_schedule.h). A schedule is built from "steps": a forward step
// of mb (recv-act, fwd, send-act, the p2p events only where a neighbour exists) and a backward
// step (recv-grad, bwd, send-grad). 1F1B orders the steps as warm-up forwards, then pairs
// (forward, backward), then the remaining backwards; GPipe as all forwards then all backwards.
#include "layout/pipeline_schedule.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace ds::layout {

const char* event_name(EventKind k) {
  switch (k) {
    case EventKind::kRecvActivation:
      return "recv_act";
    case EventKind::kForward:
      return "fwd";
    case EventKind::kSendActivation:
      return "send_act";
    case EventKind::kRecvGrad:
      return "recv_grad";
    case EventKind::kBackward:
      return "bwd";
    case EventKind::kSendGrad:
      return "send_grad";
  }
  return "?";
}

namespace {

void check_args(int stages, int stage, int m) {
  if (stages < 1) throw invalid_argument("pipeline schedule: {} stages (need at least 1)", stages);
  if (m < 1) {
    throw invalid_argument("pipeline schedule: {} micro-batches (need at least 1)", m);
  }
  if (stage < 0 || stage >= stages) {
    throw invalid_argument("pipeline schedule: stage {} out of range [0, {})", stage, stages);
  }
}

struct Builder {
  int stages, stage;
  std::vector<Event> out;
  void forward(int mb) {
    if (stage > 0) out.push_back({EventKind::kRecvActivation, mb});
    out.push_back({EventKind::kForward, mb});
    if (stage < stages - 1) out.push_back({EventKind::kSendActivation, mb});
  }
  void backward(int mb) {
    if (stage < stages - 1) out.push_back({EventKind::kRecvGrad, mb});
    out.push_back({EventKind::kBackward, mb});
    if (stage > 0) out.push_back({EventKind::kSendGrad, mb});
  }
};

}  // namespace

std::vector<Event> stage_events(PipelineSchedule kind, int stages, int stage, int m) {
  check_args(stages, stage, m);
  Builder b{stages, stage, {}};
  if (kind == PipelineSchedule::kGPipe) {
    for (int i = 0; i < m; ++i) b.forward(i);
    for (int i = 0; i < m; ++i) b.backward(i);
    return b.out;
  }
  // 1F1B: stage s must have pp - s - 1 forwards ahead before its first backward can arrive.
  const int warmup = std::min(stages - stage - 1, m);
  int f = 0, bw = 0;
  for (; f < warmup; ++f) b.forward(f);
  for (; f < m; ++f, ++bw) {
    b.forward(f);
    b.backward(bw);
  }
  for (; bw < m; ++bw) b.backward(bw);
  return b.out;
}

std::vector<std::vector<Event>> schedule_events(PipelineSchedule kind, int stages, int m) {
  check_args(stages, 0, m);
  std::vector<std::vector<Event>> all;
  for (int s = 0; s < stages; ++s) all.push_back(stage_events(kind, stages, s, m));
  return all;
}

int peak_in_flight(const std::vector<Event>& events) {
  int live = 0, peak = 0;
  for (const auto& e : events) {
    if (e.kind == EventKind::kForward) peak = std::max(peak, ++live);
    if (e.kind == EventKind::kBackward) --live;
  }
  return peak;
}

std::string events_to_string(const std::vector<Event>& events, bool with_p2p) {
  std::string s;
  for (const auto& e : events) {
    const char* p = nullptr;
    switch (e.kind) {
      case EventKind::kForward:
        p = "F";
        break;
      case EventKind::kBackward:
        p = "B";
        break;
      case EventKind::kRecvActivation:
        p = with_p2p ? "<a" : nullptr;
        break;
      case EventKind::kSendActivation:
        p = with_p2p ? ">a" : nullptr;
        break;
      case EventKind::kRecvGrad:
        p = with_p2p ? "<g" : nullptr;
        break;
      case EventKind::kSendGrad:
        p = with_p2p ? ">g" : nullptr;
        break;
    }
    if (p == nullptr) continue;
    if (!s.empty()) s += ' ';
    s += p;
    s += std::to_string(e.mb);
  }
  return s;
}

}  // namespace ds::layout
