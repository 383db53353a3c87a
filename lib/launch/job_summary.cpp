// The one summary line of a job and its exit status, for every backend (job_summary.h).
#include "launch/job_summary.h"

#include <csignal>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/preemption.h"

namespace ds::launch {

std::string describe_failure(const Failure& f) {
  if (f.rank < 0) return f.what;
  if (f.status.signal != 0) {
    return fmt::format("rank {} on {} was killed by {}", f.rank, f.host, f.status.describe());
  }
  return fmt::format("rank {} on {} exited with {}", f.rank, f.host, f.status.describe());
}

bool is_preemption(const Failure& f) {
  return f.rank >= 0 && f.status.signal == 0 && f.status.code == preempt::kPreemptedExitCode;
}

bool is_teardown_death(const JobOutcome& o) {
  if (!o.failure || o.failure->rank < 0 || o.stop_signal == 0) return false;
  const int sig = o.failure->status.signal;
  return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGKILL;
}

int finish(OutputMux& mux, const JobOutcome& o) {
  std::string after = o.restarts > 0 ? fmt::format(" after {} restart(s)", o.restarts) : "";
  if (is_teardown_death(o)) {
    // The job was being torn down around the launcher (a scheduler cancelling or requeueing it
    // signals the ranks and the launcher within moments of each other): the rank's death is part
    // of the interruption, not a failure of its own.
    mux.note(fmt::format("dstrain: job interrupted by {}{}: every rank was stopped ({} first); exit status {}",
                         signal_name(o.stop_signal), after, describe_failure(*o.failure), 128 + o.stop_signal));
    return 128 + o.stop_signal;
  }
  if (o.preempted) {
    mux.note(
        fmt::format("dstrain: job preempted{}: all {} rank(s) finished their step, wrote a "
                    "checkpoint and exited {}; run it again (a requeued or restarted job resumes "
                    "from the checkpoint by itself); exit status {}",
                    after, o.world_size, preempt::kPreemptedExitCode, preempt::kPreemptedExitCode));
    return preempt::kPreemptedExitCode;
  }
  if (o.failure && o.failure->rank < 0) {
    mux.note(fmt::format("dstrain: job failed{}: {}; every rank was stopped; exit status 1", after,
                         o.failure->what));
    return 1;
  }
  if (o.failure) {
    int status = o.failure->status.shell_status();
    if (status == 0) status = 1;
    if (const auto hung = mux.hung_rank()) {
      // The first rank to exit was one that waited for the hung rank (its error names it): the
      // cause is the hung rank.
      mux.note(fmt::format("dstrain: job failed{}: rank {} on {} hung: it {} (the first rank to end: {}; every "
                           "other rank has ended, on its own within the failure grace or stopped); exit status {}",
                           after, hung->world_rank, hung->host, hung->what, describe_failure(*o.failure), status));
      return status;
    }
    mux.note(
        fmt::format("dstrain: job failed{}: {} (the first failure; every other rank has "
                    "ended, on its own within the failure grace or stopped); exit status {}",
                    after, describe_failure(*o.failure), status));
    return status;
  }
  if (o.stop_signal != 0) {
    mux.note(fmt::format("dstrain: job interrupted by {}{}: every rank was stopped; exit status {}",
                         signal_name(o.stop_signal), after, 128 + o.stop_signal));
    return 128 + o.stop_signal;
  }
  spdlog::info("job finished: all {} rank(s) exited 0 in {:.2f} s{}", o.world_size,
               std::chrono::duration<double>(SteadyClock::now() - o.started).count(), after);
  return 0;
}

}  // namespace ds::launch
