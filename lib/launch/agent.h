// The per-node agent: spawns one worker per local slot with the environment contract, forwards
// their output line by line, reaps them, and tears the node down on the first failure, on
// SIGINT/SIGTERM/SIGHUP, or when its controller asks (a "stop" line or end of stdin). After a
// worker failure the others get a grace period (AgentConfig::failure_grace) to exit on their own
// first; signals and controller stops tear down at once. Those decisions are the teardown
// machine's (teardown.h); the agent carries them out on its workers' process groups.
//
// It runs in-process in `dstrain launch` for a single local node, and as `dstrain agent` (started
// over SSH) on every node otherwise; the listener decides where events go (the console, or the
// agent protocol on stdout). One generation per run(): --max-restarts calls it again.
//
// Deliberately not: a daemon. It owns only the workers it spawned and signals only their process
// groups, so two jobs on one host never touch each other.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "launch/process.h"
#include "launch/signals.h"
#include "launch/teardown.h"
#include "launch/world.h"

namespace ds::launch {

inline constexpr Millis kDefaultKillTimeout{10000};
inline constexpr Millis kDefaultFailureGrace{5000};

struct AgentConfig {
  World world;
  int node_rank = 0;
  std::vector<std::string> command;  // argv of every worker
  std::string job_id;
  std::string token;                 // secret: only ever placed in the workers' environment
  EnvList user_env;                  // --env and .dstrain_env, applied last
  Millis kill_timeout = kDefaultKillTimeout;  // SIGTERM -> SIGKILL grace
  // After the first worker fails: how long the others may take to exit on their own (so a
  // survivor can report, say, which peer died in a collective) before SIGTERM. A signal to the
  // agent or a controller stop ends the wait at once. 0: SIGTERM right away.
  Millis failure_grace = kDefaultFailureGrace;
  bool bind_cores = false;           // pin local rank i to the i-th contiguous block of CPUs
  std::string cwd;                   // workers' working directory; empty: the agent's
  // A signal that, like SIGTERM, means "preempted: checkpoint and stop" (--preempt-signal, e.g.
  // SIGUSR1 from `sbatch --signal`); 0: SIGTERM only. When the agent receives it, it forwards it
  // as is to every worker (and escalates to SIGKILL after the kill timeout); workers are told its
  // name in DSTRAIN_PREEMPT_SIGNAL, which `dstrain train` catches beside SIGTERM.
  int preempt_signal = 0;
};

// Where the agent's events go. Called on the agent's thread, in order: a worker's output lines
// always come before its exit.
class AgentListener {
 public:
  virtual ~AgentListener() = default;
  virtual void on_started(int rank, pid_t pid) = 0;
  virtual void on_output(int rank, int stream, std::string_view line) = 0;  // stream 1 or 2
  virtual void on_exit(int rank, const ExitStatus& status) = 0;
};

// CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> available_cpus();

// The environment of one worker: the agent's own environment, then the contract
// (world.h worker_env), OMP_NUM_THREADS = max(1, cpus / local ranks) unless the user's env or
// the agent's environment sets it, then the user's variables.
EnvList build_worker_env(const AgentConfig& cfg, const WorkerSpec& worker, const JobEnv& job,
                         int num_cpus);

// CPUs for local rank `local_rank` of `local_world_size` with --bind-cores-to-rank.
std::vector<int> cpus_for_local_rank(const std::vector<int>& cpus, int local_rank,
                                     int local_world_size);

class Agent {
 public:
  // `signals` must outlive the agent (it carries SIGCHLD too).
  Agent(AgentConfig config, AgentListener& listener, SignalPipe& signals);

  // Spawns this node's workers and supervises them until every one has ended.
  // `control_fd` (or -1) is watched too: when readable, `on_control` runs and returns true to
  // request teardown (a "stop" line, or end of input). Returns after the last worker is reaped;
  // teardown takes at most the kill timeout plus a moment. Throws only for agent-level failures
  // (no pipe, no fork); a worker that cannot start is reported as exit code 127.
  GenerationResult run(const std::string& store_addr, int master_port, int restart_count,
                       int control_fd = -1, const std::function<bool()>& on_control = {});

  // Asks a running run() to tear down (same as a controller stop); for listeners.
  void request_stop() { stop_requested_ = true; }
  // The signal the next controller stop sends the workers first (SIGTERM unless set; the
  // launcher forwards its preemption signal this way). on_control may set it before returning.
  void set_stop_signal(int sig) { stop_signal_ = sig; }
  // Asks a running run() to have its ranks dump their flight records (request_flight_dumps).
  void request_flight_dumps() { dump_requested_ = true; }

  const AgentConfig& config() const { return config_; }

 private:
  AgentConfig config_;
  AgentListener& listener_;
  SignalPipe& signals_;
  bool stop_requested_ = false;
  bool dump_requested_ = false;
  int stop_signal_ = SIGTERM;
};

// Sends the flight recorder's dump signal (SIGUSR2) to each running worker of `pids` that catches
// it (its /proc status says so: `dstrain train` does, other commands would die of it). Returns how
// many were signalled.
int request_flight_dumps(const std::vector<pid_t>& pids);

}  // namespace ds::launch
