// Preemption: a process-wide flag that a signal handler sets, so a training loop can finish its
// step, write a checkpoint and exit with kPreemptedExitCode instead of dying mid-step.
//
// Who sends the signal: Slurm (SIGTERM on scancel, requeue, preemption and the time limit, or
// the signal of `sbatch --signal`), Kubernetes (SIGTERM on eviction), or dstrain's own launcher
// and agents, which forward the signal they were given to every worker (docs/clusters.md).
//
// Deliberately not: a decision. The flag only says "this process was asked to stop"; the
// trainer agrees on the step with every other rank (its per-step all-reduce carries the flag),
// and `dstrain train` picks the exit status.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

namespace ds::preempt {

// The exit status of a worker that was preempted and wrote a checkpoint: 75, EX_TEMPFAIL of
// sysexits.h ("temporary failure; the user is invited to retry"). A launcher whose every rank
// exited 75 exits 75 too, so Slurm's RequeueExit=75 can requeue the job.
inline constexpr int kPreemptedExitCode = 75;

// While alive, SIGTERM and each signal of `extra` (0s are ignored) set the flag instead of
// ending the process; the previous handlers come back on destruction. One at a time.
class Guard {
 public:
  explicit Guard(const std::vector<int>& extra = {});
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

// True once one of the Guard's signals arrived (async-signal-safe to set, cheap to read).
bool requested();
// The signal that set the flag (0 when none).
int signal_received();
// Clears the flag (tests).
void reset();

// "SIGUSR1", "USR1", "usr1" or "10" -> 10. Anything else is an invalid_argument naming
// `origin` (a flag or a variable) with the accepted forms.
int parse_signal(const std::string& text, const std::string& origin);

}  // namespace ds::preempt
