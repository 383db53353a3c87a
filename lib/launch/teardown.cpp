// The teardown state machine (teardown.h): its transitions, and the restart rule.
#include "launch/teardown.h"

#include <csignal>

namespace ds::launch {

const char* teardown_phase_name(TeardownPhase phase) {
  switch (phase) {
    case TeardownPhase::kRunning: return "running";
    case TeardownPhase::kFailureGrace: return "failure grace";
    case TeardownPhase::kStopping: return "stopping";
    case TeardownPhase::kForced: return "forced";
  }
  return "?";
}

TeardownOrders Teardown::rank_ended(const WorkerExit& end, const std::string& host,
                                    size_t others_running, TimePoint now) {
  exits_.push_back(end);
  if (is_preemption(Failure{end.rank, host, end.status, {}})) ++preempted_ranks_;
  TeardownOrders orders;
  // A failed rank, or any rank once the teardown began, may leave children in its group.
  orders.kill_group = stopping() || !end.status.ok();
  // Only a failure of a running generation is a cause; in the grace or the teardown it is a
  // consequence (a peer that lost its collective, a rank killed by the stop).
  if (end.status.ok() || phase_ != TeardownPhase::kRunning) return orders;
  record_failure(Failure{end.rank, host, end.status, {}});
  if (policy_.failure_grace.count() > 0 && others_running > 0) {
    begin_grace(now, orders);
  } else {
    begin_stop(SIGTERM, now, orders);
  }
  return orders;
}

TeardownOrders Teardown::rank_not_started(int rank, const std::string& host, TimePoint now) {
  ExitStatus not_found;
  not_found.code = 127;
  exits_.push_back(WorkerExit{rank, not_found});
  // Workers start before anything else can stop the node, so this is the first failure unless
  // another rank could not start either.
  record_failure(Failure{rank, host, not_found, {}});
  TeardownOrders orders;
  begin_stop(SIGTERM, now, orders);
  return orders;
}

TeardownOrders Teardown::node_failed(const Failure& failure, TimePoint now) {
  // After an interruption, a node lost in the teardown is part of it, not the job's failure.
  if (!interrupted()) record_failure(failure);
  TeardownOrders orders;
  begin_stop(SIGTERM, now, orders);
  return orders;
}

TeardownOrders Teardown::signalled(int sig, TimePoint now) {
  TeardownOrders orders;
  // A repeated SIGTERM does not force: Slurm and srun may both deliver one, and the ranks may be
  // writing their preemption checkpoint.
  if (interrupted() && sig != SIGINT) return orders;
  if (closing_ || interrupted()) {
    // A second Ctrl-C (or a signal while the launcher closes): do not wait for the kill timeout.
    if (closing_ || phase_ != TeardownPhase::kForced) force(Force::kAtOnce, orders);
    return orders;
  }
  interrupt_signal_ = sig;
  orders.interrupted = true;
  // In the grace period after a failure, or a teardown already under way, the failure or the
  // stop stays the node's outcome.
  if (phase_ == TeardownPhase::kRunning) stop_signal_ = sig;
  begin_stop(sig == policy_.preempt_signal ? sig : SIGTERM, now, orders);
  return orders;
}

TeardownOrders Teardown::stop_requested(int first_signal, TimePoint now) {
  TeardownOrders orders;
  if (stopping()) return orders;
  stopped_by_controller_ = true;
  begin_stop(first_signal, now, orders);
  return orders;
}

TeardownOrders Teardown::tick(TimePoint now) {
  TeardownOrders orders;
  if (closing_) return orders;
  if (phase_ == TeardownPhase::kFailureGrace && now >= grace_until_) {
    orders.grace_over = true;
    begin_stop(SIGTERM, now, orders);
  }
  if (phase_ == TeardownPhase::kStopping && now >= kill_at_) force(Force::kKillTimeout, orders);
  return orders;
}

std::optional<Teardown::TimePoint> Teardown::next_deadline() const {
  if (phase_ == TeardownPhase::kFailureGrace) return grace_until_;
  if (phase_ == TeardownPhase::kStopping) return kill_at_;
  return std::nullopt;
}

GenerationResult Teardown::generation_result() const {
  GenerationResult r;
  r.exits = exits_;
  if (first_failure_) r.first_failure = WorkerExit{first_failure_->rank, first_failure_->status};
  r.stop_signal = stop_signal_;
  r.interrupt_signal = interrupt_signal_;
  r.stopped_by_controller = stopped_by_controller_;
  return r;
}

void Teardown::begin_grace(TimePoint now, TeardownOrders& orders) {
  phase_ = TeardownPhase::kFailureGrace;
  grace_until_ = now + policy_.failure_grace;
  orders.grace_begins = true;
}

void Teardown::begin_stop(int first_signal, TimePoint now, TeardownOrders& orders) {
  if (stopping()) return;
  phase_ = TeardownPhase::kStopping;
  kill_at_ = now + policy_.kill_timeout;
  orders.stop = first_signal;
}

void Teardown::force(Force why, TeardownOrders& orders) {
  phase_ = TeardownPhase::kForced;
  orders.force = why;
}

bool restart_after(const JobOutcome& generation, int restarts_done, int max_restarts) {
  if (!generation.failure || generation.failure->rank < 0) return false;  // success, or a node
  if (is_preemption(*generation.failure) || generation.preempted) return false;
  if (generation.stop_signal != 0) return false;  // interrupted: the user or scheduler said stop
  return restarts_done < max_restarts;
}

}  // namespace ds::launch
