// Where a step's wall time goes (DeepSpeed's wall_clock_breakdown): the trainer marks the end of
// each phase with lap(phase); the time since the previous lap goes to that phase, except the
// seconds ZeRO's dp group kept the thread blocked meanwhile (ZeroEngine::comm_times), which go to
// the exposed reduction or gather. Laps cover the step from its start to the end of the update,
// so the phases add up to the step time.
//
//   data        reading the micro-batches' tokens
//   forward     embedding and blocks forward (ZeRO-3's gather waits excluded)
//   backward    the head (its loss and gradient are one fused pass, as in llm.c) and the blocks'
//               and embedding's backward (exposed reduction and gathers excluded)
//   reduce      gradient reduction exposed: blocked on the reductions during the backward, and
//               the end of each micro-batch (the last buckets, ZeRO-2/3's adds of the partition)
//   gather      parameter gathers exposed: ZeRO-3's, and ZeRO-1/2's after the update
//   stats       the step's global loss, norm and overflow sums
//   optimizer   clipping, AdamW on this rank's range, the master weights into the model, the
//               LR schedule (its gathers excluded)
//   pipeline    a pipeline stage's time outside its compute events: waiting on receives and sends
//               (and the schedule's bookkeeping)
//   context     context parallelism's exposed communication: the seconds the attention waited on
//               the ring's transfers after its compute, or spent in Ulysses' all-to-alls (out of
//               forward and backward)
//   expert      expert parallelism's token all-to-alls (the seconds the model's thread spent in
//               them, out of forward and backward)
// Besides the phases, the dp group's own time running the reductions and the gathers (its
// communication thread included, overlapped or not), from the Comm's busy counters.
// Thread: the model's (the trainer's) only.
#pragma once

#include <array>
#include <chrono>

#include <nlohmann/json.hpp>

#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/zero.h"

namespace ds::rt::train {

enum class Phase {
  kData, kForward, kBackward, kReduce, kGather, kStats, kOptimizer, kPipeline, kContext, kExpert, kCount
};
const char* phase_name(Phase p);  // "data", "forward", ...

struct StepBreakdown {
  std::array<double, static_cast<size_t>(Phase::kCount)> ms{};
  double reduce_comm_ms = -1, gather_comm_ms = -1;  // the dp group's busy time; < 0: not measured
  double sum_ms() const;
  double& operator[](Phase p) { return ms[static_cast<size_t>(p)]; }
  double operator[](Phase p) const { return ms[static_cast<size_t>(p)]; }
};

class StepClock {
 public:
  // Starts the step now. `zero` may be null (no exposed-communication split); `cp` is null
  // without context parallelism, `ep` without expert parallelism.
  explicit StepClock(const parallel::ZeroEngine* zero, const parallel::ContextParallelHooks* cp = nullptr,
                     const parallel::ExpertParallelHooks* ep = nullptr);
  // The time since the previous lap (or the start) goes to `p`, less the ZeRO waits in it.
  void lap(Phase p);
  // The breakdown so far, with the dp group's busy time since the start.
  StepBreakdown finish() const;

 private:
  using Clock = std::chrono::steady_clock;
  const parallel::ZeroEngine* zero_;
  const parallel::ContextParallelHooks* cp_;
  const parallel::ExpertParallelHooks* ep_;
  double last_cp_s_ = 0, last_ep_s_ = 0;
  Clock::time_point last_;
  parallel::ZeroEngine::CommTimes start_comm_, last_comm_;
  StepBreakdown b_;
};

// The breakdown's fields for --metrics: time_<phase>_ms, time_reduce_comm_ms, time_gather_comm_ms.
void breakdown_to_json(const StepBreakdown& b, nlohmann::ordered_json& out);
// "time (ms) | data 0.1 | forward 12.0 | ... | reduce comm 3.2 | gather comm 0.0".
std::string breakdown_line(const StepBreakdown& b);

}  // namespace ds::rt::train
