// Pipeline schedules as plain event lists: what each stage does, in order, for one optimizer step
// over m micro-batches. Pure data (no model, no communication), so the order can be tested on its
// own, the runtime's driver (runtime/parallel/pipeline_stage.h, run_schedule) only walks the
// list, and the plan's step-time model (lib/plan/step_time.cpp) simulates the same order.
//
//   GPipe  every stage runs all m forwards, then all m backwards (in the same order). Simple, but
//          a stage keeps the activations of all m micro-batches.
//   1F1B   (default; PipeDream-flush, as Megatron and DeepSpeed run it) stage s first runs
//          min(pp - s - 1, m) warm-up forwards, then alternates one forward and one backward, then
//          drains the remaining backwards. A stage keeps at most pp - s micro-batches in flight
//          (the first stage pp), whatever m is. Same bubble as GPipe: (pp-1)/(m+pp-1).
//
// Each compute step is framed by its point-to-point events: a forward on a stage > 0 is preceded
// by recv-activation, a forward on a stage < pp-1 followed by send-activation; a backward on a
// stage < pp-1 is preceded by recv-grad, on a stage > 0 followed by send-grad. Micro-batches are
// numbered 0..m-1 and every stage handles them in increasing order in each direction, so sends
// and receives between two neighbours match in issue order.
//
// Deliberately not: interleaved (virtual-stage) schedules, zero-bubble variants.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "layout/choices.h"

namespace ds::layout {

enum class EventKind {
  kRecvActivation,  // receive micro-batch mb's input (B,T,C) from stage - 1
  kForward,         // forward of mb through this stage
  kSendActivation,  // send mb's output (B,T,C) to stage + 1
  kRecvGrad,        // receive d(output of mb) (B,T,C) from stage + 1
  kBackward,        // backward of mb through this stage (on the last stage: the head's too)
  kSendGrad,        // send d(input of mb) (B,T,C) to stage - 1
};
const char* event_name(
    EventKind k);  // "recv_act", "fwd", "send_act", "recv_grad", "bwd", "send_grad"

struct Event {
  EventKind kind;
  int mb;
  bool operator==(const Event&) const = default;
};

// The events of `stage` (0 <= stage < stages) for m micro-batches. invalid_argument when
// stages < 1, m < 1 or stage out of range.
std::vector<Event> stage_events(PipelineSchedule kind, int stages, int stage, int micro_batches);
// Every stage's list, indexed by stage.
std::vector<std::vector<Event>> schedule_events(PipelineSchedule kind, int stages, int micro_batches);

// The most micro-batches whose activations a stage holds at once (a forward started, its backward
// not yet finished) while running `events`: how many micro-batches' activations the driver allocates.
int peak_in_flight(const std::vector<Event>& events);

// "F0 F1 B0 F2 B1 B2" (compute events only; with_p2p adds ">a0" send-act, "<a0" recv-act, ">g0",
// "<g0"): for messages and test expectations.
std::string events_to_string(const std::vector<Event>& events, bool with_p2p = false);

}  // namespace ds::layout
