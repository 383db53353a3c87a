// Worker processes on POSIX: fork/exec into a fresh process group with its own environment,
// stdout and stderr on pipes, optional CPU affinity, and signals to the group.
//
// Plain POSIX rather than Boost.Process (1.74): we need setpgid, PR_SET_PDEATHSIG and
// sched_setaffinity between fork and exec, exec failures reported synchronously, and the pipes
// in our own poll() loop next to sockets and a signal pipe; Boost.Process 1.74 gives none of
// these without fighting its abstractions.
//
// Deliberately not: a general subprocess library (no stdin for the child, no shell).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "launch/world.h"

namespace ds::launch {

// How a process ended: an exit code or the signal that killed it.
struct ExitStatus {
  int code = 0;     // valid when signal == 0
  int signal = 0;   // non-zero: killed by this signal
  static ExitStatus from_wait(int wstatus);
  bool ok() const { return signal == 0 && code == 0; }
  // The status a shell would report: the code, or 128 + signal.
  int shell_status() const { return signal != 0 ? 128 + signal : code; }
  // "exit code 3" or "signal 9 (SIGKILL)".
  std::string describe() const;
};

// "SIGKILL" for 9 etc., or "signal N" when unknown.
std::string signal_name(int sig);

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is resolved on PATH unless it contains '/'
  EnvList env;                    // the complete environment of the child
  std::vector<int> cpus;          // CPU affinity; empty: inherit
  std::string cwd;                // empty: inherit
  bool kill_with_parent = true;   // PR_SET_PDEATHSIG(SIGKILL): a SIGKILL'd parent leaves no orphan
  bool defer_exec_check = false;  // true: the caller calls confirm_exec() later (spawn many at once)
};

struct Spawned {
  pid_t pid = -1;      // also the process group id
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec; owned by the caller
  int stderr_fd = -1;
  int exec_fd = -1;     // until confirm_exec(): reports an exec failure in the child
  std::string program;  // the resolved path
};

// Finds `program` on `path_env` (colon-separated) unless it contains '/'. Returns the path of an
// executable file, or nullopt.
std::optional<std::string> find_program(const std::string& program, const std::string& path_env);

// Starts the child in its own process group (pgid == pid). Safe to call from a multi-threaded
// process: everything is prepared before fork, the child only makes async-signal-safe calls.
// Throws system_error when fork fails or exec fails in the child (naming the program and errno;
// see defer_exec_check), invalid_argument when the program is not found.
Spawned spawn(const SpawnRequest& request);

// Waits until the child has exec'd (or failed to). On failure reaps the child, closes its pipes
// and throws system_error naming the program and errno. No-op when already confirmed.
void confirm_exec(Spawned& spawned);

// Sends `sig` to the process group `pgid`; ESRCH (already gone) is not an error.
void signal_group(pid_t pgid, int sig);

// This process's environment as a list (what a child gets unless the caller changes it).
EnvList current_environment();

// Blocks SIGPIPE for this process (writes to closed pipes then fail with EPIPE instead).
void ignore_sigpipe();

}  // namespace ds::launch
