// The teardown of one generation of a job's ranks, as one state machine: what a rank's failure, a
// signal, a controller's stop, a lost node or the passing of time leads to, and how the
// generation ended. Both supervisors drive it: the agent (agent.cpp) over its node's workers,
// whose orders become signals to their process groups, and the remote launcher (remote_job.cpp)
// over every node's agent, whose orders become "stop" lines and closed connections. Which
// generation comes next, a restart or the job's end, is restart_after() for every backend.
//
// Plain data: no processes, no I/O, no clock. Every event takes the time it happened; the driver
// carries out the orders an event returns, in the order of TeardownOrders' fields, and logs.
//
// Phases (the defaults: --failure-grace 5 s, --kill-timeout 10 s):
//
//   kRunning ──a rank fails, others still running, grace > 0──▶ kFailureGrace
//      │                                                           │
//      │ a signal, a controller's stop, a lost node,               │ the grace over, a signal,
//      │ a rank failing with no grace or nobody left,              │ a controller's stop,
//      │ a rank that could not start                               │ a lost node
//      ▼                                                           │
//   kStopping ◀────────────────────────────────────────────────────┘
//      │ the kill timeout, or SIGINT after an earlier signal
//      ▼
//   kForced
//
//   kRunning/kFailureGrace: the first failure is recorded (a rank's, or a node's: rank -1);
//     later failures are its consequences and never replace it.
//   kStopping: every rank still running got the first signal (SIGTERM, or the preemption signal
//     the supervisor received or was told to forward); a rank ending now has its group killed.
//   kForced: every rank still running got SIGKILL (the agent) or every connection is being
//     closed (the launcher).
// Beside the phase: `interrupted` (a signal reached the supervisor: a second SIGINT forces, a
// repeated SIGTERM does not, since the ranks may be writing their preemption checkpoint) and
// `closing` (the launcher told every agent to quit: nothing is timed any more, and a signal
// forces unless it repeats a non-SIGINT one).
//
// Internal to lib/launch.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "launch/job_summary.h"
#include "launch/process.h"

namespace ds::launch {

struct WorkerExit {
  int rank = 0;
  ExitStatus status;
};

// How one node's generation ended, as Agent::run returns it.
struct GenerationResult {
  std::vector<WorkerExit> exits;            // every local worker, in the order they ended
  std::optional<WorkerExit> first_failure;  // the first to fail (later failures, in the grace
                                            // period or teardown, never replace it)
  int stop_signal = 0;                      // SIGINT/SIGTERM/SIGHUP that stopped the node, or 0
  int interrupt_signal = 0;                 // the first signal that reached the supervisor at any
                                            // point (also during a failure's grace), or 0
  bool stopped_by_controller = false;       // the controller asked to stop (or went away)
  bool ok() const { return !first_failure && stop_signal == 0 && !stopped_by_controller; }
};

struct TeardownPolicy {
  Millis failure_grace{0};  // after the first rank failure, before the stop (0: stop at once)
  Millis kill_timeout{0};   // from the stop to the force
  int preempt_signal = 0;   // a signal forwarded as is (--preempt-signal); 0: none
};

enum class TeardownPhase { kRunning, kFailureGrace, kStopping, kForced };

// "running", "failure grace", "stopping", "forced".
const char* teardown_phase_name(TeardownPhase phase);

enum class Force {
  kNone,
  kKillTimeout,  // the kill timeout passed since the stop
  kAtOnce,       // SIGINT after an earlier signal, or a first signal while closing
};

// What the driver does after an event, in this order.
struct TeardownOrders {
  bool kill_group = false;     // SIGKILL the ended rank's process group: what it left behind
  bool grace_begins = false;   // the others may end on their own until the grace is over
  bool grace_over = false;     // the grace passed: `stop` follows
  bool interrupted = false;    // the first signal reached the supervisor
  int stop = 0;                // non-zero: send it to every rank still running (the teardown)
  Force force = Force::kNone;  // end every rank still running now
  bool any() const {
    return kill_group || grace_begins || grace_over || interrupted || stop != 0 ||
           force != Force::kNone;
  }
};

class Teardown {
 public:
  using TimePoint = Clock::time_point;

