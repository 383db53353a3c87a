// How a job ended, summed up the same way by every backend (local, remote agents, --launcher
// none): the first failure, a signal that stopped the launcher, or a preemption that every rank
// answered with its checkpoint. finish() prints the one summary line and gives the exit status
// (the table in launcher.h).
//
// Internal to lib/launch.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "launch/output.h"
#include "launch/process.h"

namespace ds::launch {

using SteadyClock = std::chrono::steady_clock;

struct Failure {
  int rank = -1;  // -1: a node-level failure (agent lost, node missing)
  std::string host;
  ExitStatus status;
  std::string what;  // for node-level failures: the reason
};

// "rank 3 on worker-1 exited with exit code 3" / "... was killed by signal 9 (SIGKILL)", or
// the node-level reason.
std::string describe_failure(const Failure& f);

struct JobOutcome {
  std::optional<Failure> failure;  // the first failure
  int stop_signal = 0;             // a signal that stopped the launcher (or this node)
  bool preempted = false;          // every rank exited kPreemptedExitCode (checkpoint written)
  int world_size = 0;
  int restarts = 0;
  SteadyClock::time_point started;
};

// True for a failure that is a rank's preemption exit (no restart answers it).
bool is_preemption(const Failure& f);

// True when the first failure is a rank killed by SIGTERM, SIGINT, SIGHUP or SIGKILL and the
// launcher was stopped by a signal too: a teardown from outside (Slurm cancelling or requeueing
// the job signals the ranks and the launcher), summed up as the interruption it is.
bool is_teardown_death(const JobOutcome& outcome);

// Prints the summary through `mux` and returns the job's exit status: 75 when preempted, else
// 128+signal when interrupted (a teardown death included: is_teardown_death), 1 for a
// node-level failure, the first failing rank's status, 0.
int finish(OutputMux& mux, const JobOutcome& outcome);

}  // namespace ds::launch
