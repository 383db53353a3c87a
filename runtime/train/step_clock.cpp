// The wall-clock breakdown's clock (step_clock.h). Reading the clock and ZeRO's counters costs
// tens of nanoseconds; a step laps a few times per micro-batch, so it always runs and
// wall_clock_breakdown only decides whether it is reported.
#include "train/step_clock.h"

#include <fmt/format.h>

namespace ds::rt::train {

namespace {
constexpr const char* kPhaseNames[] = {"data",  "forward",   "backward",      "reduce",      "gather",
                                       "stats", "optimizer", "pipeline_wait", "context_wait", "expert_wait"};
static_assert(std::size(kPhaseNames) == static_cast<size_t>(Phase::kCount));
}  // namespace

const char* phase_name(Phase p) { return kPhaseNames[static_cast<size_t>(p)]; }

double StepBreakdown::sum_ms() const {
  double s = 0;
  for (double v : ms) s += v;
  return s;
}

StepClock::StepClock(const parallel::ZeroEngine* zero, const parallel::ContextParallelHooks* cp,
                     const parallel::ExpertParallelHooks* ep)
    : zero_(zero), cp_(cp), ep_(ep), last_(Clock::now()) {
  if (zero_) start_comm_ = last_comm_ = zero_->comm_times();
  if (cp_) last_cp_s_ = cp_->blocked_seconds();
  if (ep_) last_ep_s_ = ep_->blocked_seconds();
}

void StepClock::lap(Phase p) {
  const auto now = Clock::now();
  double ms = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
  if (zero_) {
    const auto c = zero_->comm_times();
    const double reduce = (c.reduce_wait_s - last_comm_.reduce_wait_s) * 1e3;
    const double gather = (c.gather_wait_s - last_comm_.gather_wait_s) * 1e3;
    last_comm_ = c;
    if (p != Phase::kReduce && p != Phase::kGather) {
      b_[Phase::kReduce] += reduce;
      b_[Phase::kGather] += gather;
      ms -= reduce + gather;
    }
  }
  if (cp_) {
    const double now_s = cp_->blocked_seconds(), waited = (now_s - last_cp_s_) * 1e3;
    last_cp_s_ = now_s;
    b_[Phase::kContext] += waited;
    ms -= waited;
  }
  if (ep_) {
    const double now_s = ep_->blocked_seconds(), waited = (now_s - last_ep_s_) * 1e3;
    last_ep_s_ = now_s;
    b_[Phase::kExpert] += waited;
    ms -= waited;
  }
  b_[p] += ms;
}

StepBreakdown StepClock::finish() const {
  StepBreakdown b = b_;
  if (zero_) {
    const auto c = zero_->comm_times();
    if (c.reduce_busy_s >= 0) b.reduce_comm_ms = (c.reduce_busy_s - start_comm_.reduce_busy_s) * 1e3;
    if (c.gather_busy_s >= 0) b.gather_comm_ms = (c.gather_busy_s - start_comm_.gather_busy_s) * 1e3;
  }
  return b;
}

void breakdown_to_json(const StepBreakdown& b, nlohmann::ordered_json& out) {
  for (size_t i = 0; i < b.ms.size(); ++i) out[fmt::format("time_{}_ms", kPhaseNames[i])] = b.ms[i];
  if (b.reduce_comm_ms >= 0) out["time_reduce_comm_ms"] = b.reduce_comm_ms;
  if (b.gather_comm_ms >= 0) out["time_gather_comm_ms"] = b.gather_comm_ms;
}

std::string breakdown_line(const StepBreakdown& b) {
  std::string s = "time (ms)";
  for (size_t i = 0; i < b.ms.size(); ++i) s += fmt::format(" | {} {:.2f}", kPhaseNames[i], b.ms[i]);
  auto comm = [](double v) { return v < 0 ? std::string("-") : fmt::format("{:.2f}", v); };
  s += fmt::format(" | reduce comm {} | gather comm {}", comm(b.reduce_comm_ms), comm(b.gather_comm_ms));
  return s;
}

}  // namespace ds::rt::train