  explicit Teardown(TeardownPolicy policy) : policy_(policy) {}

  // ---- events
  // A rank ended (`host`: its node, for the job's summary). `others_running`: ranks (the agent)
  // or nodes (the launcher) still running besides it; the grace is for them, none: stop at once.
  TeardownOrders rank_ended(const WorkerExit& end, const std::string& host, size_t others_running,
                            TimePoint now);
  // A rank's program could not be started (the agent reports it as exit code 127): a failure
  // with nothing to wait for, so the stop comes at once.
  TeardownOrders rank_not_started(int rank, const std::string& host, TimePoint now);
  // A node-level failure (rank -1: an agent lost, silent or broken, its starter dead): recorded
  // unless a failure or an interruption came first; the stop comes at once.
  TeardownOrders node_failed(const Failure& failure, TimePoint now);
  // SIGINT, SIGTERM, SIGHUP or the preemption signal reached the supervisor.
  TeardownOrders signalled(int sig, TimePoint now);
  // The controller asked for a stop with `first_signal` (a "stop" line, its end of input, or
  // Agent::request_stop); once stopping, a stop changes nothing.
  TeardownOrders stop_requested(int first_signal, TimePoint now);
  // Time passed: the grace or the kill timeout may be over. Nothing is timed while closing.
  TeardownOrders tick(TimePoint now);
  // The launcher told every agent to quit and waits for their connections to close.
  void begin_closing() { closing_ = true; }

  // ---- state
  TeardownPhase phase() const { return phase_; }
  bool stopping() const { return phase_ >= TeardownPhase::kStopping; }
  bool interrupted() const { return interrupt_signal_ != 0; }
  bool closing() const { return closing_; }
  // When tick() has something to do next: the end of the grace or of the kill timeout.
  std::optional<TimePoint> next_deadline() const;

  // ---- outcome
  const std::optional<Failure>& first_failure() const { return first_failure_; }
  // The first signal the supervisor received, whenever it came (the launcher's interruption).
  int interrupt_signal() const { return interrupt_signal_; }
  // The signal that began the teardown while nothing had failed (the agent's stop_signal).
  int stop_signal() const { return stop_signal_; }
  bool stopped_by_controller() const { return stopped_by_controller_; }
  // Ranks that ended with the preemption exit code (checkpoint written).
  int preempted_ranks() const { return preempted_ranks_; }
  const std::vector<WorkerExit>& exits() const { return exits_; }
  GenerationResult generation_result() const;

 private:
  void record_failure(const Failure& failure) {
    if (!first_failure_) first_failure_ = failure;
  }
  void begin_grace(TimePoint now, TeardownOrders& orders);
  // Enters kStopping with `first_signal` unless already stopping (then `orders` is unchanged).
  void begin_stop(int first_signal, TimePoint now, TeardownOrders& orders);
  void force(Force why, TeardownOrders& orders);

  TeardownPolicy policy_;
  TeardownPhase phase_ = TeardownPhase::kRunning;
  TimePoint grace_until_{};
  TimePoint kill_at_{};
  bool closing_ = false;
  std::optional<Failure> first_failure_;
  int interrupt_signal_ = 0;
  int stop_signal_ = 0;
  bool stopped_by_controller_ = false;
  int preempted_ranks_ = 0;
  std::vector<WorkerExit> exits_;
};

// Whether a generation that ended as `generation` says is run again: a rank's failure that is
// not a preemption, not every rank preempted, no interruption, and a restart left of
// `max_restarts` after `restarts_done`. Every backend decides the job's end with it.
bool restart_after(const JobOutcome& generation, int restarts_done, int max_restarts);

}  // namespace ds::launch
