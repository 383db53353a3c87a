// A job whose nodes each run a `dstrain agent`, driven from the launcher over one channel per
// agent (agent_channel.h) in one poll() loop: output relayed, the first failure answered by the
// failure grace and then a stop to every node, signals forwarded (those decisions are the
// teardown machine's, teardown.h), restarts under --max-restarts, and the summary
// (job_summary.h).
//
// How the agents start and reach the launcher is an AgentStarter: over SSH (one channel per
// node, the token as the channel's first line), or through a cluster launcher (srun, mpirun)
// whose agents dial back to the launcher's control server (controller.h, the token from the
// environment). Everything after that is the same for every backend.
//
// Internal to lib/launch.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/agent_channel.h"
#include "launch/job_summary.h"
#include "launch/launcher.h"

namespace ds::launch {

class AgentStarter {
 public:
  virtual ~AgentStarter() = default;
  // Starts one agent per node of spec.world and returns their channels, index = node rank.
  // Throws ds::Error naming the node (or the starter) when one cannot start or join.
  virtual std::vector<std::unique_ptr<AgentChannel>> start(const std::string& job_id,
                                                           const std::string& token) = 0;
  // Whether the token goes over the channel as the first protocol line (SSH) or the agents
  // already have it (their environment).
  virtual bool sends_token() const = 0;
  // Descriptors of the starter process's output to poll next to the channels (-1: none), and
  // what to do when they are readable.
  virtual std::vector<int> fds() const { return {}; }
  virtual void pump() {}
  // While the job runs: a description when the starter process died under it.
  virtual std::optional<std::string> died() { return std::nullopt; }
  // After every channel closed: waits (bounded) for the starter process, then kills its group.
  virtual void finish() {}
  // Node `node`'s agent (process `pid` there) stopped answering: kill it, and so its workers
  // (they die with it), by other means than its channel where the starter has one. Bounded.
  virtual void kill_agent(size_t node, long pid) {}
};

std::unique_ptr<AgentStarter> make_ssh_starter(const JobSpec& spec);
// srun (kSlurm) or mpirun (kOpenMpi, kMpich); output lines go to `mux` as notes.
std::unique_ptr<AgentStarter> make_cluster_starter(const JobSpec& spec, OutputMux& mux);

// A node lost during the job: its channel broke or closed while the launcher still needed it,
// or its agent went silent past the agent timeout.
struct LostNode {
  int node_rank = 0;
  std::string host;
  std::string why;
  SteadyClock::time_point when;
};

// How one run of the agents ended, before the summary: the outcome, the nodes lost, and whether a
// second signal forced every connection closed (exit 128 + outcome.stop_signal, no summary).
struct RemoteResult {
  JobOutcome outcome;
  std::vector<LostNode> lost;
  bool forced = false;
};

// Runs the job's agents until they end (restarts under --max-restarts included); the caller sums up.
RemoteResult run_remote_attempt(const JobSpec& spec, OutputMux& mux, AgentStarter& starter);

// run_remote_attempt, then the summary (job_summary.h); returns the job's exit status.
int run_remote_job(const JobSpec& spec, OutputMux& mux, AgentStarter& starter);

}  // namespace ds::launch
